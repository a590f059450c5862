"""The evaluation CNN's own spread, on PUBLIC data only (docs/mainjob/tuning.md, "Classifiers").

Splits the real run's public half as the tuning protocol does (fastdpot.experiments.mainjob.tuning.tuning_split, seed 0), takes
the main job's auto-encoder of the stand-in public part (cached), decodes the stand-in public part's own latents (the
public-only baseline's images: the best any sampler in this latent space can give the classifier) and trains the
CNN of fastdpot.experiments.metrics.cnn_accuracy on them with several training seeds, epochs and learning-rate schedules,
scoring each on the held-out part. Reads neither the private half nor the test set. One JSON row per training run.

    python scripts/cnn_public_probe.py --epochs 5 10 --schedule constant cosine --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

from fastdpot.experiments.data import to_float
from fastdpot.experiments.mainjob import MainJobConfig
from fastdpot.experiments.mainjob.autoencoder import decode
from fastdpot.experiments.mainjob.protocols import load_data, stage_representation
from fastdpot.experiments.mainjob.tuning import tuning_split
from fastdpot.experiments.metrics import CNN_ARCHS, cnn_accuracy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--schedule", nargs="+", default=["constant", "cosine"], choices=["constant", "cosine"])
    ap.add_argument("--arch", nargs="+", default=["small"], choices=CNN_ARCHS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--ae-width", type=int, default=None)
    args = ap.parse_args()
    cfg = MainJobConfig().with_settings(method="public", ae_width=args.ae_width).resolved()
    split = tuning_split(load_data(cfg)["public"], args.split_seed)  # the private half and test set go no further
    ae = stage_representation(cfg, split, progress=False)
    images = decode(ae["model"], ae["public_codes"])
    held = split["test"]
    for arch, epochs, schedule, seed in itertools.product(args.arch, args.epochs, args.schedule, args.seeds):
        t0 = time.perf_counter()
        acc = cnn_accuracy(images, ae["public_labels"], to_float(held.images), held.labels, epochs=epochs,
                           seed=seed, arch=arch, schedule=schedule)
        print(json.dumps(dict(arch=arch, epochs=epochs, schedule=schedule, seed=seed, accuracy=acc,
                              n_train=int(images.shape[0]), n_heldout=len(held),
                              seconds=round(time.perf_counter() - t0, 1))), flush=True)


if __name__ == "__main__":
    main()
