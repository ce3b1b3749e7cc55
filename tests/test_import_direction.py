"""Imports flow one way: between the packages, and between the rooms of gateway/, semantic/, engine/ and
evaluation/.

The order is written once, here, and explained in docs/architecture.md. Every import counts, also one inside a
function or under `TYPE_CHECKING`: each is a dependency a reader has to follow. Another package enters
semantic/, engine/ and evaluation/ by their front doors only (`from semantic import SemanticCache`, never
`semantic.cache`): what their `__init__.py` exports is all that others may depend on. Measurement is the one
exception: evaluation/ reads the semantic cache's parts (the rule's fit, the guards), as training/ and bench/ do.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What each package may import of the others. Tools (bench/, training/) and tests/ are never imported.
MAY_IMPORT: dict[str, set[str]] = {
    "gateway": {"semantic", "engine", "evaluation"},
    "evaluation": {"semantic"},
    "semantic": set(),
    "engine": {"prefix"},
    "prefix": set(),
}
NEVER_IMPORTED = {"bench", "training", "tests"}
# Packages that others import as the package itself, whose `__init__.py` says what they export.
FRONT_DOORS = {"semantic", "engine", "evaluation"}
# Packages that may import below another's front door: measurement reads what it measures.
BEHIND_THE_DOOR = {"evaluation": {"semantic"}}

# The rooms of a package, top first: a module may import its own level and the levels below it, never one
# above. Rooms on one level may use each other. Every module of the package must stand in a room.
ROOMS: dict[str, list[set[str]]] = {
    "gateway": [
        {"gateway.cli", "gateway.supervisor"},  # the commands: start the processes, serve the app
        {"gateway.http"},  # the app, its routes and the HTTP workers
        {"gateway.apis"},  # one adapter per API, and the one pipeline every API route runs
        # one request's flow (the cache failing open); an embeddings request's; a reported hit's
        {"gateway.service", "gateway.fail_open", "gateway.embeddings", "gateway.answers", "gateway.feedback"},
        {"gateway.backends", "gateway.fleet", "gateway.traffic", "gateway.observability", "gateway.runtime"},
        {"gateway.api"},  # OpenAI's objects, errors, ids: what every room speaks
    ],
    "semantic": [
        {
            "semantic.cache",
            "semantic.language_routing",
        },  # the cache's flow; each prompt to its profile's embedder
        {"semantic.rule", "semantic.index"},  # the rule (one per language profile); the FAISS indexes
        {"semantic.guards", "semantic.verifier"},  # checks before the verifier; the verifier and its networks
        {"semantic.store", "semantic.embedding"},
    ],
    "evaluation": [
        {"evaluation.eval_pairs", "evaluation.calibrate_pairs"},  # `kvgate eval-pairs`, `kvgate calibrate`
        {  # the per-pair cache step, the figures, reported hits, populated-scope lookups
            "evaluation.probes",
            "evaluation.scoring",
            "evaluation.reported_pairs",
            "evaluation.scope_lookups",
        },
        {"evaluation.pair_sets"},  # labelled pairs files and the development sets' parts
    ],
    "engine": [
        {"engine.serving"},  # the step loop served: on a thread of this process, or as the engine process
        {  # the step loop and what it drives
            "engine.engine",
            "engine.engine_config",
            "engine.request_output",
            "engine.burst",
            "engine.scheduler",
            "engine.sequence",
            "engine.runner",
            "engine.sampler",
            "engine.penalties",
            "engine.logprobs",
            "engine.detokenizer",
            "engine.grammar",
            "engine.grammar_masks",
            "engine.stopping",
            "engine.metrics",
        },
        {"engine.weights"},  # where the weights come from and how they are stored
        {"engine.model"},  # the model over a paged KV cache, and its native decode step
    ],
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """Every module `tree` imports, with its line (`from a.b import c` names `a.b.c` if that is a module)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = ".".join(package[: len(package) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.append((node.lineno, full if full in known else base))
    return names


def level_of(name: str, rooms: list[set[str]]) -> tuple[int, str] | None:
    """The level (0 at the top) and the room of a module, by the longest room its name starts with."""
    found = [
        (len(room), index, room)
        for index, level in enumerate(rooms)
        for room in level
        if name == room or name.startswith(room + ".")
    ]
    if not found:
        return None
    _, index, room = max(found)
    return index, room


def violations(root: Path) -> list[str]:
    """Each import that goes the wrong way, and each module that stands in no room."""
    paths = [path for package in MAY_IMPORT for path in (root / package).rglob("*.py")]
    files = {path: module_name(path, root) for path in paths}
    known = set(files.values())
    found = []
    for path, module in sorted(files.items()):
        package = module.split(".")[0]
        rooms = ROOMS.get(package)
        own = level_of(module, rooms) if rooms else None
        if rooms and own is None and module != package:
            found.append(f"{path.relative_to(root)} stands in no room of {package}/ (ROOMS in this test)")
        tree = ast.parse(path.read_text(), str(path))
        for line, name in imported_names(tree, module, path.name == "__init__.py", known):
            where = f"{path.relative_to(root)}:{line} imports {name}"
            other = name.split(".")[0]
            if other in NEVER_IMPORTED:
                found.append(f"{where}: {other}/ is never imported by a package")
            elif other in MAY_IMPORT and other != package and other not in MAY_IMPORT[package]:
                found.append(f"{where}: {package}/ may import only {sorted(MAY_IMPORT[package]) or 'itself'}")
            elif (
                other in FRONT_DOORS
                and other != package
                and name != other
                and other not in BEHIND_THE_DOOR.get(package, set())
            ):
                found.append(
                    f"{where}: {package}/ may import {other}/ only through its front door, `{other}`"
                )
            elif other == package and rooms and own is not None:
                target = level_of(name, rooms)
                if target is not None and target[0] < own[0]:
                    found.append(f"{where}: {own[1]} may not import {target[1]}, a room above it")
    return list(dict.fromkeys(found))  # `from a.b import c, d` is one import


def test_imports_flow_one_way() -> None:
    found = violations(ROOT)
    assert not found, "\n".join(found)


def test_every_package_says_its_job_in_one_line() -> None:
    silent = []
    for package in (*MAY_IMPORT, "training"):
        for path in (ROOT / package).rglob("__init__.py"):
            docstring = ast.get_docstring(ast.parse(path.read_text()))
            if not docstring or "\n" in docstring.strip():
                silent.append(str(path.relative_to(ROOT)))
    assert not silent, silent


def test_an_import_the_wrong_way_is_caught(tmp_path: Path) -> None:
    tree = {
        "gateway/__init__.py": "",
        "gateway/service.py": "from gateway.http.app import create_app\n",
        "gateway/http/__init__.py": "",
        "gateway/http/app.py": "from gateway.service import CompletionService\n",
        "gateway/traffic/__init__.py": "",
        "gateway/traffic/limits.py": "def f():\n    from gateway.http import app\n",
        "gateway/stray.py": "",
        "gateway/feedback.py": "from semantic.cache import SemanticCache\nfrom semantic import SemanticCache\n",
        "gateway/backends/__init__.py": "",
        "gateway/backends/engine.py": (
            "from engine.serving.client import AsyncEngineClient\nfrom engine import build_engine\n"
            "import prefix.hashing\n"
        ),
        "semantic/__init__.py": "",
        "semantic/store/__init__.py": "",
        "semantic/store/entries.py": "import gateway.service\nfrom ..rule import verdict\n",
        "semantic/rule/__init__.py": "",
        "semantic/rule/verdict.py": "from tests.semantic import builders\n",
        "semantic/cache.py": "from evaluation import cache_probe\n",
        "evaluation/__init__.py": "",
        "evaluation/probes.py": "from semantic.cache import SemanticCache\nimport gateway.cli\n",
        "gateway/cli.py": "from evaluation.probes import cache_probe\nfrom evaluation import calibrate\n",
        "engine/__init__.py": "",
        "engine/model.py": "from semantic.cache import SemanticCache\n",
        "prefix/__init__.py": "",
        "prefix/hashing.py": "from engine import model\n",
    }
    for name, text in tree.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = "\n".join(violations(tmp_path))
    assert "gateway/service.py:1 imports gateway.http.app: gateway.service may not import" in found
    assert "gateway/http/app.py" not in found
    assert "gateway/traffic/limits.py:2 imports gateway.http.app: gateway.traffic may not import" in found
    assert "gateway/stray.py stands in no room" in found
    assert (
        "gateway/feedback.py:1 imports semantic.cache: gateway/ may import semantic/ only through its front"
        in found
    )
    assert "gateway/feedback.py:2" not in found
    assert (
        "gateway/backends/engine.py:1 imports engine.serving.client: gateway/ may import engine/ only through its"
        in found
    )
    assert "gateway/backends/engine.py:2" not in found
    assert (
        "gateway/backends/engine.py:3 imports prefix.hashing: gateway/ may import only ['engine', 'evaluation', 'semantic']"
        in found
    )
    assert "semantic/store/entries.py:1 imports gateway.service: semantic/ may import only itself" in found
    assert "semantic/store/entries.py:2 imports semantic.rule.verdict: semantic.store may not import" in found
    assert "semantic/rule/verdict.py:1 imports tests.semantic: tests/ is never imported" in found
    assert "engine/model.py:1 imports semantic.cache: engine/ may import only ['prefix']" in found
    assert "prefix/hashing.py:1 imports engine.model: prefix/ may import only itself" in found
    assert "semantic/cache.py:1 imports evaluation: semantic/ may import only itself" in found
    assert "evaluation/probes.py:1" not in found  # measurement reads inside semantic/
    assert "evaluation/probes.py:2 imports gateway.cli: evaluation/ may import only ['semantic']" in found
    assert (
        "gateway/cli.py:1 imports evaluation.probes: gateway/ may import evaluation/ only through its front"
        in found
    )
    assert "gateway/cli.py:2" not in found
