"""The CPU's share of an nvjpeg batch decoded in worker processes (NvjpegOptions.cpu_processes).

Why processes: a thread that decodes holds the GIL for its Python parts (PIL's marker parsing and
copies, ~90 us an image on the CPU box), which a launch-bound training thread waits for; 12 processes
decoding flat out (18.5k img/s) beside compiled resnet18 on an H100 cost its loop nothing
(share-probe-resnet18-H100-80GB-HBM3-2026-12-07.md). Here the reader thread only sends a table of the
share's images (where each JPEG lies: a shard file of the cache and its offset) and waits (GIL released)
while worker processes read and decode them into a slot, each image planar (CHW, nvJPEG's layout); the
GPU thread uploads the slot's pixels in one copy, a DMA where the slot is page-locked (host_pin.py).
JPEGs with no file behind them (JPEG files read through a Source, an object-store cache's evictable
shards) are first copied into the slot by the reader thread.

    slot (a file in /dev/shm, mapped by the loader and by every worker):
    | [JPEG bytes copied in, to 4 KiB] | planar RGB image 0 | image 1 | ... |

Workers are forked when the backend is made, before the loader's threads start, as torch's
DataLoader forks its workers: spawn and forkserver re-import the training script, which runs the
training again where it lacks `if __name__ == "__main__"`. A worker touches neither CUDA nor torch;
it decodes with PIL (libjpeg-turbo) and says which image failed and why, for the loader to name.
Workers run at a lower priority (DECODE_NICE): where the host's CPUs are all busy, the training
thread's launches come first.
"""
from __future__ import annotations

import collections
import mmap
import multiprocessing
import os
import struct
import tempfile
import threading
import weakref

import numpy as np

from ..._util import usable_cpus
from ...errors import LoaderError
from ..spans import EncodedBatch
from . import host_pin
from .decode_worker import serve, task_head

MIN_TASK = 16          # images per worker task at least: each task costs the loader's process a write and a read
RESERVED_CPUS = 4      # left to the training thread, the GPU thread and the readers
FULL_SHARE = 12        # decode processes that took every image (share 1.0) beside resnet18 on an H100 host:
                       # ~1.5k img/s each (share-probe-resnet18-H100-80GB-HBM3-2026-12-07.md: 12 gave 18.5k)
REF_PIXELS = 256 * 256  # ... of the images of that run's cache (build-cache --encode jpeg --size 256)
DECODE_NICE = 10        # added to the decode processes' niceness: a CPU they share with the training thread goes
                        # to the training thread (a launch waiting for a CPU idles the GPU; a late decode only
                        # hands its share back to the GPU, share_steer.py). 12 processes on the 2-core CPU box
                        # left a launching thread 13-18% of its pace at nice 0, 86-92% at 10, 89-104% at 19
                        # (decode-priority-cpu2-2026-12-07.md). On 16-core H100 hosts the training thread
                        # never waited for a CPU (runq 0) and nice 0 or 10 fed resnet18 alike (92.2% / 92.6%,
                        # ...-pipes-a.md): a guard for busier hosts. Threads are not niced: one holding the
                        # GIL while descheduled would stall the training thread behind it
# True: a JPEG cache's share is read by the decode processes from the cache's files (its rows name the file
# and offset), where the reader thread first copied each JPEG into the slot (a Python loop over the share,
# under the GIL: 25% of the reader threads' GIL samples beside resnet18 on an H100). False: always copy
DIRECT_READS = True
_ALIGN = 4096
_FRAME = struct.Struct("!i")    # multiprocessing.connection's frame: a message's length, big-endian


class SlotSpaceError(LoaderError):
    """No room for a decode slot (a small /dev/shm): a share picked by default is given back to the GPU."""


