"""redet_plugin's layers point one way (shared/DESIGN.md):

    ops <- structures, utils <- cuda_graphs <- models, datasets, evaluation, visualization
        <- engine, inference, deploy, mm

Read from the source (every import statement, those inside functions too), without importing it.
"""
import ast
import functools
import sys
from pathlib import Path
from typing import Dict, Iterator, Set

import pytest

import redet_plugin

PACKAGE_DIR = Path(redet_plugin.__file__).parent
ROOT = 'redet_plugin'

# each part of the package (a subpackage or a top-level module; '' is redet_plugin/__init__.py)
# and its layer: a part imports parts of its own layer or below
LAYERS = {
    '': 0, 'version': 0, '_ext': 0, '_C': 0, 'ops': 0, 'testing': 0,
    'structures': 1, 'utils': 1,
    'cuda_graphs': 2,
    'models': 3, 'datasets': 3, 'evaluation': 3, 'visualization': 3,
    'engine': 4, 'inference': 4, 'deploy': 4, 'mm': 4,
}
LOW = {'', 'version', '_ext', '_C'}  # what every part may import (the root holds a version only)
# redet_plugin/__init__.py loads the mm layer where mmengine is loaded already (an OpenMMLab
# program's custom_imports naming 'redet_plugin'): the one import up, from the package's root
ROOT_LOADS = {'mm'}


def module_name(path: Path) -> str:
    """The dotted name of a file of the package (redet_plugin/x/__init__.py -> redet_plugin.x)."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


def imported_modules(path: Path) -> Iterator[str]:
    """Absolute names of the modules a file imports (relative imports resolved); for
    `from m import a`, both m and m.a (a may be a submodule)."""
    name = module_name(path)
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit('.', node.level - 1)[0] if node.level > 1 else package
                module = f'{base}.{node.module}' if node.module else base
            else:
                module = node.module
            yield module
            yield from (f'{module}.{alias.name}' for alias in node.names)


def part_of(module: str) -> str:
    """The part of redet_plugin a module name belongs to ('' for the package itself)."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else ''


@functools.lru_cache(maxsize=None)
def _imports() -> Dict[Path, Set[str]]:
    return {path: set(imported_modules(path)) for path in sorted(PACKAGE_DIR.rglob('*.py'))}


def _files_of(part: str) -> Dict[Path, Set[str]]:
    return {path: names for path, names in _imports().items()
            if part_of(module_name(path)) == part}


def _offenders(part: str, allowed_parts: Set[str], allowed_libraries=None) -> list:
    """'file: module' for each import of `part` outside allowed_parts of redet_plugin (and,
    when given, outside allowed_libraries and the standard library)."""
    found = []
    for path, names in _files_of(part).items():
        for name in sorted(names):
            top = name.split('.')[0]
            if top == ROOT:
                bad = part_of(name) not in allowed_parts | LOW | {part}
            elif allowed_libraries is not None:
                bad = top not in allowed_libraries and top not in sys.stdlib_module_names
            else:
                bad = False
            if bad:
                found.append(f'{path.relative_to(PACKAGE_DIR.parent)}: {name}')
    return found


def test_every_part_has_a_layer():
    parts = {part_of(module_name(path)) for path in _imports()}
    assert parts <= set(LAYERS), (f'parts of redet_plugin without a layer: '
                                  f'{sorted(parts - set(LAYERS))}; add them to LAYERS')


def test_ops_import_torch_only():
    offenders = _offenders('ops', set(), allowed_libraries={'torch'})
    assert not offenders, f'ops/ imports more than torch and the compiled library: {offenders}'


@pytest.mark.parametrize('part', ['structures', 'utils'])
def test_structures_and_utils_import_only_ops_and_each_other(part):
    offenders = _offenders(part, {'ops', 'structures', 'utils'})
    assert not offenders, f'{part}/ imports a layer above it: {offenders}'


def test_cuda_graphs_import_torch_mmengine_ops_structures_and_utils_only():
    offenders = _offenders('cuda_graphs', {'ops', 'structures', 'utils'},
                           allowed_libraries={'torch', 'mmengine'})
    assert not offenders, f'cuda_graphs/ imports more than its layer allows: {offenders}'


def test_nothing_imports_benchmarks_or_tools():
    offenders = [f'{path.relative_to(PACKAGE_DIR.parent)}: {name}'
                 for path, names in _imports().items() for name in sorted(names)
                 if name.split('.')[0] in ('benchmarks', 'tools')]
    assert not offenders, f'redet_plugin imports benchmarks/ or tools/: {offenders}'


def test_layers_point_one_way():
    offenders = []
    for path, names in _imports().items():
        layer = LAYERS.get(part_of(module_name(path)))
        for name in sorted(names):
            target = LAYERS.get(part_of(name)) if name.split('.')[0] == ROOT else None
            upward = layer is not None and target is not None and target > layer
            if upward and not (module_name(path) == ROOT and part_of(name) in ROOT_LOADS):
                offenders.append(f'{path.relative_to(PACKAGE_DIR.parent)}: {name}')
    assert not offenders, f'imports of a higher layer: {offenders}'
