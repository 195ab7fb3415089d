"""tools/infer.py end to end with the real tiny ReDet (randomly initialised, saved as a
checkpoint): outputs, formats, the API's result, failures that let the other inputs run."""
import os.path as osp

import cv2
import numpy as np
import pytest
import torch

CONFIG = 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py'
CLASSES = ('plane', 'ship', 'storage-tank', 'small-vehicle', 'tennis-court')
PATCHES = ['--patch-size', '128', '--patch-overlap', '32', '--device', 'cpu']


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    import redet_plugin.mm  # noqa: F401
    init_default_scope('mmdet')
    model = MODELS.build(Config.fromfile(CONFIG).model)
    torch.manual_seed(0)
    model.init_weights()
    folder = tmp_path_factory.mktemp('ckpt')
    path = str(folder / 'tiny.pth')
    torch.save(dict(state_dict=model.state_dict(), meta=dict(dataset_meta=dict(classes=CLASSES))), path)
    other = str(folder / 'other_classes.pth')
    torch.save(dict(state_dict=model.state_dict(), meta=dict(dataset_meta=dict(classes=CLASSES[::-1]))), other)
    return path, other


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp('images')
    rng = np.random.default_rng(0)
    colour = cv2.GaussianBlur(rng.integers(0, 256, (160, 200, 3)).astype(np.uint8), (0, 0), 2)
    cv2.imwrite(str(folder / 'colour.png'), colour)
    cv2.imwrite(str(folder / 'gray16.png'), colour[:, :, 1].astype(np.uint16) * 200)
    (folder / 'broken.png').write_bytes(b'not an image')
    return folder, colour


def read_preds(path):
    rows = [line.split() for line in open(path).read().splitlines()]
    for row in rows:
        assert len(row) == 10 and row[8] in CLASSES and 0.05 <= float(row[9]) <= 1
    return rows


def test_infer_writes_predictions_pictures_and_matches_the_api(tmp_path, checkpoint, images, capsys):
    from tools.infer import main
    from redet_plugin.inference import RotatedDetector
    folder, colour = images
    out = tmp_path / 'out'
    failures = main([str(folder / 'colour.png'), str(folder / 'gray16.png'), str(folder / 'broken.png'),
                     str(folder / 'missing.png'), CONFIG, checkpoint[0], '--out-dir', str(out),
                     '--batch-size', '3', '--vis-max-size', '100', *PATCHES])
    # the unreadable and the missing image failed, one line each, listed at the end; the others ran
    assert len(failures) == 2 and 'broken.png' in failures[0] and 'missing.png' in failures[1]
    err = capsys.readouterr().err
    assert '2 failed:' in err and err.count("error: image '") == 2
    rows = read_preds(out / 'preds' / 'colour.txt')
    read_preds(out / 'preds' / 'gray16.txt')
    assert sorted(p.name for p in (out / 'vis').iterdir()) == ['colour.jpg', 'gray16.jpg']
    assert cv2.imread(str(out / 'vis' / 'colour.jpg')).shape == (80, 100, 3)  # longer side 100
    # the API with the same settings: the same detections (a random model finds plenty)
    detector = RotatedDetector(CONFIG, checkpoint[0], device='cpu', patch_size=128, patch_overlap=32)
    result = detector.predict(str(folder / 'colour.png'))
    assert len(rows) == len(result) > 0
    expected = result.polygons()
    np.testing.assert_allclose(np.array([[float(v) for v in r[:8]] for r in rows]), expected, atol=0.006)
    assert [r[8] for r in rows] == result.class_names()
    # batches of patches do not change the result (every patch is padded to the patch size)
    one_by_one = RotatedDetector(CONFIG, checkpoint[0], device='cpu', patch_size=128, patch_overlap=32,
                                 batch_size=1).predict(colour)
    np.testing.assert_allclose(one_by_one.boxes, result.boxes, atol=1e-3)
    np.testing.assert_allclose(one_by_one.scores, result.scores, atol=1e-5)


def test_dota_submission(tmp_path, checkpoint, images):
    from tools.infer import main
    folder, _ = images
    out = tmp_path / 'sub'
    assert main([str(folder / 'colour.png'), CONFIG, checkpoint[0], '--out-dir', str(out),
                 '--dota-submission', '--no-vis', '--batch-size', '6', *PATCHES]) == []
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f'Task1_{c}.txt' for c in CLASSES)
    lines = [line.split() for f in files for line in open(out / f).read().splitlines()]
    assert lines and all(len(line) == 10 and line[0] == 'colour' for line in lines)


