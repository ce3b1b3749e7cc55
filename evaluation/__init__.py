"""Measurement of the semantic cache: `kvgate eval-pairs` and `calibrate`, the labelled pair sets, populated-scope lookups."""

# The front door: what the gateway's commands may use of evaluation/ (tests/test_import_direction.py holds
# it to these names). Each name is imported from its module on first use (PEP 562), so `import evaluation`
# loads no torch. Measurement reads the semantic cache's parts (the rule's fit, the guards); nothing in
# semantic/ or engine/ imports it.

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evaluation.calibrate_pairs import calibrate
    from evaluation.eval_pairs import run_eval_pairs_with_progress
    from evaluation.pair_sets import SPLITS_BY_FILE
    from evaluation.probes import cache_probe

_EXPORTS: dict[str, tuple[str, ...]] = {
    "evaluation.eval_pairs": ("run_eval_pairs_with_progress",),
    "evaluation.probes": ("cache_probe",),
    "evaluation.calibrate_pairs": ("calibrate",),
    "evaluation.pair_sets": ("SPLITS_BY_FILE",),
}

__all__ = ["SPLITS_BY_FILE", "cache_probe", "calibrate", "run_eval_pairs_with_progress"]

if not TYPE_CHECKING:  # hidden from mypy, which would otherwise type a misspelt name as Any

    def __getattr__(name: str) -> Any:
        """`name` from the module that defines it, imported now (not when `evaluation` was)."""
        for module, names in _EXPORTS.items():
            if name in names:
                return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
