"""DP-Sinkhorn experiments: the paper's class-conditional DCGAN generator, its evaluation, and the command line
``python -m fastdpot.experiments.papers.dp_sinkhorn`` (Fashion-MNIST).

The training loop and the privacy accounting are the library's :func:`fastdpot.dp_sinkhorn.train_dp_sinkhorn`;
this module builds the generator it trains (:class:`ConditionalDCGANGenerator`, initial weights from ``--seed``)
and measures the result (:func:`evaluate_generator`: FID and downstream accuracy, through
:mod:`fastdpot.experiments.metrics`).

References:
    Cao et al., "Don't Generate Me: Training Differentially Private Generative Models with Sinkhorn Divergence",
    NeurIPS 2021.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from torch import nn

from ..._validate import check_choice, check_int, check_seed, check_tensor
from ...dp_sinkhorn import CLIPPINGS, DPSinkhornConfig, train_dp_sinkhorn

__all__ = ["ConditionalDCGANGenerator", "evaluate_generator", "main"]

#: what :func:`evaluate_generator` can measure
METRICS = ("fid", "logreg", "mlp")


class ConditionalDCGANGenerator(nn.Module):
    """Class-conditional DCGAN generator for 28×28 single-channel images (latent ‖ one-hot label → image).

    Linear → BN → ReLU → (2c, 7, 7) → ConvT(4, 2, 1) → BN → ReLU → (c, 14, 14) → ConvT(4, 2, 1) → sigmoid →
    (1, 28, 28), with c = ``channels``.

    Shape: z (n, latent_dim), labels (n,) -> (n, 1, 28, 28) in [0, 1].

    Raises:
        ValueError: ``latent_dim``, ``num_classes`` or ``channels`` < 1.

    References:
        Cao et al., NeurIPS 2021 (the DP-Sinkhorn generator, after Radford et al., ICLR 2016).
    """

    def __init__(self, latent_dim: int = 32, num_classes: int = 10, channels: int = 64):
        super().__init__()
        self.latent_dim, self.num_classes = check_int(latent_dim, "latent_dim"), check_int(num_classes, "num_classes")
        c = check_int(channels, "channels")
        self.fc = nn.Sequential(nn.Linear(latent_dim + num_classes, 2 * c * 7 * 7), nn.BatchNorm1d(2 * c * 7 * 7),
                                nn.ReLU(True))
        self.net = nn.Sequential(nn.ConvTranspose2d(2 * c, c, 4, 2, 1), nn.BatchNorm2d(c), nn.ReLU(True),
                                 nn.ConvTranspose2d(c, 1, 4, 2, 1), nn.Sigmoid())
        self.c = c

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Images of the given classes: z (n, latent_dim) latent codes, labels (n,) integers in
        [0, num_classes) -> (n, 1, 28, 28) in [0, 1].
        """
        h = torch.cat([z, nn.functional.one_hot(labels.long(), self.num_classes).to(z.dtype)], dim=1)
        return self.net(self.fc(h).view(-1, 2 * self.c, 7, 7))

    def sample(self, labels: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Images of the classes ``labels`` (n,) from fresh standard-normal latents drawn from ``generator``
        -> (n, 1, 28, 28).
        """
        z = torch.randn(labels.shape[0], self.latent_dim, generator=generator)  # public draw: latents
        return self(z, labels)


@torch.no_grad()
def evaluate_generator(model: ConditionalDCGANGenerator, test_images: torch.Tensor, test_labels: torch.Tensor,
                       num_samples: int = 2000, fid_samples: int = 1000, seed: int = 1,
                       metrics: Sequence[str] = METRICS) -> Dict[str, float]:
    """FID (generated vs real test images) and downstream accuracy (classifiers trained on generated labelled
    samples, tested on real test data) through :mod:`fastdpot.experiments.metrics`.

    ``num_samples`` images are generated with balanced labels (``i % num_classes``) from latents drawn from a
    generator seeded with ``seed``; FID uses the first ``fid_samples`` of them and of the test images. Public
    test data only: evaluating on private data is a release that is not accounted.

    Shape: test_images (m, 1, 28, 28) in [0, 1], test_labels (m,). Returns {"fid", "fid_samples", "logreg",
    "mlp", "num_generated"} (the metrics asked for).

    Raises:
        TypeError: ``test_images`` not a tensor. ValueError: empty or non-finite test images, labels of another
            length, sizes < 1, an unknown metric.
    """
    check_tensor(test_images, "test_images")
    if not isinstance(test_labels, torch.Tensor) or test_labels.shape != (test_images.shape[0],):
        raise ValueError(f"test_labels must be a tensor of shape ({test_images.shape[0]},), got "
                         f"{tuple(getattr(test_labels, 'shape', ())) or type(test_labels).__name__}")
    num_samples = check_int(num_samples, "num_samples")
    fid_samples = check_int(fid_samples, "fid_samples")
    for m in metrics:
        check_choice(m, "metrics", METRICS)
    from .. import metrics as M

    g = torch.Generator().manual_seed(check_seed(seed))
    was = model.training
    model.eval()
    try:
        labels = torch.arange(num_samples) % model.num_classes
        fake = model.sample(labels, generator=g)  # public draw: the trained generator
    finally:
        model.train(was)
    out: Dict[str, float] = {"num_generated": num_samples}
    if "fid" in metrics:
        out["fid"] = float(M.fid(fake[:fid_samples], test_images[:fid_samples]))
        out["fid_samples"] = min(fid_samples, num_samples)
    clf = tuple(c for c in metrics if c in ("logreg", "mlp"))
    if clf:
        acc = M.downstream_accuracy(fake.flatten(1), labels, test_images.flatten(1), test_labels, classifiers=clf)
        out.update({k: float(v) for k, v in acc.items()})
    return out


def _parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m fastdpot.experiments.papers.dp_sinkhorn",
        description="DP-Sinkhorn (Cao et al., NeurIPS 2021) on Fashion-MNIST: train a class-conditional DCGAN "
                    "generator on the training set under (epsilon, delta)-DP, then report FID and downstream "
                    "accuracy on the test set, as JSON.")
    p.add_argument("--epsilon", type=float, default=10.0,
                   help="target epsilon of the whole run; training stops when the next step would exceed it "
                        "(default: %(default)s)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta of the whole run (default: %(default)s)")
    p.add_argument("--steps", type=int, default=600,
                   help="maximum number of training steps; the noise is calibrated so that this many steps spend "
                        "--epsilon (default: %(default)s)")
    p.add_argument("--batch", type=int, default=256,
                   help="expected Poisson batch of real images per step, and generated images per step "
                        "(default: %(default)s)")
    p.add_argument("--clip-radius", type=float, default=0.5,
                   help="C, the radius the image gradient is clipped to (Opacus' max_grad_norm; "
                        "default: %(default)s)")
    p.add_argument("--clipping", choices=CLIPPINGS, default="joint",
                   help="'joint': the whole gradient block clipped to C (sensitivity 2C, the authors' code); "
                        "'per_sample': each generated image's gradient clipped to C (sensitivity 2C*sqrt(batch)) "
                        "(default: %(default)s)")
    p.add_argument("--ratio", type=float, default=0.2,
                   help="semi-debiasing ratio r in [0, 1]: r*batch extra generated images per step "
                        "(default: %(default)s)")
    p.add_argument("--latent-dim", type=int, default=32,
                   help="dimension of the generator's latent codes (default: %(default)s)")
    p.add_argument("--channels", type=int, default=64,
                   help="width c of the DCGAN generator (2c then c feature maps; default: %(default)s)")
    p.add_argument("--eval-samples", type=int, default=2000,
                   help="generated images for the evaluation (balanced labels; default: %(default)s)")
    p.add_argument("--fid-samples", type=int, default=1000,
                   help="generated and test images the FID compares (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the public draws: initial weights, latents, fake labels (and of all draws with "
                        "--replayable-noise; default: %(default)s)")
    p.add_argument("--replayable-noise", action="store_true",
                   help="draw batches and noise from --seed (replayable: NO privacy guarantee against anyone who "
                        "holds the seed); default: secret noise from the operating system")
    p.add_argument("--out", default=None, help="also write the summary JSON to this file")
    return p


def main(argv=None):
    """``python -m fastdpot.experiments.papers.dp_sinkhorn [--steps 600 --epsilon 10 ...]`` (``--help`` lists every
    option): trains on Fashion-MNIST, prints the run's summary with the evaluation as JSON (and writes it to
    ``--out``); returns it as a dict.

    Raises:
        SystemExit: bad options (argparse, exit code 2). FileNotFoundError: Fashion-MNIST not installed.
    """
    import json

    from ..data.datasets import load_fashion_mnist, to_float

    p = _parser()
    a = p.parse_args(argv)
    try:
        cfg = DPSinkhornConfig(target_epsilon=a.epsilon, delta=a.delta, max_steps=a.steps, expected_batch_size=a.batch,
                               generated_batch_size=a.batch, clip_radius=a.clip_radius, clipping=a.clipping,
                               ratio=a.ratio, seed=a.seed, secure_mode=not a.replayable_noise)
        with torch.random.fork_rng(devices=[]):  # initial weights from --seed; the global RNG left as it was
            torch.manual_seed(a.seed)
            model = ConditionalDCGANGenerator(a.latent_dim, 10, a.channels)
    except ValueError as err:
        p.error(str(err))
    xtr, ytr = load_fashion_mnist("train")
    xte, yte = load_fashion_mnist("test")
    xtr, xte = to_float(xtr[:, None]), to_float(xte[:, None])
    res = train_dp_sinkhorn(xtr, ytr, model, cfg, progress=True)
    summary = res.summary()
    summary["eval"] = evaluate_generator(res.generator, xte, yte, a.eval_samples, a.fid_samples)
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
