"""Engine on CPU: learning, accumulation, non-finite policy, exact resume, DDP/ZeRO, compile, auto batch."""
from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fastdata
from fastdata.read.augment import AugmentConfig
from fastdata.engine.batch_size import BatchSearchConfig, find_batch_size
from fastdata.engine.config import EngineConfig
from fastdata.engine.engine import Engine
from fastdata.engine.models import SmallNet, resnet18
from fastdata.errors import EngineError


def tiny_net(num_classes: int = 10) -> nn.Module:
    """No BatchNorm: per-sample gradients do not depend on the micro-batch, so sums must agree."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(128, num_classes))


def _fixed_batches(n, bs, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 3, size, size, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]


def test_loss_falls_on_real_photo_cache(raw_cache):
    dl = fastdata.loader(raw_cache, 24, device="cpu", augment=AugmentConfig(size=48), seed=0)
    eng = Engine(SmallNet(10, width=16), EngineConfig(precision="bf16", lr=0.05, log_every=5))
    report = eng.fit(dl, epochs=6)
    losses = [h["loss"] for h in report["history"]]
    assert losses[-1] < 0.6 * losses[0], losses
    assert report["img_per_s"] > 0 and 0 <= report["data_wait_frac"] <= 1


def test_accumulation_4x8_equals_32():
    data32 = _fixed_batches(1, 32)
    x, y = data32[0]
    data8 = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
    cfg = dict(precision="fp32", lr=0.1, momentum=0.0, weight_decay=0.0, channels_last=False)
    a = Engine(tiny_net(), EngineConfig(accum_steps=4, **cfg))
    b = Engine(tiny_net(), EngineConfig(accum_steps=1, **cfg))
    ra, rb = a.fit(data8), b.fit(data32)
    assert ra["steps"] == rb["steps"] == 1
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_short_last_accumulation_window_is_averaged_over_what_it_has():
    x, y = _fixed_batches(1, 24)[0]
    data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]
    cfg = dict(precision="fp32", lr=0.1, momentum=0.0, weight_decay=0.0, channels_last=False)
    a = Engine(tiny_net(), EngineConfig(accum_steps=4, **cfg))  # 3 batches: one short window of 3
    b = Engine(tiny_net(), EngineConfig(**cfg))
    a.fit(data)
    b.fit([(x, y)])
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_fp16_scaler_skips_injected_inf():
    eng = Engine(tiny_net(), EngineConfig(precision="fp16", lr=0.1, log_every=1, channels_last=False))
    (x, y), = _fixed_batches(1, 8)
    before = copy.deepcopy(eng.model.state_dict())
    bad = x.clone()
    bad[0] = float("inf")
    report = eng.fit([(bad, y)])
    assert report["nonfinite"] == 1
    assert all(torch.equal(before[k], v) for k, v in eng.model.state_dict().items())
    good = eng.fit([(x, y)])
    assert good["nonfinite"] == 0
    assert not all(torch.equal(before[k], v) for k, v in eng.model.state_dict().items())


def test_nonfinite_stop_names_the_step():
    eng = Engine(tiny_net(), EngineConfig(precision="fp32", nonfinite="stop", log_every=2, channels_last=False))
    data = _fixed_batches(4, 8)
    data[2] = (data[2][0] * float("nan"), data[2][1])
    with pytest.raises(EngineError, match="up to step 4"):
        eng.fit(data)


def test_checkpoint_resume_reproduces_next_losses_bit_for_bit(raw_cache, tmp_path):
    def make():
        torch.manual_seed(0)
        dl = fastdata.loader(raw_cache, 16, device="cpu", augment=AugmentConfig(size=32), seed=3)
        eng = Engine(SmallNet(10, width=8), EngineConfig(precision="fp32", lr=0.05, log_every=1, seed=0))
        return eng, dl
    eng, dl = make()
    full = [h["loss"] for h in eng.fit(dl, steps=10, epochs=3)["history"]]
    eng, dl = make()
    eng.fit(dl, steps=4, epochs=3)
    eng.save(tmp_path / "ck.pt", dl)
    keys = torch.load(tmp_path / "ck.pt", weights_only=False)["model"].keys()
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in keys)
    eng2, dl2 = make()
    eng2.load(tmp_path / "ck.pt", dl2)
    rest = [h["loss"] for h in eng2.fit(dl2, steps=10, epochs=3)["history"]]
    assert rest == full[4:]


def test_half_written_checkpoint_is_never_read(tmp_path):
    eng = Engine(tiny_net(), EngineConfig(channels_last=False))
    path = eng.save(tmp_path / "last.pt")
    (tmp_path / "last.pt.tmp").write_bytes(b"partial")  # what a kill mid-save leaves
    Engine(tiny_net(), EngineConfig(channels_last=False)).load(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(EngineError, match="cannot read checkpoint"):
        Engine(tiny_net(), EngineConfig(channels_last=False)).load(path)


def test_activation_checkpointing_keeps_results_and_keys():
    data = _fixed_batches(2, 8)
    cfg = dict(precision="fp32", channels_last=False, log_every=1)
    a = Engine(SmallNet(10, width=8), EngineConfig(**cfg))
    torch.manual_seed(0)
    b = Engine(copy.deepcopy(a.model), EngineConfig(checkpoint_blocks=("features",), **cfg))
    la, lb = a.fit(data), b.fit(data)
    assert [h["loss"] for h in la["history"]] == pytest.approx([h["loss"] for h in lb["history"]], rel=1e-5)
    assert a.model.state_dict().keys() == b.model.state_dict().keys()
    with pytest.raises(EngineError, match="top-level modules are"):
        Engine(SmallNet(), EngineConfig(checkpoint_blocks=("nope",)))


def test_compile_path_runs_and_checkpoints_have_clean_keys(tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eng = Engine(tiny_net(), EngineConfig(compile="default", precision="fp32", channels_last=False, log_every=1))
    data = _fixed_batches(3, 8) + [(torch.randn(3, 3, 32, 32), torch.randint(0, 10, (3,)))]  # partial last
    counts = torch._dynamo.utils.counters
    report = eng.fit(data)
    assert report["steps"] == 4 and report["loss"] == report["loss"]
    assert counts["stats"]["unique_graphs"] == 1  # compiled once; the partial batch ran eagerly
    eng.save(tmp_path / "c.pt")
    assert not any("_orig_mod" in k for k in torch.load(tmp_path / "c.pt", weights_only=False)["model"])


def test_auto_batch_size_recovers_from_oom_and_keeps_margin():
    calls = []

    def step(bs):
        calls.append(bs)
        if bs >= 256:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        x = torch.randn(bs, 64)
        (x @ x.T).sum()

    best, curve = find_batch_size(step, torch.device("cpu"), BatchSearchConfig(start=16, max_batch=1024, steps=2))
    assert curve[-1]["oom"] and curve[-1]["batch_size"] == 256
    assert best in {16, 32, 64, 128} and 512 not in calls
    with pytest.raises(EngineError, match="does not fit"):
        find_batch_size(lambda bs: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")), torch.device("cpu"))


def test_resnet18_of_our_own_trains_a_step():
    eng = Engine(resnet18(10), EngineConfig(precision="bf16", log_every=1))
    assert eng.fit(_fixed_batches(1, 4, size=64))["steps"] == 1


@pytest.mark.parametrize("mode", ["ddp", "zero"])
def test_torchrun_two_process_gloo_agrees_with_one_process(raw_cache, tmp_path, mode):
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    worker = str(here / "ddp_worker.py")
    subprocess.run([sys.executable, worker, str(raw_cache), str(one), "none", "16"], check=True, env=env)
    with socket.socket() as s:  # a port free now, not a fixed one another process may hold
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(port), worker, str(raw_cache), str(two), mode, "16"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-12000:]
    a, b = torch.load(one), torch.load(two)
    for k in a["model"]:
        assert torch.allclose(a["model"][k], b["model"][k], atol=1e-5), k
    assert b["coverage"]["seen_all_ranks"] == a["coverage"]["seen"] == 48
    assert a["resumed_step"] == b["resumed_step"] == 3     # engine.load under DDP and ZeRO too


def test_partial_batch_beside_a_captured_graph_runs_eagerly(monkeypatch):
    """A compiled + graphed engine meeting the last partial batch must not compile a second graph
    (seen on the GPU: a 30 s recompile inside the timed window)."""
    import torch._dynamo

    from fastdata.engine import engine as engine_mod

    class FakeGraph:  # stands in for a captured step on this CPU machine
        def __init__(self, shape):
            self.shape, self.calls = shape, 0

        def matches(self, images):
            return tuple(images.shape) == self.shape

        def __call__(self, images, labels):
            self.calls += 1

    monkeypatch.setattr(engine_mod, "try_capture", lambda step, images, *a: FakeGraph(tuple(images.shape)))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eng = Engine(tiny_net(), EngineConfig(compile="default", cuda_graph=True, precision="fp32",
                                          channels_last=False, log_every=1))
    data = _fixed_batches(3, 8) + [(torch.randn(3, 3, 32, 32), torch.randint(0, 10, (3,)))]
    report = eng.fit(data)
    assert report["steps"] == 4 and eng.graphed.calls == 3
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # the partial batch ran eagerly


def test_engine_does_not_augment_uint8_batches_and_says_what_to_do(raw_cache):
    """Batches are augmented once, by the loader (in the engine's dtype); a uint8 batch is an error
    that names the fix instead of a second, float32 augmentation inside the engine."""
    from fastdata.errors import EngineError

    engine = Engine(SmallNet(10), EngineConfig(precision="fp32", log_every=1000), device=torch.device("cpu"))
    with pytest.raises(EngineError, match="uint8 images: give the loader an augmentation"):
        engine.fit(fastdata.loader(raw_cache, 8, device="cpu"), steps=1)
    dl = fastdata.loader(raw_cache, 8, device="cpu", augment=AugmentConfig(size=32))
    engine.train_step(next(iter(dl)))
    assert engine.global_step == 1


def test_a_model_function_that_cannot_take_num_classes_is_named():
    from fastdata.engine.models import resolve_model
    from fastdata.errors import EngineError

    with pytest.raises(EngineError, match=r"--model os:getcwd: cannot be called as getcwd\(num_classes=3\)"):
        resolve_model("os:getcwd", 3)
    assert resolve_model("fastdata.engine.models:SmallNet", 3).head.out_features == 3


def test_an_output_object_with_logits_trains_like_the_tensor_and_a_tuple_is_refused():
    """Hugging Face-style outputs carry .logits; Inception's (logits, aux) is the model's own recipe."""
    from types import SimpleNamespace

    class WithLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny_net()

        def forward(self, x):
            return SimpleNamespace(logits=self.net(x), hidden=None)

    class Pair(WithLogits):
        def forward(self, x):
            out = self.net(x)
            return out, out

    data = _fixed_batches(2, 8)
    cfg = EngineConfig(precision="fp32", channels_last=False, lr=0.1)
    a, b = Engine(WithLogits(), cfg), Engine(tiny_net(), cfg)
    a.fit(data)
    b.fit(data)
    for pa, pb in zip(a.model.net.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    with pytest.raises(EngineError, match="the model returned tuple, not a logits tensor"):
        Engine(Pair(), cfg).fit(data)


def test_models_the_engine_cannot_train_are_named_before_torch_fails():
    """No trainable parameter ("optimizer got an empty parameter list", or "element 0 of tensors does not
    require grad"), and per-pixel logits (cross_entropy's "only batches of spatial targets supported")."""
    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny_net()
            self.net.requires_grad_(False)

        def forward(self, x):
            return self.net(x)

    class NoParams(nn.Module):
        def forward(self, x):
            return x.mean((2, 3))

    class Spatial(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.conv(x)

    cfg = EngineConfig(precision="fp32", channels_last=False, lr=0.1)
    for model in (Frozen(), NoParams()):
        with pytest.raises(EngineError, match=f"{type(model).__name__} has no trainable parameters"):
            Engine(model, cfg)
    with pytest.raises(EngineError, match=r"logits of shape \(8, 4, 32, 32\), not \(N, classes\).*Flatten"):
        Engine(Spatial(), cfg).fit(_fixed_batches(1, 8))
    frozen_backbone = Frozen()
    frozen_backbone.net[-1].requires_grad_(True)            # a head to train: fine
    Engine(frozen_backbone, cfg).fit(_fixed_batches(1, 8))


def test_integer_label_columns_of_any_width_train_like_int64_ids():
    """int32 labels (numpy datasets) and (N, 1) label columns failed cross_entropy; float (N, C) soft
    targets (mixup) pass as they are."""
    from fastdata.engine.engine import class_ids

    cfg = EngineConfig(precision="fp32", channels_last=False, lr=0.1)
    data = _fixed_batches(2, 8)
    ref = Engine(tiny_net(), cfg)
    ref.fit(data)
    for convert in (lambda y: y.int(), lambda y: y[:, None], lambda y: y.to(torch.int16)[:, None]):
        eng = Engine(tiny_net(), cfg)
        eng.fit([(x, convert(y)) for x, y in data])
        for a, b in zip(eng.model.parameters(), ref.model.parameters()):
            assert torch.equal(a, b)
    soft = torch.softmax(torch.randn(8, 10), 1)
    assert class_ids(soft) is soft and class_ids(torch.tensor([True, False])).dtype == torch.int64


def test_dict_batches_train_like_tuples_and_unknown_keys_are_named():
    """Hugging Face datasets collate to {"pixel_values", "labels"}; batch[0] raised KeyError: 0."""
    data = _fixed_batches(2, 8)
    cfg = EngineConfig(precision="fp32", channels_last=False, lr=0.1)
    a, b = Engine(tiny_net(), cfg), Engine(tiny_net(), cfg)
    a.fit([{"pixel_values": x, "labels": y} for x, y in data])
    b.fit(data)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    with pytest.raises(EngineError, match="a dict batch needs an image key .* this one has pic, cls"):
        Engine(tiny_net(), cfg).fit([{"pic": x, "cls": y} for x, y in data])


def test_a_compiler_that_cannot_run_falls_back_to_eager_and_says_why(caplog):
    """A slim container without a C++ compiler: torch.compile's first call raised InductorError out of
    fit(). Now the engine trains eagerly (identical results) and the report carries the reason."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    data = _fixed_batches(2, 8)
    cfg = dict(precision="fp32", channels_last=False, lr=0.1)
    a, b = Engine(tiny_net(), EngineConfig(compile="default", **cfg)), Engine(tiny_net(), EngineConfig(**cfg))
    # inductor's own patch(): monkeypatch's undo deleted the option and broke every later compile
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}), \
            caplog.at_level("WARNING", logger="fastdata.engine"):
        report = a.fit(data)
        torch._dynamo.reset()
    b.fit(data)
    assert "torch.compile failed" in caplog.text and "training without it" in caplog.text
    assert "C++ compiler" in report["compile_error"] and report["steps"] == 2
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    wrong = nn.Sequential(nn.Flatten(), nn.Linear(5, 10))   # a model bug still stops the run, in eager words
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        Engine(wrong, EngineConfig(compile="default", **cfg)).fit(data)
    torch._dynamo.reset()


@pytest.mark.parametrize("kw,needle", [
    (dict(lr=-1), "lr=-1: give a learning rate of 0 or more"),
    (dict(clip_grad=-1.0), "clip_grad=-1.0: give a positive norm, or None"),
    (dict(ckpt_every=-5), "ckpt_every=-5: give 0"),
    (dict(weight_decay=-1e-4), "weight_decay=-0.0001: give 0 or more"),
    (dict(momentum=-0.5), "momentum=-0.5: give 0 or more"),
])
def test_bad_optimizer_settings_are_engine_errors_naming_the_setting(kw, needle):
    """torch's own ValueError (or nothing: clip_grad=-1 and ckpt_every=-5 were taken silently)."""
    with pytest.raises(EngineError, match=needle.replace("(", r"\(")):
        Engine(tiny_net(), EngineConfig(precision="fp32", **kw))


def test_a_classifier_smaller_than_the_label_map_is_warned_about_before_it_fails(raw_cache, caplog):
    """On a GPU a label past the classifier is a bare 'device-side assert triggered'."""
    from fastdata.engine.engine import warn_head_mismatch

    dl = fastdata.loader(raw_cache, 8, device="cpu", augment=AugmentConfig(size=32))
    assert dl.num_classes == 10
    with caplog.at_level("WARNING", logger="fastdata.engine"):
        assert warn_head_mismatch(SmallNet(4), dl.num_classes)
    assert "last Linear layer has 4 outputs but the data has 10 classes" in caplog.text
    assert not warn_head_mismatch(SmallNet(3), 3) and not warn_head_mismatch(SmallNet(10), 3)
    assert not warn_head_mismatch(nn.Conv2d(3, 3, 1), 3) and not warn_head_mismatch(SmallNet(2), None)
