"""`python -m bench [NAME ...]`: run the benchmarks (all of them, or those named), one after another.

Each `bench/*/bench_*.py` has a `main(argv)` that prints its figures measured side by side in one run; a
benchmark is named without its folder (`python -m bench rule` runs bench/semantic/bench_rule.py).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

# Each benchmark's name (its file's, less `bench_`) and its module, in whichever folder it stands.
MODULES = {
    path.stem.removeprefix("bench_"): f"bench.{path.parent.name}.{path.stem}"
    for path in Path(__file__).parent.glob("*/bench_*.py")
}


def main(argv: list[str]) -> int:
    names = argv or sorted(MODULES)
    failed = []
    for name in names:
        print(f"\n=== bench_{name} ===", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(MODULES.get(name, f"bench.bench_{name}"))
        try:
            module.main([])
        except Exception as error:  # keep going: one broken benchmark should not hide the others
            print(f"bench_{name} failed: {error!r}", flush=True)
            failed.append(name)
        print(f"=== bench_{name}: {time.perf_counter() - started:.1f} s ===", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
