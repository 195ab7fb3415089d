"""datasets/ is below evaluation/: the metric may read what the data side writes, never the
other way round. The patch grid (patches, padding, patch ids, mapping back) lives in
structures/patch_grid.py for the splitter, patch inference and the merge alike. The whole
package's layering: tests/test_package_layers.py."""
import ast
from pathlib import Path

import redet_plugin.datasets as datasets_pkg
import redet_plugin.evaluation as evaluation_pkg
import redet_plugin.inference as inference_pkg
from redet_plugin.structures import patch_grid
from tests.test_package_layers import imported_modules

DATASETS_DIR = Path(datasets_pkg.__file__).parent
PACKAGE_DIR = DATASETS_DIR.parent


def test_datasets_do_not_import_evaluation():
    offenders = {f'{path.name}: {name}' for path in sorted(DATASETS_DIR.glob('*.py'))
                 for name in imported_modules(path)
                 if name == 'redet_plugin.evaluation' or name.startswith('redet_plugin.evaluation.')}
    assert not offenders, f'datasets/ imports evaluation/: {offenders}'


def test_patch_ids_have_one_home():
    assert evaluation_pkg.patch_id is patch_grid.patch_id
    assert evaluation_pkg.parse_patch_id is patch_grid.parse_patch_id
    assert datasets_pkg.patch_id is patch_grid.patch_id
    assert datasets_pkg.parse_patch_id is patch_grid.parse_patch_id
    assert datasets_pkg.patch_windows is patch_grid.patch_windows
    assert datasets_pkg.pad_patch is patch_grid.pad_patch
    assert inference_pkg.plan_patches is patch_grid.plan_patches
    assert inference_pkg.Patch is patch_grid.Patch


def test_nothing_defines_the_patch_grid_again():
    """No module of the packages that cut, read or merge patches defines one of the grid's names."""
    grid_names = {name for name, value in vars(patch_grid).items()
                  if not name.startswith('_') and getattr(value, '__module__', None) == patch_grid.__name__}
    assert {'patch_windows', 'pad_patch', 'parse_patch_id', 'patch_to_image'} <= grid_names
    offenders = sorted(
        f'{path.relative_to(PACKAGE_DIR)}: {node.name}'
        for package in ('datasets', 'inference', 'evaluation')
        for path in sorted((PACKAGE_DIR / package).rglob('*.py'))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in grid_names)
    assert not offenders, f'patch grid names defined outside structures/patch_grid.py: {offenders}'
