"""The front doors of semantic/, engine/ and evaluation/: each name they export is the object its module defines, the
lazy table, `__all__` and the typed imports agree, and opening a door loads no torch (a subprocess each)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import engine
import evaluation
import semantic

ROOT = Path(__file__).resolve().parents[1]
DOORS = [semantic, engine, evaluation]
HEAVY = ("torch", "transformers", "faiss")


@pytest.mark.parametrize("door", DOORS, ids=lambda door: door.__name__)
def test_every_exported_name_is_its_modules_object(door: ModuleType) -> None:
    table: dict[str, tuple[str, ...]] = door._EXPORTS
    names = [name for names in table.values() for name in names]
    assert sorted(names) == sorted(door.__all__) and len(set(names)) == len(names)
    for module, exported in table.items():
        for name in exported:
            assert getattr(door, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError):
        door.__getattr__("no_such_name")


@pytest.mark.parametrize("door", DOORS, ids=lambda door: door.__name__)
def test_the_typed_imports_name_the_same_modules(door: ModuleType) -> None:
    """What mypy and a reader see (`if TYPE_CHECKING:`) is what `__getattr__` imports."""
    assert door.__file__ is not None
    tree = ast.parse(Path(door.__file__).read_text())
    typed: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module is not None
                typed[statement.module] = tuple(alias.name for alias in statement.names)
    table: dict[str, tuple[str, ...]] = door._EXPORTS
    assert {module: sorted(names) for module, names in typed.items()} == {
        module: sorted(names) for module, names in table.items()
    }


@pytest.mark.parametrize(
    "statement",
    [
        "import semantic",
        "import engine",
        "from semantic import RedisClient, resolve_embedder",
        "from engine import EngineClient, EngineStopped, Finished, ask_blocking, resolve_generator",
        "import gateway.backends.protocol",
        "import evaluation",
        "from evaluation import SPLITS_BY_FILE",
    ],
)
def test_opening_a_door_loads_no_torch(statement: str) -> None:
    check = f"import sys; {statement}; print(sorted(set(sys.modules) & {set(HEAVY)!r}))"
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", f"{statement} loaded {result.stdout.strip()}"


def test_the_gateway_and_the_engine_share_one_finished() -> None:
    from gateway.backends.protocol import Finished

    assert Finished is engine.Finished
    finished = Finished("stop", 3, 4, cached_tokens=2)
    assert finished.choice_finish_reasons == ("stop",)
    assert (finished.prompt_tokens, finished.completion_tokens, finished.cached_tokens) == (3, 4, 2)
