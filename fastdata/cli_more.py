"""CLI commands for the read side, engine and tools: demo, bench, train, doctor, monitor."""
from __future__ import annotations

COMMANDS: dict = {}


def add_commands(sub) -> None:
    """Register the commands whose code lives outside the write side."""
    from . import demo
    from .engine import cli as train_cli
    from .monitor import cli as monitor_cli

    demo.add_cli(sub, COMMANDS)
    train_cli.add_cli(sub, COMMANDS)
    monitor_cli.add_cli(sub, COMMANDS)
