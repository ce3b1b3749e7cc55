"""The files of a device bundle (`training/export_device_bundle.py`): gzipped JSON lines, int8 rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch


def write_jsonl(path: Path, rows: list[list[object]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as lines:
        for row in rows:
            lines.write(json.dumps(row, ensure_ascii=False) + "\n")


def quantised_rows(table: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows `ids` of `table` as int8 with one fp32 scale per row (absmax): a quarter of fp32's size, so the
    bundle travels with the tree. The trainer reads them back (`rows * scales`); the error is at most half a
    step (row max / 254), measured in docs/benchmarks.md against fp32 rows."""
    rows = table[ids].float()
    scales = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return {
        "ids": ids,
        "rows": torch.round(rows / scales[:, None]).to(torch.int8).contiguous(),
        "scales": scales.contiguous(),
    }
