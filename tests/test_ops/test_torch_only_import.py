"""The ops layer (and its test inputs, redet_plugin.testing) imports with torch alone; the mm layer
is loaded only when asked for."""
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MM_AND_FRIENDS = ("mmcv", "mmdet", "mmengine", "mmrotate", "e2cnn", "cv2", "shapely")


def _run(script: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_ops_import_loads_no_mm_module_and_changes_no_torch_setting():
    out = _run(f"""
        import sys, torch
        safe_before = list(torch.serialization.get_safe_globals())
        import redet_plugin.ops, redet_plugin._ext, redet_plugin.testing
        from redet_plugin.ops import roi_pool
        out = roi_pool(torch.rand(1, 2, 8, 8), torch.tensor([[0, 0., 0., 4., 4.]]), 2)
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in {MM_AND_FRIENDS!r})
        print('loaded', loaded)
        print('safe globals unchanged', list(torch.serialization.get_safe_globals()) == safe_before)
        print('mm layer loaded', 'redet_plugin.mm' in sys.modules)
    """)
    assert "loaded []" in out
    assert "safe globals unchanged True" in out
    assert "mm layer loaded False" in out


def test_package_import_from_an_mm_program_loads_the_mm_layer():
    # custom_imports=dict(imports=['redet_plugin']) runs after mmengine is loaded
    out = _run("""
        import mmengine
        import redet_plugin
        from mmdet.registry import MODELS
        print('registered', MODELS.get('RedetRoIPool') is not None)
    """)
    assert "registered True" in out
