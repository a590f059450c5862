"""Primitives of the ``cuda`` backend: row sorts with 32-bit indices and the histogram passes, on torch tensors.

Two implementations with one interface, so the step that uses them (``kernels/flow_step.py``, ``kernels/dpswd.py``)
is written once and tested on any machine:

* :data:`CUB` -- ``fastdpot._C_cuda_flow`` (``csrc/cuda/flow.cu``): CUB radix argsorts of float32 keys with uint32
  indices, shared-memory histogram counting and transport. CUDA tensors (float32; the histogram passes take float64
  too); built only where nvcc and a CUDA torch exist (see ``setup.py``).
* :data:`TORCH` -- the same contracts in plain torch (``torch.sort(stable=True)``, ``scatter_add_``, ``gather``):
  the reference that the CUDA primitives are tested against, and what runs the step's ``cuda`` code path on CPU under
  ``TRITON_INTERPRET=1`` in the tests.

Contracts (``rows`` x ``n`` tensors, C-contiguous):

* ``argsort_rows_(keys, idx, per_row=None)`` sorts every row of the float32 ``keys`` ascending in place, stably,
  and writes into the int32 ``idx`` the original column of every sorted position. ``per_row``: CUB's strategy (one
  onesweep sort per row, or one segmented sort; default by row length, :data:`PER_ROW_MIN_N`); the result does not
  depend on it.
* ``hist_count(s, lo, width, num_bins)`` -> int32 (rows, B) counts of ``s`` in B equal bins ``[lo, lo + B width]``
  per row (``kernels/histogram.py``'s bins: values clamped into the first / last bin).
* ``hist_coef_(s, lo, width, hist, cum, q)``: ``s <- s - T(s)`` in place, T the linear interpolation of the sorted
  private row ``q`` (rows, M) at position ``u (M - 1)``, u the histogram-CDF level ``(cum_b + frac n_b) / n``
  (:func:`fastdpot.reference.flow.histogram_levels`).
"""
from __future__ import annotations

import torch

from ._ext import _try_import
from .reference.flow import histogram_bins, target_at as _target_at

__all__ = ["CUB", "TORCH", "cuda_status", "PER_ROW_MIN_N", "MAX_HIST_BINS"]

#: rows of at least this length are sorted one at a time with CUB's onesweep radix sort (the whole GPU on one row);
#: shorter rows in one segmented sort (one thread block per row)
PER_ROW_MIN_N = 1 << 20
#: most bins the shared-memory histogram transport takes (two int32 tables of B entries in 48 KB)
MAX_HIST_BINS = 6144


def cuda_status():
    """``(available, reason)`` of the CUDA primitives: the compiled module and a CUDA device."""
    mod, err = _try_import("fastdpot._C_cuda_flow")
    if mod is None:
        return False, (f"the CUDA extension fastdpot._C_cuda_flow is not built ({err}); build it on a machine with "
                       f"the CUDA toolkit and a CUDA torch: `pip install --no-build-isolation -e .`")
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    return True, None


def _check_rows(keys, idx):
    if keys.dim() != 2 or idx.shape != keys.shape or idx.device != keys.device:
        raise ValueError(f"keys and idx must be (rows, n) of one shape on one device, got {tuple(keys.shape)}, "
                         f"{tuple(idx.shape)}")
    if not (keys.is_contiguous() and idx.is_contiguous()):
        raise ValueError("keys and idx must be contiguous")
    if keys.dtype != torch.float32 or idx.dtype != torch.int32:
        raise ValueError(f"keys must be float32 and idx int32, got {keys.dtype}, {idx.dtype}")


def _check_hist(s, lo, width, num_bins, hist=None, cum=None, q=None):
    """Shapes, dtypes and layout of the histogram passes' arguments (the CUDA kernels read raw pointers)."""
    if s.dim() != 2 or s.dtype not in (torch.float32, torch.float64) or not s.is_contiguous():
        raise ValueError(f"s must be a contiguous (rows, n) float32/float64 tensor, got {tuple(s.shape)} {s.dtype}")
    rows = s.shape[0]
    if int(num_bins) < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    for name, t in (("lo", lo), ("width", width)):
        if t.shape != (rows,) or t.dtype != s.dtype or not t.is_contiguous() or t.device != s.device:
            raise ValueError(f"{name} must be a contiguous ({rows},) {s.dtype} tensor on {s.device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")
    for name, t, dt in (("hist", hist, torch.int32), ("cum", cum, torch.int64)):
        if t is not None and (t.shape != (rows, num_bins) or t.dtype != dt or not t.is_contiguous()
                              or t.device != s.device):
            raise ValueError(f"{name} must be a contiguous ({rows}, {num_bins}) {dt} tensor on {s.device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")
    if q is not None and (q.dim() != 2 or q.shape[0] != rows or q.shape[1] < 1 or q.dtype != s.dtype
                          or not q.is_contiguous() or q.device != s.device):
        raise ValueError(f"q must be a contiguous ({rows}, M >= 1) {s.dtype} tensor on {s.device}, got "
                         f"{tuple(q.shape)} {q.dtype} on {q.device}")


