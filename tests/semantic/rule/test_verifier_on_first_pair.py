"""A verifier loaded on its first pair (semantic/verifier/on_first_pair.py): once, then as if loaded at start."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from semantic.rule.loading import load_served_rule, shipped_verifier
from semantic.rule.profiles import MULTILINGUAL
from semantic.rule.verifier_on_first_pair import LoadsOnFirstPair


class CountingVerifier:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        self.calls += 1
        return np.full(len(pairs), 0.5, dtype=np.float32)


def test_loads_once_on_the_first_pair_even_from_many_threads() -> None:
    loads: list[CountingVerifier] = []

    def load() -> CountingVerifier:
        time.sleep(0.05)  # long enough for the threads to meet at the lock
        loads.append(CountingVerifier())
        return loads[-1]

    verifier = LoadsOnFirstPair("counting", load)
    assert not verifier.loaded and loads == []
    threads = [threading.Thread(target=verifier.probabilities, args=([("a", "b")],)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert verifier.loaded and len(loads) == 1 and loads[0].calls == 8


def test_the_served_multilingual_verifier_loads_on_its_first_pair_and_scores_as_the_shipped_one() -> None:
    rule = load_served_rule()
    lazy = rule.multilingual.verifier
    assert isinstance(lazy, LoadsOnFirstPair) and not lazy.loaded and lazy.runtime is None
    pairs = [
        ("¿Cómo cambio mi contraseña?", "¿Cómo puedo cambiar mi contraseña?"),
        ("Wie spät ist es?", "Wie alt bist du?"),
    ]

    scores = lazy.probabilities(pairs)

    shipped = shipped_verifier(MULTILINGUAL)
    assert lazy.loaded and lazy.name == shipped.name and lazy.runtime == shipped.runtime
    np.testing.assert_array_equal(scores, shipped.probabilities(pairs))


def test_loading_runs_once_on_a_thread_of_its_own() -> None:
    threads: list[str] = []

    def load() -> CountingVerifier:
        threads.append(threading.current_thread().name)
        return CountingVerifier()

    verifier = LoadsOnFirstPair("counting", load)
    first, second = verifier.loading(), verifier.loading()

    assert first is second
    assert isinstance(first.result(timeout=10), CountingVerifier) and verifier.loaded
    assert threads and threads[0] != threading.current_thread().name and len(threads) == 1


def test_a_failed_load_is_seen_by_its_waiters_and_tried_again() -> None:
    attempts: list[int] = []

    def load() -> CountingVerifier:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("weights missing")
        return CountingVerifier()

    verifier = LoadsOnFirstPair("counting", load)
    failed = verifier.loading()
    with pytest.raises(OSError):
        failed.result(timeout=10)
    assert not verifier.loaded
    assert isinstance(verifier.loading().result(timeout=10), CountingVerifier)


def test_the_served_rule_asks_a_lookup_to_wait_only_for_a_pair_bound_for_the_unloaded_verifier() -> None:
    rule = load_served_rule()
    assert rule.verifier_loading("How do I reset my router?") is None  # English: its verifier loaded at start
    loading = rule.verifier_loading("¿Cómo cambio la contraseña de mi correo electrónico?")
    assert loading is not None
    loading.result(timeout=120)
    assert rule.verifier_loading("¿Cómo cambio la contraseña de mi correo electrónico?") is None
