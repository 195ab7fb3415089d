"""What an exported ReDet package holds besides the program: one JSON document (the metadata),
and where each kind of package keeps it. Written by redet_plugin.inference.export, read by
redet_plugin.deploy.load; stdlib and torch only.

A package is a PT2 archive (a zip file):
- kind 'program' (torch.export.save): the exported program; the metadata is the extra file
  `redet.json` (stored as extra/redet.json);
- kind 'compiled' (torch._inductor.aoti_compile_and_package): the AOTInductor-compiled model;
  the metadata is the model's AOTInductor metadata entry `redet`, stored in the archive's
  .../<model>_metadata.json.
"""
import json
import zipfile
from typing import Optional

FORMAT = 1
EXTRA_FILE = 'redet.json'
METADATA_KEY = 'redet'
KINDS = ('program', 'compiled')
KEYS = ('format', 'kind', 'classes', 'input_size', 'mean', 'std', 'bgr_to_rgb', 'torch',
        'plugin', 'device', 'dtype', 'max_detections')


class NotAPackageError(ValueError):
    """The file is no package that redet_plugin.inference.export wrote."""


def metadata_json(**values) -> str:
    """The metadata document (every key of KEYS, no other) as one JSON string."""
    if set(values) != set(KEYS) - {'format'}:
        raise ValueError(f'metadata: expected the keys {sorted(set(KEYS) - {"format"})}, got '
                         f'{sorted(values)}')
    return json.dumps(dict(format=FORMAT, **values))


def read_metadata(path: str) -> dict:
    """The metadata of the package at `path`, read from the archive without loading the model."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise NotAPackageError(f'package {path!r} does not exist') from None
    except (zipfile.BadZipFile, IsADirectoryError, OSError):
        raise NotAPackageError(f'{path!r} is not an exported ReDet package (not a PT2 archive); '
                               f'make one with tools/export.py') from None
    with archive:
        text = _program_metadata(archive) or _compiled_metadata(archive)
    if text is None:
        raise NotAPackageError(f'{path!r} is a PT2 archive without ReDet metadata '
                               f'(not written by tools/export.py)')
    try:
        meta = json.loads(text)
    except ValueError:
        raise NotAPackageError(f'{path!r}: its ReDet metadata is not valid JSON') from None
    missing = [key for key in KEYS if key not in meta] if isinstance(meta, dict) else list(KEYS)
    if missing:
        raise NotAPackageError(f'{path!r}: its ReDet metadata lacks {", ".join(missing)}')
    return meta


def _program_metadata(archive: zipfile.ZipFile) -> Optional[str]:
    for name in archive.namelist():
        if name.endswith(f'extra/{EXTRA_FILE}'):
            return archive.read(name).decode('utf-8')
    return None


def _compiled_metadata(archive: zipfile.ZipFile) -> Optional[str]:
    for name in archive.namelist():
        if name.endswith('_metadata.json') and '/aotinductor/' in name:
            try:
                entries = json.loads(archive.read(name).decode('utf-8'))
            except ValueError:
                continue
            if isinstance(entries, dict) and METADATA_KEY in entries:
                return entries[METADATA_KEY]
    return None
