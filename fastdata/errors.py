"""Errors that users see. Each message says what happened, to which file, and what to do.

The CLI turns every FastdataError into one line on stderr and exit code 2, so a
user never sees a traceback for a problem they can fix themselves.
"""
from __future__ import annotations


class FastdataError(Exception):
    """Base class: a problem the user can fix; the message says how."""


class SourceError(FastdataError):
    """The build input (SRC) cannot be read or understood."""


class BuildError(FastdataError):
    """A cache build could not proceed (lock held, config changed, write failed)."""


class CacheFormatError(FastdataError):
    """A cache on disk is missing, damaged or of an unsupported format version."""


class SampleError(FastdataError):
    """One input sample could not be decoded (quarantined or raised per policy)."""


class LoaderError(FastdataError):
    """A loader could not deliver batches (bad argument, worker died, cache changed)."""


class EmptyEpochError(LoaderError):
    """drop_last with fewer samples per rank than one batch: every epoch would be empty."""

    def __init__(self, message: str, samples: int) -> None:
        super().__init__(message)
        self.samples = samples      # per rank


class DependencyError(FastdataError):
    """An optional dependency is missing; the message names the extra to install."""


class EngineError(FastdataError):
    """The training engine stopped (non-finite loss per policy, bad config)."""


class CheckpointError(EngineError):
    """A checkpoint is missing, damaged, or would need code to run to be opened."""
