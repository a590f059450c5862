"""Class-conditional DP sliced-Wasserstein flows (:class:`ClassConditionalFlow`).

Two modes: ``label_privacy="private"`` (default) runs one flow on labelled rows
(:class:`fastdpot.flows.LabelledRowsFlow`), so labels and class sizes are protected; ``label_privacy="public"`` runs
one :class:`~fastdpot.flows.DPSlicedWassersteinFlow` per label (parallel composition, labels and class sizes assumed
public), sharded over a process group when one is given.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from .._checkpoint import (CheckpointError, atomic_save, check_checkpoint_every, check_checkpoint_path,
                           generator_state, load_checkpoint, require_state)
from .._random import draw_seed, make_generator
from .._validate import check_choice, check_int, check_positive, check_tensor
from .flow import DPSlicedWassersteinFlow
from .init import INIT_KINDS
from .allocation import allocate_particles
from .labelled import LabelledRowsFlow, label_rows
from .sharded import make_flow

__all__ = ["ClassConditionalFlow"]


def _check_labels(private_data, labels, values: bool = True):
    """Shape and dtype of the labels (public properties); with ``values``, also that they are >= 0 (only where
    labels are public: the label-private mode never reads a label value to decide whether to run)."""
    check_tensor(private_data, "private_data", 2)
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.shape[0] != private_data.shape[0]:
        raise ValueError(f"labels must be a 1-D tensor of length {private_data.shape[0]}, got "
                         f"{getattr(labels, 'shape', labels)!r}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    labels = labels.long()
    if values and bool((labels < 0).any()):
        raise ValueError("labels must be >= 0")
    return labels


class ClassConditionalFlow:
    """Class-conditional DP flows, in one of two modes chosen by ``label_privacy``.

    * ``"private"`` (default): labels and class sizes are protected. ONE flow
      (:class:`fastdpot.flows.LabelledRowsFlow`) runs on the rows ``[clip_r(x), c·e_y]`` in R^{d+C}, built
      inside the step; a particle's label is the argmax of its label block, read at the end (post-processing).
      Guarantee: (ε, δ)-DP for neighbouring data sets that differ by the **replacement of one record (x, y) by any
      (x', y'), its label free to change** (n public); sensitivity Δ = sqrt(4r² + 2c²)·sqrt(⌈k/(d+C)⌉) (orthogonal
      directions; the tail bound at dimension d + C for uniform ones), proof in :mod:`fastdpot.flows.labelled`. Nothing
      is computed from the private class counts: B, q = B/n, T, z, σ and Δ depend on n only; the particles per
      class at the start are equal or given (public), and the generated class proportions come out of the flow.
      ``num_classes`` (the label domain) must be given.
    * ``"public"``: one :class:`DPSlicedWassersteinFlow` per label, each on its own label partition. Guarantee: the
      partitions are disjoint, so by parallel composition the whole release is (ε, δ)-DP with the ε, δ of one
      class flow, for neighbouring data sets that differ in one row's features with its label unchanged
      (label-preserving replace-one). The labels and the class sizes n_c are assumed PUBLIC: they set each class's
      sample rate q_c = B/n_c, its noise multiplier and, with ``particles_per_class="proportional"``, its particle
      count, none of which is noised. Under the standard relations (add/remove one (x, y) record, or replace one
      with its label free to change) this mode could reveal the labels and class sizes: that is NOT covered
      (ε = ∞ for the label). :meth:`run` prints nothing computed from n_c.

    Args:
        num_particles: total N, split over classes by ``particles_per_class``.
        dim, num_projections, step_size: as :class:`DPSlicedWassersteinFlow` (``dim`` = d, the features; in the
            private mode the k directions live in R^{d+C}).
        num_classes: number of labels C (public mode default: ``labels.max() + 1`` at the first run; required in
            the private mode).
        particles_per_class: ``"proportional"`` (public mode only, its default: to the class counts of the private
            labels, largest-remainder rounding, at least 2 each), ``"equal"`` (the private mode's default), or a
            sequence of C public integers (then ``num_particles`` is ignored). In the private mode these are the
            particles that START in each class (their label block at c·e_y); the flow may move them.
        label_privacy: ``"private"`` (default) or ``"public"``, see above.
        label_scale: c > 0, the length of the label block in the private mode (public; larger c separates the
            classes but raises Δ; unused and refused in the public mode unless 1).
        generator: master generator of the public draws; each flow gets its own generator seeded from it.
        secure_mode: passed to every flow (default True: privacy draws from the operating system).
        init, init_scale: data-independent start of every flow (of the feature block in the private mode), drawn
            from that flow's generator (:func:`draw_init`, s = ``init_scale`` > 0): ``"gaussian"`` (default,
            N(0, s²·I_d)), ``"sphere"`` (uniform on the sphere of radius s) or ``"gaussian_scaled"``
            (N(0, (s²/d)·I_d)). Tensors are not accepted here (give one to each :class:`DPSlicedWassersteinFlow`
            instead).
        **flow_kwargs: every other :class:`DPSlicedWassersteinFlow` argument (``target_epsilon``, ``steps``,
            ``batch_size``, ...), shared by all flows. ``process_group=pg`` (with ``data_rank``) shards every class
            flow over ``pg`` in the public mode (:class:`fastdpot.flows.DistributedSlicedWassersteinFlow`: data and
            labels on the data rank only, the class counts broadcast from it); the private mode does not take a
            process group yet.

    Shape:
        private_data (n, d); labels (n,) integers in [0, C). :meth:`run` returns ``(samples (N, d), labels (N,))``.

    Raises:
        ValueError: bad sizes or ``particles_per_class``, ``init`` not one of :data:`INIT_KINDS`, ``init_scale``
            <= 0, one of ``num_particles, dim, num_projections, step_size`` repeated in ``flow_kwargs``, counts of
            ``particles_per_class`` that do not sum to ``num_particles``,
            ``label_privacy`` not ``"private"``/``"public"``, in the private mode ``num_classes`` missing or
            ``particles_per_class="proportional"`` (it reads the private class counts), ``label_scale`` <= 0 (or
            != 1 in the public mode).

    References:
        Sebag et al., "Differentially Private Gradient Flow based on the Sliced Wasserstein Distance", TMLR.
    """

    def __init__(self, num_particles: int, dim: int, num_projections: int, step_size: float, *,
                 num_classes: Optional[int] = None,
                 particles_per_class: Union[None, str, Sequence[int]] = None,
                 generator: Optional[torch.Generator] = None, init: str = "gaussian", init_scale: float = 1.0,
                 secure_mode: bool = True, label_privacy: str = "private", label_scale: float = 1.0,
                 **flow_kwargs):
        if not isinstance(init, str) or init not in INIT_KINDS:
            raise ValueError(f"init of ClassConditionalFlow must be one of {list(INIT_KINDS)}, got "
                             f"{type(init).__name__ if isinstance(init, torch.Tensor) else repr(init)}")
        self.init = init
        self.init_scale = check_positive(init_scale, "init_scale")
        check_choice(label_privacy, "label_privacy", ("private", "public"))
        self.label_privacy = label_privacy
        self.label_scale = check_positive(label_scale, "label_scale")
        if label_privacy == "public" and self.label_scale != 1.0:
            raise ValueError(f"label_scale is only used with label_privacy='private', got {label_scale!r}")
        if particles_per_class is None:
            particles_per_class = "equal" if label_privacy == "private" else "proportional"
        if label_privacy == "private":
            if num_classes is None:
                raise ValueError("num_classes is required with label_privacy='private' (the label domain must be "
                                 "public; it is not read from the private labels)")
            if particles_per_class == "proportional":
                raise ValueError("particles_per_class='proportional' reads the private class counts; with "
                                 "label_privacy='private' give 'equal' or C public counts")
        self.num_particles = check_int(num_particles, "num_particles", 2)
        self.dim = check_int(dim, "dim", 1)
        self.num_projections = check_int(num_projections, "num_projections", 1)
        self.step_size = check_positive(step_size, "step_size")
        self.num_classes = None if num_classes is None else check_int(num_classes, "num_classes", 1)
        if isinstance(particles_per_class, str):
            check_choice(particles_per_class, "particles_per_class", ("proportional", "equal"))
        else:
            particles_per_class = [check_int(v, "particles_per_class[i]", 2) for v in particles_per_class]
            if sum(particles_per_class) != self.num_particles:
                raise ValueError(f"particles_per_class must sum to num_particles = {self.num_particles}, got "
                                 f"{sum(particles_per_class)}")
            if self.num_classes is not None and len(particles_per_class) != self.num_classes:
                raise ValueError(f"particles_per_class must have num_classes = {self.num_classes} entries, got "
                                 f"{len(particles_per_class)}")
        self.particles_per_class = particles_per_class
        for bad in ("num_particles", "dim", "num_projections", "step_size"):
            if bad in flow_kwargs:
                raise ValueError(f"{bad} cannot be passed through flow_kwargs of ClassConditionalFlow")
        self.flow_kwargs = flow_kwargs
        self._pg = flow_kwargs.get("process_group")
        if label_privacy == "private" and self._pg is not None:
            raise ValueError("process_group is not supported with label_privacy='private' yet (the one labelled-rows "
                             "flow is not sharded); use label_privacy='public' (labels and class sizes public) or "
                             "one process")
        if not isinstance(secure_mode, bool):
            raise ValueError(f"secure_mode must be a bool, got {secure_mode!r}")
        # validate flow_kwargs now (target_epsilon=-1, accountant='bogus', an unknown keyword ...), not at run():
        # a throwaway 2-particle one-process flow checks them as the class flows will (the process group is checked
        # by the class flows)
        local = {key: v for key, v in flow_kwargs.items() if key not in ("process_group", "data_rank")}
        DPSlicedWassersteinFlow(2, self.dim, self.num_projections, self.step_size, init="gaussian",
                                generator=torch.Generator(), secure_mode=False, **local)
        self.secure_mode = secure_mode
        self._generator = make_generator() if generator is None else generator
        self.flows: List[DPSlicedWassersteinFlow] = []

    def _class_particles(self, counts: torch.Tensor) -> List[int]:
        C = counts.numel()
        if not isinstance(self.particles_per_class, str):
            if len(self.particles_per_class) != C:
                raise ValueError(f"particles_per_class must have {C} entries, got {len(self.particles_per_class)}")
            return list(self.particles_per_class)
        if self.num_particles < 2 * C:
            raise ValueError(f"num_particles must be >= 2·num_classes = {2 * C}, got {self.num_particles}")
        # every class gets at least 2 particles, the rest in proportion (largest remainders)
        return allocate_particles(self.num_particles, "equal" if self.particles_per_class == "equal" else counts, C,
                                  minimum=2)

    def _build_private(self):
        """The label-private mode's one flow on embedded rows (nothing read from the private labels)."""
        C = self.num_classes
        sizes = (allocate_particles(self.num_particles, "equal", C, minimum=1 if self.num_particles >= C else 0) if isinstance(self.particles_per_class, str)
                 else list(self.particles_per_class))
        self.flows = [LabelledRowsFlow(sum(sizes), self.dim + C, self.num_projections, self.step_size,
                                       num_classes=C, label_scale=self.label_scale, class_particles=sizes,
                                       generator=make_generator(draw_seed(self._generator)), init=self.init,
                                       init_scale=self.init_scale, secure_mode=self.secure_mode, **self.flow_kwargs)]

    def _build_public(self, counts: torch.Tensor):
        """One flow per class (counts: the class sizes, public in this mode)."""
        C = counts.numel()
        self.num_classes = C
        if bool((counts == 0).any()):
            raise ValueError(f"every class needs private rows; empty classes: "
                             f"{torch.nonzero(counts == 0).flatten().tolist()}")
        sizes = self._class_particles(counts)
        self.flows = [make_flow(sizes[c], self.dim, self.num_projections, self.step_size,
                                generator=make_generator(draw_seed(self._generator)), init=self.init,
                                init_scale=self.init_scale, secure_mode=self.secure_mode, **self.flow_kwargs)
                      for c in range(C)]

    def run(self, private_data: Optional[torch.Tensor], labels: Optional[torch.Tensor], steps: Optional[int] = None,
            progress: bool = True, checkpoint_path: Optional[str] = None, checkpoint_every: Optional[int] = None):
        """Run every class flow on its partition (private mode: the one flow on the labelled rows); returns
        ``(samples (N, d), labels (N,))`` (sharded: this rank's rows; :meth:`gather_samples` gives all).

        Checkpoints (if ``checkpoint_path``) hold every class flow; :meth:`load` + :meth:`run` resumes where it
        stopped (classes already done are skipped when ``steps`` is None). Sharded (``process_group`` given):
        ``private_data`` and ``labels`` on the data rank, None on the others; ``checkpoint_path`` is a folder with
        one sub-folder per class flow. Every argument is checked before the first release.

        Raises:
            ValueError: bad data, labels of the wrong shape or dtype, a negative label or one outside [0, C)
                in the public mode (labels are public there), a class without rows or with fewer rows than the batch
                size (public mode), ``checkpoint_path`` not writable, ``checkpoint_every`` without ``checkpoint_path``.
                In the private mode no label VALUE stops the run: a label outside the public domain [0, C) is mapped
                to class 0 before the mechanism (:func:`fastdpot.flows.labelled.label_rows`).
        """
        checkpoint_every = check_checkpoint_every(checkpoint_every, checkpoint_path)  # before any class flow's step
        if self._pg is not None:
            return self._run_sharded(private_data, labels, steps, progress, checkpoint_path, checkpoint_every)
        labels = _check_labels(private_data, labels, values=self.label_privacy == "public")
        if checkpoint_path is not None:
            checkpoint_path = check_checkpoint_path(checkpoint_path)

        def ckpt(flow):
            if checkpoint_path is not None and checkpoint_every is not None and \
                    flow.steps_taken % checkpoint_every == 0:
                self.save(checkpoint_path)

        if self.label_privacy == "private":
            if private_data.shape[1] != self.dim:
                raise ValueError(f"private_data must have d={self.dim} columns, got shape "
                                 f"{tuple(private_data.shape)}")
            rows = label_rows(private_data, labels, self.num_classes)  # raw rows; bounded inside the flow's step
            if not self.flows:
                self._build_private()
            self.flows[0].run(rows, steps=steps, progress=progress, callback=ckpt,  # ε depends on n only
                              checkpoint_every=checkpoint_every)  # ckpt's cadence: what a crash may leave in flight
        else:
            C = self.num_classes if self.num_classes is not None else int(labels.max()) + 1
            if int(labels.max()) >= C:
                raise ValueError(f"labels must lie in [0, {C})")
            if not self.flows:
                self._build_public(torch.bincount(labels.cpu(), minlength=C))
            parts = [private_data[labels.to(private_data.device) == c] for c in range(C)]
            for c, (flow, part) in enumerate(zip(self.flows, parts)):  # every class's batch before any class steps
                if flow._mode is None and flow.config.sampled:
                    try:
                        flow.config.resolve_batch(part.shape[0])
                    except ValueError:
                        raise ValueError(f"class {c} has fewer private rows than the batch size (or sketch_bins); "
                                         f"lower batch_size, or use label_privacy='private'") from None
            for c, (flow, part) in enumerate(zip(self.flows, parts)):
                if progress:  # nothing computed from the private class size n_c
                    print(f"class {c} of {len(self.flows)}", flush=True)
                flow.run(part, steps=steps, progress=progress, callback=ckpt, progress_epsilon=False,
                         checkpoint_every=checkpoint_every)
        if checkpoint_path is not None:
            self.save(checkpoint_path)
        return self.samples()

    def _run_sharded(self, private_data, labels, steps, progress, checkpoint_path, checkpoint_every):
        """The public mode with every class flow sharded over the process group: the data rank checks the data
        and broadcasts the class counts (public in this mode); checkpoints go to ``checkpoint_path/class<c>``."""
        import os

        import torch.distributed as dist

        pg, data_rank = self._pg, self.flow_kwargs.get("data_rank", 0)
        rank = dist.get_rank(pg)
        src = dist.get_global_rank(pg, data_rank) if pg != dist.group.WORLD else data_rank
        msg = None
        if rank == data_rank:
            try:
                labels = _check_labels(private_data, labels)
                C = self.num_classes if self.num_classes is not None else int(labels.max()) + 1
                msg = torch.bincount(labels.cpu(), minlength=C).tolist()
            except (ValueError, TypeError) as e:
                msg = f"rank {rank}: {e}"
        elif private_data is not None or labels is not None:
            msg = f"rank {rank}: private_data and labels must be None off the data rank {data_rank}"
        errs = [None] * dist.get_world_size(pg)
        dist.all_gather_object(errs, msg if isinstance(msg, str) else "", group=pg)
        if any(errs):
            raise ValueError("; ".join(e for e in errs if e))
        box = [msg]
        dist.broadcast_object_list(box, src=src, group=pg)
        if not self.flows:
            self._build_public(torch.tensor(box[0], dtype=torch.long))
        for c, flow in enumerate(self.flows):
            part = private_data[labels.to(private_data.device) == c] if rank == data_rank else None
            if progress and rank == data_rank:
                print(f"class {c} of {len(self.flows)}", flush=True)
            flow.run(part, steps=steps, progress=progress, progress_epsilon=False, checkpoint_every=checkpoint_every,
                     checkpoint_path=None if checkpoint_path is None else os.path.join(checkpoint_path, f"class{c:03d}"))
        return self.samples()

    def gather_samples(self):
        """The full ``(samples (N, d), labels (N,))`` of sharded class flows, on every rank (a collective), class by
        class in global particle order; the same as :meth:`samples` in one process."""
        if self._pg is None:
            return self.samples()
        xs = [f.gather_particles() for f in self.flows]
        return torch.cat(xs), torch.cat([torch.full((x.shape[0],), c, dtype=torch.long) for c, x in enumerate(xs)])

    def samples(self):
        """``(samples (N, d), labels (N,))`` of the current particles (private mode: the feature block and the
        argmax of the label block; sharded: this rank's rows)."""
        if self.label_privacy == "private":
            return self.flows[0].labelled_samples()
        xs = [f.particles for f in self.flows]
        ys = [torch.full((f.particles.shape[0],), c, dtype=torch.long) for c, f in enumerate(self.flows)]
        return torch.cat(xs), torch.cat(ys)

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε of the whole release (parallel composition: the largest ε over the class flows)."""
        return max(f.epsilon(delta) for f in self.flows) if self.flows else 0.0

    def get_epsilon(self, delta: float) -> float:
        """ε at total δ = ``delta`` (Opacus' accountant interface; :meth:`epsilon`)."""
        return self.epsilon(delta)

    def state_dict(self):
        """Everything needed to resume: settings, the master generator's state and every class flow's
        ``state_dict`` (a private artefact: it holds the particles)."""
        return dict(kind="ClassConditionalFlow", num_particles=self.num_particles, dim=self.dim,
                    num_projections=self.num_projections, step_size=self.step_size, num_classes=self.num_classes,
                    particles_per_class=self.particles_per_class, init=self.init, init_scale=self.init_scale,
                    secure_mode=self.secure_mode, flow_kwargs=dict(self.flow_kwargs),
                    label_privacy=self.label_privacy, label_scale=self.label_scale,
                    generator=self._generator.get_state(), flows=[f.state_dict() for f in self.flows])

    def save(self, path: str) -> None:
        """``torch.save`` of :meth:`state_dict` (every class flow), written atomically; a private artefact.

        Raises:
            TypeError, ValueError: ``path`` not a path, a directory, or not writable (checked before writing).
        """
        atomic_save(self.state_dict(), path)

    @staticmethod
    def from_release(release, num_particles: Optional[int] = None, **kwargs):
        """Flows that read ONLY a one-shot release (:func:`fastdpot.privacy.class_sketch.release_class_sketch`):
        one :class:`fastdpot.flows.ReleasedTargetFlow` per class, particles per class from the released counts, at
        no further privacy cost (post-processing; their ``epsilon()`` is the release's, ``run()`` takes no private
        data). ``kwargs``: :class:`fastdpot.flows.ReleasedClassFlows`'.

        Returns:
            a :class:`fastdpot.flows.ReleasedClassFlows`; ``run(steps=T)`` gives ``(samples (N, d), labels (N,))``.
        """
        from .released import ReleasedClassFlows

        return ReleasedClassFlows(release, num_particles, **kwargs)

    @classmethod
    def load(cls, path: str, *, device="cpu", backend="auto") -> "ClassConditionalFlow":
        """Rebuild from :meth:`save` (``torch.load(weights_only=True)``: tensors and plain values only, nothing in the
        file runs; every class flow's state is checked as :meth:`fastdpot.flows.DPSlicedWassersteinFlow.load_state_dict`
        says).

        Raises:
            FileNotFoundError: no file at ``path``.
            fastdpot.flows.CheckpointError (a ValueError): ``path`` is a directory, the file is truncated / garbage,
                another kind of checkpoint, or holds an invalid state (the message names the file).
        """
        st = load_checkpoint(path, "ClassConditionalFlow")
        if isinstance(st, dict) and st.get("kind") not in (None, "ClassConditionalFlow"):
            raise CheckpointError(f"{path!r} is a single-flow checkpoint ({st['kind']}); load it with "
                                  f"{st['kind']}.load")
        keys = ("kind", "num_particles", "dim", "num_projections", "step_size", "num_classes", "particles_per_class",
                "init", "init_scale", "secure_mode", "flow_kwargs", "label_privacy", "label_scale", "generator",
                "flows")
        try:
            require_state(st, keys, "ClassConditionalFlow")
            if st["kind"] != "ClassConditionalFlow":
                raise ValueError(f"this is a {st['kind']!r} checkpoint; load it with {st['kind']}.load")
            if not isinstance(st["flow_kwargs"], dict) or not isinstance(st["flows"], list):
                raise ValueError("state['flow_kwargs'] must be a dict and state['flows'] a list")
            if not isinstance(st["secure_mode"], bool):
                raise ValueError(f"state['secure_mode'] must be a bool, got {st['secure_mode']!r}")
            generator_state(st["generator"])
        except ValueError as err:
            raise CheckpointError(f"ClassConditionalFlow checkpoint {path!r} is invalid: {err}") from err
        kw = dict(st["flow_kwargs"])
        kw.update(device=device, backend=backend)
        try:
            obj = cls(st["num_particles"], st["dim"], st["num_projections"], st["step_size"],
                      num_classes=st["num_classes"], particles_per_class=st["particles_per_class"],
                      generator=torch.Generator(device="cpu"), init=st["init"], init_scale=st["init_scale"],
                      secure_mode=st["secure_mode"], label_privacy=st["label_privacy"],
                      label_scale=st["label_scale"], **kw)
            flow_cls = LabelledRowsFlow if obj.label_privacy == "private" else DPSlicedWassersteinFlow
            expected = 1 if obj.label_privacy == "private" else obj.num_classes
            if st["flows"] and len(st["flows"]) != expected:  # a class flow dropped would drop its releases
                raise ValueError(f"state['flows'] must hold {expected} flow state(s) (or none before the first "
                                 f"run), got {len(st['flows'])}")
            flows = [flow_cls.from_state_dict(s, device=device, backend=backend) for s in st["flows"]]
        except (ValueError, TypeError) as err:
            raise CheckpointError(f"ClassConditionalFlow checkpoint {path!r} is invalid: {err}") from err
        obj._generator.set_state(st["generator"])
        obj.flows = flows
        return obj
