"""The main job's settings: :class:`MainJobConfig`, frozen and nested, one dataclass per stage.

* :class:`DataSettings` — the data set and the protocol's split (``public_size=0``: the private-only protocol);
* :class:`RepresentationSettings` — the code space: the public auto-encoder (public-half protocol) or the DP
  representation of the sensitive images (private-only protocol);
* :class:`GenerationSettings` — the generator run on the private codes (the flow or a baseline) and its flow's keywords;
* :class:`EvaluationSettings` — FID and the downstream classifiers.

Every field is addressed by its dotted name (``generation.step_size``) in :func:`parse_settings`, the one parser of
the command line's ``--set``, the tuning grids and the run folder's ``config.json``; a leaf name that occurs in one
stage only (``step_size``) may be written alone. :meth:`MainJobConfig.resolved` returns the settings a run uses:
the ``quick`` reductions and the protocol's defaults filled in, every value validated once.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Sequence

from ..._validate import (check_choice, check_delta, check_epsilon, check_int, check_nonnegative, check_positive,
                          check_probability)
from ...flows import INIT_KINDS
from ..metrics import CLASSIFIERS, CNN_ARCHS
from .settings import (_DP_REPRESENTATION, _PER_STEP_FLOW, AE_ARCHS, DEFAULT_SKETCH_BINS,  # noqa: F401
                       FLOW_ONLY_SETTINGS, MAX_FLOW_STEPS, METHODS, ONESHOT_SETTINGS, PRIVATE_ONLY_SETTINGS,
                       PRIVATE_ONLY_TABLE, PROTOCOLS, PUBLIC_HALF_SETTINGS, QUICK_SKETCH_BLOCKS, QUICK_SKETCH_ROUNDS,
                       REPRESENTATION_KINDS, SKETCH_CENTERS, SKETCH_CLAMPS, SKETCH_SHRINKS, DataSettings,
                       EvaluationSettings, GenerationSettings, RepresentationSettings, steps_duration, table_row)

__all__ = ["DataSettings", "RepresentationSettings", "GenerationSettings", "EvaluationSettings", "MainJobConfig",
           "METHODS", "PROTOCOLS", "AE_ARCHS", "REPRESENTATION_KINDS", "DEFAULT_SKETCH_BINS", "parse_settings",
           "setting_names", "flat_settings", "resolve", "PRIVATE_ONLY_SETTINGS", "PUBLIC_HALF_SETTINGS",
           "PRIVATE_ONLY_TABLE", "table_row"]

@dataclass(frozen=True)
class MainJobConfig:
    """Settings of one run of the main job (defaults: Sebag et al., TMLR, Fashion-MNIST DPSWflow-r at
    (ε, δ) = (10, 1e-5), with the changes recorded in docs/mainjob/tuning.md and docs/mainjob-private.md).

    Attributes:
        epsilon: the run's ε: the budget of EVERYTHING the run publishes (``inf``: non-private). delta: its δ (None:
            1e-5 for the public-half protocol, DPImageBench's 1/(N ln N) for the private-only one).
        seed: master seed of the public work (split, auto-encoder, initial particles, evaluation).
        device, backend: where the flow runs and which backend of op ``flow_step``.
        replayable_noise: False (default): every privacy draw is secret OS randomness. True: from ``seed``, NO
            guarantee against anyone who holds the seed (privacy.md and metrics.json say so).
        quick: a short run (small data, few steps; no FID unless ``evaluation.fid_samples`` is given, then at most
            100 images).
        data, representation, generation, evaluation: the stages' settings.
    """
    epsilon: float = 10.0
    delta: Optional[float] = None
    seed: int = 0
    device: str = "cpu"
    backend: str = "auto"
    replayable_noise: bool = False
    quick: bool = False
    data: DataSettings = field(default_factory=DataSettings)
    representation: RepresentationSettings = field(default_factory=RepresentationSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)

    @property
    def protocol(self) -> str:
        """``"private-only"`` when ``data.public_size == 0``, else ``"public-half"``."""
        return "private-only" if self.data.public_size == 0 else "public-half"

    @property
    def private(self) -> bool:
        """Whether the run is private (ε finite)."""
        return not math.isinf(self.epsilon)

    def with_settings(self, **dotted: Any) -> "MainJobConfig":
        """A copy with the given settings (dotted names, or leaf names that occur in one stage only)."""
        return _apply(self, dotted)

    def resolved(self) -> "MainJobConfig":
        """The settings a run uses: the ``quick`` reductions and the protocol's defaults applied, validated.

        Raises:
            ValueError: a value out of range or a setting the protocol or method does not take (named).
        """
        return resolve(self)


_STAGES = ("data", "representation", "generation", "evaluation")
_TOP = tuple(f.name for f in fields(MainJobConfig) if f.name not in _STAGES)


def setting_names() -> List[str]:
    """Every setting's dotted name, e.g. ``["epsilon", ..., "generation.step_size", ...]``."""
    out = list(_TOP)
    for stage in _STAGES:
        cls = type(getattr(MainJobConfig(), stage))
        out += [f"{stage}.{f.name}" for f in fields(cls)]
    return out


