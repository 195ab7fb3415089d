"""A tool imports the OpenMMLab stack without Hugging Face transformers unless its config needs it.

mmengine (to register transformers' Adafactor) and mmdet (its GLIP and Grounding DINO text
transforms, BERT language model and vision-language head) import transformers at their own import
whenever it is installed. That is seconds of every tool's start-up, most of the stack's import time
on the GPU machine, for parts no rotated-detection config uses. The tools hide it while they import
the stack; afterwards transformers imports as usual (a config's custom_imports may use it).
Only torch-free modules are imported here: this runs before the stack.
"""
import contextlib
import importlib.abc
import os.path as osp
import sys

# The types of mmengine 0.10 and mmdet 3.3 that are built on transformers. A config or
# --cfg-options naming one of them gets the stack with transformers.
TRANSFORMERS_TYPES = ('Adafactor', 'BertModel', 'LoadTextAnnotations', 'RandomSamplingNegPos',
                      'ATSSVLFusionHead')


class _HideTransformers(importlib.abc.MetaPathFinder):

    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] == 'transformers':
            raise ModuleNotFoundError(f'No module named {name!r} (hidden while the tool imports '
                                      'the OpenMMLab stack)', name=name)
        return None


def needs_transformers(argv) -> bool:
    """Whether the command line, or a config file it names, mentions a type built on transformers.
    A config that cannot be read counts as needing it: the tool then reports the problem itself."""
    from mmengine.config import Config  # mmengine.config imports neither torch nor transformers
    texts = list(argv)
    for arg in argv:
        if arg.endswith('.py') and osp.isfile(arg):
            try:
                texts.append(repr(Config.fromfile(arg, import_custom_modules=False).to_dict()))
            except Exception:
                return True
    return any(name in text for text in texts for name in TRANSFORMERS_TYPES)


@contextlib.contextmanager
def transformers_hidden(argv):
    """Within this block transformers cannot be imported, unless `argv` (a tool's command line;
    None when the tool is imported as a module rather than run) needs it, or the stack is
    imported already."""
    hide = (argv is not None and 'transformers' not in sys.modules
            and 'mmengine.optim' not in sys.modules and 'mmdet' not in sys.modules
            and not needs_transformers(argv))
    finder = _HideTransformers()
    if hide:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if hide:
            sys.meta_path.remove(finder)
