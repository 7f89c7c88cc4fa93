"""`fastdata train`: the engine on a cache (or an image folder through a GPU-decode backend)."""
from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from pathlib import Path


log = logging.getLogger("fastdata.engine")


def add_cli(sub, commands: dict) -> None:
    p = sub.add_parser("train", help="train a model with the fastdata engine")
    p.add_argument("--data", required=True, help="cache folder, s3:// cache, image folder, file list or tar")
    p.add_argument("--allow-empty-classes", action="store_true",
                   help="an image folder's class folders without images stay labels (as for build-cache)")
    p.add_argument("--backend", default="auto", choices=("auto", "raw", "pil", "nvjpeg", "dali", "cache", "cpu"),
                   help="fastdata.loader's backend: raw (raw cache), dali/nvjpeg (GPU JPEG decode), pil (CPU); "
                        "auto picks; cache and cpu are the wave-1 names of raw and pil")
    p.add_argument("--model", default="resnet50", help="smallnet | resnet18 | resnet50 | module:function")
    p.add_argument("--batch-size", default="256", help="an integer or 'auto'")
    p.add_argument("--image-size", type=int, default=224,
                   help="training crop size in pixels")
    p.add_argument("--steps", type=_count, default=None,
                   help="stop when the run reaches this many optimizer steps in total")
    p.add_argument("--epochs", type=_count, default=None,
                   help="epochs in total (a resumed run trains only the rest); default 1, or as many as "
                        "--steps needs when --steps is given")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32", "tf32"),
                   help="autocast precision; batches ship in the matching dtype")
    p.add_argument("--compile", default="off", choices=("off", "default", "max-autotune", "reduce-overhead"),
                   help="torch.compile mode")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture the whole step as one CUDA graph where it can be captured")
    p.add_argument("--no-channels-last", action="store_true",
                   help="keep NCHW contiguous memory format")
    p.add_argument("--accum-steps", type=int, default=1,
                   help="micro-batches per optimizer step")
    p.add_argument("--clip-grad", type=float, default=None,
                   help="clip the gradient norm to this value")
    p.add_argument("--checkpoint-blocks", default="", help="comma-separated module names, e.g. layer3,layer4")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"),
                   help="optimizer (fused where available)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="learning rate")
    p.add_argument("--distributed", default="auto", choices=("auto", "ddp", "zero", "none"),
                   help="under torchrun: DDP, ZeroRedundancyOptimizer, or none")
    p.add_argument("--nonfinite", default="skip", choices=("skip", "stop"),
                   help="a NaN/inf loss skips that update, or stops the run")
    p.add_argument("--ckpt-dir", default=None,
                   help="save DIR/last.pt here (every --ckpt-every steps, at the end, and on Ctrl-C); a rerun resumes from it")
    p.add_argument("--ckpt-every", type=int, default=0,
                   help="optimizer steps between checkpoints (0: only at the end)")
    p.add_argument("--resume", default=None, help="checkpoint to continue from: a file, or the --ckpt-dir a run "
                   "saved into (default: CKPT_DIR/last.pt if any)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="open a checkpoint of an earlier fastdata with full unpickling, which can run code "
                        "from the file: only for checkpoints you trust")
    p.add_argument("--log-every", type=int, default=50,
                   help="steps between loss read-backs (each is one host sync)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds Python, NumPy and torch before the model is built, and the data order")
    p.add_argument("--json", default=None, help="write the report here")
    commands["train"] = run_train


