"""The private-only protocol (``fastdpot flow --public-size 0``): image generation that reads no image outside the
sensitive set, evaluated as DPImageBench does (Gong et al., "DPImageBench: A Unified Benchmark for Differentially
Private Image Synthesis", CCS 2025).

Data: the training set (Fashion-MNIST's 60 000 images) is split, with one fixed public seed shared by every run, into
the SENSITIVE set (all but ``validation_size``) and a VALIDATION split of ``validation_size`` images; the test set is scored once, at the end.
The validation split is an explicit tuning split, disjoint from the sensitive set: it trains the label-fidelity
classifier (an evaluation model, never released) and served to choose the hyper-parameters
(``docs/mainjob-private.md``); no model weight, statistic or setting of the run is computed from it.

Stages, each a mechanism recorded in ONE :class:`fastdpot.privacy.composition.ComposedLedger` (replace-one
neighbours, the label free to change; RDP composition; δ = 1/(N ln N) for N sensitive images by default):

1. ``"representation"`` — DP-PCA of the sensitive images (one Gaussian second-moment release; or a supervised
   auto-encoder trained with DP-SGD, ``rep_kind="autoencoder"``; :mod:`fastdpot.experiments.dp_representation`),
   calibrated alone to ``representation_share`` of ε;
2. ``"flow"`` — the label-private DP sliced-Wasserstein flow (:class:`fastdpot.flows.ClassConditionalFlow`,
   ``label_privacy="private"``, orthogonal directions: no sensitivity tail) on the sensitive images' codes, its
   noise multiplier calibrated so that the composition of both stages is exactly the run's ε;
3. post-processing: the particles are decoded; their labels are the flow's (``labels_from="flow"``) or the DP head's
   (``"head"``, auto-encoder only). ``method="gaussian"`` replaces stage 2 by one label-private Gaussian mechanism on the per-class
   moments (:func:`dp_gaussian_label_private`).

Evaluation (not part of the release): CNN accuracy on the real test set (trained on the synthetic labelled images),
FID of synthetic against sensitive images, and label fidelity (the share of synthetic images that a classifier
trained on the validation split assigns to their generated class).
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict
from typing import Any, Dict, Optional

import torch

from ..privacy.composition import ComposedLedger
from .config import PipelineConfig
from .data import load_dataset, to_float
from .dp_representation import RepresentationConfig, head_labels, train_dp_representation

__all__ = ["protocol_delta", "private_split", "run_private_only", "generate", "dp_gaussian_label_private",
           "representation_config", "NUM_CLASSES", "PRIVATE_ONLY_METHODS", "SPLIT_SEED"]

NUM_CLASSES = 10  # the label domain of Fashion-MNIST: public
#: ``flow``: the label-private flow; ``gaussian``: the label-private DP Gaussian per class; ``decoded``: ANALYSIS
#: ONLY, not private: the sensitive images' own codes and labels decoded (what the representation caps).
PRIVATE_ONLY_METHODS = ("flow", "gaussian", "decoded")


def protocol_delta(n: int) -> float:
    """DPImageBench's δ = 1 / (N ln N) for N sensitive records (1.66e-6 for N = 55 000)."""
    return 1.0 / (n * math.log(n))


#: the seed of THE split: every run (every seed) uses the same sensitive / validation split, so the settings tuned
#: on the validation split never come from any run's sensitive images (the seeds' spread describes the algorithm)
SPLIT_SEED = 0


def private_split(n_train: int, validation_size: int, seed: int = SPLIT_SEED):
    """``(sensitive_index, validation_index)``: a seeded permutation of the training indices; the last
    ``validation_size`` are the validation split (public randomness: the split depends on no image)."""
    if not 0 < validation_size < n_train:
        raise ValueError(f"validation_size must be in (0, {n_train}), got {validation_size}")
    perm = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed))
    return perm[:-validation_size], perm[-validation_size:]


def representation_config(cfg: PipelineConfig) -> RepresentationConfig:
    """The representation's settings from the run's config."""
    d = cfg.rep_lowpass ** 2 if cfg.rep_kind == "dct" and cfg.rep_lowpass else \
        cfg.latent_dim or (32 if cfg.rep_kind == "pca" else 16)
    return RepresentationConfig(kind=cfg.rep_kind, latent_dim=d, scale=cfg.rep_scale, width=cfg.ae_width or 16,
                                label_weight=cfg.rep_label_weight, epochs=cfg.rep_epochs,
                                batch_size=cfg.rep_batch_size, clip_radius=cfg.rep_clip_radius, lr=cfg.rep_lr,
                                share=cfg.representation_share, lowpass=cfg.rep_lowpass)


