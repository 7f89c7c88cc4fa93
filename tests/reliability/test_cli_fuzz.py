"""Fuzz every command's arguments: exit code 2 with a message, never a traceback."""
from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdata.cli import main

JUNK = st.sampled_from(["", "-", "--", "x", "-1", "0", "1/0", "3/2", "999999999999", "nan", "1e309", "/nonexistent",
                        "/dev/null", "/tmp/../..", "\x00", "é", "--format", "--size", "--part", "--workers",
                        "--encode", "--shard-size", "--batch-size", "auto", "--steps", "--model", "no.such:fn",
                        "--precision", "fp8", "--remove", "--resume", "--data", "--seconds", "-v", "0MB", "-5GB"])
COMMANDS = {
    "build-cache": ["/nonexistent/src", "/nonexistent/dst"],
    "verify": ["/nonexistent/cache"],
    "info": ["/nonexistent/cache"],
    "stage": ["/nonexistent/cache", "/nonexistent/target"],
    "merge": ["/nonexistent/out", "/nonexistent/p0"],
    "train": ["--data", "/nonexistent/cache", "--steps", "1"],
    "doctor": ["--data", "/nonexistent/cache", "--seconds", "0.1"],
}


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
    return code, err.getvalue()


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.lists(JUNK, max_size=5), keep=st.booleans())
def test_fuzzed_arguments_fail_cleanly(cmd, extra, keep, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)        # relative junk arguments ("auto", "3/2") land here, not in the repo
    argv = [cmd] + (COMMANDS[cmd] if keep else []) + extra
    if "\x00" in "".join(argv) and cmd in ("train", "doctor"):
        argv = [a.replace("\x00", "") for a in argv]
    code, err = _run(argv)
    assert "Traceback" not in err
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.strip(), argv


@pytest.mark.parametrize("argv", [["build-cache", "/tmp", "/tmp/\x00"], ["info", "\x00"],
                                  ["stage", "x", "y\x00", "--remove"]])
def test_nul_bytes_anywhere_fail_cleanly(argv):
    code, err = _run(argv)
    assert code == 2 and "NUL byte" in err
