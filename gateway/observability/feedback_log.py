"""Reported hits as labelled pairs: one JSON line each in `<data dir>/feedback.jsonl`, what `kvgate calibrate`
reads beside its pairs files (`evaluation/pair_sets.py` reads the `a`, `b`, `label` and `kind` of each line).

    {"a": stored prompt, "b": the prompt it was served for, "label": 0 wrong | 1 right, "kind": "feedback",
     "tenant": ..., "request_id": ..., "entry_id": ..., "ts": epoch seconds}

Each line is written whole by one `write` on a descriptor opened for appending, under an exclusive `flock`
and followed by an `fsync`: concurrent reports, from one worker or several of `--workers N`, never lose or
interleave a line, and a line acknowledged is on disk. Knows the file; nothing about Redis or HTTP.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Literal

FEEDBACK_FILE = "feedback.jsonl"
FEEDBACK_KIND = "feedback"
Verdict = Literal["wrong", "right"]
LABELS: dict[Verdict, int] = {"wrong": 0, "right": 1}


class FeedbackLog:
    """Appends labelled pairs to one JSON Lines file (created, with its folder, on the first report)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def append(
        self,
        *,
        stored: str,
        asked: str,
        verdict: Verdict,
        tenant: str,
        request_id: str,
        entry_id: str,
    ) -> None:
        row = {
            "a": stored,
            "b": asked,
            "label": LABELS[verdict],
            "kind": FEEDBACK_KIND,
            "tenant": tenant,
            "request_id": request_id,
            "entry_id": entry_id,
            "ts": round(time.time(), 3),
        }
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        await asyncio.to_thread(self._write, line)  # a lock held by another process must not block the loop

    def _write(self, line: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            written = os.write(descriptor, line)
            if written != len(line):  # a full disk: leave no half line for the next one to follow
                os.ftruncate(descriptor, os.fstat(descriptor).st_size - written)
                raise OSError(f"could not write a whole line to {self.path}")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)  # releases the lock
