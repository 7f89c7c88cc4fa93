"""Find build inputs: an ImageFolder tree, a file list / CSV, or any folder of small files.

Discovery is deterministic (sorted paths) so that a resumed or partitioned
build sees exactly the same item order as an uninterrupted one.

Folder semantics follow torchvision's ImageFolder: classes are the sorted
sub-folders of SRC (symlinked ones included), files are found recursively
with symlinks followed (a link back to an ancestor folder is a loop and is
skipped), and a class folder with no image is refused unless
``allow_empty_classes``. Nothing is dropped silently: every entry left out
(hidden, not an image, a loop, a fastdata cache inside SRC, a file beside the
class folders) is counted in ``Source.skipped`` with its reason. A symlink
whose target is gone is kept as an item, so the build quarantines it with a
reason that names the missing target instead of the data set looking complete.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._util import refuse_url, user_path
from .codecs import dangling
from ..errors import SourceError
from .format import MANIFEST, is_manifest
from .journal import BUILD_DIR, JOURNAL
from .lists import read_list, resolve
from .tarsource import is_tar_source, tar_items

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
LIST_EXTS = frozenset({".csv", ".txt", ".tsv", ".lst"})


@dataclass(frozen=True)
class Item:
    path: str   # absolute path to read (a file, or the tar that holds the member)
    key: str    # path relative to SRC, stored in the shard for audits
    label: int
    span: tuple[int, int] | None = None   # (offset, size) of the bytes inside path (tar members)
    problem: str = ""                     # set at discovery: quarantined with this reason, never read


@dataclass(frozen=True)
class Source:
    items: tuple[Item, ...]
    label_map: dict[str, int]
    layout: str  # "folder" | "flat" | "list" | "tar"
    skipped: tuple[tuple[str, str], ...] = ()   # (path relative to SRC, why it was left out)

    def skipped_summary(self) -> str:
        """'3 entries skipped: 2 not an image file, 1 hidden' (empty when nothing was skipped)."""
        if not self.skipped:
            return ""
        counts = Counter(why for _, why in self.skipped)
        parts = ", ".join(f"{n} {why}" for why, n in counts.most_common())
        n = len(self.skipped)
        return f"{n} {'entry' if n == 1 else 'entries'} skipped: {parts}"


def with_classes(source: Source, label_map: dict[str, int], origin: str) -> Source:
    """source numbered by another cache's label map (build-cache --classes-from TRAIN_CACHE), as
    torchvision's DatasetFolder takes a class_to_idx: a validation folder or list that lacks a class
    would otherwise number every later class one lower than the training cache does, silently. Each
    class of source must be in label_map; classes of label_map without samples here are fine."""
    names = {v: k for k, v in source.label_map.items()}
    unknown = sorted({names[it.label] for it in source.items} - label_map.keys())
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise SourceError(f"--classes-from {origin}: SRC has class(es) {shown} that {origin} does not know "
                          f"(it has {len(label_map)}: {', '.join(list(label_map)[:3])}{', ...' if len(label_map) > 3 else ''}); fix SRC's class "
                          f"names, or build without --classes-from")
    items = tuple(replace(it, label=label_map[names[it.label]]) for it in source.items)
    return replace(source, items=items, label_map=dict(label_map))


def read_item(item: Item, options: dict | None = None) -> bytes:
    """An item's bytes: a file, a member of a tar (one pread at its offset), or an s3:// object."""
    if item.path.startswith("s3://"):
        from ..stores.s3 import filesystem, strip

        return filesystem(options).cat_file(strip(item.path))
    with open(item.path, "rb") as f:
        if item.span is None:
            return f.read()
        return os.pread(f.fileno(), item.span[1], item.span[0])