def _full_name(name: str) -> str:
    names = setting_names()
    key = name.strip().replace("-", "_")
    if key in names:
        return key
    hits = [n for n in names if n.rpartition(".")[2] == key]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ValueError(f"setting {name!r} is ambiguous: write one of {hits}")
    raise ValueError(f"{name!r} is not a setting of the main job (see fastdpot.experiments.mainjob.config."
                     f"setting_names())")


def _apply(cfg: MainJobConfig, dotted: Dict[str, Any]) -> MainJobConfig:
    top, staged = {}, {s: {} for s in _STAGES}
    for name, value in dotted.items():
        full = _full_name(name)
        stage, _, leaf = full.rpartition(".")
        (staged[stage] if stage else top)[leaf] = value
    kw = {s: replace(getattr(cfg, s), **v) for s, v in staged.items() if v}
    return replace(cfg, **top, **kw)


def flat_settings(cfg: MainJobConfig) -> Dict[str, Any]:
    """``{dotted name: value}`` of every setting (``config.json``, the tuning tables)."""
    d = asdict(cfg)
    out = {k: d[k] for k in _TOP}
    for stage in _STAGES:
        out.update({f"{stage}.{k}": v for k, v in d[stage].items()})
    return out


def _value(text: str):
    t = text.strip()
    low = t.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if low in ("inf", "+inf"):
        return math.inf
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def parse_settings(specs: Sequence[str], *, grid: bool = False) -> Dict[str, Any]:
    """``["generation.step_size=0.3", "epsilon=10"]`` -> ``{"generation.step_size": 0.3, "epsilon": 10}``.

    Values are parsed as None / bool / inf / int / float / string. With ``grid=True`` each value is a comma-separated
    list (``step_size=0.1,0.3`` -> ``{"generation.step_size": [0.1, 0.3]}``); without, the value is taken whole
    (``evaluation.classifiers=logreg,mlp`` is one value).

    Raises:
        ValueError: a spec without ``=``, an unknown or ambiguous name, a name given twice, an empty value list.
    """
    out: Dict[str, Any] = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"settings are NAME=VALUE{',VALUE...' if grid else ''}, got {spec!r}")
        key, val = spec.split("=", 1)
        full = _full_name(key)
        if full in out:
            raise ValueError(f"setting {full!r} given twice")
        if grid:
            values = [_value(v) for v in val.split(",") if v.strip()]
            if not values:
                raise ValueError(f"setting {full!r} has no values")
            out[full] = values
        else:
            out[full] = _value(val)
    return out