class _Torch:
    """Reference implementations (any device)."""

    name = "torch"

    @staticmethod
    def argsort_rows_(keys, idx, per_row=None):
        _check_rows(keys, idx)  # per_row (CUB's sort strategy) changes nothing here
        res = torch.sort(keys, dim=1, stable=True)
        keys.copy_(res.values)
        idx.copy_(res.indices)
        return keys, idx

    @staticmethod
    def hist_count(s, lo, width, num_bins):
        _check_hist(s, lo, width, num_bins)
        b, _ = histogram_bins(s, lo[:, None], width[:, None], num_bins)
        hist = torch.zeros(s.shape[0], num_bins, dtype=torch.int32, device=s.device)
        return hist.scatter_add_(1, b, torch.ones_like(b, dtype=torch.int32))

    @staticmethod
    def hist_coef_(s, lo, width, hist, cum, q):
        _check_hist(s, lo, width, hist.shape[1] if hist.dim() == 2 else -1, hist, cum, q)
        b, frac = histogram_bins(s, lo[:, None], width[:, None], hist.shape[1])
        u = (cum.gather(1, b).to(s.dtype) + frac * hist.gather(1, b).to(s.dtype)) / s.shape[1]
        s.sub_(_target_at(q.t(), u.t()).t())  # the reference's interpolation works on columns
        return s


class _Cub:
    """``fastdpot._C_cuda_flow`` on CUDA tensors (enqueued on the current stream)."""

    name = "cub"

    @staticmethod
    def _mod():
        mod, err = _try_import("fastdpot._C_cuda_flow")
        if mod is None:
            raise RuntimeError(cuda_status()[1])
        return mod

    @staticmethod
    def argsort_rows_(keys, idx, per_row=None):
        _check_rows(keys, idx)
        if not keys.is_cuda:
            raise ValueError("the CUB sort needs CUDA tensors")
        mod = _Cub._mod()
        rows, n = keys.shape
        if per_row is None:
            per_row = rows == 1 or n >= PER_ROW_MIN_N
        span = n if per_row else rows * n
        dev = keys.device
        alt_k = torch.empty(span, dtype=keys.dtype, device=dev)
        alt_i = torch.empty(span, dtype=idx.dtype, device=dev)
        offsets = None if per_row else torch.arange(0, (rows + 1) * n, n, dtype=torch.int64, device=dev)
        with torch.cuda.device(dev):
            nbytes = mod.argsort_temp_bytes(n, rows, per_row)
            temp = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=dev)
            mod.argsort_rows(keys.data_ptr(), alt_k.data_ptr(), idx.data_ptr(), alt_i.data_ptr(), n, rows,
                             bool(per_row), 0 if offsets is None else offsets.data_ptr(), temp.data_ptr(),
                             int(nbytes), torch.cuda.current_stream(dev).cuda_stream)
        return keys, idx

    @staticmethod
    def hist_count(s, lo, width, num_bins):
        _check_hist(s, lo, width, num_bins)
        mod = _Cub._mod()
        hist = torch.zeros(s.shape[0], num_bins, dtype=torch.int32, device=s.device)
        with torch.cuda.device(s.device):
            mod.hist_count(_dtype_name(s), s.data_ptr(), s.shape[1], s.shape[0], lo.data_ptr(), width.data_ptr(),
                           int(num_bins), hist.data_ptr(), torch.cuda.current_stream(s.device).cuda_stream)
        return hist

    @staticmethod
    def hist_coef_(s, lo, width, hist, cum, q):
        _check_hist(s, lo, width, hist.shape[1] if hist.dim() == 2 else -1, hist, cum, q)
        mod = _Cub._mod()
        with torch.cuda.device(s.device):
            mod.hist_coef(_dtype_name(s), s.data_ptr(), s.shape[1], s.shape[0], lo.data_ptr(), width.data_ptr(),
                          hist.data_ptr(), cum.data_ptr(), q.data_ptr(), q.shape[1], hist.shape[1],
                          torch.cuda.current_stream(s.device).cuda_stream)
        return s


def _dtype_name(t):
    """The kernels' name of ``t``'s dtype (already checked by :func:`_check_hist`); CUDA tensors only."""
    if not t.is_cuda:
        raise ValueError(f"the CUDA histogram passes take CUDA tensors, got a tensor on {t.device}")
    return "float32" if t.dtype == torch.float32 else "float64"


CUB = _Cub()
TORCH = _Torch()
