"""Importing mmrotate-dev 1.0.1 in the tests.

mmrotate imports torchvision in one detector module (h2rbox_v2: `torchvision.transforms`), and
torchvision cannot load beside the CPU torch of the CI machines. Only when the real import fails,
a stand-in with the one function mmrotate uses (and the version string mmengine's Runner
logs) takes its place; with a working torchvision (the
GPU machine) the real one is used.
"""

STAND_IN_CODE = '''
import sys, types
try:
    import torchvision.transforms  # noqa: F401
except Exception:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.vflip = lambda img: img.flip(-2)
    transforms = types.ModuleType("torchvision.transforms")
    transforms.functional = functional
    torchvision = types.ModuleType("torchvision")
    torchvision.transforms = transforms
    torchvision.__version__ = "0+redet-stand-in"  # mmengine's Runner reports it (collect_env)
    torchvision.__redet_stand_in__ = True
    sys.modules.update({"torchvision": torchvision, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})
'''


def ensure_torchvision_transforms() -> None:
    exec(STAND_IN_CODE, {"__name__": "redet_tests_stand_in"})


def register_mmrotate() -> None:
    """Registers mmrotate's modules; a stand-in is removed again afterwards (mmrotate keeps its
    reference), so that code asking for torchvision later sees it missing, as without mmrotate."""
    import sys
    ensure_torchvision_transforms()
    from mmrotate.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    if getattr(sys.modules.get("torchvision"), "__redet_stand_in__", False):
        for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
            del sys.modules[name]


