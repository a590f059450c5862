"""The downstream classifiers of the "train on synthetic, test on real" evaluation: small torch networks trained on
generated labelled images, their training length selected on a validation split, scored once on real test images.

* :func:`cnn_accuracy` — train, select and score in one call (the main job's ``accuracy_cnn``);
* :func:`select_cnn` — train for ``epochs`` passes, score the network on a validation split after every pass and
  keep the checkpoint of the best validation accuracy (:class:`CNNSelection` records the curve). It never sees a
  test set: the caller scores the returned network once, at the end;
* :func:`accuracy_on` — the one read of the test set, by the chosen network;
* :func:`train_cnn` — a fixed number of passes, no selection (the label-fidelity judge); :func:`cnn_predict`.

Networks (``arch``, :data:`CNN_ARCHS`): ``"small"`` (2 convolutions, the default), ``"dropout"`` (the shape of
DPImageBench's MNIST classifier) and ``"resnet20"`` (He et al.'s CIFAR ResNet-20, the stronger option).
:mod:`fastdpot.experiments.metrics` re-exports these names.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .._validate import check_choice, check_int, check_tensor

__all__ = ["CNN_ARCHS", "CNNSelection", "cnn_accuracy", "select_cnn", "train_cnn", "cnn_predict", "accuracy_on"]

CNN_ARCHS = ("small", "dropout", "resnet20")
nn = torch.nn


def _shift_flip(x: torch.Tensor, g: torch.Generator, max_shift: int = 2, fill: float = -1.0) -> torch.Tensor:
    """Each image of ``x`` (b, C, H, W) shifted by its own integer offset in [-max_shift, max_shift]² (uncovered
    pixels set to ``fill``: black in the CNN's [-1, 1] scale) and mirrored left-right with probability 1/2; offsets
    and flips drawn from ``g``."""
    b, _, H, W = x.shape
    xp = torch.nn.functional.pad(x, (max_shift,) * 4, value=fill)
    oy = torch.randint(0, 2 * max_shift + 1, (b,), generator=g)
    ox = torch.randint(0, 2 * max_shift + 1, (b,), generator=g)
    rows = (oy[:, None] + torch.arange(H))[:, :, None]                     # (b, H, 1)
    cols = (ox[:, None] + torch.arange(W))[:, None, :]                     # (b, 1, W)
    out = xp.permute(0, 2, 3, 1)[torch.arange(b)[:, None, None], rows, cols].permute(0, 3, 1, 2)
    flip = torch.rand(b, generator=g) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(-1), out)


class _BasicBlock(nn.Module):
    """Two 3×3 convolutions with batch norm and an identity shortcut (a 1×1 projection where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def _resnet20(ch: int, C: int, width: int = 16, blocks: int = 3) -> nn.Module:
    """ResNet-20 (6n + 2 layers, n = 3): a 3×3 convolution, three stages of n basic blocks of widths w, 2w, 4w (the
    last two stages start with stride 2), global average pooling, a linear layer. He, Zhang, Ren & Sun, "Deep
    residual learning for image recognition", CVPR 2016, Sec. 4.2 (its CIFAR-10 network), with projection shortcuts
    (their option B) where the shape changes; 0.27 M parameters at w = 16."""
    layers = [nn.Conv2d(ch, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage, mult in enumerate((1, 2, 4)):
        for b in range(blocks):
            layers.append(_BasicBlock(cin, width * mult, 2 if stage > 0 and b == 0 else 1))
            cin = width * mult
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, C))


def _cnn(arch: str, ch: int, H: int, W: int, C: int) -> nn.Module:
    """The evaluation network named by ``arch`` (see :func:`cnn_accuracy`) for (ch, H, W) images and C classes."""
    if arch == "small":
        return nn.Sequential(
            nn.Conv2d(ch, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (H // 4) * (W // 4), 128), nn.ReLU(), nn.Linear(128, C))
    if arch == "resnet20":
        return _resnet20(ch, C)
    side_h, side_w = ((H - 2) // 2 - 2) // 2 - 2, ((W - 2) // 2 - 2) // 2 - 2
    return nn.Sequential(
        nn.Conv2d(ch, 32, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Dropout(0.5),
        nn.Conv2d(32, 64, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Dropout(0.5),
        nn.Conv2d(64, 128, 3), nn.ReLU(),
        nn.Flatten(), nn.Linear(128 * side_h * side_w, 128), nn.ReLU(), nn.Linear(128, C))


@dataclass(frozen=True)
class CNNSelection:
    """How :func:`select_cnn` chose its checkpoint.

    Attributes:
        epoch: the selected epoch (1-based): the first of the best validation accuracy.
        validation_accuracy: the validation accuracy after each epoch (length ``epochs``), in [0, 1].
        validation_samples: the validation split's size.
    """
    epoch: int
    validation_accuracy: Tuple[float, ...]
    validation_samples: int


def _check_set(x, y, name: str, like, read: bool = True):
    """Validate the ``name`` set (images ``x``, labels ``y``) against the training images ``like``; returns the labels
    as int64, or None with ``read=False``: then only metadata (type, shape, dtype) is checked and no value is read
    (the test set before the final score)."""
    check_tensor(x, f"{name}_images", 4, finite=read)
    if like is not None and x.shape[1:] != like.shape[1:]:
        raise ValueError(f"train_images and {name}_images must have the same (C, H, W), got "
                         f"{tuple(like.shape[1:])} and {tuple(x.shape[1:])}")
    if tuple(y.shape if hasattr(y, "shape") else (len(y),)) != tuple(x.shape[:1]):
        raise ValueError(f"{name}_labels must have one label per image")
    return torch.as_tensor(y).long() if read else None


def _check_training(train_images, train_labels, arch: str, schedule: str) -> torch.Tensor:
    ytr = _check_set(train_images, train_labels, "train", None)
    check_choice(arch, "arch", CNN_ARCHS)
    check_choice(schedule, "schedule", ("constant", "cosine"))
    if arch == "dropout" and min(train_images.shape[-2:]) < 18:
        raise ValueError(f"arch='dropout' needs images of at least 18 x 18 pixels, got "
                         f"{tuple(train_images.shape[-2:])}")
    if ytr.unique().numel() < 2:
        raise ValueError(f"train_labels must contain at least 2 classes, got {ytr.unique().tolist()}")
    return ytr


def _epochs(train_images, ytr, num_classes, epochs, batch_size, lr, seed, augment, arch, schedule):
    """Train the network; yield it (in train mode) after every epoch. Seeded by ``seed`` (initialisation, batch order,
    augmentation draws); the global RNG is restored when the generator is closed or exhausted."""
    ch, H, W = train_images.shape[1:]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = _cnn(arch, ch, H, W, num_classes)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        xtr = train_images.detach().float().cpu() * 2.0 - 1.0
        g = torch.Generator().manual_seed(seed)
        per_epoch = -(-xtr.shape[0] // batch_size)
        total, t = epochs * per_epoch, 0
        for _ in range(epochs):
            net.train()
            perm = torch.randperm(xtr.shape[0], generator=g)
            for s in range(0, xtr.shape[0], batch_size):
                i = perm[s:s + batch_size]
                xb = _shift_flip(xtr[i], g) if augment else xtr[i]
                if schedule == "cosine":  # per-batch cosine decay from lr to 0 over all steps
                    for group in opt.param_groups:
                        group["lr"] = 0.5 * lr * (1.0 + math.cos(math.pi * t / total))
                t += 1
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(net(xb), ytr[i]).backward()
                opt.step()
            yield net


def train_cnn(train_images, train_labels, num_classes: int, epochs: int = 5, batch_size: int = 128, lr: float = 1e-3,
              seed: int = 0, augment: bool = False, arch: str = "small", schedule: str = "constant"):
    """The network of :func:`cnn_accuracy` trained for exactly ``epochs`` passes (no selection), in eval mode.

    Shape: train_images (n, C, H, W) in [0, 1], train_labels (n,) int in [0, num_classes)."""
    net = None
    for net in _epochs(train_images, torch.as_tensor(train_labels).long(), num_classes, epochs, batch_size, lr, seed,
                       augment, arch, schedule):
        pass
    net.eval()
    return net


def select_cnn(train_images, train_labels, validation_images, validation_labels, num_classes: int, epochs: int = 10,
               batch_size: int = 128, lr: float = 1e-3, seed: int = 0, augment: bool = False, arch: str = "small",
               schedule: str = "constant") -> Tuple[nn.Module, CNNSelection]:
    """Train the network of :func:`cnn_accuracy` for ``epochs`` passes and return the checkpoint of the best
    validation accuracy (checkpoint selection, as DPImageBench selects its classifiers; the first epoch wins a tie).

    The validation images are read after every epoch; no test set is passed or read. With the constant schedule the
    checkpoint of epoch e is the network :func:`train_cnn` returns for ``epochs=e`` (the same draws: scoring draws
    nothing); with ``schedule="cosine"`` the learning rate decays over all ``epochs``.

    Shape:
        train_images (n, C, H, W), validation_images (m, C, H, W) in [0, 1]; labels (n,), (m,) int in
        [0, num_classes).

    Returns:
        (network in eval mode, :class:`CNNSelection`).

    Raises:
        ValueError: as :func:`cnn_accuracy`, naming ``validation_images`` / ``validation_labels``.

    References:
        Gong et al., "DPImageBench: A Unified Benchmark for Differentially Private Image Synthesis", CCS 2025 (the
        classifier selected on a validation split, the test set read once).
    """
    ytr = _check_training(train_images, train_labels, arch, schedule)
    yval = _check_set(validation_images, validation_labels, "validation", train_images)
    epochs, batch_size = check_int(epochs, "epochs"), check_int(batch_size, "batch_size")
    num_classes = check_int(num_classes, "num_classes", 2)
    curve, best, state = [], -1.0, None
    for net in _epochs(train_images, ytr, num_classes, epochs, batch_size, lr, seed, augment, arch, schedule):
        acc = float((cnn_predict(net, validation_images) == yval).double().mean())
        curve.append(acc)
        if acc > best:
            best, state = acc, copy.deepcopy(net.state_dict())
    net.load_state_dict(state)
    net.eval()
    return net, CNNSelection(epoch=curve.index(best) + 1, validation_accuracy=tuple(curve),
                             validation_samples=int(validation_images.shape[0]))


def cnn_accuracy(train_images, train_labels, test_images, test_labels, epochs: int = 5, batch_size: int = 128,
                 lr: float = 1e-3, seed: int = 0, num_classes: Optional[int] = None, augment: bool = False,
                 arch: str = "small", schedule: str = "constant", validation=None, return_selection: bool = False):
    """Accuracy on real test images of a CNN trained on generated labelled images.

    Networks (``arch``): ``"small"`` (default): conv 3×3 (C → 16) – ReLU – max-pool 2 – conv 3×3 (16 → 32) – ReLU –
    max-pool 2 – linear (→ 128) – ReLU – linear (→ num_classes); 0.21 M parameters at 28 × 28. ``"dropout"``: the
    shape of DPImageBench's MNIST / Fashion-MNIST classifier — unpadded conv 3×3 (C → 32) – max-pool 2 – ReLU –
    dropout 0.5 – conv 3×3 (32 → 64) – max-pool 2 – ReLU – dropout 0.5 – conv 3×3 (64 → 128) – ReLU – linear (→ 128)
    – ReLU – linear (→ num_classes); dropout is active in training only. ``"resnet20"``: He et al.'s CIFAR ResNet-20
    (19 convolutions with batch norm in 9 residual blocks of widths 16, 32, 64, global average pooling; 0.27 M
    parameters), several times the small network's cost per epoch. All: Adam (``lr``; ``schedule="cosine"``:
    decayed per batch from ``lr`` to 0 along a half cosine), cross-entropy, mini-batches of ``batch_size``. Inputs
    are rescaled to [-1, 1]. With ``augment``, every training batch is shifted (each image by its own offset of up to
    2 pixels per axis, black fill) and mirrored left-right with probability 1/2; test images are never altered.
    Training is seeded by ``seed`` (initialisation, batch order, augmentation draws) and runs in float32 on the CPU.

    Training length: with ``validation=(images, labels)`` (the main job's evaluation), ``epochs`` is a budget and the
    checkpoint of the best validation accuracy is kept (:func:`select_cnn`); without, exactly ``epochs`` passes. The
    test set is read once, at the end, by the chosen network.

    Shape:
        train_images (n, C, H, W) in [0, 1], train_labels (n,) int; test_images (m, C, H, W), test_labels (m,);
        validation: ((v, C, H, W), (v,)).

    Returns:
        the accuracy in [0, 1]; with ``return_selection``, ``(accuracy, CNNSelection or None)``.

    Raises:
        ValueError: shapes disagree, non-finite values, fewer than 2 classes, epochs / batch_size < 1, an unknown
            ``arch`` or ``schedule``, images under 18 × 18 pixels for ``arch="dropout"``, a ``validation`` that is not
            an (images, labels) pair.

    References:
        The "train on synthetic, test on real" CNN protocol of Dockhorn et al., "Differentially private diffusion
        models", TMLR 2023 (DPDM) and Gong et al., "DPImageBench", CCS 2025.
    """
    if validation is not None and (not isinstance(validation, (tuple, list)) or len(validation) != 2):
        raise ValueError(f"validation must be an (images, labels) pair or None, got {type(validation).__name__}")
    ytr = _check_training(train_images, train_labels, arch, schedule)
    _check_set(test_images, test_labels, "test", train_images, read=False)  # metadata only: read once, at the end
    if validation is not None:
        _check_set(*validation, "validation", train_images)
    epochs, batch_size = check_int(epochs, "epochs"), check_int(batch_size, "batch_size")
    # the classes are the training labels' range (the test labels' values are not read before the final score)
    C = int(ytr.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes", 2)
    selection = None
    if validation is None:
        net = train_cnn(train_images, ytr, C, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, augment=augment,
                        arch=arch, schedule=schedule)
    else:
        net, selection = select_cnn(train_images, ytr, validation[0], validation[1], C, epochs=epochs,
                                    batch_size=batch_size, lr=lr, seed=seed, augment=augment, arch=arch,
                                    schedule=schedule)
    acc = accuracy_on(net, test_images, test_labels)
    return (acc, selection) if return_selection else acc


def accuracy_on(net, test_images, test_labels) -> float:
    """The accuracy in [0, 1] of a trained network on (m, C, H, W) test images in [0, 1] with (m,) labels: the one
    read of the test set, after training and selection.

    Raises:
        ValueError: non-finite test images, labels not one per image."""
    yte = _check_set(test_images, test_labels, "test", None)
    return float((cnn_predict(net, test_images) == yte).double().mean())


@torch.no_grad()
def cnn_predict(net, images, batch_size: int = 1000) -> torch.Tensor:
    """Labels (n,) predicted by a :func:`train_cnn` / :func:`select_cnn` network for images (n, C, H, W) in
    [0, 1] (the network is put in eval mode)."""
    net.eval()
    return torch.cat([net(images[s:s + batch_size].detach().float().cpu() * 2.0 - 1.0).argmax(1)
                      for s in range(0, images.shape[0], batch_size)])
