"""Backends: how sample indices become a batch on the device. A new backend is one file.

A backend has, besides the attributes the core reads (``name`` for Batch.source, ``kind`` = its
LoaderConfig.backend, ``where`` for messages, ``device``, ``shard_counts`` and ``window`` for the
SampleOrder, ``streamed``):

    ring(n), fresh_slot()  the slots reads write into (a pinned ring, reused once copied out)
    read(key, idx, slot)   reader thread: fetch (and for CPU decoders decode) the batch's samples
    stage(slot, out, n)    main thread: start the batch's trip to the device, without a host wait
    finish(staged, idx)    main thread: (images, labels) ready on the training stream
    close()

or, when ``streamed`` (DALI runs its own prefetching pipeline): ``next_batch(epoch, position) ->
(indices, images, labels)``. BaseBackend gives the optional hooks their do-nothing defaults.
"""
from __future__ import annotations


class BaseBackend:
    streamed = False
    stage_ahead = 1        # batches staged (copy or GPU decode in flight) beyond the one being trained on

    def attach(self, order) -> None:
        """The loader's SampleOrder, for backends that plan ahead themselves (DALI)."""

    def ring(self, n: int) -> list[dict] | None:
        """n reusable (pinned) slots for reads, or None: then each read gets a fresh_slot()."""
        return None

    def fresh_slot(self) -> dict:
        return {}

    def begin(self, batches) -> None:
        """A pass starts with these batches (lists of sample indices)."""

    def submitted(self, k: int) -> None:
        """Batch k of the current pass was just handed to a reader."""

    def waited(self, seconds: float) -> None:
        """The training thread waited this long for the next batch's read (0.0: it was ready)."""

    def close(self) -> None:
        pass