def check_stage_settings(c: MainJobConfig) -> None:
    """The checks that hold for both protocols (called by :meth:`MainJobConfig.resolved`)."""
    g, r, e, d = c.generation, c.representation, c.evaluation, c.data
    check_epsilon(c.epsilon, "epsilon", allow_inf=True)
    if c.delta is not None:
        check_delta(c.delta)
    check_int(c.seed, "seed", 0)
    check_choice(c.device.split(":")[0], "device", ("cpu", "cuda"))
    for name, v in (("replayable_noise", c.replayable_noise), ("quick", c.quick),
                    ("generation.class_conditional", g.class_conditional), ("generation.decode_on_sphere",
                                                                           g.decode_on_sphere),
                    ("generation.each_seed_at_epsilon", g.each_seed_at_epsilon),
                    ("evaluation.cnn_augment", e.cnn_augment)):
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be True or False, got {v!r}")
    if g.method is not None:
        check_choice(g.method, "method", METHODS)
    check_int(g.batch_size, "batch_size")
    check_positive(g.epochs, "epochs")
    if g.epochs > MAX_FLOW_STEPS:  # T = epochs·n/B >= epochs flow steps
        raise ValueError(f"epochs = {g.epochs:g} makes at least {g.epochs:.3g} flow steps (T = epochs·n/B, B <= n): "
                         f"{steps_duration(g.epochs)}; a run takes at most {MAX_FLOW_STEPS:.0e} steps")
    check_int(g.flow_seeds, "flow_seeds")
    check_int(g.checkpoint_every, "checkpoint_every")
    check_nonnegative(g.diffusion, "diffusion")
    check_choice(g.spread, "spread", ("public", "flow"))
    check_choice(g.directions, "directions", ("orthogonal", "uniform"))
    check_choice(g.init, "init", INIT_KINDS)
    if g.init_scale is not None:
        check_positive(g.init_scale, "init_scale")
    check_choice(g.center, "center", ("public", "none"))
    check_choice(g.release, "release", ("points", "sketch"))
    check_positive(g.label_scale, "label_scale")
    for name in ("num_particles", "num_projections", "sketch_bins"):
        v = getattr(g, name)
        if v is not None:
            check_int(v, name, 2 if name == "num_particles" else 1)
    if g.step_size is not None:
        check_positive(g.step_size, "step_size")
    if r.latent_dim is not None:
        check_int(r.latent_dim, "latent_dim", 2)
    check_int(r.ae_epochs, "ae_epochs")
    if r.ae_width is not None:
        check_int(r.ae_width, "ae_width")
        if r.ae_arch == "conv":
            raise ValueError("ae_width does not apply to ae_arch='conv' (fixed width); leave it None")
    if r.ae_arch is not None:
        check_choice(r.ae_arch, "ae_arch", AE_ARCHS)
    if r.share is not None:
        check_probability(r.share, "representation_share", low_open=True, high_open=True)
    if e.fid_samples != 0:  # 0: no FID
        check_int(e.fid_samples, "fid_samples", 2)
    check_int(e.fid_real, "fid_real", 2)
    check_int(e.cnn_epochs, "cnn_epochs")
    check_choice(e.cnn_arch, "cnn_arch", CNN_ARCHS)
    for v in [v.strip() for v in str(e.classifiers or "").split(",") if v.strip()]:
        check_choice(v, "classifiers", CLASSIFIERS)
    for name in ("max_train", "max_test"):
        if getattr(d, name) is not None:
            check_int(getattr(d, name), name)
    if d.public_size is not None:
        check_int(d.public_size, "public_size", 0)


_DEFAULTS = dict(data=DataSettings(), representation=RepresentationSettings(), generation=GenerationSettings())


def _changed(cfg: MainJobConfig, names):
    return [f"{s}.{n}" for s, n in names if getattr(getattr(cfg, s), n) != getattr(_DEFAULTS[s], n)]


