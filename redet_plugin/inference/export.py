"""A trained ReDet as one file that runs without the training stack (tools/export.py).

    from redet_plugin.inference.export import export_detector
    export_detector('configs/redet/redet-le90_re50_refpn_1x_dota.py', 'epoch_12.pth',
                    'redet.pt2', image_size=(1024, 1024))

The package holds the whole test forward of one image of a fixed size (SingleImageForward:
uint8 BGR pixels in, max_detections fixed-size rows and the valid count out), traced by
torch.export with the equivariant backbone and neck converted to plain convolutions, and the
metadata (deploy/package_format.py). redet_plugin.deploy.load runs it with torch and
redet_plugin.ops only.
"""
import os
import os.path as osp
from typing import Optional, Sequence

import torch
from torch import _inductor

import redet_plugin
from ..deploy.package_format import metadata_json
from .detector import _build_model
from .plain_model import make_plain
from .single_image_forward import SingleImageForward

DEVICES = ('cpu', 'cuda')
DTYPES = ('float32', 'float16')


def export_detector(config, checkpoint: Optional[str], out: str, *,
                    image_size: Sequence[int] = (1024, 1024), device: str = 'cpu',
                    dtype: str = 'float32', compile: bool = False,
                    cfg_options: Optional[dict] = None,
                    inductor_configs: Optional[dict] = None) -> str:
    """Export the detector of `config` with `checkpoint` (None: the config's initialisation, for
    tests) to the package `out`; returns its path.

    image_size: (H, W) of the images the package takes (smaller ones are padded when run).
    device: 'cpu' or 'cuda', where the package runs.
    dtype: 'float32', or 'float16': the forward under fp16 autocast, as `tools/test.py --amp`
        runs it (CUDA only); the outputs are float32 either way.
    compile: AOTInductor-compile the program (a package of machine code for this device and
        torch version; minutes to make) instead of saving the exported program.
    inductor_configs: more of inductor's settings for the compile (e.g. {'max_autotune': True}).
    """
    image_size = _checked_image_size(image_size)
    if device not in DEVICES:
        raise ValueError(f'device: expected one of {DEVICES}, got {device!r}')
    if device == 'cuda' and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' asked for, but torch sees no CUDA device")
    if dtype not in DTYPES:
        raise ValueError(f'dtype: expected one of {DTYPES}, got {dtype!r}')
    if dtype == 'float16' and device != 'cuda':
        raise ValueError("dtype: 'float16' (fp16 autocast) runs on a GPU only: export it with "
                         "device='cuda' (--device cuda)")
    if not isinstance(out, (str, os.PathLike)) or not str(out):
        raise ValueError(f'out: expected a file path, got {out!r}')
    folder = osp.dirname(osp.abspath(out))
    if not osp.isdir(folder):
        raise ValueError(f'out: the folder {folder!r} does not exist')

    model, classes, _ = _build_model(config, checkpoint, torch.device(device), cfg_options)
    forward = single_image_forward(model, image_size, half=dtype == 'float16')
    program = export_program(forward, device)
    meta = metadata_json(
        kind='compiled' if compile else 'program', classes=list(classes),
        input_size=list(image_size), mean=forward.mean.flatten().tolist(),
        std=forward.std.flatten().tolist(), bgr_to_rgb=forward.bgr_to_rgb,
        torch=torch.__version__, plugin=redet_plugin.__version__, device=device, dtype=dtype,
        max_detections=max_detections(program))
    if compile:
        # inductor's freezing makes the weights constants of the compiled code, so it can fold
        # what folding left (e.g. the R-CNN head's linear layers) and lay the weights out for
        # its kernels
        return _inductor.aoti_compile_and_package(
            program, package_path=str(out),
            inductor_configs={'freezing': True, **(inductor_configs or {}),
                              'aot_inductor.metadata': {'redet': meta}})
    torch.export.save(program, str(out), extra_files={'redet.json': meta})
    return str(out)


def single_image_forward(model: torch.nn.Module, image_size,
                         half: bool = False) -> SingleImageForward:
    """The eval-mode detector, its equivariant networks converted to plain PyTorch and their
    batch norms folded into the convolutions (make_plain: in the module, so the saved program
    and the compiled package run the same folded graph), as one image's test forward (under
    fp16 autocast when `half`)."""
    make_plain(model, half=half)
    return SingleImageForward(model.eval(), image_size, half=half).eval()


def export_program(forward: SingleImageForward, device: str) -> torch.export.ExportedProgram:
    """torch.export's program of `forward` for one zero image of its size on `device`."""
    example = torch.zeros(*forward.image_size, 3, dtype=torch.uint8, device=device)
    with torch.no_grad():
        return torch.export.export(forward, (example,), strict=False)


def max_detections(program: torch.export.ExportedProgram) -> int:
    """The rows of the program's fixed-size outputs (the R-CNN test_cfg's max_per_img)."""
    output = next(node for node in program.graph.nodes if node.op == 'output')
    return int(output.args[0][0].meta['val'].shape[0])


def _checked_image_size(image_size) -> tuple:
    try:
        height, width = (int(v) for v in image_size)
        ok = [height, width] == list(image_size) and height > 0 and width > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f'image_size: expected (H, W), two positive integers, got {image_size!r}')
    return height, width
