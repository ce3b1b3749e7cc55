"""A progress bar on the console for long start-up work, such as rebuilding the semantic index from the store.

The cache reports progress as a plain callback (`done`, `total`); how it is shown is the gateway's choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def rich_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar as a `(done, total)` callback: `with rich_progress("...") as progress: ...`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