def _quick(c: MainJobConfig) -> MainJobConfig:
    d, r, g, e = c.data, c.representation, c.generation, c.evaluation
    return replace(
        c,
        data=replace(d, max_train=min(d.max_train or 4000, 4000), max_test=min(d.max_test or 1000, 1000),
                     validation_size=min(d.validation_size, 500)),
        representation=replace(r, ae_epochs=1, epochs=min(r.epochs, 1.0), batch_size=min(r.batch_size, 256)),
        generation=replace(g, epochs=min(g.epochs, 2.0), batch_size=min(g.batch_size, 100),
                           checkpoint_every=min(g.checkpoint_every, 10)),
        evaluation=replace(e, fid_samples=0 if e.fid_samples == EvaluationSettings.fid_samples else
                           min(e.fid_samples, 100), fid_real=min(e.fid_real, 100), cnn_epochs=min(e.cnn_epochs, 1)))


def _check_quick(cfg: MainJobConfig, quick: MainJobConfig) -> None:
    """Refuse a setting given explicitly that ``quick`` would lower: the run would ignore it."""
    default, given, short = flat_settings(MainJobConfig()), flat_settings(cfg), flat_settings(quick)
    lowered = [f"{k}={given[k]!r} to {short[k]!r}" for k in given if given[k] != default[k] and short[k] != given[k]]
    if lowered:
        raise ValueError(f"quick (--quick, a short run) lowers {', '.join(lowered)}: this run would ignore "
                         f"{'them' if len(lowered) > 1 else 'it'}; drop --quick for the full run, or the setting")


