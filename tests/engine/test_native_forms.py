"""The native decode step's form is measured per CPU once and then read (engine/model/native_forms.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.model import native_forms
from engine.model.config import ModelConfig
from engine.model.native_build import DOT_FORMS, cpu_isa, cpu_isas, load_decode_library, source_digest
from engine.model.native_decode import NativeDecoder
from engine.model.native_forms import CHOICES_FILE, FormChoice, choose_form
from engine.model.paging import LogitsFor, SequenceChunk, build_paging_metadata
from engine.runner import ModelRunner
from engine.weights.formats import build_model
from tests.engine.llama_testing import QUANTISABLE_LLAMA, make_hf_llama

pytestmark = pytest.mark.skipif(
    cpu_isa() is None or load_decode_library() is None,
    reason="this CPU has no AVX2, or there is no C compiler",
)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    hf = make_hf_llama(seed=5, num_hidden_layers=2, tie_word_embeddings=True, **QUANTISABLE_LLAMA)
    return build_model(ModelConfig.from_hf(hf.config), hf.state_dict(), "int4")


def factory(model):  # type: ignore[no-untyped-def]
    return lambda library, build, cache: NativeDecoder(library, build.isa, model, cache, build)


BUILDS = {f"{isa} {form}" for isa in cpu_isas() for form in DOT_FORMS}


def test_every_form_is_measured_once_then_the_kept_choice_is_read(model, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    chosen = choose_form(model, 4, 1, factory(model), tmp_path)
    assert chosen is not None
    _, first = chosen
    assert first.measured_now and set(first.step_us) == BUILDS
    assert all(
        set(by_rows) == {"1", "16"} and min(by_rows.values()) > 0 for by_rows in first.step_us.values()
    )
    products = {build: by_rows["1"] * by_rows["16"] for build, by_rows in first.step_us.items()}
    assert first.name == min(products, key=products.__getitem__)
    kept = json.loads((tmp_path / CHOICES_FILE).read_text())
    assert [(entry["isa"], entry["form"]) for entry in kept.values()] == [(first.isa, first.form)]

    def never(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("measured again")

    monkeypatch.setattr(native_forms, "measure_forms", never)
    again = choose_form(model, 4, 1, factory(model), tmp_path)
    assert again is not None and again[1] == FormChoice(first.isa, first.form, first.step_us)
    # Another thread count is another key: it would be measured.
    with pytest.raises(AssertionError, match="measured again"):
        choose_form(model, 4, 2, factory(model), tmp_path)
    # So is a kept build this CPU no longer offers (a machine moved to another host keeps its cache).
    others = [isa for isa in ("avx2", "avx512_vnni") if isa != first.isa]
    with pytest.raises(AssertionError, match="measured again"):
        choose_form(model, 4, 1, factory(model), tmp_path, isas=others)


def test_a_kept_choice_naming_no_form_is_measured_anew(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    key = native_forms._key(model, 1)
    stale = key.replace(f"|{source_digest()}|", "|0123456789ab|")
    retired = {"isa": "avx2", "form": "retired", "step_us": {}}
    (tmp_path / CHOICES_FILE).write_text(json.dumps({key: retired, stale: retired}))
    chosen = choose_form(model, 4, 1, factory(model), tmp_path)
    assert chosen is not None and chosen[1].form in DOT_FORMS and chosen[1].measured_now
    assert list(json.loads((tmp_path / CHOICES_FILE).read_text())) == [
        key
    ]  # an older source's choice dropped
    (tmp_path / CHOICES_FILE).write_text("{not json")
    chosen = choose_form(model, 4, 1, factory(model), tmp_path)
    assert chosen is not None and chosen[1].measured_now


def test_the_forms_decode_the_same_tokens(model) -> None:  # type: ignore[no-untyped-def]
    isa = cpu_isa()
    assert isa is not None
    prompt = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    logits = {}
    for form in DOT_FORMS:
        runner = ModelRunner(model, num_blocks=8, block_size=4, decode_kernel="torch")
        library = load_decode_library(isa, form=form)
        assert library is not None
        native = NativeDecoder(library, isa, model, runner.kv_cache, form)
        runner.execute([SequenceChunk(prompt[:-1], 0, [0, 1, 2], LogitsFor.NONE)])
        chunk = SequenceChunk([prompt[-1]], len(prompt) - 1, [0, 1, 2])
        logits[form] = native.decode(torch.tensor([prompt[-1]]), build_paging_metadata([chunk], 4))
    first, second = logits.values()
    # The same integer sums, grouped differently into float lanes: equal up to float rounding, which can move
    # an activation's 16-bit code by one in a later layer (measured: 0.00004 of the logits' spread).
    spread = float(first.max() - first.min())
    assert float((first - second).abs().max()) <= 0.003 * spread
    assert torch.equal(first.argmax(-1), second.argmax(-1))


def test_health_names_the_form_and_its_figures(model) -> None:  # type: ignore[no-untyped-def]
    runner = ModelRunner(model, num_blocks=8, block_size=4)
    assert runner.native is not None
    kernel = runner.decode_kernel
    assert kernel.startswith(f"native ({runner.native.isa}, {runner.native.form.form} dots")
    choice = FormChoice(
        "avx2",
        "i16",
        {"avx2 byte_pairs": {"1": 3100.0, "16": 9000.0}, "avx2 i16": {"1": 2900.0, "16": 8000.0}},
    )
    assert (
        choice.describe()
        == "avx2, i16 dots, measured ms a step at 1 / 16 rows: avx2 byte_pairs 3.1 / 9.0; avx2 i16 2.9 / 8.0"
    )
