"""`fastdata train`: the engine on a cache (or an image folder through a GPU-decode backend)."""
from __future__ import annotations

import json
import logging

from ..errors import FastdataError

log = logging.getLogger("fastdata.engine")


def add_cli(sub, commands: dict) -> None:
    p = sub.add_parser("train", help="train a model with the fastdata engine")
    p.add_argument("--data", required=True, help="cache folder, or an image folder with --backend dali|nvjpeg|cpu")
    p.add_argument("--backend", default="auto", choices=("auto", "cache", "dali", "nvjpeg", "cpu"))
    p.add_argument("--model", default="resnet50", help="smallnet | resnet18 | resnet50 | module:function")
    p.add_argument("--batch-size", default="256", help="an integer or 'auto'")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32", "tf32"))
    p.add_argument("--compile", default="off", choices=("off", "default", "max-autotune", "reduce-overhead"))
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--no-channels-last", action="store_true")
    p.add_argument("--accum-steps", type=int, default=1)
    p.add_argument("--clip-grad", type=float, default=None)
    p.add_argument("--checkpoint-blocks", default="", help="comma-separated module names, e.g. layer3,layer4")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"))
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--distributed", default="auto", choices=("auto", "ddp", "zero", "none"))
    p.add_argument("--nonfinite", default="skip", choices=("skip", "stop"))
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--resume", default=None, help="checkpoint to continue from")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the report here")
    commands["train"] = run_train


def _config(a):
    from .config import EngineConfig

    blocks = tuple(b for b in a.checkpoint_blocks.split(",") if b)
    return EngineConfig(precision=a.precision, channels_last=not a.no_channels_last, compile=a.compile,
                        cuda_graph=a.cuda_graph, accum_steps=a.accum_steps, clip_grad=a.clip_grad,
                        checkpoint_blocks=blocks, optimizer=a.optimizer, lr=a.lr, nonfinite=a.nonfinite,
                        distributed=a.distributed, log_every=a.log_every, ckpt_dir=a.ckpt_dir,
                        ckpt_every=a.ckpt_every, seed=a.seed)


def run_train(a) -> int:
    from ..data.select import make_loader, num_classes
    from .engine import Engine
    from .models import resolve_model

    if a.batch_size != "auto" and not a.batch_size.isdigit():
        raise FastdataError(f"--batch-size {a.batch_size!r}: give a positive integer or 'auto'")
    cfg = _config(a)
    model = resolve_model(a.model, num_classes(a.data))
    engine = Engine(model, cfg)
    bs = a.batch_size
    curve = None
    if bs == "auto":
        bs, curve = auto_batch(engine, a.image_size)
    # a compiled GPU run compiles the augmentation too: its few seconds are nothing beside the model's
    fused = cfg.compile != "off" and engine.device.type == "cuda"
    loader = make_loader(a.data, int(bs), backend=a.backend, image_size=a.image_size, seed=a.seed,
                         device=str(engine.device), fused_augment=fused)
    if a.resume:
        engine.load(a.resume, loader)
    report = engine.fit(loader, steps=a.steps, epochs=a.epochs)
    if cfg.ckpt_dir:
        engine.save(f"{cfg.ckpt_dir}/last.pt", loader)
    report.update({"batch_size": int(bs), "batch_curve": curve, "source": getattr(loader, "source", "")})
    print(f"trained {report['steps']} steps: {report['img_per_s']:.0f} img/s, data wait "
          f"{report['data_wait_frac']:.0%}, loss {report['loss']:.4f}, cuda_graph={report['cuda_graph']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


def auto_batch(engine, image_size: int):
    """Search the batch size on synthetic input of the real shape, then restore the model."""
    import torch

    from .batch_size import find_batch_size

    dev = engine.device

    def step(bs: int) -> None:
        x = torch.randn(bs, 3, image_size, image_size, device=dev)
        y = torch.randint(0, 10, (bs,), device=dev)
        engine.step.full(x.contiguous(memory_format=torch.channels_last), y)

    with engine.preserved_state():
        bs, curve = find_batch_size(step, dev)
    log.info("auto batch size chose %d", bs)
    return bs, curve