def resolve(cfg: MainJobConfig) -> MainJobConfig:
    """See :meth:`MainJobConfig.resolved`."""
    check_stage_settings(cfg)
    private_only = cfg.protocol == "private-only"
    wrong = _changed(cfg, PUBLIC_HALF_SETTINGS if private_only else PRIVATE_ONLY_SETTINGS)
    if wrong:
        raise ValueError(f"{', '.join(wrong)} {'apply' if len(wrong) > 1 else 'applies'} to the "
                         f"{'public-half' if private_only else 'private-only'} protocol only "
                         f"({'public_size > 0 or None' if private_only else 'public_size=0, --public-size 0'}); "
                         f"this run would ignore {'them' if len(wrong) > 1 else 'it'}")
    c = _quick(cfg) if cfg.quick else cfg
    if cfg.quick:
        _check_quick(cfg, c)
    g, r = c.generation, c.representation
    g = replace(g, method=g.method or ("oneshot" if private_only else "flow"))
    if g.method != "oneshot":
        given = [f"generation.{n}" for n in ONESHOT_SETTINGS if getattr(g, n) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to method='oneshot' only; this run ({g.method!r}) would "
                             f"ignore {'them' if len(given) > 1 else 'it'}")
    if g.method in ("gaussian", "public", "decoded"):
        ignored = _changed(cfg, FLOW_ONLY_SETTINGS)
        if ignored:
            raise ValueError(f"{', '.join(ignored)} set the per-step flow (method='flow'), which method {g.method!r} "
                             f"does not run; this run would ignore {'them' if len(ignored) > 1 else 'it'}")
    if g.each_seed_at_epsilon and (g.flow_seeds == 1 or not c.private or g.method in ("public", "decoded")):
        raise ValueError("each_seed_at_epsilon calibrates each of flow_seeds > 1 private seeds alone at epsilon; this "
                         "run (" + ("flow_seeds=1" if g.flow_seeds == 1 else "epsilon=inf" if not c.private else
                                    f"method={g.method!r}, which spends nothing") + ") would ignore it")
    if private_only and g.method == "decoded" and c.private:
        raise ValueError(f"method='decoded' is an ANALYSIS that reads the sensitive images without noise: it runs only "
                         f"with epsilon=inf (--epsilon inf), not at epsilon={c.epsilon:g}, so that nothing names it a "
                         f"private run")
    if private_only and c.data.max_train is not None and not c.data.validation_size < c.data.max_train:
        raise ValueError(f"validation_size must be < max_train = {c.data.max_train} (the validation split is taken "
                         f"from the training set, the rest is the sensitive set), got {c.data.validation_size}")
    if private_only:  # the ε table's row, where a setting was not given
        row = table_row(c.epsilon, c.data)
        kind = r.kind or ("pixels" if g.method == "oneshot" else "pca")
        if g.method == "oneshot":
            g = replace(g, **{k: v for k, v in row["generation"].items() if getattr(g, k) is None})
            if g.sketch_block_directions is not None and cfg.generation.sketch_rotations is None:
                g = replace(g, sketch_rotations=0)  # the row's rotations need full patch blocks (one block size)
            if c.quick:  # a short run: two passes over the whole-image and 7-px blocks
                given, lowered = cfg.generation, []  # what it would lower of the settings given
                if (given.sketch_rounds or 0) > QUICK_SKETCH_ROUNDS:
                    lowered.append(f"sketch_rounds={given.sketch_rounds!r}")
                if given.sketch_blocks == "default":
                    lowered.append("sketch_blocks='default'")
                if lowered:
                    raise ValueError(f"quick (--quick, a short run) runs at most {QUICK_SKETCH_ROUNDS} sketch_rounds "
                                     f"on the blocks {QUICK_SKETCH_BLOCKS!r}: this run would ignore "
                                     f"{', '.join(lowered)}; drop --quick for the full run, or the setting")
                g = replace(g, sketch_rounds=min(g.sketch_rounds, QUICK_SKETCH_ROUNDS),
                            sketch_blocks=QUICK_SKETCH_BLOCKS if g.sketch_blocks == "default" else g.sketch_blocks)
            if kind != "pixels":
                raise ValueError(f"method='oneshot' runs in pixel space: representation kind 'pixels', got {kind!r}")
        if kind == "pixels":  # no DP representation: its settings would be ignored
            ignored = _changed(cfg, _DP_REPRESENTATION)
            if ignored:
                raise ValueError(f"{', '.join(ignored)} set the DP representation, which representation kind "
                                 f"'pixels' (the one-shot method's) does not have; this run would ignore them")
        if g.method == "oneshot":
            ignored = _changed(cfg, _PER_STEP_FLOW)
            if ignored:
                raise ValueError(f"{', '.join(ignored)} set the per-step flow (method='flow'), which method "
                                 f"'oneshot' does not run; this run would ignore them")
        r = replace(r, kind=kind, **({k: v for k, v in row["representation"].items() if getattr(r, k) is None}
                                     if kind == "pca" else {}))
        if g.method == "flow":
            g = replace(g, **{k: v for k, v in row["flow"].items() if getattr(g, k) is None})
    if g.init_scale is None:  # the public-half protocol's (docs/mainjob/tuning.md)
        g = replace(g, init_scale=0.3)
    if c.delta is None and not private_only:  # private-only: DPImageBench's 1/(N ln N), set when N is known
        c = replace(c, delta=1e-5)
    if g.release == "sketch":
        bins = min(DEFAULT_SKETCH_BINS, g.batch_size) if g.sketch_bins is None else g.sketch_bins
        if bins > g.batch_size:
            raise ValueError(f"sketch_bins must be <= batch_size = {g.batch_size}, got {bins}")
        g = replace(g, sketch_bins=bins)
    elif g.sketch_bins is not None:
        raise ValueError(f"sketch_bins is only used with release='sketch', got sketch_bins={g.sketch_bins!r}")
    labels = g.labels
    if labels is None:  # secure by default: labels private for the flow (and in the private-only protocol)
        labels = "private" if g.method == "flow" or private_only else "public"
    if labels not in ("public", "private"):
        raise ValueError(f"labels must be one of ['public', 'private'], got {labels!r}")
    g = replace(g, labels=labels)
    if g.clip_radius is not None:
        check_positive(g.clip_radius, "clip_radius")
        if g.center != "public":
            raise ValueError("clip_radius applies to center='public' (with center='none' the codes are scaled "
                             "onto the unit sphere, r = 1)")
    if private_only:
        check_int(c.data.validation_size, "validation_size")
        if labels != "private":
            raise ValueError("public_size=0 (the private-only protocol) protects the labels: labels='private'")
        if g.method == "public":
            raise ValueError("method='public' needs public images; public_size=0 has none")
        if g.labels_from not in ("flow", "head"):
            raise ValueError(f"labels_from must be one of ['flow', 'head'], got {g.labels_from!r}")
        if g.labels_from == "head" and (r.kind != "autoencoder" or r.label_weight == 0):
            raise ValueError(f"labels_from='head' reads the label head of the DP auto-encoder (representation kind "
                             f"'autoencoder', rep_label_weight > 0); representation kind {r.kind!r} with "
                             f"rep_label_weight={r.label_weight:g} has none")
        if r.kind not in REPRESENTATION_KINDS:
            raise ValueError(f"representation kind must be one of {list(REPRESENTATION_KINDS)}, got {r.kind!r}")
        check_positive(r.scale, "rep_scale")
        for name in ("epochs", "clip_radius", "lr"):
            check_positive(getattr(r, name), f"rep_{name}")
        if r.epochs > MAX_FLOW_STEPS:  # DP-SGD's T = round(epochs·n/B) >= epochs steps: the flow's bound
            raise ValueError(f"rep_epochs = {r.epochs:g} makes at least {r.epochs:.3g} DP-SGD steps (T = "
                             f"round(epochs·n/B), B <= n): {steps_duration(r.epochs)}; a run takes at most "
                             f"{MAX_FLOW_STEPS:.0e} steps")
        check_int(r.batch_size, "rep_batch_size")
        if r.label_weight < 0:
            raise ValueError(f"rep_label_weight must be >= 0, got {r.label_weight!r}")
        if r.share is None:  # the auto-encoder's (the table gives DP-PCA's)
            r = replace(r, share=0.9)
        if g.method == "oneshot":
            check_positive(g.sketch_radius, "sketch_radius")
            check_int(g.sketch_rounds, "sketch_rounds")
            if g.sketch_block_directions is not None:
                check_int(g.sketch_block_directions, "sketch_block_directions")
            check_int(g.sketch_rotations, "sketch_rotations", 0)
            check_int(g.sketch_rotation_bins, "sketch_rotation_bins")
            check_choice(g.sketch_clamp, "sketch_clamp", SKETCH_CLAMPS)
            check_choice(g.sketch_shrink, "sketch_shrink", SKETCH_SHRINKS)
            check_probability(g.sketch_floor, "sketch_floor", low_open=False, high_open=True)
            check_choice(g.sketch_center, "sketch_center", SKETCH_CENTERS)
            check_probability(g.sketch_mean_share, "sketch_mean_share", low_open=True, high_open=True)
            if not 0 < g.step_size <= 1:
                raise ValueError(f"step_size of the one-shot flow must be in (0, 1], got {g.step_size!r}")
            from .oneshot import parse_blocks, parse_plan

            parse_blocks(g.sketch_blocks), parse_plan(g.sketch_plan)
    else:
        if labels == "private" and g.method != "flow":
            raise ValueError(f"labels='private' is a mode of the flow (method='flow'), got method={g.method!r}")
        if g.method in ("decoded", "oneshot"):
            raise ValueError(f"method={g.method!r} belongs to the private-only protocol (public_size=0)")
    classifiers = c.evaluation.classifiers
    if classifiers is None:  # the private-only protocol's report trains the CNN only (its 45-minute run)
        classifiers = "cnn" if private_only else "logreg,mlp,cnn"
    classifiers = ",".join(v.strip() for v in str(classifiers).split(",") if v.strip())
    return replace(c, generation=g, representation=r, evaluation=replace(c.evaluation, classifiers=classifiers))
