"""datasets/ is below evaluation/: the metric may read what the data side writes, never the
other way round (the patch-id naming lives in datasets/patch_naming.py for both)."""
import ast
from pathlib import Path

import redet_plugin.datasets as datasets_pkg
import redet_plugin.evaluation as evaluation_pkg
from redet_plugin.datasets import patch_naming

DATASETS_DIR = Path(datasets_pkg.__file__).parent


def _imported_modules(path: Path):
    """Absolute names of the modules a file imports (relative imports resolved)."""
    package = 'redet_plugin.datasets'
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


def test_datasets_do_not_import_evaluation():
    offenders = {f'{path.name}: {name}' for path in sorted(DATASETS_DIR.glob('*.py'))
                 for name in _imported_modules(path)
                 if name == 'redet_plugin.evaluation' or name.startswith('redet_plugin.evaluation.')}
    assert not offenders, f'datasets/ imports evaluation/: {sorted(offenders)}'


def test_patch_ids_have_one_home():
    assert evaluation_pkg.patch_id is patch_naming.patch_id
    assert evaluation_pkg.parse_patch_id is patch_naming.parse_patch_id
    assert datasets_pkg.patch_id is patch_naming.patch_id
