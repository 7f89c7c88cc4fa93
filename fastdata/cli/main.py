"""`fastdata build-cache | verify | info | stage | merge | train | doctor | bench | demo`.

Every FastdataError becomes one line on stderr and exit code 2; argparse's
own usage errors also exit 2. Tracebacks are for bugs only.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from .. import demo
from ..errors import FastdataError
from . import build, doctor, train

log = logging.getLogger("fastdata")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fastdata", description="Make PyTorch training GPU-bound.")
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for module in (build, train, doctor, demo):
        module.add_cli(sub, COMMANDS)
    return ap


COMMANDS: dict = {}


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    argv = sys.argv[1:] if argv is None else argv
    if any("\x00" in x for x in argv):
        ap.error("an argument contains a NUL byte; no path or option can contain one")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO, format="%(name)s: %(message)s")
    fn = COMMANDS[a.cmd]
    for stream in (sys.stdout, sys.stderr):   # file names that are not UTF-8 print escaped, not crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    main_thread = threading.current_thread() is threading.main_thread()   # (signals go to that one only)
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None   # train sets its own
    try:
        code = fn(a)
        sys.stdout.flush()   # inside the try: a closed pipe shows up here, not at interpreter exit
        return code
    except Terminated:
        print(f"fastdata {a.cmd}: terminated (SIGTERM); rerun the same command to resume", file=sys.stderr)
        return 143
    except BrokenPipeError:   # `fastdata info CACHE | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except FastdataError as e:
        print(f"fastdata {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastdata {a.cmd}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except RuntimeError as e:   # torch.OutOfMemoryError (torch is not imported here for every command)
        if type(e).__name__ != "OutOfMemoryError":
            raise
        fix = ("lower --batch-size, or pass --batch-size auto to find the largest that fits" if a.cmd == "train"
               else "free GPU memory (another process on it?) and rerun the same command")
        print(f"fastdata {a.cmd}: error: the GPU ran out of memory ({str(e).splitlines()[0][:160]}); {fix}",
              file=sys.stderr)
        return 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class Terminated(KeyboardInterrupt):
    """SIGTERM (Slurm at its time limit, `docker stop`, kill): unwinds like Ctrl-C, so a build stops its
    workers at once and keeps its journal, where Python's default ended the process on the spot and left
    the pool's workers running on."""


def _terminated(signum, frame) -> None:
    raise Terminated()


