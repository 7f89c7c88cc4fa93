"""EngineConfig: the one frozen config of the training engine."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import EngineError

PRECISIONS = ("bf16", "fp16", "fp32", "tf32")
COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")


@dataclass(frozen=True)
class EngineConfig:
    precision: str = "bf16"            # bf16 | fp16 (GradScaler) | fp32 | tf32
    channels_last: bool = True
    compile: str = "off"               # off | default | max-autotune | reduce-overhead
    cuda_graph: bool = False           # capture forward+backward+optimizer step as one graph
    accum_steps: int = 1
    clip_grad: float | None = None
    checkpoint_blocks: tuple[str, ...] = ()   # module names to wrap in activation checkpointing
    optimizer: str = "sgd"             # sgd | adamw
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-5
    nonfinite: str = "skip"            # skip | stop: what a NaN/inf loss does
    distributed: str = "auto"          # auto | ddp | zero | none
    log_every: int = 50                # loss is read back (one host sync) this often
    max_inflight_steps: int = 3        # steps the host may run ahead of the GPU (0: unbounded)
    ckpt_dir: str | None = None
    ckpt_every: int = 0                # optimizer steps; 0: only at the end of fit()
    seed: int = 0

    @property
    def batch_dtype(self) -> str:
        """The dtype batches should arrive in: the autocast dtype, so no cast runs before the first layer
        and half the bytes cross the augmentation's output (fp32 and tf32 train in float32)."""
        return {"bf16": "bfloat16", "fp16": "float16"}.get(self.precision, "float32")

    def validate(self) -> None:
        checks = [
            (self.precision in PRECISIONS, f"precision={self.precision!r}: choose one of {PRECISIONS}"),
            (self.compile in COMPILE_MODES, f"compile={self.compile!r}: choose one of {COMPILE_MODES}"),
            (self.accum_steps >= 1, f"accum_steps={self.accum_steps}: give 1 or more"),
            (self.optimizer in ("sgd", "adamw"), f"optimizer={self.optimizer!r}: choose sgd or adamw"),
            (self.nonfinite in ("skip", "stop"), f"nonfinite={self.nonfinite!r}: choose skip or stop"),
            (self.distributed in ("auto", "ddp", "zero", "none"),
             f"distributed={self.distributed!r}: choose auto, ddp, zero or none"),
            (self.log_every >= 1, f"log_every={self.log_every}: give 1 or more"),
            (self.max_inflight_steps >= 0, f"max_inflight_steps={self.max_inflight_steps}: give 0 or more"),
            (self.lr >= 0, f"lr={self.lr}: give a learning rate of 0 or more"),
            (self.weight_decay >= 0, f"weight_decay={self.weight_decay}: give 0 or more"),
            (self.momentum >= 0, f"momentum={self.momentum}: give 0 or more (0.9 is usual)"),
            (self.clip_grad is None or self.clip_grad >= 0, f"clip_grad={self.clip_grad}: give a positive norm, "
                                                            f"or None (or 0) for no clipping"),
            (self.ckpt_every >= 0, f"ckpt_every={self.ckpt_every}: give 0 (only at the end) or more"),
        ]
        for ok, msg in checks:
            if not ok:
                raise EngineError(msg)
