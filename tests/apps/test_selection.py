"""The downstream classifier's training length is chosen on a validation split, and the test set is read once, at
the end (issue 44): a guarded test set raises on any read of its values before the final score, in the library
call (`cnn_accuracy`, `select_cnn`) and in the main job's evaluation stage; the selected checkpoint is the best epoch
on the validation split, and the network of that epoch."""
import pytest
import torch

import fastdpot.experiments.classifiers as C
import fastdpot.experiments.metrics as M
from fastdpot.experiments.data import ImageData
from fastdpot.experiments.mainjob import MainJobConfig
from fastdpot.experiments.mainjob.evaluation import SELECTION_SIZE, evaluate, selection_split

_OPEN = {"on": False}
#: metadata a shape / dtype check may look at: no pixel or label value
_METADATA = {torch.Tensor.shape.__get__, torch.Tensor.dim, torch.Tensor.size, torch.Tensor.dtype.__get__,
             torch.Tensor.device.__get__, torch.Tensor.numel, torch.Tensor.is_floating_point}


class Guarded(torch.Tensor):
    """The test set: reading any value before the classifier is chosen raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if not _OPEN["on"] and func not in _METADATA:
            raise AssertionError(f"test set read before the final score: {getattr(func, '__name__', func)}")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _open_after(fn):
    """``fn`` (the selection) runs with the test set closed; once it has returned the final score may read it."""
    def wrapped(*a, **kw):
        out = fn(*a, **kw)
        _OPEN["on"] = True
        return out
    return wrapped


@pytest.fixture(autouse=True)
def _closed():
    _OPEN["on"] = False
    yield
    _OPEN["on"] = False


def _blobs(n, seed, side=8):
    """Two classes: a bright left or right half, with noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.rand(n, 1, side, side, generator=g) * 0.3
    x[y == 0, :, :, :side // 2] += 0.6
    x[y == 1, :, :, side // 2:] += 0.6
    return x.clamp(0, 1), y


def test_the_selection_reads_the_validation_split_only_and_the_test_set_once(monkeypatch):
    xtr, ytr = _blobs(200, 0)
    xval, yval = _blobs(60, 1)
    xte, yte = _blobs(100, 2)
    test_x, test_y = xte.as_subclass(Guarded), yte.as_subclass(Guarded)
    with pytest.raises(AssertionError, match="before the final score"):
        test_x.sum()
    predicted = []
    real_predict = C.cnn_predict

    def spy(net, images, **kw):
        predicted.append("test" if images is test_x else "validation" if images is xval else "other")
        return real_predict(net, images, **kw)

    monkeypatch.setattr(C, "cnn_predict", spy)
    monkeypatch.setattr(C, "select_cnn", _open_after(C.select_cnn))
    acc, sel = C.cnn_accuracy(xtr, ytr, test_x, test_y, epochs=3, validation=(xval, yval), return_selection=True)
    assert predicted == ["validation"] * 3 + ["test"]  # one validation score per epoch, then the test set once
    assert acc >= 0.95 and len(sel.validation_accuracy) == 3 and sel.validation_samples == 60
    assert sel.epoch == 1 + max(range(3), key=lambda i: (sel.validation_accuracy[i], -i))
    # without a validation split: a fixed schedule, and still no read of the test set before it is trained
    _OPEN["on"] = False
    monkeypatch.setattr(C, "train_cnn", _open_after(C.train_cnn))
    assert C.cnn_accuracy(xtr, ytr, test_x, test_y, epochs=1) >= 0.5
    with pytest.raises(ValueError, match="validation must be an"):
        C.cnn_accuracy(xtr, ytr, xte, yte, validation=xval)
    with pytest.raises(ValueError, match="validation_images must have the same"):
        C.cnn_accuracy(xtr, ytr, xte, yte, validation=(xval[:, :, :4], yval))
    with pytest.raises(ValueError, match="validation_labels"):
        C.select_cnn(xtr, ytr, xval, yval[:5], 2)


def test_the_selected_checkpoint_is_the_best_epoch_and_that_epochs_network():
    xtr, ytr = _blobs(200, 0)
    xval, yval = _blobs(60, 1)
    # a validation split labelled against the task: the longer the network learns, the worse it scores there, so
    # the first epoch is the best one (a rule that kept the last epoch would fail here); a slow lr for a gradual curve
    net, sel = C.select_cnn(xtr, ytr, xval, 1 - yval, 2, epochs=4, batch_size=50, lr=1e-4)
    assert sel.epoch == 1 and sel.validation_accuracy[0] > sel.validation_accuracy[-1]
    assert not net.training
    first = C.train_cnn(xtr, ytr, 2, epochs=1, batch_size=50, lr=1e-4)
    last = C.train_cnn(xtr, ytr, 2, epochs=4, batch_size=50, lr=1e-4)
    for p, q, r in zip(net.parameters(), first.parameters(), last.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)  # the same draws: scoring consumes none
    assert any(not torch.allclose(p, r, atol=1e-3) for p, r in zip(net.parameters(), last.parameters()))
    # the usual case: the right labels, the best of the curve, the earliest on a tie
    _, sel = C.select_cnn(xtr, ytr, xval, yval, 2, epochs=3, batch_size=50)
    best = max(sel.validation_accuracy)
    assert sel.epoch == 1 + sel.validation_accuracy.index(best) and best >= 0.95


def test_resnet20_shape_and_it_learns():
    net = C._cnn("resnet20", 1, 28, 28, 10)
    n_params = sum(p.numel() for p in net.parameters())
    assert 0.26e6 < n_params < 0.28e6  # He et al.'s ResNet-20: 0.27 M
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) == 19  # + the linear layer: 20 weighted layers
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert C._cnn("resnet20", 3, 64, 64, 4)(torch.zeros(2, 3, 64, 64)).shape == (2, 4)
    # small batches: batch norm's running statistics (used in eval mode) need a few dozen steps to settle
    xtr, ytr = _blobs(96, 0)
    xval, yval = _blobs(40, 1)
    xte, yte = _blobs(100, 2)
    assert C.cnn_accuracy(xtr, ytr, xte, yte, epochs=2, batch_size=8, arch="resnet20", validation=(xval, yval)) >= 0.9
    assert MainJobConfig().with_settings(cnn_arch="resnet20").resolved().evaluation.cnn_arch == "resnet20"
    assert M.CNN_ARCHS == C.CNN_ARCHS and "resnet20" in M.CNN_ARCHS


def _data(n_val=60, n_test=80):
    """Private-only evaluation data: a validation split and a guarded test set (uint8 images, as loaded)."""
    xval, yval = _blobs(n_val, 1)
    xte, yte = _blobs(n_test, 2)
    u8 = lambda x: (x * 255).round().to(torch.uint8)  # noqa: E731
    test = ImageData(u8(xte), yte, "blobs")
    guarded = ImageData(u8(xte).as_subclass(Guarded), yte.as_subclass(Guarded), "blobs")
    return dict(validation=ImageData(u8(xval), yval, "blobs"), test=guarded, private=None, public=None,
                dataset="blobs"), test


def test_the_evaluation_stage_selects_on_the_validation_split_before_reading_the_test_set(monkeypatch):
    xtr, ytr = _blobs(200, 0)
    data, test = _data()
    monkeypatch.setattr(M, "select_cnn", _open_after(M.select_cnn))
    cfg = MainJobConfig().with_settings(public_size=0, classifiers="cnn", cnn_epochs=3, fid_samples=0).resolved()
    out = evaluate(cfg, xtr, ytr, data, progress=False)
    assert out["accuracy_cnn"] >= 0.95 and 1 <= out["cnn_selected_epoch"] <= 3
    assert len(out["cnn_validation_accuracy"]) == 3 and "the validation split (60 images)" in out["cnn_selection"]
    assert 0.0 <= out["label_fidelity"] <= 1.0  # the judge reads the test set only after the selection
    # the score is the selected checkpoint's on the whole test set
    net, _ = C.select_cnn(xtr, ytr, data["validation"].images.float() / 255, data["validation"].labels, 2, epochs=3)
    assert out["accuracy_cnn"] == pytest.approx(C.accuracy_on(net, test.images.float() / 255, test.labels),
                                                abs=1e-12)


def test_the_selection_split_of_each_protocol():
    data, test = _data()
    private_only = MainJobConfig().with_settings(public_size=0).resolved()
    sel, what = selection_split(private_only, data)
    assert sel is data["validation"] and what == "the validation split (60 images)"
    with pytest.raises(ValueError, match="must not be the test set"):
        selection_split(private_only, dict(data, validation=data["test"]))
    # public-half: a fixed-seed part of the public images (at most SELECTION_SIZE), never the test set
    pub = ImageData(torch.arange(50, dtype=torch.uint8).view(50, 1, 1, 1).expand(50, 1, 4, 4).contiguous(),
                    torch.arange(50) % 3, "pub")
    half = MainJobConfig().resolved()
    sel, what = selection_split(half, dict(public=pub, test=test))
    assert len(sel) == min(SELECTION_SIZE, 50) and what == "the public part (50 images)"
    again, _ = selection_split(half, dict(public=pub, test=test))
    assert torch.equal(sel.images, again.images)
