""":meth:`MainJobConfig.resolved`: the ``quick`` reductions, the protocol's defaults and the checks that a setting
belongs to the protocol and method it is given with (a setting the run would ignore is refused, named)."""
from __future__ import annotations

from dataclasses import replace

from ..._validate import check_int, check_positive
from .config import (DEFAULT_SKETCH_BINS, REPRESENTATION_KINDS, DataSettings, GenerationSettings,
                     MainJobConfig, RepresentationSettings, check_stage_settings)

__all__ = ["resolve", "PRIVATE_ONLY_SETTINGS", "PUBLIC_HALF_SETTINGS"]

#: settings that only the private-only protocol reads (``--public-size 0``)
PRIVATE_ONLY_SETTINGS = (("data", "validation_size"), ("representation", "kind"), ("representation", "scale"),
                         ("representation", "lowpass"), ("representation", "epochs"),
                         ("representation", "batch_size"), ("representation", "clip_radius"),
                         ("representation", "lr"), ("representation", "label_weight"), ("representation", "share"),
                         ("generation", "labels_from"))
#: settings that only the public-half protocol reads (its public auto-encoder and the post-processing of its codes;
#: ``ae_width`` is read by both auto-encoders, the public one and the DP one)
PUBLIC_HALF_SETTINGS = (("representation", "ae_arch"), ("representation", "ae_epochs"),
                        ("representation", "ae_max_train"),
                        ("generation", "center"), ("generation", "clip_radius"), ("generation", "spread"),
                        ("generation", "decode_on_sphere"))
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
        evaluation=replace(e, fid_samples=min(e.fid_samples, 100), fid_real=min(e.fid_real, 100),
                           cnn_epochs=min(e.cnn_epochs, 1)))


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
    g, r = c.generation, c.representation
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
        if r.kind not in REPRESENTATION_KINDS:
            raise ValueError(f"representation kind must be one of {list(REPRESENTATION_KINDS)}, got {r.kind!r}")
        check_positive(r.scale, "rep_scale")
        for name in ("epochs", "clip_radius", "lr"):
            check_positive(getattr(r, name), f"rep_{name}")
        check_int(r.batch_size, "rep_batch_size")
        if r.label_weight < 0:
            raise ValueError(f"rep_label_weight must be >= 0, got {r.label_weight!r}")
        if r.share is None:  # tuned on the validation split (docs/mainjob-private.md)
            r = replace(r, share=0.3 if r.kind == "pca" else 0.9)
    else:
        if labels == "private" and g.method != "flow":
            raise ValueError(f"labels='private' is a mode of the flow (method='flow'), got method={g.method!r}")
        if g.method == "decoded":
            raise ValueError("method='decoded' (an analysis of the representation) belongs to public_size=0")
    classifiers = ",".join(v.strip() for v in str(c.evaluation.classifiers).split(",") if v.strip())
    return replace(c, generation=g, representation=r, evaluation=replace(c.evaluation, classifiers=classifiers))