def is_cache_dir(path: str | Path) -> bool:
    """A fastdata cache (finished, or being built: its lock is taken first): never an input class. A
    folder holding another tool's manifest.json or a .build folder of its own is not one."""
    p = Path(path)
    return is_manifest(p / MANIFEST) or (p / BUILD_DIR / "lock").is_file() or (p / JOURNAL).is_file()


@dataclass
class _Scan:
    images_only: bool
    exclude: frozenset[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def skip(self, rel: str, why: str) -> None:
        self.skipped.append((rel, why))

    def wanted(self, name: str) -> bool:
        return not self.images_only or os.path.splitext(name)[1].lower() in IMAGE_EXTS

    def walk(self, folder: str, rel: str, ancestors: frozenset[str]) -> list[tuple[str, str, str]]:
        """(path, key, problem) of every input under folder, sorted as Path objects sort (by parts). A
        dangling symlink is kept with its problem set here, where the scan has found it anyway: a build
        quarantines it, and a loader reading the folder directly leaves it out with a warning
        (encoded._readable) instead of failing the batch that holds it mid-epoch. A link to a device or
        pipe is not kept (/dev/zero never ends)."""
        out = []
        for e in sorted(os.scandir(folder), key=lambda e: e.name):
            key = f"{rel}/{e.name}" if rel else e.name
            if e.name.startswith("."):
                self.skip(key, "hidden")
            elif e.is_dir(follow_symlinks=True):
                if self._enter(e.path, key, ancestors):
                    out += self.walk(e.path, key, ancestors | {os.path.realpath(e.path)})
            elif not (e.is_file(follow_symlinks=True) or (e.is_symlink() and not os.path.exists(e.path))):
                self.skip(key, "not a regular file")
            elif not self.wanted(e.name):
                self.skip(key, "not an image file" if self.images_only else "not a file")
            else:
                out.append((e.path, key, "" if e.is_file(follow_symlinks=True) else dangling(e.path)))
        return out

    def _enter(self, path: str, key: str, ancestors: frozenset[str]) -> bool:
        real = os.path.realpath(path)
        if real in ancestors:
            self.skip(key, "symlink loop")
        elif real in self.exclude or is_cache_dir(path):
            self.skip(key, "a fastdata cache")
        else:
            return True
        return False


def _from_folder(src: Path, images_only: bool, exclude: frozenset[str], allow_empty: bool) -> Source:
    scan = _Scan(images_only, exclude)
    root = os.path.realpath(src)
    classes = []
    for e in sorted(os.scandir(src), key=lambda e: e.name):
        if e.name.startswith("."):      # .ipynb_checkpoints/, .DS_Store: never a class (torchvision's would be)
            scan.skip(e.name, "hidden")
        elif e.is_dir(follow_symlinks=True) and scan._enter(e.path, e.name, frozenset({root})):
            classes.append(e.name)
    if not classes:
        scan.skipped.clear()
        files = scan.walk(str(src), "", frozenset({root}))
        items = tuple(Item(p, k, 0, problem=why) for p, k, why in files)
        return Source(items, {".": 0}, "flat", tuple(scan.skipped))
    label_map = {c: i for i, c in enumerate(classes)}
    items, empty = [], []
    for e in sorted(os.scandir(src), key=lambda e: e.name):
        if e.name not in label_map and not e.is_dir(follow_symlinks=True) and not e.name.startswith("."):
            scan.skip(e.name, "file outside the class folders")
    for c in classes:
        files = scan.walk(str(src / c), c, frozenset({root, os.path.realpath(src / c)}))
        empty += [] if files else [c]
        items += [Item(p, k, label_map[c], problem=why) for p, k, why in files]
    if empty and not allow_empty:
        raise SourceError(f"SRC {src}: class folder {src / empty[0]} holds no image files"
                          f"{f' (and {len(empty) - 1} more)' if len(empty) > 1 else ''}; add images, remove "
                          f"the folder, or pass --allow-empty-classes (allow_empty_classes=True in Python) to keep it "
                          f"as a label without samples")
    return Source(tuple(items), label_map, "folder", tuple(scan.skipped))


SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "eval"})


