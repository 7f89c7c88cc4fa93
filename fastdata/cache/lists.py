"""Parse a file list (.csv/.tsv/.txt/.lst) of `path,label` lines, as spreadsheets and scripts write them.

Accepted: a UTF-8 byte-order mark, a header line (`path,label`, `image,class`, ...), comma, tab or
whitespace separation (sniffed from the first entry; `.tsv` is always tab), `#` comments, blank
lines. Errors give the file's own line number.

Labels: when every label is an integer, ids are the integers' ranks (0,10,...,50 -> 0..5), so a
model sized by the number of classes never meets an id past its last output; the manifest's
label_map keeps the original values as keys. Negative integers are refused. Other labels are
class names, numbered in sorted order (as ImageFolder numbers its folders). A list without labels is one
class ("0"); a line without a label among labelled ones is an error, not class 0.
"""
from __future__ import annotations

import csv
import logging
import os
from pathlib import Path

from ..errors import SourceError

log = logging.getLogger("fastdata.build")
_WARNED: set[str] = set()
HEADER_WORDS = frozenset({"path", "file", "filename", "file_name", "filepath", "image", "img", "image_path",
                          "images", "name", "relpath", "url"})


def _sniff(src: Path, lines: list[tuple[int, str]]) -> str:
    """The separator under which one of the first two lines (the first may be a header) names a file
    that exists: `we,ird/a b.jpg cat` is a path with a comma and a space-separated label. Where none
    does, tab if there is one, else comma if there is one, else whitespace."""
    if src.suffix.lower() == ".tsv":
        return "tab"
    for _, line in lines[:2]:
        for how in ("tab", "comma", "space"):
            parts = _split(line, how)
            if parts and parts[0] and resolve(parts[0], src).is_file():
                return how
    first = lines[0][1]
    if "\t" in first:
        return "tab"
    return "comma" if "," in first else "space"


def resolve(path: str, src: Path) -> Path:
    """A list's path: relative ones are relative to the list's folder."""
    p = Path(path)
    return p if p.is_absolute() else src.parent / p


def _split(line: str, how: str) -> list[str]:
    if how == "tab":
        return [p.strip() for p in line.split("\t")]
    if how == "comma":
        return [p.strip() for p in next(csv.reader([line]))]
    return line.strip().rsplit(None, 1)


def _is_header(path: str, src: Path) -> bool:
    p = resolve(path, src)
    return path.lower() in HEADER_WORDS or (not p.exists() and not p.suffix)


def _int_label(name: str) -> int | None:
    try:
        return int(name)
    except ValueError:
        return None


def read_list(src: Path) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """([(line number, path, label name)], label_map name -> contiguous id)."""
    try:
        text = src.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{src}: cannot read file list ({e}); give a UTF-8 text file of 'path,label' lines") from e
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise SourceError(f"{src}: no entries (the list is empty, or only comments); add one 'path,label' line "
                          f"per image")
    how = _sniff(src, lines)
    rows = []
    for n, line in lines:
        parts = _split(line, how)
        rows.append((n, parts[0], parts[1] if len(parts) > 1 else ""))
    if _is_header(rows[0][1], src):
        rows = rows[1:]
    if not rows:
        raise SourceError(f"{src}: line {lines[0][0]} is a header (or names a missing file without an "
                          f"extension) and no entries follow; add one 'path,label' line per image")
    unlabelled = [n for n, _, name in rows if not name]
    if unlabelled and len(unlabelled) < len(rows):   # a list without labels is one class; a gap is an error
        raise SourceError(f"{src}: line {unlabelled[0]} has no label but other lines do"
                          f"{f' ({len(unlabelled)} such lines)' if len(unlabelled) > 1 else ''}; give every "
                          f"line a label, or none")
    rows = [(n, path, name or "0") for n, path, name in rows]
    _warn_conflicts(src, rows)
    return _label_map(src, rows)


def _warn_conflicts(src: Path, rows: list[tuple[int, str, str]]) -> None:
    """A path listed twice with different labels (a spreadsheet merged from two sources) is kept as two
    samples, as written, with a warning naming the first such pair of lines."""
    seen: dict[str, tuple[int, str]] = {}
    clashes = []
    for n, path, name in rows:
        key = os.path.normpath(path)
        first = seen.setdefault(key, (n, name))
        if first[1] != name:
            clashes.append((first[0], n, path))
    if clashes and str(src) not in _WARNED:   # once a process: `train` discovers a list twice
        _WARNED.add(str(src))
        a, b, path = clashes[0]
        log.warning("%s: %s is labelled differently on lines %d and %d%s; each line stays a sample, as written: "
                    "fix the labels if one is wrong", src, path, a, b,
                    f" ({len(clashes)} such lines)" if len(clashes) > 1 else "")


def _label_map(src: Path, rows: list[tuple[int, str, str]]) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """Rows with integer labels written canonically ('007' -> '7'), and the label map."""
    ints = [_int_label(name) for _, _, name in rows]
    if rows and all(v is not None for v in ints):
        for (n, _, name), v in zip(rows, ints):
            if v < 0:
                raise SourceError(f"{src}: line {n} has label {name}; labels must be 0 or more (or class names)")
        rows = [(n, path, str(v)) for (n, path, _), v in zip(rows, ints)]
        return rows, {str(v): i for i, v in enumerate(sorted(set(ints)))}
    return rows, {name: i for i, name in enumerate(sorted({name for _, _, name in rows}))}
