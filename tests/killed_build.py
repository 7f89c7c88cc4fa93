"""Run `fastdata` in this process and kill -9 its whole process group at a chosen point of a build.

usage: python tests/killed_build.py SHARDS EXTRA_S -- CLI ARGS...

The kill comes from inside the build, after the journal has recorded SHARDS shards and EXTRA_S
more seconds have passed while this process waits in its journal save (so it commits nothing
further while its workers go on writing their shards). A poll from outside, as the tests once did,
lands after the build has finished on a loaded machine; this cannot: the manifest is never
written, and the workers die wherever they are mid-write.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from fastdata.cache.journal import Journal
from fastdata.cli.main import main


def _arm(shards: int, extra_s: float) -> None:
    save = Journal.save

    def save_then_die(self, dest):
        save(self, dest)
        if len(self.shards) >= shards:
            time.sleep(extra_s)
            os.killpg(0, signal.SIGKILL)

    Journal.save = save_then_die


if __name__ == "__main__":
    _arm(int(sys.argv[1]), float(sys.argv[2]))
    sys.exit(main(sys.argv[4:]))
