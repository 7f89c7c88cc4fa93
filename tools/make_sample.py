#!/usr/bin/env python
"""Make an ImageFolder of photo-like JPEGs from the real photos in skimage/sklearn.

    python tools/make_sample.py OUT --per-class 32 [--photos DIR] [--export-photos DIR]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fastdata.sample import export_photos, make_image_folder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--per-class", type=int, default=32)
    ap.add_argument("--classes", type=int, default=None)
    ap.add_argument("--photos", default=None, help="folder of base photos (when skimage is absent)")
    ap.add_argument("--export-photos", action="store_true", help="only write the base photos to OUT as PNG")
    a = ap.parse_args()
    if a.export_photos:
        print("\n".join(map(str, export_photos(a.out))))
    else:
        print(make_image_folder(a.out, a.per_class, classes=a.classes, photos_dir=a.photos))


if __name__ == "__main__":
    main()
