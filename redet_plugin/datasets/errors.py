"""The errors and the warning of the data sets (one module, so that every data set module and
redet_plugin/datasets/bad_images.py can import them)."""


class DOTADataError(ValueError):
    """The data set cannot be used as configured (no images, no object of the classes, ...); the
    message names the folder or file. tools/train.py and tools/test.py print it as one line."""


class DOTAAnnotationError(DOTADataError):
    """A DOTA annotation file (or its image) is malformed; the message names file and line."""


class DOTAAnnotationWarning(UserWarning):
    """Annotations were skipped: a malformed line or missing image (on_bad_line='warn'), or
    objects whose class is not in metainfo.classes."""


class BadImageError(DOTADataError):
    """An image cannot be read (missing, empty, cut short, not an image); the message names the
    file and the reason."""
