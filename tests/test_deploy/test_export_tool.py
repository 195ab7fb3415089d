"""tools/export.py: a package that deploy loads, and one-line errors for bad arguments."""
import pytest

from redet_plugin.deploy import load

from .conftest import CLASSES, CONFIG


def test_export_tool_writes_a_package_of_the_asked_size(tiny_checkpoint, tmp_path, capsys):
    from tools.export import main
    out = str(tmp_path / 'tool.pt2')
    assert main([CONFIG, tiny_checkpoint, '--out', out, '--image-size', '64', '96',
                 '--cfg-options', 'model.test_cfg.rcnn.max_per_img=20']) == out
    detector = load(out)
    assert detector.input_size == (64, 96) and detector.classes == CLASSES
    assert detector.max_detections == 20 and detector.kind == 'program'
    assert f'float32 exported program for 64x96 images on cpu written to {out}' in capsys.readouterr().err


@pytest.mark.parametrize('args, message', [
    (['nope.py', '{ckpt}'], "^error: config file 'nope.py' does not exist$"),
    ([CONFIG, 'nope.pth'], "^error: checkpoint 'nope.pth' does not exist$"),
    ([CONFIG, '{ckpt}', '--image-size', '0', '64'],
     r'^error: --image-size: expected two positive integers H W, got \[0, 64\]$'),
    ([CONFIG, '{ckpt}', '--device', 'tpu'], "^error: --device: expected cpu or cuda, got 'tpu'$"),
    ([CONFIG, '{ckpt}', '--dtype', 'float16'],
     r"^error: dtype: 'float16' \(fp16 autocast\) runs on a GPU only: export it with "
     r"device='cuda' \(--device cuda\)$"),
])
def test_bad_arguments_fail_in_one_line(tiny_checkpoint, tmp_path, args, message):
    from tools.export import main
    args = [a.format(ckpt=tiny_checkpoint) for a in args]
    with pytest.raises(SystemExit, match=message):
        main([*args, '--out', str(tmp_path / 'x.pt2')])


def test_missing_out_folder_and_other_classes_fail_in_one_line(tiny_checkpoint, tmp_path):
    import torch
    from tools.export import main
    with pytest.raises(SystemExit, match=r"^error: --out: the folder '.*nowhere' does not exist$"):
        main([CONFIG, tiny_checkpoint, '--out', str(tmp_path / 'nowhere' / 'x.pt2')])
    other = str(tmp_path / 'other.pth')
    saved = torch.load(tiny_checkpoint, weights_only=False)
    saved['meta']['dataset_meta']['classes'] = CLASSES[::-1]
    torch.save(saved, other)
    with pytest.raises(SystemExit, match=r"^error: checkpoint '.*other\.pth' was trained on"):
        main([CONFIG, other, '--out', str(tmp_path / 'x.pt2')])


def test_export_detector_refuses_an_unknown_dtype(tiny_checkpoint, tmp_path):
    from redet_plugin.inference.export import export_detector
    with pytest.raises(ValueError,
                       match=r"^dtype: expected one of \('float32', 'float16'\), got 'bfloat16'$"):
        export_detector(CONFIG, tiny_checkpoint, str(tmp_path / 'x.pt2'), dtype='bfloat16')