def _shm_dir() -> str | None:
    """tmpfs when there is one (the pages are RAM either way; a disk folder would write them out)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Slot:
    """A file in tmpfs mapped here, grown (as a new file) on demand; page-locked for CUDA device
    `device` where one is given and the driver agrees (host_pin.py; `pinned` says whether it did)."""

    def __init__(self, device: int | None = None) -> None:
        self.device, self.path, self.size, self.array, self._map, self.pinned = device, None, 0, None, None, False
        self._release = None    # unregisters and unlinks at close(), or at exit/collection when never closed

    def ensure(self, nbytes: int) -> np.ndarray:
        """The slot's bytes, at least nbytes of them (a quarter more when it must grow)."""
        if nbytes > self.size:
            self.close()
            size = -(-(nbytes + nbytes // 4) // _ALIGN) * _ALIGN
            fd, path = tempfile.mkstemp(prefix="fastdata-decode-", dir=_shm_dir())
            try:
                os.ftruncate(fd, size)
                # the pages now, or ENOSPC now: a sparse file on a full tmpfs (Docker's 64 MB /dev/shm) would
                # instead kill the writer with SIGBUS at its first write past the room
                os.posix_fallocate(fd, 0, size)
                self._map = mmap.mmap(fd, size)
            except OSError as e:
                os.close(fd)
                os.unlink(path)
                raise SlotSpaceError(f"{path}: cannot make a {size >> 20} MB decode slot ({e.strerror}); free room "
                                     f"in {os.path.dirname(path)} (docker run --shm-size), or set "
                                     f"cpu_processes=0") from None
            os.close(fd)
            self.path, self.size = path, size
            self.array = np.frombuffer(self._map, dtype=np.uint8)
            token = None if self.device is None else host_pin.register(self.array.ctypes.data, size, self.device)
            self.pinned = token is not None
            # tmpfs holds RAM, and a registration must go before its mapping (host_pin.py): a loader never
            # closed (Ctrl-C, an exception, a dropped reference) does both when the slot is collected or
            # at exit. The finalizer holds the mapping, so it is still mapped when the registration goes
            self._release = weakref.finalize(self, _release, path, token, self._map)
        return self.array

    def close(self) -> None:
        if self.path is None:
            return
        m, release = self._map, self._release
        self.array, self._map, self.path, self.size, self.pinned, self._release = None, None, None, 0, False, None
        release()
        try:
            m.close()
        except BufferError:     # a tensor still views it: the mapping goes when that tensor does
            pass


def _release(path: str, token, _mapping) -> None:
    if token is not None:
        host_pin.unregister(token)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def resolve_share(share: float | None, processes: int | None, pixels: float | None = None) -> tuple[float, int]:
    """(share, processes) the nvjpeg backend runs with, None picked. Processes: the CPUs this rank may
    use (torchrun's LOCAL_WORLD_SIZE ranks share the host's) less RESERVED_CPUS, none below 2. Share: each
    process takes 1/FULL_SHARE of the batches of images of REF_PIXELS (the measured 256 px cache), fewer of
    larger ones; pixels is the source's mean pixels an image, None where unknown (a folder of photos of
    any size: not measured, so the GPU decodes it all). A share given with no processes is decoded by
    the reader threads, as asked."""
    if processes is None:
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
        except ValueError:
            local = 1
        processes = max(0, usable_cpus() // local - RESERVED_CPUS)
        processes = processes if processes >= 2 else 0
    if share is None:
        fits = processes and pixels
        share = min(1.0, processes / FULL_SHARE * REF_PIXELS / max(pixels, 1.0)) if fits else 0.0
    return float(share), (processes if share else 0)


def tasks_per_batch(processes: int, readers: int) -> int:
    """Tasks a batch is cut into: with `readers` batches in flight, enough to keep `processes` busy,
    and one more so that a task finishing late leaves no process idle."""
    return max(1, min(processes, -(-processes // max(1, readers)) + 1))


class _Task:
    __slots__ = ("msg", "worker", "sent")

    def __init__(self, msg: bytes) -> None:
        self.msg, self.worker, self.sent = msg, -1, threading.Event()


class DecodePool:
    """`processes` forked decoders, each behind its own pipe; decode() runs in any reader thread.

    A batch is cut into as few tasks as keep every process busy while `readers` reader threads each
    have a batch in flight (one more than processes / readers): each task costs the loader's process
    CPU beside the training thread. Tasks are queued and sent to free workers in the order queued, so
    the oldest batch, the one the training thread waits for next, is decoded first. A task is one write
    of its table of int64 rows to a worker's pipe and one read of its short answer, both with the GIL
    released: no pickling and no helper threads, as a ProcessPoolExecutor has (18-34% less of the
    loader's CPU a batch, pool-overhead-cpu2-2026-12-07-pipes.md). One task per process instead of 3
    (12 processes, 8 readers) fed resnet18 on an H100 no faster: 92.8% / 53.0% of synthetic at 224 /
    160 px against 90.1% / 57.4% (host-probe-resnet18-jpeg-H100-80GB-HBM3-2026-12-07-fifo-*)."""

    def __init__(self, processes: int, readers: int = 1, nice: int | None = None) -> None:
        nice = DECODE_NICE if nice is None else nice
        self.per_batch = tasks_per_batch(processes, readers)
        ctx = multiprocessing.get_context("fork")
        self._conns, self._procs, self._idle = [], [], []
        self._pending: collections.deque[_Task] = collections.deque()
        self._lock, self._broken = threading.Lock(), None
        for k in range(processes):     # every worker forked now, before the loader's threads start
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(theirs, [*self._conns, mine], nice), daemon=True,
                               name=f"fastdata-decode-{k}")
            proc.start()
            theirs.close()
            self._conns.append(mine)
            self._procs.append(proc)
            self._idle.append(k)
        self.pids = [p.pid for p in self._procs]

    def decode(self, slot: Slot, batch: EncodedBatch, heights: np.ndarray, widths: np.ndarray,
               name_of) -> np.ndarray:
        """Reader thread: the batch decoded into the slot as planar RGB images back to back (1-D uint8,
        a view of the slot, valid until the slot's next decode). name_of(j) names image j in an error."""
        lens, sizes = batch.ends - batch.starts, heights * widths * 3
        direct = DIRECT_READS and batch.files is not None
        n_in = 0 if direct else -(-int(lens.sum()) // _ALIGN) * _ALIGN
        buf = slot.ensure(n_in + int(sizes.sum()))
        if direct:      # the processes read the JPEGs from the cache's files: no copy here, under the GIL
            used, which = np.unique(batch.which, return_inverse=True)
            files = [batch.files[k] for k in used.tolist()]
            source = which + 1
            starts = batch.starts + np.array([f[1] for f in files], dtype=np.int64)[which]
        else:           # bytes with no file behind them (JPEG files, an evicting store): copied into the slot
            files, source, starts = [], np.zeros(len(batch), np.int64), batch.packed(buf[:n_in]).starts
        outs = n_in + np.cumsum(sizes) - sizes
        table = np.stack([source, starts, lens, outs, heights, widths], axis=1).astype(np.int64)
        tasks = max(1, min(self.per_batch, len(batch) // MIN_TASK))
        bounds = np.linspace(0, len(batch), tasks + 1).astype(int).tolist()
        head = task_head(slot.path, slot.size, files)
        failed = self._run(slot, [head + table[lo:hi].tobytes() for lo, hi in zip(bounds[:-1], bounds[1:])])
        if failed:
            k, row, why = failed[0]
            if row < 0:
                raise LoaderError(f"a decode process failed on a batch's share ({why}); set cpu_processes=0 to "
                                  f"decode it in the reader threads instead")
            raise LoaderError(f"{name_of(bounds[k] + row)}: {why}; fix or remove the file, or run "
                              f"`fastdata build-cache` to quarantine bad files first")
        return buf[n_in:n_in + int(sizes.sum())]

    def _run(self, slot: Slot, messages: list[bytes]) -> list[tuple[int, int, str]]:
        """Each message queued, sent to a worker in the order queued (the oldest batch's first, as the
        training thread wants them), its answer read back here: (task, row, why) of the tasks that failed."""
        tasks = [_Task(m) for m in messages]
        with self._lock:
            self._pending.extend(tasks)
            self._pump()
        failed: list[tuple[int, int, str]] = []
        try:
            for t, task in enumerate(tasks):   # answers read in the order sent: a batch's tasks end together
                if not task.sent.is_set():      # ours go out oldest first, once a worker is free
                    task.sent.wait()
                self._check()
                got = _read_message(self._conns[task.worker].fileno())
                if got:
                    row, why = got.decode(errors="replace").split("\n", 1)
                    failed.append((t, int(row), why))
                with self._lock:
                    self._idle.append(task.worker)
                    self._pump()
        except (EOFError, OSError) as e:
            self._fail(_died(e, slot.path))
        except BaseException as e:  # a worker in flight is now lost to the idle list: later calls fail, not hang
            if not isinstance(e, LoaderError):
                self._fail(f"the decode processes were left mid-batch ({type(e).__name__}); make a new loader")
            raise
        self._check()
        return failed

    def _pump(self) -> None:
        """Lock held: the oldest queued tasks onto the idle workers."""
        while self._idle and self._pending and not self._broken:
            task, k = self._pending.popleft(), self._idle.pop()
            try:
                _write_message(self._conns[k].fileno(), task.msg)
            except OSError as e:
                self._pending.appendleft(task)
                self._fail(_died(e), locked=True)
                return
            task.worker = k
            task.sent.set()

    def _fail(self, why: str, locked: bool = False) -> None:
        """The pool broken for good: every reader waiting for a worker is woken to raise `why`."""
        if not locked:
            with self._lock:
                return self._fail(why, locked=True)
        self._broken = self._broken or why
        while self._pending:
            self._pending.popleft().sent.set()

    def _check(self) -> None:
        if self._broken:
            raise LoaderError(self._broken)

    def close(self) -> None:
        """Each worker is told to exit (an empty message: the end of its pipe alone is not enough, a
        process forked since may hold a copy of the loader's end); one still there after 10 s is killed."""
        for c in self._conns:
            try:
                _write_message(c.fileno(), b"")
            except OSError:
                pass
            c.close()
        for p in self._procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join()


def _died(e: BaseException, path: str | None = None) -> str:
    """Why the pool is broken when a worker's pipe fails: one message wherever it is found."""
    held = f": {path} holds each batch's share" if path else ""
    return (f"a decode process of the loader died (killed, or out of memory{held}; {type(e).__name__}); "
            f"lower cpu_processes, or set it to 0")


def _write_message(fd: int, msg: bytes) -> None:
    """msg framed as multiprocessing's Connection frames it (the worker reads it with recv_bytes), in
    one write: each system call a loader thread makes is one more time it takes the GIL back from the
    training thread (benchmarks/gil_convoy.py). With _read_message, the loader's threads make 6 calls a
    batch (futex aside) against 8.5 through connection.wait + recv_bytes and 24-27 through a
    ProcessPoolExecutor (pool-syscalls-cpu2-2026-12-07.md)."""
    data = memoryview(_FRAME.pack(len(msg)) + msg)
    while data:
        data = data[os.write(fd, data):]


def _read_message(fd: int) -> bytes:
    """One framed answer, in one read where it fits (answers are short); EOFError where the worker is gone."""
    data = os.read(fd, 65536)
    while len(data) < 4 or len(data) < 4 + _FRAME.unpack_from(data)[0]:
        more = os.read(fd, 65536)
        if not more:
            raise EOFError
        data += more
    return data[4:4 + _FRAME.unpack_from(data)[0]]
