"""Find build inputs: an ImageFolder tree, a file list / CSV, or any folder of small files.

Discovery is deterministic (sorted paths) so that a resumed or partitioned
build sees exactly the same item order as an uninterrupted one.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
LIST_EXTS = frozenset({".csv", ".txt", ".tsv", ".lst"})


@dataclass(frozen=True)
class Item:
    path: str   # absolute path to read
    key: str    # path relative to SRC, stored in the shard for audits
    label: int


@dataclass(frozen=True)
class Source:
    items: tuple[Item, ...]
    label_map: dict[str, int]
    layout: str  # "folder" | "flat" | "list"


def _files_under(root: Path, images_only: bool) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        if any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        if p.is_file() and (not images_only or p.suffix.lower() in IMAGE_EXTS):
            out.append(p)
    return sorted(out)


def _from_folder(src: Path, images_only: bool) -> Source:
    classes = sorted(d.name for d in src.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        files = _files_under(src, images_only)
        items = tuple(Item(str(p), p.relative_to(src).as_posix(), 0) for p in files)
        return Source(items, {".": 0}, "flat")
    label_map = {c: i for i, c in enumerate(classes)}
    items = []
    for c in classes:
        for p in _files_under(src / c, images_only):
            items.append(Item(str(p), p.relative_to(src).as_posix(), label_map[c]))
    return Source(tuple(items), label_map, "folder")


def _read_list_rows(src: Path) -> list[list[str]]:
    try:
        text = src.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{src}: cannot read file list ({e}); give a UTF-8 text file of 'path,label' lines") from e
    delim = "\t" if src.suffix.lower() == ".tsv" else ","
    rows = [r for r in csv.reader(text.splitlines(), delimiter=delim) if r and r[0].strip() and not r[0].startswith("#")]
    if rows and rows[0][0].strip().lower() in ("path", "file", "filename"):
        rows = rows[1:]
    return rows


def _from_list(src: Path) -> Source:
    rows = _read_list_rows(src)
    names = [r[1].strip() if len(r) > 1 else "0" for r in rows]
    if all(n.lstrip("-").isdigit() for n in names):
        label_map = {n: int(n) for n in sorted(set(names), key=int)}
    else:
        label_map = {n: i for i, n in enumerate(sorted(set(names)))}
    items = []
    for lineno, (row, name) in enumerate(zip(rows, names), start=1):
        p = Path(row[0].strip())
        p = p if p.is_absolute() else (src.parent / p)
        if not p.is_file():
            raise SourceError(f"{src}: entry {lineno} names {p}, which does not exist; fix or remove that line")
        items.append(Item(str(p), row[0].strip(), label_map[name]))
    return Source(tuple(items), label_map, "list")


def discover(src: str | Path, images_only: bool = True) -> Source:
    """Return the sorted items of SRC. images_only=False keeps every file (kind=bytes)."""
    src = Path(src)
    if not src.exists():
        raise SourceError(f"SRC {src} does not exist; give an image folder (class sub-folders) or a file list (.csv/.txt)")
    if src.is_file():
        if src.suffix.lower() not in LIST_EXTS:
            raise SourceError(f"SRC {src} is a file but not a list (.csv/.txt/.tsv of 'path,label' lines)")
        source = _from_list(src)
    elif not src.is_dir():
        raise SourceError(f"SRC {src} is neither a folder nor a regular file; give an image folder "
                          f"(class sub-folders) or a file list (.csv/.txt)")
    else:
        try:
            source = _from_folder(src, images_only)
        except OSError as e:  # unreadable sub-folder or file: name it rather than fail with a traceback
            raise SourceError(f"SRC {src}: cannot scan {e.filename or src} ({e.strerror or e}); "
                              f"fix its permissions or point SRC at the dataset folder itself") from e
    if not source.items:
        what = "image files (" + ", ".join(sorted(IMAGE_EXTS)) + ")" if images_only else "files"
        raise SourceError(f"SRC {src}: no {what} found; expected class sub-folders of images, "
                          f"or use --encode bytes for other files")
    return source


def partition(items: tuple[Item, ...], part: tuple[int, int] | None) -> tuple[Item, ...]:
    """Contiguous slice i of n (0-based) for job arrays; slices are disjoint and complete."""
    if part is None:
        return items
    i, n = part
    return items[i * len(items) // n:(i + 1) * len(items) // n]
