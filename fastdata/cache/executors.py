"""Where shard jobs run: this process, a local process pool, or a Dask cluster.

``shard_map(executor, workers)`` yields (run, counter): run maps shard tasks to an iterator of their
results, in completion order; counter.value is the items the workers have done so far (a progress bar
reads it between shards). Executors:

  local              fork-based process pool of ``workers`` (0: this process). fork, not spawn:
                     spawn re-imports __main__, which breaks stdin scripts and notebooks.
  dask               a dask.distributed LocalCluster of ``workers`` single-threaded processes.
  dask://HOST:PORT   an existing Dask scheduler. Its workers need fastdata installed and DEST
                     (and SRC) at the same path: a shared folder.

Dask jobs are submitted with retries, so a job lost with its worker (killed, OOM, preempted) is
run again elsewhere; a shard is written atomically, so a retried job never leaves half a shard.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from ..errors import BuildError, DependencyError
from .jobs import _init_worker, build_shard

RETRIES = 3


def progress_counter(start: str = "fork"):
    """The items-done count that workers started by `start` share. A fork-context one has no resource-tracker
    process behind it, but reaches only forked workers: a spawn-context one left a tracker that a SIGTERM test
    caught about 1 run in 3 under load."""
    return mp.get_context(start).Value("q", 0)


@contextlib.contextmanager
def shard_map(executor: str, workers: int, fn=build_shard):
    counter = progress_counter()
    if executor == "local":
        with process_map(workers, counter, fn) as run:
            yield run, counter
    else:
        address = executor[len("dask://"):] if executor.startswith("dask://") else None
        with dask_map(address, workers, fn) as run:
            yield run, counter          # (a cluster's workers do not share it: it stays 0)


@contextlib.contextmanager
def process_map(workers: int, counter, fn, start: str = "fork", init=_init_worker, init_args: tuple | None = None):
    """A process pool that notices a worker dying. multiprocessing.Pool replaces a killed worker (the OOM
    killer's SIGKILL) but loses its shard job, and the build then waited for it forever at 98%;
    ProcessPoolExecutor marks the pool broken, which ends the build with a message and a resumable DEST.
    start: the multiprocessing start method; init(*init_args) runs in each worker (default: (counter,))."""
    init_args = (counter,) if init_args is None else init_args
    if workers == 0:
        init(*init_args)
        yield lambda tasks: map(fn, tasks)
        return
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(start), initializer=init, initargs=init_args)
    try:
        # a fork pool starts all its workers at the first submit: do it now, while this process has one
        # thread (the progress bar's monitor thread starts next; forking beside threads can deadlock a child)
        pool.submit(int).result()
    except BrokenProcessPool:
        pool.shutdown(wait=True, cancel_futures=True)
        raise _died(start) from None

    def run(tasks):
        futures = [pool.submit(fn, t) for t in tasks]
        for fut in as_completed(futures):
            try:
                yield fut.result()
            except BrokenProcessPool:
                raise _died(start) from None
    clean = False
    try:
        yield run
        clean = True
    finally:
        if not clean:   # Ctrl-C or an error: stop the shard jobs now instead of waiting for them
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _died(start: str) -> BuildError:
    killed = ("killed by a signal (the kernel's out-of-memory killer sends one: see `dmesg`); the finished shards "
              "are kept: rerun the same command to resume, with fewer --workers or a smaller --shard-size if "
              "memory is short")
    if start == "fork":
        return BuildError(f"a build worker process died: {killed}")
    return BuildError(f"a build worker process died: if a script starts this build, put the call under "
                      f"`if __name__ == \"__main__\":` (these workers import the script first); otherwise it was {killed}")


# A cluster the build starts for itself runs one job per worker and nothing else, so what Dask does
# beside the job each worker pays for in GIL hand-offs: a stack sampler every 10 ms, an event-loop
# health tick every 20 ms, a memory check every 100 ms and a system monitor every 500 ms. None of
# them helps a shard job (a cluster given by address keeps its own settings).
_QUIET_CLUSTER = {
    "distributed.worker.multiprocessing-method": "forkserver",
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "500ms",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
}


def _client(address: str | None, workers: int):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise DependencyError("--executor dask needs Dask: pip install 'fastdata[dask]'") from None
    if address is None:
        import dask

        # forkserver, not Dask's default spawn: each worker forks from a clean server process instead of
        # starting a fresh interpreter, which halved start-up and cut shutdown 10x (1.2 -> 0.6 s and
        # 0.4 -> 0.05 s for 4 workers on the 2-core box); plain fork is faster still, but forking a
        # process that may hold threads (torch, a progress bar) can deadlock the workers. The server
        # keeps the environment it started with, so the build's current one is handed over (env=).
        # the server imports the build's modules once, so no worker pays for numpy, PIL and h5py again
        mp.set_forkserver_preload(["fastdata.cache.jobs", "distributed"])
        with dask.config.set(_QUIET_CLUSTER):
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                   dashboard_address=None, env=dict(os.environ))
        return Client(cluster), cluster
    try:
        return Client(address, timeout="20s"), None
    except (OSError, TimeoutError) as e:
        raise BuildError(f"--executor dask://{address}: cannot reach the Dask scheduler ({e}); start it "
                         f"(dask scheduler) or check the address") from None


@contextlib.contextmanager
def dask_map(address: str | None, workers: int, fn=build_shard):
    """Shard jobs as Dask futures, yielded as they complete (the progress bar follows them)."""
    from dask.distributed import as_completed

    client, cluster = _client(address, workers)

    def run(tasks):
        futures = [client.submit(fn, t, retries=RETRIES, pure=False) for t in tasks]
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            client.cancel(futures)

    try:
        yield run
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
