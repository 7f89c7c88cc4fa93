"""torch.compile passthrough and whole-step CUDA graph capture with a named fallback.

A captured step replays forward, loss, backward and the optimizer update as
one graph launch: the host cost of a step drops from thousands of kernel
launches to one. Inputs are copied into static buffers with ``copy_``. What
breaks capture is found before capture: a host sync (found by running one
step under ``torch.cuda.set_sync_debug_mode("error")``), a shape different
from the captured one (the last partial batch runs eagerly), fp16 loss
scaling growth... Each fallback logs a warning that names the cause.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from .step import TrainStep

log = logging.getLogger("fastdata.engine")


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    if mode == "off":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)


def compiler_failed(e: BaseException) -> bool:
    """An error raised by torch.compile's machinery (dynamo, inductor, Triton's build of its launcher):
    no C/C++ compiler in a slim container, a Triton that does not match the driver, an operator the
    compiler cannot lower. Its message names the cause; eager mode then shows a model bug plainly."""
    mod = type(e).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor", "triton")) or "C compiler" in str(e)


def without_compile(model: nn.Module) -> nn.Module:
    """model with the torch.compile wrapper taken off (kept under DDP), the same parameters."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        if hasattr(model.module, "_orig_mod"):
            model.module = model.module._orig_mod
        return model
    return getattr(model, "_orig_mod", model)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under DDP and torch.compile wrappers (no `module.`/`_orig_mod.` keys)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def find_host_sync(step: TrainStep, images: torch.Tensor, labels: torch.Tensor) -> str | None:
    """Run one full step with sync debugging set to error; return the cause if it syncs.

    One plain step runs first: the first call of a compiled model compiles it, and the compiler
    (inductor's autotuning, cuDNN's algorithm search) syncs with the host, which is no property of
    the step (timm's resnet50 was refused capture for it). The caller undoes both steps."""
    step.full(images, labels)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step.full(images, labels)
        return None
    except RuntimeError as e:
        return str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class GraphedStep:
    """A TrainStep.full captured as one CUDA graph; call with batches of the captured shape."""

    def __init__(self, step: TrainStep, images: torch.Tensor, labels: torch.Tensor, warmup: int = 3) -> None:
        self.static_images, self.static_labels = images.clone(), labels.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            for _ in range(warmup):
                step.full(self.static_images, self.static_labels)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            step.full(self.static_images, self.static_labels)
        self.shape = tuple(images.shape)

    def matches(self, images: torch.Tensor) -> bool:
        return tuple(images.shape) == self.shape

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.static_images.copy_(images, non_blocking=True)
        self.static_labels.copy_(labels, non_blocking=True)
        self.graph.replay()


def try_capture(step: TrainStep, images: torch.Tensor, labels: torch.Tensor, accum_steps: int,
                distributed: bool) -> GraphedStep | None:
    """GraphedStep, or None with a warning that says why the step cannot be captured."""
    cause = None
    if not torch.cuda.is_available() or images.device.type != "cuda":
        cause = "no CUDA device"
    elif accum_steps != 1:
        cause = f"accum_steps={accum_steps} (a graph captures one whole optimizer step; raise batch size instead)"
    elif distributed:
        cause = "DDP all-reduce hooks are not captured here"
    else:
        cause = find_host_sync(step, images, labels)
        if cause:
            cause = f"the step syncs with the host: {cause}"
    if cause is None:
        try:
            return GraphedStep(step, images, labels)
        except Exception as e:  # noqa: BLE001 - any capture failure means: run eagerly, say why
            cause = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    log.warning("cuda_graph: running eagerly because %s", cause)
    return None