def split_hint(source: Source, src: str | Path) -> str:
    """'' or a warning when SRC's classes are split folders (imagenet/ holding train/ and val/): the
    build would make 'train' and 'val' the two classes, as torchvision's ImageFolder would, silently."""
    names = set(source.label_map)
    if source.layout != "folder" or len(names) < 2 or not names <= SPLIT_NAMES:
        return ""
    nested = [n for n in sorted(names) if any(it.key.count("/") >= 2 for it in source.items
                                              if it.key.split("/", 1)[0] == n)]
    if not nested:
        return ""
    first = nested[0]
    return (f"SRC {src}: its classes are {', '.join(sorted(names))}, which look like data set splits holding "
            f"the real class folders; build each split on its own (SRC {Path(src) / first}), unless these are "
            f"the classes you mean")


def _from_list(src: Path) -> Source:
    rows, label_map = read_list(src)
    items = []
    for lineno, path, name in rows:
        p = resolve(path, src)
        is_file = p.is_file()
        if not is_file and p.exists():
            raise SourceError(f"{src}: line {lineno} names {p}, which is not a regular file (a folder, device or "
                              f"pipe); fix or remove that line")
        if not is_file and not p.is_symlink():
            raise SourceError(f"{src}: line {lineno} names {p}, which does not exist; fix or remove that line")
        items.append(Item(str(p), path, label_map[name], problem="" if is_file else dangling(str(p))))
    return Source(tuple(items), label_map, "list")


def _from_s3(url: str, images_only: bool, options: dict | None, allow_empty: bool) -> Source:
    """An ImageFolder (or flat folder) under an s3:// prefix: the first path part is the class."""
    from ..stores.s3 import filesystem, storage_error, strip

    root = strip(url)
    try:
        keys = sorted(k[len(root) + 1:] for k in filesystem(options).find(root) if k.startswith(root + "/"))
    except Exception as e:  # noqa: BLE001 - storage errors name the URL and the fix
        raise storage_error(e, url, "listing SRC") from None
    scan = _Scan(images_only, frozenset())
    files = []
    for key in keys:
        if any(part.startswith(".") for part in key.split("/")):
            scan.skip(key, "hidden")
        elif scan.wanted(key):
            files.append(key)
        else:
            scan.skip(key, "not an image file" if images_only else "not a file")
    classes = sorted({k.split("/")[0] for k in files if "/" in k})
    if not classes:
        return Source(tuple(Item(f"{url.rstrip('/')}/{k}", k, 0) for k in files), {".": 0}, "flat", tuple(scan.skipped))
    label_map = {c: i for i, c in enumerate(classes)}
    items = [Item(f"{url.rstrip('/')}/{k}", k, label_map[k.split("/")[0]]) for k in files if "/" in k]
    scan.skipped += [(k, "file outside the class folders") for k in files if "/" not in k]
    return Source(tuple(items), label_map, "folder", tuple(scan.skipped))