def _count(text: str) -> int:
    """--steps / --epochs: a total, 0 or more (a negative one trained nothing and said so, exit 0)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 0 or more") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: give 0 or more (a total for the run, counted from its start)")
    return n


def _config(a):
    from ..engine.config import EngineConfig

    blocks = tuple(b for b in a.checkpoint_blocks.split(",") if b)
    return EngineConfig(precision=a.precision, channels_last=not a.no_channels_last, compile=a.compile,
                        cuda_graph=a.cuda_graph, accum_steps=a.accum_steps, clip_grad=a.clip_grad,
                        checkpoint_blocks=blocks, optimizer=a.optimizer, lr=a.lr, nonfinite=a.nonfinite,
                        distributed=a.distributed, log_every=a.log_every, ckpt_dir=a.ckpt_dir,
                        ckpt_every=a.ckpt_every, seed=a.seed)


def _resume_path(a, cfg):
    """--resume, else DIR/last.pt when --ckpt-dir holds one (a rerun of an interrupted command)."""
    if a.resume:
        return a.resume
    if cfg.ckpt_dir and (Path(cfg.ckpt_dir) / "last.pt").is_file():
        log.info("resuming from %s (pass another --ckpt-dir to start afresh)", Path(cfg.ckpt_dir) / "last.pt")
        return str(Path(cfg.ckpt_dir) / "last.pt")
    return None


@contextlib.contextmanager
def _stop_on_signals(engine):
    """SIGINT/SIGTERM finish the step in progress, then fit() returns and the caller saves; a second
    SIGINT interrupts at once. A signal this process started with ignored stays ignored: a shell script's
    background job (`fastdata train ... &`) starts with SIGINT ignored, so the Ctrl-C meant for the script
    does not stop it, as POSIX intends and as Python's own handler would leave it."""
    def handler(signum, frame):
        if engine.stopped:
            raise KeyboardInterrupt
        engine.request_stop(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)
           if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _epochs(a) -> int:
    """--epochs, else 1, or unbounded when --steps is given (Lightning's max_steps convention): a run
    asked for N steps trains N steps, however many epochs that takes."""
    if a.epochs is not None:
        return a.epochs
    return 1 if a.steps is None else sys.maxsize


def run_train(a) -> int:
    from ..engine.distributed import rank
    from .assemble import RunConfig, assemble

    cfg = _config(a)
    if cfg.ckpt_dir:
        from pathlib import Path

        from ..engine.checkpoint import ensure_writable

        ensure_writable(Path(cfg.ckpt_dir))
    run = assemble(RunConfig(data=a.data, model=a.model, batch_size=a.batch_size, backend=a.backend,
                             image_size=a.image_size, seed=a.seed, engine=cfg,
                             allow_empty_classes=a.allow_empty_classes))
    engine, loader, bs, curve = run.engine, run.loader, run.batch_size, run.batch_curve
    resume = _resume_path(a, cfg)
    if resume:
        engine.load(resume, loader, trust=a.trust_checkpoint)
    start = engine.global_step
    with _stop_on_signals(engine):   # --epochs is a total, as --steps is: a resumed run trains the rest
        report = engine.fit(loader, steps=a.steps, epochs=max(0, _epochs(a) - engine.epoch))
    saved = engine.save(f"{cfg.ckpt_dir}/last.pt", loader) if cfg.ckpt_dir and engine.global_step > start else None
    report.update({"batch_size": int(bs), "batch_curve": curve, "source": getattr(loader, "source", "")})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if engine.stopped:
        where = f"saved {saved} at step {engine.global_step}; rerun the same command to resume" if saved else \
            "nothing saved (no --ckpt-dir)"
        if rank() == 0:     # (the other ranks said "nothing saved": rank 0 writes the checkpoint)
            print(f"fastdata train: stopped by {engine.stopped}: {where}", file=sys.stderr)
        return 130 if engine.stopped == "SIGINT" else 143
    if engine.global_step == start:
        print(f"nothing to train: the run is at step {start}, epoch {engine.epoch} (limits --steps {a.steps}, "
              f"--epochs {a.epochs}); the checkpoint is left as it is")
        return 0
    rate = (f"{report['img_per_s']:.0f} img/s, data wait {report['data_wait_frac']:.0%}" if report["timed_steps"]
            else "no rate: every step was a warm-up step (the first 5 are not timed)")
    print(f"trained {report['steps']} steps: {rate}, loss {report['loss']:.4f}, cuda_graph={report['cuda_graph']}")
    return 0


def auto_batch(engine, image_size: int, num_classes: int):
    """Search the batch size on synthetic input of the real shape, then restore the model."""
    import torch

    from ..engine.batch_size import find_batch_size

    dev = engine.device

    def step(bs: int) -> None:
        x = torch.randn(bs, 3, image_size, image_size, device=dev)
        y = torch.randint(0, num_classes, (bs,), device=dev)   # labels the model's head can take
        engine.step.full(x.contiguous(memory_format=torch.channels_last), y)

    with engine.preserved_state():
        bs, curve = find_batch_size(step, dev)
    log.info("auto batch size chose %d", bs)
    return bs, curve
