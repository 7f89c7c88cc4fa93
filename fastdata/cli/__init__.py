"""The `fastdata` command: one module per command group.

    main.py      parser, dispatch, errors -> one line and exit 2
    build.py     build-cache, plan, verify, info, stage, merge (the write side)
    train.py     train (the engine)
    doctor.py    doctor, monitor
    assemble.py  the one place that makes (engine, loader) from run settings: train, doctor, benchmarks
"""
from .main import COMMANDS, _parser, main

__all__ = ["COMMANDS", "_parser", "main"]