def discover(src: str | Path, images_only: bool = True, *, exclude: tuple[str | Path, ...] = (),
             allow_empty_classes: bool = False, storage_options: dict | None = None) -> Source:
    """Return the sorted items of SRC. images_only=False keeps every file (kind=bytes).
    exclude: folders never taken as input (the cache being built, when it lies inside SRC)."""
    if str(src).startswith("s3://"):
        source = _from_s3(str(src), images_only, storage_options, allow_empty_classes)
        if not source.items:
            raise SourceError(f"SRC {src}: no input files found under this prefix; check the bucket and prefix")
        return source
    refuse_url(src, "SRC")
    src = Path(user_path(src))
    if not src.exists() and not src.is_symlink():
        raise SourceError(f"{src} does not exist; give an image folder (class sub-folders), a file list "
                          f"(.csv/.txt), a .tar or folder of them, or a cache")
    if is_tar_source(src):
        items, label_map, skipped = tar_items(src, IMAGE_EXTS if images_only else frozenset({""}), Item)
        source = Source(items, label_map, "tar", skipped)
    elif src.is_file():
        if src.name == "manifest.json":
            raise SourceError(f"SRC {src} is a cache's manifest; give the cache folder, {src.parent}")
        if src.suffix.lower() not in LIST_EXTS:
            raise SourceError(f"SRC {src} is a file but not a list (.csv/.txt/.tsv of 'path,label' lines); give "
                              f"an image folder (class sub-folders), a file list, a .tar or a cache folder")
        source = _from_list(src)
    elif not src.is_dir():
        raise SourceError(f"SRC {src} is neither a folder nor a regular file; give an image folder "
                          f"(class sub-folders) or a file list (.csv/.txt)")
    else:
        ex = frozenset(os.path.realpath(p) for p in exclude)
        try:
            source = _from_folder(src, images_only, ex, allow_empty_classes)
        except OSError as e:  # unreadable sub-folder or file: name it rather than fail with a traceback
            raise SourceError(f"SRC {src}: cannot scan {e.filename or src} ({e.strerror or e}); "
                              f"fix its permissions or point SRC at the dataset folder itself") from e
    if not source.items and src.is_dir() and is_cache_dir(src):
        if not (src / "manifest.json").is_file():   # the loader sent it here: it is no cache yet
            raise SourceError(f"{src} is a cache whose build has not finished (no manifest.json, a .build "
                              f"folder): rerun the same `fastdata build-cache` command to finish it, then "
                              f"read it")
        raise SourceError(f"SRC {src} is a fastdata cache, not an image folder: read it with "
                          f"fastdata.loader({str(src)!r}), check it with `fastdata info {src}`, or give the "
                          f"image folder it was built from to build another cache")
    if not source.items:
        what = "image files (" + ", ".join(sorted(IMAGE_EXTS)) + ")" if images_only else "files"
        skipped = f" ({source.skipped_summary()})" if source.skipped else ""
        packed = _packed_hint(src, source.skipped)
        raise SourceError(f"SRC {src}: no {what} found{skipped}; " + (packed or "expected class sub-folders "
                          "of images, or use --encode bytes for other files"))
    return source


# data sets as they are often downloaded: the images are inside these, not beside them
_UNPACK = "{name} holds the images: unpack it first ({how}), then give the folder as SRC"
_EXPORT = "{name} is {what}: save its images to class folders first, then give that folder as SRC"
_PACKED = {".zip": _UNPACK.replace("{how}", "unzip {name}"), ".tgz": _UNPACK.replace("{how}", "tar xzf {name}"),
           ".gz": _UNPACK.replace("{how}", "tar xzf {name}; or gunzip -k {name} and give the .tar"),
           ".parquet": _EXPORT.replace("{what}", "a Parquet data set (Hugging Face datasets)"),
           ".arrow": _EXPORT.replace("{what}", "an Arrow data set (Hugging Face datasets)"),
           ".tfrecord": _EXPORT.replace("{what}", "a TFRecord data set"),
           ".npy": _EXPORT.replace("{what}", "a NumPy array"), ".npz": _EXPORT.replace("{what}", "NumPy arrays")}


def _packed_hint(src: Path, skipped) -> str:
    """What to do where SRC holds archives or packed data sets instead of images, naming one."""
    for rel, _ in skipped:
        template = _PACKED.get(os.path.splitext(rel)[1].lower())
        if template:
            return template.format(name=src / rel)
    return ""


def partition(items: tuple[Item, ...], part: tuple[int, int] | None) -> tuple[Item, ...]:
    """Contiguous slice i of n (0-based) for job arrays; slices are disjoint and complete."""
    if part is None:
        return items
    i, n = part
    return items[i * len(items) // n:(i + 1) * len(items) // n]