def test_checkpoint_of_other_classes_is_one_line(tmp_path, checkpoint, images):
    from tools.infer import main
    folder, _ = images
    with pytest.raises(SystemExit, match=r"^error: checkpoint '.*other_classes\.pth' was trained on 5 classes "
                       r"\['tennis-court', .*the config has 5: \['plane'"):
        main([str(folder / 'colour.png'), CONFIG, checkpoint[1], '--out-dir', str(tmp_path), *PATCHES])
    with pytest.raises(SystemExit, match=r"^error: checkpoint '.*nope\.pth' does not exist$"):
        main([str(folder / 'colour.png'), CONFIG, str(tmp_path / 'nope.pth'), '--out-dir', str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^error: patch_overlap must be an integer in \[0, patch_size=128\)"):
        main([str(folder / 'colour.png'), CONFIG, checkpoint[0], '--out-dir', str(tmp_path), '--patch-size', '128',
              '--patch-overlap', '200', '--device', 'cpu'])


def test_the_apis_patches_are_the_models_test_step(checkpoint, images):
    """predict_patches (run one batch behind, read when first used) gives the detections of the
    model's own test step on the same patches."""
    from mmdet.structures import DetDataSample
    from redet_plugin.inference import RotatedDetector
    _, colour = images
    detector = RotatedDetector(CONFIG, checkpoint[0], device='cpu', patch_size=128, patch_overlap=32)
    patches = [np.ascontiguousarray(colour[:128, :128]), np.ascontiguousarray(colour[-128:, -128:])]
    found = detector.predict_patches(patches)
    with torch.no_grad():
        outputs = detector.model.test_step(dict(
            inputs=[torch.from_numpy(p.transpose(2, 0, 1).copy()) for p in patches],
            data_samples=[DetDataSample(metainfo=dict(img_shape=(128, 128), ori_shape=(128, 128),
                                                      scale_factor=(1.0, 1.0))) for _ in patches]))
    assert len(found) == 2 and sum(len(f.scores) for f in found) > 0
    for ours, output in zip(found, outputs):
        pred = output.pred_instances
        np.testing.assert_array_equal(ours.boxes, pred.bboxes.numpy().reshape(-1, 5))
        np.testing.assert_array_equal(ours.scores, pred.scores.numpy())
        np.testing.assert_array_equal(ours.labels, pred.labels.numpy())


def test_amp_needs_a_gpu_and_a_config(tmp_path, checkpoint, images, monkeypatch):
    from tools.infer import main
    from redet_plugin.inference import RotatedDetector
    folder, _ = images
    args = [str(folder / 'colour.png'), CONFIG, checkpoint[0], '--out-dir', str(tmp_path),
            '--amp']
    with pytest.raises(SystemExit, match=r'^error: --amp needs a GPU .*--device is cpu$'):
        main(args + ['--device', 'cpu'])
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(SystemExit, match=r'^error: --amp needs a GPU .*none is available$'):
        main(args)
    with pytest.raises(SystemExit) as stopped:  # (a package runs in the dtype it was exported in)
        main([str(folder / 'colour.png'), '--model', 'model.pt2', '--out-dir', str(tmp_path),
              '--amp'])
    assert stopped.value.code == 2
    with pytest.raises(ValueError, match=r'^amp=True \(fp16 autocast\) needs a CUDA device; got cpu$'):
        RotatedDetector(CONFIG, checkpoint[0], device='cpu', amp=True)


@pytest.mark.cuda
def test_amp_runs_the_model_in_fp16(checkpoint, images):
    from redet_plugin.inference import RotatedDetector
    _, colour = images
    found, dtypes = {}, []
    for amp in (False, True):
        detector = RotatedDetector(CONFIG, checkpoint[0], device='cuda', patch_size=128,
                                   patch_overlap=32, score_thr=0.0, amp=amp)
        hook = detector.model.neck.register_forward_hook(
            lambda module, args, outputs: dtypes.append(outputs[0].dtype))
        found[amp] = detector.predict(colour)
        hook.remove()
    assert torch.float32 in dtypes and torch.float16 in dtypes
    assert dtypes[-1] == torch.float16 and dtypes[0] == torch.float32
    # an untrained model: fp16 moves its near-equal scores, so only the outputs' form is held
    for result in found.values():
        assert len(result) > 0 and np.isfinite(result.boxes).all()
        assert ((result.scores >= 0) & (result.scores <= 1)).all()
