"""Every file or folder of the repository that README.md and docs/ name exists: a module that
moves takes its mentions along. Checked: paths that start at one of the repository's top-level
folders (`redet_plugin/...`, `tools/...`, ...) wherever they stand, and the targets of relative
Markdown links."""
import glob
import os.path as osp
import re

import pytest

from tests._helpers import REPO

DOCS = ['README.md'] + sorted(osp.relpath(p, REPO)
                               for p in glob.glob(osp.join(REPO, 'docs', '*.md')))
TOP_FOLDERS = ('benchmarks', 'configs', 'csrc', 'docs', 'redet_plugin', 'scripts', 'tests', 'tools')
# (placeholders such as <name> or * are taken in, so that such a path is left out below)
REPO_PATH = re.compile(r'(?<![\w./:-])((?:%s)/[\w./<>*{}-]*)' % '|'.join(TOP_FOLDERS))
LINK = re.compile(r'\]\(([^)\s]+)\)')
# paths that name another project's file, not ours
OTHER_PROJECTS = {'configs/redet/README.md'}  # mmrotate's model zoo page (docs/data.md)


def named_paths(doc, root=REPO):
    """[(line, path)]: repository paths the page `doc` (relative to `root`) names, relative to
    the repository root."""
    with open(osp.join(root, doc), encoding='utf-8') as f:
        lines = f.read().splitlines()
    found = []
    for number, line in enumerate(lines, 1):
        # a file that a command writes (`--out FILE`) need not exist yet
        line = re.sub(r'--out[ =]\S+', '', line)
        for match in REPO_PATH.finditer(line):
            found.append((number, match.group(1).rstrip('.')))
        for target in LINK.findall(line):
            if re.match(r'[a-z]+:|#', target):  # a web address or an anchor of the same page
                continue
            path = osp.normpath(osp.join(osp.dirname(doc), target.split('#')[0]))
            found.append((number, path))
    return [(n, p) for n, p in found if p not in OTHER_PROJECTS and not re.search(r'[<>*{}]', p)]


@pytest.mark.parametrize('doc', DOCS)
def test_every_path_a_page_names_exists(doc):
    missing = [f'{doc}:{n}: {p}' for n, p in named_paths(doc) if not osp.exists(osp.join(REPO, p))]
    assert not missing, 'paths that do not exist:\n' + '\n'.join(missing)


def test_the_check_sees_paths_in_prose_code_and_links(tmp_path):
    page = tmp_path / 'docs' / 'page.md'
    page.parent.mkdir()
    page.write_text('Run `python tools/train.py X`, see redet_plugin/ops/ and [ops](ops.md);\n'
                    'then `x --out benchmarks/results/new.json` and [web](https://a.b/c).\n'
                    'Placeholders: `tools/dist_*.sh`, `benchmarks/<name>`.\n')
    assert named_paths('docs/page.md', str(tmp_path)) == [
        (1, 'tools/train.py'), (1, 'redet_plugin/ops/'), (1, 'docs/ops.md')]
