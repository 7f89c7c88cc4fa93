"""One training step without host syncs: autocast, scaled backward, fused optimizer step.

Every precision goes through a GradScaler: fp16 gets the usual dynamic loss
scale; bf16/fp32 get a fixed scale of 1 and use it only for its non-finite
check. With a fused optimizer, GradScaler hands ``grad_scale``/``found_inf``
to the optimizer kernel, which skips a step with inf/NaN gradients on the
device: no ``.item()``, so the step can run ahead of the GPU and be captured
in a CUDA graph. Losses are accumulated on the device and read back only at
log points.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EngineError
from .config import EngineConfig

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_optimizer(params, cfg: EngineConfig, device: torch.device) -> torch.optim.Optimizer:
    fused = device.type in ("cuda", "cpu")
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused)


def make_scaler(cfg: EngineConfig, device: torch.device) -> torch.amp.GradScaler:
    if cfg.precision == "fp16":
        return torch.amp.GradScaler(device.type)
    # scale 1 that (practically) never grows: only the sync-free inf/NaN skip is wanted
    return torch.amp.GradScaler(device.type, init_scale=1.0, growth_factor=2.0, growth_interval=2**30)


def autocast(cfg: EngineConfig, device: torch.device):
    if cfg.precision in _DTYPES:
        return torch.autocast(device.type, dtype=_DTYPES[cfg.precision])
    return contextlib.nullcontext()


@dataclass
class StepState:
    """Device-side running sums, read at log points (one host sync each time)."""

    loss_sum: torch.Tensor
    nonfinite: torch.Tensor
    micro_steps: int = 0

    @classmethod
    def zeros(cls, device: torch.device) -> "StepState":
        return cls(torch.zeros((), device=device), torch.zeros((), device=device, dtype=torch.int64))

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.nonfinite.zero_()
        self.micro_steps = 0


def logits_of(out) -> torch.Tensor:
    """The (N, classes) logits of a model's output: a tensor, or an output object with .logits (Hugging
    Face, timm wrappers). Anything else (Inception's (logits, aux) tuple, a dict) is refused by name:
    which part is the loss's, and with what weight, is the model's recipe, not a guess to make here."""
    logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        if logits.dim() != 2:   # cross_entropy would read (N, C, H, W) as per-pixel classes: a torch error
            raise EngineError(f"the model returned logits of shape {tuple(logits.shape)}, not (N, classes): the "
                              f"engine trains classifiers; pool and flatten in the model's head (e.g. "
                              f"nn.AdaptiveAvgPool2d(1) then nn.Flatten() before the last Linear)")
        return logits
    raise EngineError(f"the model returned {type(out).__name__}, not a logits tensor: the engine trains with "
                      f"cross-entropy on (N, classes) logits; wrap the model so that forward returns them "
                      f"(e.g. for Inception's aux output, return the main logits, or eval-mode outputs)")


class TrainStep:
    """forward+backward per micro-batch; optimizer step at the end of each accumulation window."""

    def __init__(self, model: nn.Module, optimizer, scaler, cfg: EngineConfig, device: torch.device) -> None:
        self.model, self.optimizer, self.scaler, self.cfg, self.device = model, optimizer, scaler, cfg, device
        self.state = StepState.zeros(device)

    def micro(self, images: torch.Tensor, labels: torch.Tensor, window: int, model: nn.Module | None = None) -> None:
        """Backward of loss / window; gradients accumulate until apply(). `model` overrides the module
        used for this micro-batch (the eager twin of a compiled model, sharing its parameters)."""
        with autocast(self.cfg, self.device):
            loss = F.cross_entropy(logits_of((model or self.model)(images)), labels)
        self.scaler.scale(loss / window).backward()
        detached = loss.detach().float()
        self.state.loss_sum.add_(torch.nan_to_num(detached, nan=0.0, posinf=0.0, neginf=0.0))
        self.state.nonfinite.add_((~torch.isfinite(detached)).long())
        self.state.micro_steps += 1

    def apply(self) -> None:
        """Clip (optional), step (skipped on device if any grad is inf/NaN), zero grads."""
        if self.cfg.clip_grad:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad, foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=False)  # keep grad buffers: static addresses for graphs

    def full(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        """A whole optimizer step on one batch (accum_steps == 1): what a CUDA graph captures."""
        self.micro(images, labels, 1)
        self.apply()
