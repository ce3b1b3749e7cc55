"""Suite-wide fixtures: what every test process shares, whichever folder its tests come from."""

from __future__ import annotations

import fcntl
import gc
import os
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.scheduler import LoadFileScheduling
    from xdist.workermanage import WorkerController

    from semantic.embedding.embedder import SentenceEmbedder
    from semantic.embedding.embedder_source import EmbedderSource

# Under `--dist loadfile` (`make unit`), files that share a session fixture costlier than their tests run on
# one worker, which builds it once: here the three kvgate processes of tests/reliability/conftest.py.
SHARED_FIXTURES = {
    "tests/reliability/test_replicas.py": "replicas",
    "tests/reliability/test_kvgate_restart.py": "replicas",
}
# Then the files that start processes, servers and models go first, the slowest first: a two-minute file
# dealt last would run alone at the end. Measured on 2 cores (a file's summed test times); a file not
# named here goes after these, the files with the most tests first (pytest-xdist's own order).
SLOWEST_FIRST = (
    "tests/integration/test_workers.py",
    "replicas",
    "tests/engine/test_engine_smollm2.py",
    "tests/semantic/rule/test_multilingual_served.py",
    "tests/reliability/test_redis_cluster.py",
    "tests/gateway/traffic/test_ratelimit.py",
    "tests/reliability/",
    "tests/integration/",
    "tests/gateway/traffic/",
    "tests/gateway/proxy/",
)


@pytest.fixture(scope="session", autouse=True)
def cheaper_app_starts() -> Iterator[None]:
    """Two costs of an app's start that a test process pays hundreds of times, for nothing it checks.

    The sentence embedder: each app built the same ONNX session from the same files (the session, the
    digest of the weights, the tokenizer: 0.3-1.4 s of CPU). A built embedder holds no state between
    calls, so the first app of a configuration builds it and later ones take it. Tests that check how an
    embedder is built call `SentenceEmbedder` themselves, which this leaves alone.

    The full collection before `gc.freeze()`: it walks every object of the test process (torch,
    transformers, every test module: 40% of the CPU of tests/gateway/test_bad_input.py). Here the young
    generations are collected, then everything is frozen as in a served process; the app's stop
    unfreezes as before.
    """
    # Imported here, not above: a run of tests/prefix alone never imports torch.
    from gateway.http import app as app_module
    from semantic.embedding.embedder import SentenceEmbedder

    built: dict[tuple[str, str, str, Path | None, int], SentenceEmbedder] = {}

    def shared(
        source: EmbedderSource, runtime: str = "auto", export_dir: Path | None = None, threads: int = 1
    ) -> SentenceEmbedder:
        key = (source.name, source.location, runtime, export_dir, threads)
        if key not in built:
            built[key] = SentenceEmbedder(source, runtime, export_dir, threads)
        return built[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_module, "SentenceEmbedder", shared)
        patch.setattr(app_module, "freeze_startup_objects", freeze_after_a_young_collection)
        yield


def freeze_after_a_young_collection() -> None:
    gc.collect(1)
    gc.freeze()


@pytest.hookimpl(optionalhook=True)  # a venv without pytest-xdist still runs the suite, in one process
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadFileScheduling | None:
    """`--dist loadfile` with SHARED_FIXTURES' files together and SLOWEST_FIRST's first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowestFirst(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path: str = super()._split_scope(nodeid)
            return SHARED_FIXTURES.get(path, path)

        def _assign_work_unit(self, node: WorkerController) -> None:
            if not self.ordered:  # the first call: the queue is whole, nothing dealt yet
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SlowestFirst(config, log)


def _rank(scope: str) -> int:
    return next(
        (rank for rank, name in enumerate(SLOWEST_FIRST) if scope.startswith(name)), len(SLOWEST_FIRST)
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Under pytest-xdist (`make unit` runs two workers), a test marked `alone` runs while no other does.

    Such a test compares wall-clock times; the other worker's test would take its share of the two cores.
    Setup and teardown are inside the turn, module fixtures included.
    """
    with _turn(alone=item.get_closest_marker("alone") is not None):
        return (yield)


@contextmanager
def _turn(alone: bool) -> Iterator[None]:
    """A readers-writer lock between the workers of one run, on two files: `alone` takes `turn` whole,
    other tests share it. Whoever holds `gate` is next, so a waiting `alone` test is not starved by
    tests that keep taking `turn` shared."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: every test runs alone already
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"kvgate-pytest-{run}"
    folder.mkdir(exist_ok=True)
    with (folder / "gate").open("a") as gate, (folder / "turn").open("a") as turn:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(turn, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
