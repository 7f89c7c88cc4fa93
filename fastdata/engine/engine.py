"""Engine: the training loop that keeps the GPU fed and says where time goes.

Per step the host only launches work: losses and non-finite counts stay on
the device until a log point, so the host runs ahead of the GPU, by at most
``max_inflight_steps`` steps (fence.py), and the time spent waiting in
``next(loader)`` is the true data wait.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import EngineError
from . import checkpoint as ckpt
from .config import EngineConfig
from .distributed import StopVote, init_from_env, local_device, own_state, per_rank, rank, wrap
from ..read.fence import StepFence, cuda_event_factory
from .graph import compile_model, compiler_failed, try_capture, unwrap, without_compile
from .step import TrainStep, make_scaler

log = logging.getLogger("fastdata.engine")


def apply_activation_checkpointing(model: nn.Module, names: tuple[str, ...]) -> None:
    """Recompute the named blocks in backward instead of storing their activations.
    forward is patched in place, so state_dict keys do not change."""
    for name in names:
        try:
            block = model.get_submodule(name)
        except AttributeError:
            top = ", ".join(n for n, _ in model.named_children())
            raise EngineError(f"checkpoint_blocks: no module {name!r}; top-level modules are: {top}") from None
        inner = block.forward
        block.forward = lambda *a, _f=inner, **k: checkpoint(_f, *a, use_reentrant=False, **k)


@dataclass
class Meter:
    t0: float = 0.0
    images: int = 0
    wait: float = 0.0
    steps: int = 0
    started: bool = False
    records: list = field(default_factory=list)
    mark: float = 0.0                 # monotonic time of start(): NVML samples are summarised from here

    def start(self) -> None:
        self.t0, self.images, self.wait, self.steps, self.started = time.perf_counter(), 0, 0.0, 0, True
        self.mark = time.monotonic()


def warn_head_mismatch(model: nn.Module, classes: int | None) -> bool:
    """Warn where the model's last Linear layer has fewer outputs than the data has classes: a label past
    it fails cross-entropy, on a GPU as a bare 'device-side assert triggered' that also ends the CUDA
    context. A warning, not an error: the last Linear is usually, not always, the classifier."""
    heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not classes or not heads or heads[-1].out_features >= classes:
        return False
    log.warning("the model's last Linear layer has %d outputs but the data has %d classes: labels from %d on "
                "will fail the loss (on a GPU: 'device-side assert triggered'); build the model with "
                "num_classes=%d", heads[-1].out_features, classes, heads[-1].out_features, classes)
    return True


IMAGE_KEYS = ("pixel_values", "image", "images", "img", "input", "inputs", "x")
LABEL_KEYS = ("labels", "label", "target", "targets", "y")


def images_and_labels(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of a batch: a (images, labels, ...) sequence, a fastdata Batch, or a dict with
    the usual keys (Hugging Face datasets: pixel_values/labels; torchvision-style: image/label)."""
    if isinstance(batch, dict):
        image = next((k for k in IMAGE_KEYS if k in batch), None)
        label = next((k for k in LABEL_KEYS if k in batch), None)
        if image is None or label is None:
            raise EngineError(f"a dict batch needs an image key ({', '.join(IMAGE_KEYS)}) and a label key "
                              f"({', '.join(LABEL_KEYS)}); this one has {', '.join(map(str, batch))}")
        return batch[image], batch[label]
    return batch[0], batch[1]


def class_ids(labels: torch.Tensor) -> torch.Tensor:
    """Integer labels as the int64 (N,) ids cross_entropy takes: numpy's int32 datasets and (N, 1)
    label columns failed it ("expected target dtype to be Long", "multi-target not supported").
    Float (N, classes) labels are soft targets (mixup, label smoothing done by the loader) and pass."""
    if labels.is_floating_point():
        return labels
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    return labels if labels.dtype == torch.int64 else labels.long()


