"""record_layout_mixes names the ops that read or write feature maps of more than one layout, in
the forward and in the backward, and nothing in a step kept in one layout."""
import torch
import torch.nn.functional as F

from redet_plugin.testing import record_layout_mixes

CHANNELS_LAST = torch.channels_last


def test_an_add_of_a_channels_last_and_an_nchw_map_is_named_with_its_site():
    a = torch.randn(2, 4, 8, 8).contiguous(memory_format=CHANNELS_LAST)
    b = torch.randn(2, 4, 8, 8)
    mixes = record_layout_mixes(lambda: a + b, batch_size=2)
    assert [(m['op'], m['layouts'], m['count']) for m in mixes] == [
        ('aten.add.Tensor', ['channels_last', 'nchw'], 1)]


def test_a_backward_that_meets_an_nchw_gradient_is_named():
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=CHANNELS_LAST).requires_grad_()
    weight = torch.randn(4, 4, 3, 3)

    def step():
        y = F.conv2d(x, weight, padding=1)
        # a gradient of y in NCHW, as a RoI op's backward might give
        y.backward(torch.ones(2, 4, 8, 8))
    mixes = record_layout_mixes(step, batch_size=2)
    assert any('convolution_backward' in m['op'] for m in mixes)


def test_a_step_kept_channels_last_mixes_nothing():
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=CHANNELS_LAST).requires_grad_()
    weights = [torch.randn(4, 4, 3, 3, requires_grad=True) for _ in range(2)]

    def step():
        y = F.relu(F.conv2d(x, weights[0], padding=1))
        z = F.conv2d(y, weights[1], padding=1) + y
        # (a mean's gradient would be NCHW: torch materialises the broadcast value contiguous)
        ((z * z).sum() + y.sum()).backward()
    # (the NCHW weights are not maps: their first dimension is not the batch size)
    assert record_layout_mixes(step, batch_size=2) == []


def test_frames_are_named_by_the_packages_own_folders(tmp_path):
    """A checkout whose folder carries a library's name (a clone into `redet_plugin/`) holds no
    library frame: only files inside an imported package's own folder are named after it."""
    import os.path as osp
    import traceback

    import redet_plugin
    from redet_plugin.testing import _call_site, _library_path
    package_file = osp.join(osp.dirname(redet_plugin.__file__), 'ops', 'roi_pool.py')
    assert _library_path(package_file) == 'redet_plugin/ops/roi_pool.py'
    look_alike = tmp_path / 'redet_plugin' / 'tests' / 'test_x.py'
    assert _library_path(str(look_alike)) is None
    stack = [traceback.FrameSummary(str(look_alike), 3, 'test_x'),
             traceback.FrameSummary(package_file, 40, 'roi_pool')]
    assert _call_site(stack) == ('redet_plugin/ops/roi_pool.py:40 roi_pool',
                                 ['redet_plugin/ops/roi_pool.py:40 roi_pool'])