def _domain_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels outside the public domain [0, C) are mapped to class 0 record by record, before any mechanism: a
    deterministic per-record map (no data-dependent failure; the neighbouring relation already lets a record's label
    be anything)."""
    y = labels.long()
    return torch.where((y >= 0) & (y < NUM_CLASSES), y, torch.zeros_like(y))


def dp_gaussian_label_private(latents: torch.Tensor, labels: torch.Tensor, ledger: ComposedLedger,
                              num_particles: int, generator: torch.Generator, *, secure_mode: bool = True,
                              calibration_size: Optional[int] = None):
    r"""One Gaussian mechanism on every class's (count, Σ y, Σ y yᵀ) of rows y clipped to the unit ball, labels
    private (rows on the unit sphere are unchanged by the clipping).

    Replacing one record (x, c) by (x', c') changes class c's statistics by (−1, −y, −yyᵀ) and class c''s by
    (+1, y', y'y'ᵀ) (when c = c' the change is (0, y' − y, ...), whose norm is smaller), so the ℓ2 sensitivity of the
    concatenated (C·(1 + d + d²)) vector is at most Δ = sqrt(2·(1 + ‖y‖² + ‖yyᵀ‖_F²)) = sqrt(6) for ‖y‖ <= 1. The noise
    multiplier is calibrated so that the run's composed ε is met (stage ``"gaussian"``, the full data set).
    Post-processing: μ_c = S_c / ñ_c, Σ_c = Q_c/ñ_c − μ_cμ_cᵀ projected onto the PSD cone, ñ_c = max(noisy count, 1);
    the N samples are drawn per class in proportion to the noisy counts. ``calibration_size``: the data-set size
    the noise is calibrated and recorded for (default n; a stand-in run passes the real run's size and its noise is
    scaled by n / calibration_size, the same noise relative to the sums).

    Returns ``(samples (N, d), labels (N,), info)``.
    """
    from ..privacy.randomness import privacy_randomness

    n, d = latents.shape
    C = NUM_CLASSES
    y = latents.double()
    y = y / y.norm(dim=1, keepdim=True).clamp_min(1.0)
    stats = torch.zeros(C, 1 + d + d * d, dtype=torch.float64)
    stats.index_add_(0, labels, torch.cat([torch.ones(n, 1, dtype=torch.float64), y,
                                           (y[:, :, None] * y[:, None, :]).reshape(n, -1)], dim=1))
    sens = math.sqrt(6.0)
    sigma = 0.0
    n_cal = n if calibration_size is None else calibration_size
    if ledger.private:
        z = ledger.calibrate(1, sampling="full", dataset_size=n_cal)
        ledger.record("gaussian", z, 1, sampling="full", dataset_size=n_cal)
        sigma = z * sens * n / n_cal
    rng = privacy_randomness(secure_mode, generator if not secure_mode else None)
    noisy = stats + rng.normal(stats.shape) * sigma
    counts = noisy[:, 0].clamp_min(1.0)
    mu = noisy[:, 1:1 + d] / counts[:, None]
    q = noisy[:, 1 + d:].view(C, d, d)
    q = 0.5 * (q + q.transpose(1, 2))
    cov = q / counts[:, None, None] - mu[:, :, None] * mu[:, None, :]
    ev, evec = torch.linalg.eigh(cov)
    cov = (evec * ev.clamp_min(0.0)[:, None, :]) @ evec.transpose(1, 2) + 1e-9 * torch.eye(d, dtype=torch.float64)
    share = counts / counts.sum() * num_particles
    per = share.floor().long()
    per[torch.argsort(share - per.double(), descending=True)[: num_particles - int(per.sum())]] += 1
    xs, ys = [], []
    for c in range(C):
        if int(per[c]) == 0:
            continue
        L = torch.linalg.cholesky(cov[c])
        eps = torch.randn(int(per[c]), d, generator=generator, dtype=torch.float64)
        xs.append(mu[c] + eps @ L.t())
        ys.append(torch.full((int(per[c]),), c, dtype=torch.long))
    return torch.cat(xs).float(), torch.cat(ys), dict(noise_std=sigma, sensitivity=sens)


def _stage_flow(cfg: PipelineConfig, latents, labels, ledger: ComposedLedger, num_particles: int, seed: int,
                progress: bool, on_sphere: bool, calibration_size: Optional[int] = None):
    """The label-private flow on the sensitive codes, calibrated to the rest of the composed budget (rows normalised
    onto the sphere for sphere codes, clipped to the unit ball otherwise). A stand-in (``calibration_size`` > n)
    takes the real run's steps and noise multiplier: the same batch, the same noise per step."""
    from ..flows import ClassConditionalFlow

    n, d = latents.shape
    k = d + NUM_CLASSES if cfg.num_projections is None else cfg.num_projections  # one orthogonal block in R^{d+C}
    h = 0.3 if cfg.step_size is None else cfg.step_size
    B = min(cfg.batch_size, n)
    n_cal = n if calibration_size is None else calibration_size
    T = max(1, int(round(cfg.epochs * n_cal / B)))
    z = None
    if ledger.private:
        z = ledger.calibrate(T, dataset_size=n_cal, batch_size=B)
        ledger.record("flow", z, T, sampling="without_replacement", dataset_size=n_cal, batch_size=B)  # before it runs
    kw = dict(noise_multiplier=z, steps=T, batch_size=B) if z is not None else dict(batch_size=B, steps=T)
    flow = ClassConditionalFlow(num_particles, d, k, h, num_classes=NUM_CLASSES, label_privacy="private",
                                label_scale=cfg.label_scale, particles_per_class="equal",
                                generator=torch.Generator().manual_seed(seed), init=cfg.init,
                                init_scale=cfg.init_scale, secure_mode=not cfg.replayable_noise, clip_radius=1.0,
                                normalize=on_sphere, directions="orthogonal", release=cfg.release,
                                sketch_bins=cfg.sketch_bins, diffusion=cfg.diffusion, device=cfg.device,
                                backend=cfg.backend, **kw)
    samples, sample_labels = flow.run(latents, labels, progress=progress)
    f = flow.flows[0]
    return samples, sample_labels, dict(num_projections=k, step_size=h, batch_size=B, steps=T,
                                        steps_taken=f.steps_taken, noise_multiplier=f.noise_multiplier,
                                        noise_std=f.noise_std, sensitivity=f.sensitivity)


def _evaluate(cfg: PipelineConfig, images, labels, data, cache_dir: str, progress: bool) -> Dict[str, Any]:
    """CNN accuracy on the real test set, FID against the sensitive images, label fidelity (validation CNN)."""
    from . import metrics as M

    out: Dict[str, Any] = {}
    g = torch.Generator().manual_seed(cfg.seed + 2)
    n_gen, n_real = min(cfg.fid_samples, images.shape[0]), min(cfg.fid_real, len(data["sensitive"]))
    gi = torch.randperm(images.shape[0], generator=g)[:n_gen]
    ri = torch.sort(torch.randperm(len(data["sensitive"]), generator=torch.Generator().manual_seed(12345))[:n_real]).values
    key = f"sensitive_split{SPLIT_SEED}_n{n_real}"  # the same images for every run (fixed split, fixed pick)
    mu_r, sig_r, _ = M.real_statistics(to_float(data["sensitive"].images[ri]), device=cfg.device,
                                       cache=os.path.join(cache_dir, "fid_real_stats", key + ".npz"),
                                       progress=progress)
    mu_g, sig_g = M.feature_statistics(M.inception_features(images[gi], device=cfg.device, progress=progress,
                                                            desc="FID generated"))
    out.update(fid=M.frechet_distance(mu_r, sig_r, mu_g, sig_g), fid_generated_samples=n_gen,
               fid_real_samples=n_real, fid_real="the sensitive training images (DPImageBench's protocol: an "
                                                 "evaluation statistic of the sensitive set, outside the guarantee)")
    ti = torch.sort(torch.randperm(len(data["test"]), generator=torch.Generator().manual_seed(12345))[:n_real]).values
    mu_t, sig_t, _ = M.real_statistics(to_float(data["test"].images[ti]), device=cfg.device,
                                       cache=os.path.join(cache_dir, "fid_real_stats", f"test_n{n_real}.npz"),
                                       progress=progress)
    out["fid_test"] = M.frechet_distance(mu_t, sig_t, mu_g, sig_g)
    test = data["test"]
    for name in [v for v in cfg.classifiers.split(",") if v]:
        if name == "cnn":
            out["accuracy_cnn"] = M.cnn_accuracy(images, labels, to_float(test.images), test.labels,
                                                 epochs=cfg.cnn_epochs, seed=cfg.seed, num_classes=NUM_CLASSES,
                                                 augment=cfg.cnn_augment, arch=cfg.cnn_arch)
        else:
            out.update({f"accuracy_{k}": v for k, v in M.downstream_accuracy(
                images.flatten(1), labels, to_float(test.images).flatten(1), test.labels, classifiers=[name],
                seed=cfg.seed).items()})
    val = data["validation"]
    judge = M.train_cnn(to_float(val.images), val.labels, NUM_CLASSES, epochs=cfg.cnn_epochs, seed=cfg.seed + 5)
    out["label_fidelity"] = float((M.cnn_predict(judge, images) == labels).double().mean())
    out["label_fidelity_judge_accuracy_on_test"] = float(
        (M.cnn_predict(judge, to_float(test.images)) == test.labels).double().mean())
    out["downstream_train_samples"] = int(images.shape[0])
    return out


def generate(cfg: PipelineConfig, images: torch.Tensor, labels: torch.Tensor, ledger: ComposedLedger, *,
             cache_dir: str, progress: bool = True, calibration_size: Optional[int] = None):
    """The protocol's release: the DP representation of the sensitive ``images`` (uint8 (n, 1, 28, 28)), then the
    method's generation in its code space, decoded; every mechanism recorded in ``ledger``.

    ``calibration_size``: the data-set size every stage is calibrated and recorded for (default n). A stand-in run
    on public data (:mod:`fastdpot.experiments.private_tuning`) passes the real run's size: each stage then adds the
    real run's noise relative to its signal, so a setting that works on the stand-in is one that works at that ε.

    Returns ``(images (N, 1, 28, 28) in [0, 1], labels (N,), info)``; info holds ``representation_config``,
    ``representation``, ``generation`` and ``wall_time_s`` (seconds per phase).
    """
    times: Dict[str, float] = {}
    n = images.shape[0]
    t0 = time.perf_counter()
    rep_cfg = representation_config(cfg)
    if cfg.labels_from == "head" and (rep_cfg.kind != "autoencoder" or rep_cfg.label_weight == 0):
        raise ValueError("labels_from='head' needs the auto-encoder representation with a head (rep_kind="
                         "'autoencoder', rep_label_weight > 0)")
    model, rep_info = train_dp_representation(images, labels, rep_cfg, ledger, num_classes=NUM_CLASSES,
                                              seed=cfg.seed, secure_mode=not cfg.replayable_noise,
                                              calibration_size=calibration_size,
                                              cache_dir=os.path.join(cache_dir, "dp_representation") if cache_dir
                                              else None, progress=progress)
    with torch.no_grad():
        latents = torch.cat([model.encode(to_float(images[s:s + 4096])) for s in range(0, n, 4096)])
    times["representation"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    num_particles = cfg.num_particles or (1000 if cfg.quick else 60_000)  # DPImageBench generates 60 000
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    if cfg.method == "flow":
        samples, sample_labels, flow_info = _stage_flow(cfg, latents, labels, ledger, num_particles, cfg.seed + 1,
                                                        progress, model.on_sphere, calibration_size)
    elif cfg.method == "decoded":  # analysis: the representation's cap (reads the sensitive codes, releases them)
        pick = torch.randint(n, (num_particles,), generator=gen) if num_particles > n else \
            torch.randperm(n, generator=gen)[:num_particles]
        samples, sample_labels, flow_info = latents[pick], labels[pick], dict(note="the sensitive images' own codes "
                                                                                   "decoded: NOT private")
    else:
        samples, sample_labels, flow_info = dp_gaussian_label_private(latents, labels, ledger, num_particles, gen,
                                                                      secure_mode=not cfg.replayable_noise,
                                                                      calibration_size=calibration_size)
    times["generation"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = torch.cat([model.decode(samples[s:s + 4096]) for s in range(0, samples.shape[0], 4096)]).clamp_(0, 1)
        if cfg.labels_from == "head":
            sample_labels = head_labels(model, samples)
    times["decode"] = round(time.perf_counter() - t0, 2)
    return out, sample_labels, dict(representation_config=rep_cfg, representation=rep_info, generation=flow_info,
                                    wall_time_s=times)


def run_private_only(cfg: PipelineConfig, run_dir: str, progress: bool = True,
                     cache_dir: Optional[str] = None) -> Dict[str, Any]:
    """Run the private-only protocol (module docstring) into ``run_dir``; returns the metrics (also in
    ``metrics.json``; ``privacy.md`` states the composed guarantee and every stage).

    Raises:
        ValueError: a configuration the protocol does not take (labels public, a method other than flow/gaussian).
    """
    from .autoencoder import default_cache_dir
    from .report import _finite, _json_default, _save_grid_png, samples_grid

    cfg = cfg.resolved()
    if cfg.labels != "private":
        raise ValueError("the private-only protocol protects labels: labels='private' (the default for the flow)")
    if cfg.method not in PRIVATE_ONLY_METHODS:
        raise ValueError(f"method must be one of {list(PRIVATE_ONLY_METHODS)} with public_size=0, got {cfg.method!r}")
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    os.makedirs(run_dir, exist_ok=True)
    times: Dict[str, float] = {}
    t0 = time.perf_counter()
    train = load_dataset(cfg.dataset, "train", cfg.data_dir, cfg.celeba_dir, cfg.max_train)
    test = load_dataset(cfg.dataset, "test", cfg.data_dir, cfg.celeba_dir, cfg.max_test)
    sens_idx, val_idx = private_split(len(train), cfg.validation_size)
    data = dict(sensitive=train.subset(sens_idx), validation=train.subset(val_idx), test=test)
    sensitive = data["sensitive"]
    n = len(sensitive)
    delta = protocol_delta(n) if cfg.delta is None else cfg.delta
    ledger = ComposedLedger(cfg.epsilon, delta)
    labels = _domain_labels(sensitive.labels)
    times["data"] = round(time.perf_counter() - t0, 2)

    images, sample_labels, gen_info = generate(cfg, sensitive.images, labels, ledger, cache_dir=cache_dir,
                                               progress=progress)
    times.update(gen_info.pop("wall_time_s"))
    rep_cfg, rep_info, flow_info = gen_info["representation_config"], gen_info["representation"], \
        gen_info["generation"]
    num_particles = images.shape[0]
    t0 = time.perf_counter()
    met = _evaluate(cfg, images, sample_labels, data, cache_dir, progress)
    times["metrics"] = round(time.perf_counter() - t0, 2)

    eps = ledger.epsilon() if cfg.method != "decoded" else float("inf")
    metrics = _finite(dict(
        protocol="private-only (DPImageBench: 55 000 sensitive / 5 000 validation images, labels private)",
        dataset=train.name, method=cfg.method, n_sensitive=n, n_validation=len(data["validation"]),
        n_test=len(test), seed=cfg.seed, epsilon_target=cfg.epsilon, epsilon=eps, delta=delta,
        neighbouring_relation="replace one labelled image (x, y) by any (x', y'), its label free to change",
        stages=ledger.stages, representation=dict(asdict(rep_cfg), **rep_info), generation=flow_info,
        labels_from=cfg.labels_from, num_particles=num_particles,
        noise="replayable from seed: NO privacy guarantee against anyone who holds the seed"
              if cfg.replayable_noise else "secret (operating-system CSPRNG; not stored)",
        wall_time_s=dict(times, total=round(sum(times.values()), 2)), torch_threads=torch.get_num_threads(),
        machine=platform.machine(), processor=platform.processor(), **met))
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2, default=_json_default)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(_finite(asdict(cfg)), f, indent=2)
    with open(os.path.join(run_dir, "privacy.md"), "w") as f:
        f.write(_privacy_md(metrics))
    _save_grid_png(samples_grid(images, sample_labels), os.path.join(run_dir, "samples.png"),
                   row_names=train.class_names, title=f"private-only, ε = {cfg.epsilon:g}")
    return metrics


def _non_finite(v) -> bool:
    """None, ∞ or its JSON spelling "inf" (:func:`fastdpot.experiments.report._finite`)."""
    return v is None or v == "inf" or (isinstance(v, float) and not math.isfinite(v))


def _privacy_md(m: Dict[str, Any]) -> str:
    lines = ["# Privacy of this run (private-only protocol)", ""]
    if m["method"] == "decoded":
        return "\n".join(lines + ["**Analysis run (`--method decoded`): the sensitive images' own codes, decoded. It "
                                   "releases the sensitive data: no differential-privacy guarantee.**", ""])
    if _non_finite(m["epsilon"]) or _non_finite(m["epsilon_target"]):  # metrics.json writes ∞ as "inf"
        return "\n".join(lines + ["**Non-private run (`--epsilon inf`): no differential-privacy guarantee.**", ""])
    lines += [f"The whole run is **({m['epsilon']:.4g}, {m['delta']:.3g})-differentially private** for neighbouring "
              f"data sets that differ by the replacement of one labelled image by any other (its label free to "
              f"change; n = {m['n_sensitive']} is public). Everything the run publishes (the samples, their labels, "
              f"metrics computed from them) is post-processing of the stages below, composed in one Rényi-DP "
              f"accountant (dp-accounting, replace-one relation), all of δ to the accountant (every stage has a "
              f"deterministic sensitivity). No image outside the sensitive set was used for any weight, statistic or "
              f"setting. The validation split ({m['n_validation']} images, disjoint from the sensitive set, the same "
              f"split for every run) is an explicit tuning split: the protocol's settings were chosen on it "
              f"(`fastdpot.experiments.private_tuning`), and it trains the label-fidelity judge, an evaluation "
              f"model that is not released.", "",
              "| stage | mechanism | noise multiplier | releases | batch / n |", "|---|---|---|---|---|"]
    what = {"representation": "DP-PCA: Gaussian second-moment matrix, sensitivity sqrt(2)"
            if m["representation"].get("kind") == "pca" else "DP-SGD, per-sample clipping, sensitivity 2C",
            "flow": "label-private sliced quantile sketch, orthogonal directions",
            "gaussian": "Gaussian mechanism on per-class moments, sensitivity sqrt(6)"}
    for s in m["stages"]:
        e = s["event"]
        lines.append(f"| {s['stage']} | {what.get(s['stage'], '')} | {s['noise_multiplier']:.4g} | {s['releases']} | "
                     f"{e['batch_size']} / {e['dataset_size']} |")
    lines += ["", f"Noise: {m['noise']}.", ""]
    return "\n".join(lines)


def summarize(folder: str) -> str:
    """A markdown table of the private-only runs under ``folder`` (one ``metrics.json`` per run folder), grouped by
    (method, ε, labels_from, latent dimension d): the mean ± sd over the runs (each an independent run with its own
    ε and its own DP representation; the spread describes the algorithm: no pooled release) and each run's wall
    time."""
    import statistics

    rows: Dict[tuple, list] = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "metrics.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            m = json.load(f)
        eps = None if _non_finite(m["epsilon_target"]) else float(m["epsilon_target"])  # None: ε = ∞
        key = (m["method"], eps, m.get("labels_from", "flow"), m["representation"]["latent_dim"])
        rows.setdefault(key, []).append(m)

    def stat(ms, k, scale=1.0, fmt="{:.1f}"):
        vals = [m[k] * scale for m in ms if m.get(k) is not None]
        if not vals:
            return "–"
        if len(vals) == 1:
            return fmt.format(vals[0])
        return f"{fmt.format(statistics.mean(vals))} ± {fmt.format(statistics.stdev(vals))}"

    out = ["| method | ε (target) | ε (composed) | labels | d | runs | CNN acc. % | FID (sensitive) | FID (test) | "
           "label fidelity % | wall time min |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (method, eps, lab, d), ms in sorted(rows.items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 1e9), kv[0][2],
                                                                          -kv[0][3])):
        composed = "∞ (not private)" if method == "decoded" or eps is None else stat(ms, "epsilon", fmt="{:.3f}")
        eps = "∞" if eps is None else f"{eps:g}"
        minutes = ", ".join("{:.0f}".format(m["wall_time_s"]["total"] / 60) for m in ms)
        out.append(f"| {method} | {eps} | {composed} | {lab} | {d} | {len(ms)} | {stat(ms, 'accuracy_cnn', 100)} | "
                   f"{stat(ms, 'fid')} | {stat(ms, 'fid_test')} | {stat(ms, 'label_fidelity', 100)} | {minutes} |")
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m fastdpot.experiments.private_only FOLDER``: print :func:`summarize` of the run folders in FOLDER
    (the runs themselves: ``fastdpot flow --public-size 0 ...``, see ``scripts/private_only.sh``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fastdpot.experiments.private_only",
                                description="Summarise the private-only protocol's runs (one metrics.json each).")
    p.add_argument("folder", help="the folder holding one run folder per run (e.g. results/private_only)")
    a = p.parse_args(argv)
    print(summarize(a.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