class Engine:
    """Engine(model, EngineConfig).fit(loader, steps=...) -> report dict."""

    def __init__(self, model: nn.Module, cfg: EngineConfig = EngineConfig(), device: torch.device | None = None):
        cfg.validate()
        if not any(p.requires_grad for p in model.parameters()):
            raise EngineError(f"{type(model).__name__} has no trainable parameters (none at all, or every one "
                              f"has requires_grad=False): unfreeze the layers to train, e.g. the head")
        self.cfg = cfg
        self.device = device or local_device()
        self.distributed = cfg.distributed != "none" and init_from_env(self.device.type)
        torch.manual_seed(cfg.seed)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.precision == "tf32"
            torch.backends.cudnn.allow_tf32 = cfg.precision == "tf32"
            torch.backends.cudnn.benchmark = True
        fmt = torch.channels_last if cfg.channels_last else torch.preserve_format
        model = model.to(self.device, memory_format=fmt)
        apply_activation_checkpointing(model, cfg.checkpoint_blocks)
        # a compiled model meeting a new batch shape (the last partial batch) would recompile, or switch
        # to slower dynamic-shape kernels; such batches run through the eager module (same parameters)
        self._eager = model if cfg.compile != "off" and not self.distributed else None
        self._compiled_shape = None
        self.model, self.optimizer = wrap(compile_model(model, cfg.compile), cfg, self.device, self.distributed)
        self.scaler = make_scaler(cfg, self.device)
        self.step = TrainStep(self.model, self.optimizer, self.scaler, cfg, self.device)
        self.graphed, self._graph_tried = None, False
        self._compile_ok, self.compile_error = cfg.compile == "off", None   # set at the first step
        self.global_step, self.epoch = 0, 0
        self._sampler = None
        self.stopped: str | None = None   # set by request_stop()
        self._vote = StopVote() if self.distributed else None   # ranks stop after the same step

    # ---- batches -------------------------------------------------------------------------------
    def _prepare(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch on the device, as the loader made it. The engine does not augment: the loader's
        augmentation (one kernel, in the batch dtype) is the only one, so no batch is augmented twice."""
        images, labels = images_and_labels(batch)
        if images.dtype == torch.uint8:
            raise EngineError("the engine got uint8 images: give the loader an augmentation, e.g. "
                              "fastdata.loader(cache, bs, augment=AugmentConfig(dtype=engine.cfg.batch_dtype)), "
                              "or convert them to float in your own loader")
        images = images.to(self.device, non_blocking=True)
        labels = class_ids(labels).to(self.device, non_blocking=True)
        if self.cfg.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels

    def train_step(self, batch) -> None:
        """One whole optimizer step on one batch (no accumulation), as fit() runs it: for tools that
        drive the step themselves (the doctor's profiler)."""
        images, labels = self._prepare(batch)
        self._train_on(images, labels, 1, True)
        self.global_step += 1

    def _train_on(self, images, labels, window: int, last: bool) -> None:
        if self._eager is not None and self._compiled_shape is None:
            self._compiled_shape = tuple(images.shape)   # the one shape compiled (and captured)
        if self.cfg.cuda_graph and not self._graph_tried:
            self._graph_tried = True
            with self.preserved_state():
                self.graphed = try_capture(self.step, images, labels, self.cfg.accum_steps, self.distributed)
        if self.graphed is not None and self.graphed.matches(images):
            self.graphed(images, labels)
            self.step.state.micro_steps += 1  # the replay added one loss to the device-side sum
            return
        sync = self.model.no_sync() if self.distributed and not last else contextlib.nullcontext()
        eager = self._eager if self._eager is not None and tuple(images.shape) != self._compiled_shape else None
        with sync:
            try:
                self.step.micro(images, labels, window, model=eager)
            except Exception as e:  # noqa: BLE001 - only the compiler's own failure is handled here
                if self.cfg.compile == "off" or self._compile_ok or not compiler_failed(e):
                    raise
                self._drop_compile(e)
                self.step.micro(images, labels, window)
        self._compile_ok = True
        if last:
            self.step.apply()

    def _drop_compile(self, e: BaseException) -> None:
        """torch.compile failed on its first call: train eagerly (same parameters, nothing stepped yet)
        rather than stop, and say why and how to get it back."""
        why = " ".join(str(e).split())[:300]
        log.warning("torch.compile failed (%s: %s); training without it. Install what it needs (a C/C++ "
                    "compiler such as gcc; Triton matching the driver on a GPU) or pass --compile off",
                    type(e).__name__, why)
        self.model = self.step.model = without_compile(self.model)
        self._eager, self._compiled_shape = None, None
        self.compile_error = f"{type(e).__name__}: {why}"

    @contextlib.contextmanager
    def preserved_state(self):
        """Undo the steps run inside (graph-capture warm-up, batch-size probes), in place, so that
        tensor addresses stay valid: weights, buffers, optimizer and scaler state, loss sums."""
        tensors = list(unwrap(self.model).state_dict(keep_vars=True).values())
        tensors += [t for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        saved = [t.detach().clone() for t in tensors]
        scale = self.scaler.state_dict()
        try:
            yield
        finally:
            for t, s in zip(tensors, saved):
                if t.shape == s.shape:
                    t.detach().copy_(s)
            for t in self.optimizer.state.values():  # state created during warm-up starts from zero
                for v in t.values():
                    if torch.is_tensor(v) and not any(v is x for x in tensors):
                        v.zero_()
            if scale:
                self.scaler.load_state_dict(scale)  # fills the scale tensors in place
            self.step.state.reset()

    # ---- loop ------------------------------------------------------------------------------------
    def fit(self, loader, *, steps: int | None = None, epochs: int = 1, warmup_steps: int = 5,
            time_limit: float | None = None) -> dict:
        """Train for `epochs` passes over the loader (a loader restored mid-epoch finishes that epoch
        first), or until the engine's step count reaches `steps` (a total: an engine restored at or past
        it trains nothing), or `time_limit` timed seconds, or request_stop().

        The report covers the steps after `warmup_steps` (compilation, cudnn autotuning, graph
        capture happen there) and, on a GPU, NVML duty cycle and GPM SM activity over that window.
        """
        from ..monitor.nvml import GpuSampler

        warn_head_mismatch(unwrap(self.model), getattr(loader, "num_classes", None))
        meter = Meter()
        self._sampler = GpuSampler().start() if self.device.type == "cuda" else None
        bound_lead = getattr(loader, "bound_lead", None)       # a fastdata Loader: our steps are fenced here
        lead = bound_lead(0) if callable(bound_lead) else None
        try:
            return self._fit(loader, meter, steps, epochs, warmup_steps, time_limit)
        finally:
            if self._vote is not None:
                self._vote.drain()      # the vote every rank started after its last step
            if self._sampler is not None:
                self._sampler.stop()
            if lead is not None:
                bound_lead(lead)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Make fit() return after the optimizer step in progress (safe from a signal handler): the
        caller then saves a checkpoint whose resume continues with the next batch."""
        self.stopped = reason

    def _fit(self, loader, meter: Meter, steps, epochs: int, warmup_steps: int, time_limit) -> dict:
        accum = self.cfg.accum_steps
        if steps is not None and self.global_step >= steps:   # resumed from the run's last checkpoint
            return self._report(meter)
        for _ in range(epochs):
            remaining = _batches_left(loader)
            window_left, window = 0, accum
            it = iter(loader)
            fence = StepFence(self.cfg.max_inflight_steps, cuda_event_factory(self.device))
            while True:
                fence.wait()   # GPU backlog: booked as compute, not as data wait
                t = time.perf_counter()
                batch = next(it, None)
                meter.wait += time.perf_counter() - t
                if batch is None:
                    break
                images, labels = self._prepare(batch)
                if window_left == 0:
                    window = window_left = max(1, min(accum, remaining))
                self._train_on(images, labels, window, last=window_left == 1)
                window_left, remaining = window_left - 1, remaining - 1
                meter.images += len(labels)
                if window_left:
                    continue
                self.global_step += 1
                meter.steps += 1
                fence.record()
                self._after_step(meter, warmup_steps, loader)
                timed_out = time_limit is not None and meter.started and time.perf_counter() - meter.t0 >= time_limit
                if (steps is not None and self.global_step >= steps) or self._agreed(bool(self.stopped) or timed_out):
                    return self._report(meter)
            self.epoch += 1
        return self._report(meter)

    def _agreed(self, stop: bool) -> bool:
        """Whether to stop after this step: this process's wish, or, under torchrun, the ranks' vote."""
        if self._vote is None:
            return stop
        agreed = self._vote.vote(stop)
        if agreed and not stop and self.stopped is None:
            self.stopped = "a stop on another rank"
        return agreed

    def _after_step(self, meter: Meter, warmup_steps: int, loader) -> None:
        if not meter.started and meter.steps >= warmup_steps:
            self._sync()
            meter.start()
        if self.global_step % self.cfg.log_every == 0:
            self._log(meter)
        if self.cfg.ckpt_dir and self.cfg.ckpt_every and self.global_step % self.cfg.ckpt_every == 0:
            self.save(f"{self.cfg.ckpt_dir}/last.pt", loader)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _log(self, meter: Meter) -> dict:
        """The one host sync per log interval: read losses and the non-finite count."""
        st = self.step.state
        micro = max(1, st.micro_steps)
        loss = float(st.loss_sum) / micro  # host sync
        bad = int(st.nonfinite)
        if bad and self.cfg.nonfinite == "stop":
            raise EngineError(f"non-finite loss in {bad} micro-batches up to step {self.global_step} (those "
                              f"updates were skipped); lower the learning rate, clip gradients or use bf16")
        rec = {"step": self.global_step, "loss": loss, "nonfinite": bad}
        meter.records.append(rec)
        st.reset()
        if rank() == 0:
            log.info("step %d loss %.4f%s", self.global_step, loss, f" ({bad} non-finite skipped)" if bad else "")
        return rec

    def _report(self, meter: Meter) -> dict:
        self._sync()
        if self.step.state.micro_steps:
            self._log(meter)
        if not meter.started:
            meter.start()
        wall = max(time.perf_counter() - meter.t0, 1e-9)
        return {"img_per_s": meter.images / wall if meter.images else 0.0, "steps": self.global_step,
                "data_wait_frac": min(1.0, meter.wait / wall), "timed_steps": meter.steps,
                "loss": meter.records[-1]["loss"] if meter.records else float("nan"),
                "nonfinite": sum(r["nonfinite"] for r in meter.records), "cuda_graph": self.graphed is not None,
                "gpu": self._sampler.summary(since=meter.mark) if self._sampler else {},
                "stopped": self.stopped, "compile_error": self.compile_error,
                "history": meter.records}

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self, loader=None) -> dict:
        opt = self.optimizer
        if hasattr(opt, "consolidate_state_dict"):  # ZeRO: gather shards on rank 0
            opt.consolidate_state_dict(0)
        mine = loader.state_dict() if hasattr(loader, "state_dict") else None
        ranks = per_rank(mine)      # every rank's loader position: each resumes its own
        return {"model": unwrap(self.model).state_dict(), "optimizer": opt.state_dict() if rank() == 0 else None,
                "scaler": self.scaler.state_dict(), "step": self.global_step, "epoch": self.epoch,
                "loader": mine if ranks is None else {"per_rank": ranks},
                "rng": ckpt.rng_state(), "config": self.cfg.__dict__}

    def save(self, path, loader=None):
        state = self.state_dict(loader)
        return ckpt.save_checkpoint(path, state) if rank() == 0 else None

    def load(self, path, loader=None, *, trust: bool = False) -> None:
        """Restore model, optimizer, scaler, step, loader position and RNG state from path.
        trust=True unpickles a checkpoint of an earlier fastdata (only for files you trust)."""
        state = ckpt.load_checkpoint(path, map_location=self.device, trust=trust)
        state["loader"] = own_state(state["loader"], path)
        # checked (model, loader) or undone (optimizer) before the rest loads: a refused resume leaves
        # this engine as it was
        ckpt.check_model_fits(unwrap(self.model), state["model"], path)
        if loader is not None and state["loader"] is not None and hasattr(loader, "check_state"):
            loader.check_state(state["loader"])
        ckpt.load_optimizer(self.optimizer, state["optimizer"], path)
        ckpt.load_into(unwrap(self.model), state["model"], "model", path)
        self.scaler.load_state_dict(state["scaler"])
        self.global_step, self.epoch = state["step"], state["epoch"]
        if loader is not None and state["loader"] is not None:
            loader.load_state_dict(state["loader"])
        ckpt.set_rng_state(state["rng"])


def _batches_left(loader) -> int:
    left = getattr(loader, "batches_left", None)
    return left() if left is not None else len(loader)
