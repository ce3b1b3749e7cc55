"""Write what `training/train_on_device.py` needs on a lent GPU machine, which reaches neither PyPI nor
`../shared/data`, for one language profile: the training examples, the calibration rows it selects
checkpoints on, and the base model as the network reads it, small enough to travel (64 MiB with the tree).

    .venv/bin/python training/export_device_bundle.py --profile english --out .device-bundle
    .venv/bin/python training/export_device_bundle.py --profile multilingual --out .device-bundle-ml

What each profile's bundle holds is said in `training/english_bundle.py` and `training/multilingual_bundle.py`:
`examples/<name>.jsonl.gz` (`[a, b, target]` per line), `calibration.jsonl.gz` and `calibration.npz`, `base/`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training import english_bundle, multilingual_bundle
from training.bundle_files import write_jsonl
from training.train_verifier import DATA_DIR


@dataclass(frozen=True, slots=True)
class BundleProfile:
    """What one profile's bundle is made of."""

    examples: Callable[[Path], dict[str, list[list[object]]]]  # data dir -> rows per example file
    calibration_rows: Callable[[Path], tuple[list[list[object]], dict[str, npt.NDArray[Any]]]]
    write_base: Callable[[Path, list[str]], None]  # (out/base, every text the bundle holds)
    out: Path  # the default --out


PROFILES = {
    "english": BundleProfile(
        english_bundle.examples,
        english_bundle.calibration_rows,
        english_bundle.write_base,
        Path(".device-bundle"),
    ),
    "multilingual": BundleProfile(
        multilingual_bundle.examples,
        multilingual_bundle.calibration_rows,
        multilingual_bundle.write_base,
        Path(".device-bundle-ml"),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="english")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, help="default: .device-bundle (english), .device-bundle-ml")
    args = parser.parse_args()
    profile = PROFILES[args.profile]
    out: Path = args.out or profile.out
    (out / "examples").mkdir(parents=True, exist_ok=True)
    texts: set[str] = set()
    for name, rows in profile.examples(args.data_dir).items():
        write_jsonl(out / "examples" / f"{name}.jsonl.gz", rows)
        texts.update(str(text) for row in rows for text in row[:2])
        print(f"{name}: {len(rows)} examples")

    rows, arrays = profile.calibration_rows(args.data_dir)
    write_jsonl(out / "calibration.jsonl.gz", rows)
    np.savez(out / "calibration.npz", **arrays)  # type: ignore[arg-type]
    texts.update(str(text) for row in rows for text in row[:2])
    print(f"calibration: {len(rows)} rows")

    profile.write_base(out / "base", sorted(texts))
    total = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(f"wrote {out} ({total / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
