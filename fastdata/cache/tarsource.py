"""WebDataset-style tar sources: SRC is a .tar, or a folder of .tar files (sorted), no extraction.

A sample is the group of members sharing a basename up to its first dot, within one tar
(``a/x001.jpg`` + ``a/x001.cls`` -> sample ``a/x001``). The image is the member with an image
extension; the label is the integer text of a ``.cls`` / ``.label`` member, or the integer under
"label"/"cls"/"class"/"target" in a ``.json`` member. Where no sample has one, it is the first folder
of the member's path (ImageFolder inside a tar), numbered in sorted order; where some do, a sample
without one is quarantined (it used to become class "0", beside the real class 0).

Nothing is extracted: each item records (tar path, data offset, size), and the build reads those
bytes with one pread. So a member can never be written anywhere, and names are never followed:

* a member name with ``..``, an absolute path, or a NUL is quarantined ("unsafe member name");
* symlink and hardlink members are quarantined ("link member, not followed");
* other non-regular members (devices, fifos, folders) are skipped and counted.

A sample's key is ``<tar name>/<normalised member name>``. Compressed tars cannot be read by
offset and are refused with the command that unpacks them.
"""
from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path

from ..errors import SourceError

TAR_EXTS = (".tar",)
LABEL_EXTS = (".cls", ".label", ".cls.txt")
JSON_LABEL_KEYS = ("label", "cls", "class", "target")


def is_tar_source(src: Path) -> bool:
    if src.is_file():
        return src.suffix.lower() in TAR_EXTS or src.name.lower().endswith((".tar.gz", ".tgz", ".tar.bz2",
                                                                          ".tar.xz"))
    if src.is_dir():
        entries = [p for p in src.iterdir() if not p.name.startswith(".")]
        return bool(entries) and all(p.is_file() and p.suffix.lower() in TAR_EXTS for p in entries)
    return False


def _unsafe(name: str) -> bool:
    return name.startswith("/") or "\0" in name or ".." in name.split("/") or os.path.isabs(name)


def _members(tar_path: Path):
    """(member, problem) for every entry, problem '' for a regular file with a safe name."""
    if not tar_path.name.lower().endswith(".tar"):
        raise SourceError(f"SRC {tar_path}: compressed tars cannot be read in place; unpack it to a plain .tar "
                          f"first (e.g. gunzip -k {tar_path.name}), or extract it to a folder")
    try:
        with tarfile.open(tar_path, "r:") as tf:
            members = tf.getmembers()
    except (tarfile.TarError, OSError) as e:
        raise SourceError(f"SRC {tar_path}: cannot read the tar ({e}); check the file, or give a folder") from e
    for m in members:
        if _unsafe(m.name):
            yield m, f"unsafe member name {m.name!r} (absolute or with '..'): not read"
        elif m.issym() or m.islnk():
            yield m, f"link member, not followed ({m.name} -> {m.linkname})"
        else:
            yield m, ""


def _sample_key(name: str) -> tuple[str, str]:
    """('a/x001', '.jpg') from 'a/x001.jpg'; the basename's first dot starts the extension."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem), (dot + ext).lower()


def _member_bytes(tar_path: Path, m: tarfile.TarInfo, limit: int) -> bytes | None:
    if m.size > limit:
        return None
    with open(tar_path, "rb") as f:
        f.seek(m.offset_data)
        return f.read(m.size)


def _label_text(tar_path: Path, m: tarfile.TarInfo) -> str:
    """A .cls/.label member's text ('' when it is empty or too long to be a label)."""
    data = _member_bytes(tar_path, m, 64)
    return "" if data is None else data.decode("utf-8", "replace").strip()


def _json_label(tar_path: Path, m: tarfile.TarInfo) -> str:
    """The integer under "label", "cls", "class" or "target" of a sample's .json member (WebDataset
    metadata), as text; '' when there is none. json.loads builds plain values only: nothing runs."""
    import json

    data = _member_bytes(tar_path, m, 1 << 16)
    try:
        obj = json.loads(data) if data is not None else None
    except ValueError:
        return ""
    if isinstance(obj, dict):
        for k in JSON_LABEL_KEYS:
            if isinstance(obj.get(k), int) and not isinstance(obj.get(k), bool):
                return str(obj[k])
    return ""


def tar_items(src: Path, image_exts: frozenset[str], item_cls):
    """(items, label_map, skipped) of a tar or folder of tars, in sorted tar then member order."""
    tars = [src] if src.is_file() else sorted(p for p in src.iterdir() if p.suffix.lower() in TAR_EXTS)
    groups, skipped, rejected = {}, [], []
    for tar_path in tars:
        for m, problem in _members(tar_path):
            prefix = f"{tar_path.name}/"
            if problem:
                rejected.append((prefix + m.name.lstrip("/"), problem, str(tar_path)))
                continue
            if not m.isfile():
                if not m.isdir():
                    skipped.append((prefix + m.name, "not a regular file"))
                continue
            name = posixpath.normpath(m.name)   # './a/x.jpg' -> 'a/x.jpg' 
            key, ext = _sample_key(name)
            g = groups.setdefault((tar_path, key), {})
            if ext in LABEL_EXTS:
                g["label"] = _label_text(tar_path, m)
            elif ext == ".json":
                g["json"] = _json_label(tar_path, m)
            elif ext in image_exts or any(ext.endswith(e) for e in image_exts):
                g["image"] = (m, prefix + name)
            else:
                skipped.append((prefix + name, "not an image or label member"))
    return _assemble(groups, rejected, skipped, item_cls)


def _assemble(groups: dict, rejected: list, skipped: list, item_cls):
    """Labels from the samples' label members where any sample has one: then a sample without one is
    quarantined, not given class "0" beside the real class 0. Else from the first folder of the member
    path (ImageFolder inside a tar), or one class "0" for a flat, unlabelled tar."""
    names = {}
    labelled = any(g.get("label") or g.get("json") for g in groups.values() if "image" in g)
    for (tar_path, key), g in groups.items():
        if "image" not in g:
            skipped.append((f"{tar_path.name}/{key}", "sample without an image member"))
            continue
        label = g.get("label") or g.get("json")
        if labelled and not label:
            why = ("its label member is empty or not a label" if "label" in g else
                   "no label member (.cls, .label, or .json with a label) beside its image, while other "
                   "samples have one: not guessed")
            rejected.append((g["image"][1], why, str(tar_path)))
            continue
        names[(tar_path, key)] = label or (key.split("/")[0] if "/" in key else "0")
    values = set(names.values())
    if values and all(v.isdigit() for v in values):
        order = sorted(values, key=int)
    else:
        order = sorted(values)
    label_map = {v: i for i, v in enumerate(order)}
    items = []
    for (tar_path, key), g in groups.items():
        if (tar_path, key) in names:
            m, member_key = g["image"]
            items.append(item_cls(str(tar_path), member_key, label_map[names[(tar_path, key)]],
                                  span=(m.offset_data, m.size)))
    items += [item_cls(tar, key, 0, problem=why) for key, why, tar in rejected]
    items.sort(key=lambda it: it.key)
    return tuple(items), label_map, tuple(skipped)
