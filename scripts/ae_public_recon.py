"""Compare auto-encoder architectures on PUBLIC data only (docs/mainjob/tuning.md, "The auto-encoder").

Splits the real run's public half as the tuning protocol does (fastdpot.experiments.mainjob.tuning.tuning_split, seed 0), trains
each architecture on the stand-in public part (cached like the main job's auto-encoders) and scores its
reconstructions of 1 000 held-out public images: mean squared error and FID against 1 000 other held-out images
(biased upwards at this size; compare rows of one run only). Reads neither the private half nor the test set.

    python scripts/ae_public_recon.py --arch conv convbn
"""
from __future__ import annotations

import argparse
import json

from fastdpot.experiments.data import to_float
from fastdpot.experiments.mainjob import MainJobConfig
from fastdpot.experiments.mainjob.autoencoder import AutoEncoderConfig, decode, encode, train_autoencoder
from fastdpot.experiments.mainjob.protocols import load_data
from fastdpot.experiments.mainjob.tuning import tuning_split
from fastdpot.experiments.metrics import fid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["conv", "convbn"])
    ap.add_argument("--latent-dim", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=1000, help="held-out images reconstructed (and as many as reference)")
    args = ap.parse_args()
    data = load_data(MainJobConfig().resolved())
    split = tuning_split(data["public"], args.split_seed)
    del data  # the private half and the test set go no further
    train, held = split["public"].images, split["test"].images
    x, ref = held[:args.n], to_float(held[args.n:2 * args.n])
    for arch in args.arch:
        cfg = AutoEncoderConfig(arch=arch, latent_dim=args.latent_dim, epochs=args.epochs, seed=0)
        model, info = train_autoencoder(train, cfg, progress=False)
        rec = decode(model, encode(model, x))
        row = dict(arch=arch, latent_dim=args.latent_dim, epochs=args.epochs, n_train=len(train),
                   mse=float(((rec - to_float(x)) ** 2).mean()), fid_recon=fid(rec, ref), n_fid=args.n,
                   train_seconds=None if info["cached"] else info["seconds"])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
