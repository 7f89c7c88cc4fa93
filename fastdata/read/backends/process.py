"""A decoding backend (nvjpeg, pil) run in a child process, its batches handed over through a shared ring.

Why a process: a compiled ResNet-18 step on the H200 needs the host (main thread plus autograd's
thread, both holding the GIL to launch) for about as long as the GPU needs for it. Every
millisecond another thread of the process holds the GIL is then lost, and each hand-off between
threads costs more. Fed by nvJPEG in reader and decode threads, resnet18 ran at 54% of synthetic;
the same decoding in another process at the model's rate left it at 100%
(benchmarks/host_probe.py --jpeg, results/host-probe-resnet18-jpeg-H200-2026-12-04.md). So:

    child:   a Loader with the same config (in-process) decodes ahead; batch -> slot k of a ring
             it allocated on the device, event done[k] recorded -> message ("batch", ..., k)
    parent:  this streamed backend: the training stream waits for done[k] (no host sync), clones
             slot k into a fresh tensor (the batch the user may keep), records free[k] -> ("free", k)

The child allocates the ring and the done events, the parent the free events; CUDA tensors and
events cross as IPC handles (torch.multiprocessing). On the CPU the ring is shared memory and the
messages alone order the writes. The order is the parent's SampleOrder; the child follows it from
the (epoch, position) the parent asks for ("start"), so resume and early exits work as in process.
The pipe carries only our own messages between our own processes, never bytes read from a cache.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import threading
import weakref
from collections import deque
from multiprocessing.connection import Client, Listener
from pathlib import Path

import torch
import torch.multiprocessing  # noqa: F401 - registers the reductions that share CUDA and CPU tensors

from ...errors import FastdataError, LoaderError
from ..encoded import EncodedSource
from ..order import resolve_rank_world
from . import BaseBackend
from .decode import source_attrs

START_TIMEOUT_S = 600.0     # spawn, import torch, CUDA context, first batch


class ProcessBackend(BaseBackend):
    streamed = True

    def __init__(self, data, cfg, device: torch.device) -> None:
        self.kind, self.device = cfg.backend, device
        source_attrs(self, EncodedSource(data, cfg.options.integrity), cfg.backend)
        rank, world = resolve_rank_world(cfg.rank, cfg.world_size)
        child_cfg = dataclasses.replace(cfg, rank=rank, world_size=world, process=False)
        self.bs, self.slots = cfg.batch_size, max(2, cfg.read_ahead)
        self.drop_last = cfg.drop_last
        self._proc, self._conn = _spawn()
        self._finalizer = weakref.finalize(self, _shutdown, self._conn, self._proc)
        cuda = device.type == "cuda"
        self._free = [torch.cuda.Event(interprocess=True) for _ in range(self.slots)] if cuda else None
        self._conn.send(("init", str(data), child_cfg, self.slots, self._free))
        self._ring = self._done = None
        self._gen, self._expect = 0, None

    def attach(self, order) -> None:
        self.order = order

    def next_batch(self, epoch: int, position: int):
        if self._expect != (epoch, position):
            self._gen += 1
            self._send(("start", self._gen, epoch, position))
            self._expect = (epoch, position)
        while True:
            msg = self._recv()
            if msg[0] == "ring":
                self._ring, self._done = msg[1], msg[2]
                continue
            _, gen, e, p, k, idx = msg
            if gen != self._gen:            # made for a position left behind: hand the slot back
                self._send(("free", k))
                continue
            images, labels = self._take(k, len(idx))
            self._expect = self._after(e, p + len(idx))
            return idx, images, labels

    def _take(self, k: int, n: int):
        images, labels = self._ring[k]
        if self._done is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_event(self._done[k])
            out = images[:n].clone(), labels[:n].clone()
            self._free[k].record(main)
        else:
            out = images[:n].clone(), labels[:n].clone()
        self._send(("free", k))
        return out

    def _after(self, epoch: int, position: int) -> tuple[int, int]:
        """Where the child goes on after a batch ending at position: the next epoch after the last."""
        per_rank = sum(self.shard_counts) // self.order.cfg.world_size
        end = per_rank - per_rank % self.bs if self.drop_last else per_rank
        return (epoch + 1, 0) if position >= end else (epoch, position)

    def _dead(self) -> LoaderError:
        return LoaderError(f"{self.where}: the decoding process ({self.kind}) exited with code "
                           f"{self._proc.wait()}; pass process=False to decode in this process")

    def _send(self, msg) -> None:
        try:
            self._conn.send(msg)
        except OSError:
            raise self._dead() from None

    def _recv(self):
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if self._proc.poll() is not None:
                raise self._dead()
            if waited > START_TIMEOUT_S:
                raise LoaderError(f"{self.where}: no batch from the decoding process in {waited:.0f} s")
        try:
            msg = self._conn.recv()
        except EOFError:
            raise LoaderError(f"{self.where}: the decoding process closed its pipe (exit code "
                              f"{self._proc.exitcode}); pass process=False to decode in this process") from None
        if msg[0] == "error":
            raise LoaderError(msg[1])
        return msg

    def close(self) -> None:
        self._finalizer()


def _spawn():
    """The child: a fresh interpreter (not multiprocessing's spawn, which re-runs the user's main
    module and needs an `if __name__ == "__main__"` guard most training scripts lack), connected
    back over a Unix socket with this process's authkey (torch shares CPU tensors by passing file
    descriptors, which multiprocessing authenticates with that key)."""
    key = multiprocessing.current_process().authkey
    listener = Listener(family="AF_UNIX", authkey=key)
    package_root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "FASTDATA_DECODE_ADDRESS": listener.address, "FASTDATA_DECODE_KEY": key.hex(),
           "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", "from fastdata.read.backends.process import child_main; "
                             "child_main()"], env=env)
    accepted: list = []
    waiter = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    waiter.start()
    while waiter.is_alive() and proc.poll() is None:
        waiter.join(0.5)
    listener.close()
    if not accepted:
        proc.wait()
        raise LoaderError(f"the decoding process exited with code {proc.returncode} before it connected; "
                          f"pass process=False to decode in this process")
    return proc, accepted[0]


def _shutdown(conn, proc) -> None:
    try:
        conn.send(("stop",))
    except (OSError, ValueError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(5)
    conn.close()


# ---- the child ----------------------------------------------------------------------------------
def child_main() -> None:
    """Entry point of the decoding process (_spawn)."""
    key = bytes.fromhex(os.environ["FASTDATA_DECODE_KEY"])
    multiprocessing.current_process().authkey = key
    conn = Client(os.environ["FASTDATA_DECODE_ADDRESS"], family="AF_UNIX", authkey=key)
    from ..verbs import make_loader

    try:
        _, data, cfg, slots, free_events = conn.recv()
        device = torch.device(cfg.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _Child(conn, make_loader(Path(data), cfg), free_events, slots).run()
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return                                      # the parent went away
    except BaseException as e:  # noqa: BLE001 - every failure goes to the parent, which raises it
        text = str(e) if isinstance(e, FastdataError) else f"decoding process failed: {type(e).__name__}: {e}"
        try:
            conn.send(("error", text))
        except (OSError, ValueError):
            pass


class _Child:
    def __init__(self, conn, loader, free_events, slots: int) -> None:
        self.conn, self.loader, self.free_events = conn, loader, free_events
        self.slots, self.free = slots, deque(range(slots))
        self.ring: list | None = None
        self.done: list | None = None
        self.target = None                  # (generation, epoch, position) of the last "start"

    def handle(self, msg) -> bool:
        """False on stop."""
        if msg[0] == "free":
            self.free.append(msg[1])
        elif msg[0] == "start":
            self.target = msg[1:]
        return msg[0] != "stop"

    def run(self) -> None:
        while True:
            if self.target is None:
                if not self.handle(self.conn.recv()):
                    return
                continue
            (gen, epoch, position), self.target = self.target, None
            self.loader.seek(epoch, position)
            if not self.produce(gen, epoch, position):
                return

    def produce(self, gen: int, epoch: int, position: int) -> bool:
        """Batches from (epoch, position) on, across epochs, until a new start (True) or stop (False)."""
        while True:
            made = 0
            for batch in self.loader:
                while not self.free or self.conn.poll():
                    if not self.handle(self.conn.recv()):
                        return False
                    if self.target is not None:
                        return True
                k = self.free.popleft()
                self.put(k, batch)
                idx = batch.indices.numpy()
                self.conn.send(("batch", gen, epoch, position, k, idx))
                position, made = position + len(idx), made + 1
            if not made:                    # an empty epoch: wait for the parent
                return True
            epoch, position = epoch + 1, 0

    def put(self, k: int, batch) -> None:
        images, labels = batch
        if self.ring is None:
            self.ring, self.done = _ring(images, labels, self.slots, self.loader.cfg.batch_size)
            self.conn.send(("ring", self.ring, self.done))
        n = len(labels)
        dst_images, dst_labels = self.ring[k]
        if self.done is not None:
            stream = torch.cuda.current_stream(images.device)
            stream.wait_event(self.free_events[k])   # the parent's clone of this slot has run
            dst_images[:n].copy_(images)
            dst_labels[:n].copy_(labels)
            self.done[k].record(stream)
        else:
            dst_images[:n].copy_(images)
            dst_labels[:n].copy_(labels)


def _ring(images: torch.Tensor, labels: torch.Tensor, slots: int, bs: int):
    """slots x (images, labels) shaped like a full batch, and their done events (CUDA) or None."""
    fmt = torch.channels_last if images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last) \
        and not images.is_contiguous() else torch.contiguous_format
    ring = []
    for _ in range(slots):
        im = torch.empty((bs, *images.shape[1:]), dtype=images.dtype, device=images.device, memory_format=fmt)
        lb = torch.empty((bs, *labels.shape[1:]), dtype=labels.dtype, device=labels.device)
        ring.append((im.share_memory_(), lb.share_memory_()) if images.device.type == "cpu" else (im, lb))
    done = [torch.cuda.Event(interprocess=True) for _ in range(slots)] if images.device.type == "cuda" else None
    return ring, done
