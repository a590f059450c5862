"""Checks shared by the library's generator trainers (:func:`fastdpot.dpswgen.train_dpswgen`,
:func:`fastdpot.dp_sinkhorn.train_dp_sinkhorn`, :func:`fastdpot.ldp.train_generator`): the caller's generator module
is refused before any private release when it cannot be trained or maps latents to rows of the wrong shape."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ._validate import check_int

__all__ = ["check_generator_model", "check_generator_output", "model_dtype_device"]


def check_generator_model(model, name: str = "model", attrs: Sequence[str] = ("latent_dim",), *,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> nn.Module:
    """Refuse a generator module the trainers cannot train: not an ``nn.Module``, an integer attribute of ``attrs``
    missing or < 1, no trainable parameter, floating parameters of another dtype or on another device than the data.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``. ValueError: the rest, naming the attribute or the fix.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module (the generator to train), got {type(model).__name__}")
    for attr in attrs:
        if not hasattr(model, attr):
            raise ValueError(f"{name} must have an integer attribute {attr!r} (the trainers read it), "
                             f"{type(model).__name__} has none")
        check_int(getattr(model, attr), f"{name}.{attr}")
    params = [q for q in model.parameters() if q.requires_grad]
    if not params:
        raise ValueError(f"{name} has no trainable parameter (requires_grad=True): nothing to train")
    for q in params:
        if dtype is not None and q.is_floating_point() and q.dtype != dtype:
            raise ValueError(f"{name}'s parameters are {q.dtype} but the data are {dtype}; convert one of them "
                             f"(e.g. {name}.to({dtype}))")
        if device is not None and q.device != device:
            raise ValueError(f"{name}'s parameters are on {q.device} but the data are on {device}; move one of "
                             f"them (e.g. {name}.to({str(device)!r}))")
    return model


def check_generator_output(model: nn.Module, inputs: Sequence[torch.Tensor], row_shape: Sequence[int], name: str,
                  what: str, *, flat: bool = False) -> None:
    """Run ``model(*inputs)`` once (eval mode, no grad, training mode restored) and refuse an output that is not
    (len(inputs[0]), *row_shape) (``flat``: whose rows, flattened, are not). ``inputs`` hold no random draw: the
    check changes no generator's state."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        model.train(was)
    want = (inputs[0].shape[0],) + tuple(row_shape)
    if isinstance(out, torch.Tensor) and flat and out.dim() >= 1:
        out = out.reshape(out.shape[0], -1)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{name} must map {what} to rows of shape {want}, got {got}")


def model_dtype_device(model: nn.Module):
    """``(dtype, device)`` of a generator's first parameter (its dtype: the default float dtype when that parameter is
    not floating)."""
    q = next(model.parameters())
    return (q.dtype if q.is_floating_point() else torch.get_default_dtype()), q.device
