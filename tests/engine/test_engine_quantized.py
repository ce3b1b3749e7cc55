"""Stored weights: GGUF Q4_1 blocks decode to the values gguf itself dequantises, each projection format
multiplies by exactly the weight it reports, and a model in every format generates transformers' greedy
tokens when transformers runs those same dequantised weights, with prefix blocks reused and not.

Tolerances: the quantised and bf16 kernels take bfloat16 inputs and give bfloat16 outputs, so a
projection agrees with float32 math on its own weights to bfloat16 rounding (relative 2^-8 per input and
output), and the tiny models' logits to within 5% of their spread."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants

from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.native_build import load_decode_library
from engine.model.paging import LogitsFor, SequenceChunk
from engine.model.quantized import Int4Groups, Int4Linear, Int8GroupLinear, Int8Groups, Int8Linear
from engine.runner import ModelRunner
from engine.weights.choice import choose_weights, pick
from engine.weights.formats import WEIGHTS_FORMATS, build_model, dequantized_hf_state, make_projection
from engine.weights.gguf_weights import _unpermute_rotary as unpermute_rotary
from engine.weights.gguf_weights import decode_q4, decode_q8_0, hf_name, projection_storage
from tests.engine.llama_testing import (
    QUANTISABLE_LLAMA,
    BlockAllocator,
    ToySequence,
    make_hf_llama,
    run_greedy,
)

NEW_TOKENS = 10
# Widths divisible by int4's groups of 32 on every projection input (hidden, and intermediate for down).


def q4_1_blocks(codes: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(rows, cols) codes and (rows, cols/32) d, m -> the file's bytes, written as llama.cpp lays them out."""
    rows, cols = codes.shape
    grouped = codes.reshape(rows, cols // 32, 32).astype(np.uint8)
    nibbles = grouped[..., :16] | (grouped[..., 16:] << 4)
    header = np.concatenate(
        (d.astype(np.float16)[..., None].view(np.uint8), m.astype(np.float16)[..., None].view(np.uint8)),
        axis=-1,
    )
    return np.concatenate((header, nibbles), axis=-1).reshape(rows, -1)


def random_q4_1(rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (rows, cols))
    d = rng.uniform(0.001, 0.02, (rows, cols // 32))
    m = rng.uniform(-0.2, 0.0, (rows, cols // 32))
    return codes, q4_1_blocks(codes, d, m)


def test_q4_1_blocks_decode_to_what_gguf_dequantizes() -> None:
    codes, blocks = random_q4_1(6, 96, seed=0)
    decoded = decode_q4(blocks, 6, 96, GGMLQuantizationType.Q4_1)
    assert decoded.codes.numpy().tolist() == codes.tolist()
    reference = quants.dequantize(blocks, GGMLQuantizationType.Q4_1).reshape(6, 96)
    np.testing.assert_allclose(decoded.dense().numpy(), reference, rtol=0, atol=1e-6)


def test_q4_0_blocks_decode_to_what_gguf_dequantizes() -> None:
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 16, (5, 64))
    d = rng.uniform(0.001, 0.02, (5, 2)).astype(np.float16)
    grouped = codes.reshape(5, 2, 32).astype(np.uint8)
    nibbles = grouped[..., :16] | (grouped[..., 16:] << 4)
    blocks = np.concatenate((d[..., None].view(np.uint8), nibbles), axis=-1).reshape(5, -1)
    decoded = decode_q4(blocks, 5, 64, GGMLQuantizationType.Q4_0)
    reference = quants.dequantize(blocks, GGMLQuantizationType.Q4_0).reshape(5, 64)
    np.testing.assert_allclose(decoded.dense().numpy(), reference, rtol=0, atol=1e-6)


def write_gguf(path: Path, projection_type: GGMLQuantizationType) -> None:
    """A one-layer llama GGUF whose projections are stored as `projection_type` (others F32)."""
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        weight = np.random.default_rng(0).normal(0, 0.1, (64, 64)).astype(np.float32)
        if projection_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(
                f"blk.0.{part}.weight",
                weight.astype(np.float16 if projection_type.name == "F16" else np.float32),
            )
        else:
            data = quants.quantize(weight, projection_type)
            writer.add_tensor(f"blk.0.{part}.weight", data, raw_shape=data.shape, raw_dtype=projection_type)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("projection_type", "storage", "candidates"),
    [
        (GGMLQuantizationType.Q4_1, "4-bit", {"fp32", "bf16", "int8", "int4"}),
        (GGMLQuantizationType.Q4_0, "4-bit", {"fp32", "bf16", "int8", "int4"}),
        (GGMLQuantizationType.Q8_0, "quantized", {"fp32", "bf16", "int8"}),
        (GGMLQuantizationType.F16, "float", {"fp32", "bf16"}),
    ],
)
def test_auto_never_keeps_fewer_bits_than_the_file(
    tmp_path: Path, projection_type, storage, candidates
) -> None:  # type: ignore[no-untyped-def]
    write_gguf(tmp_path / "model.gguf", projection_type)
    assert projection_storage(tmp_path / "model.gguf") == storage
    config = ModelConfig.from_hf(make_hf_llama(**QUANTISABLE_LLAMA).config)
    choice = choose_weights("auto", config, storage, decode_kernel="torch")  # the timed rule
    assert set(choice.batch1_us) == candidates and choice.weights in candidates
    assert storage in choice.reason
    # Where the native decode step builds, a 4-bit file stays int4 untimed; other files are timed as above.
    native = choose_weights("auto", config, storage)
    if storage == "4-bit" and load_decode_library() is not None:
        assert native.weights == "int4" and native.batch1_us == {} and "natively" in native.reason
    else:
        assert set(native.batch1_us) == candidates


def test_min_max_requantisation_gives_a_q4_1_tensor_its_codes_back() -> None:
    # llama.cpp makes Q4_1 with d = (max - min) / 15 and m = min: every group's codes span 0..15.
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (8, 64))
    codes[:, ::32], codes[:, 1::32] = 0, 15
    d, m = rng.uniform(0.001, 0.02, (8, 2)), rng.uniform(-0.2, 0.0, (8, 2))
    blocks = q4_1_blocks(codes, d, m)
    dense = torch.from_numpy(quants.dequantize(blocks, GGMLQuantizationType.Q4_1).reshape(8, 64).copy())
    assert Int4Groups.quantize(dense).codes.numpy().tolist() == codes.tolist()


def test_rotary_unpermute_inverts_llama_cpp_permutation() -> None:
    heads, head_dim, cols = 3, 8, 32
    weight = torch.randn(heads * head_dim, cols)
    # llama.cpp's convert_hf_to_gguf.py permute(): each head's rows interleaved pairwise.
    permuted = weight.reshape(heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(weight.shape)
    assert torch.equal(unpermute_rotary(permuted, heads), weight)  # type: ignore[arg-type]
    groups = Int4Groups.quantize(permuted)
    restored = unpermute_rotary(groups, heads)
    assert isinstance(restored, Int4Groups)
    assert torch.equal(restored.codes, Int4Groups.quantize(weight).codes)


def test_gguf_names_map_to_transformers_names() -> None:
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError, match="unknown GGUF tensor"):
        hf_name("blk.0.ffn_gate_exps.weight")


@pytest.mark.parametrize("weights_format", WEIGHTS_FORMATS)
def test_a_projection_multiplies_by_the_weight_it_reports(weights_format: str) -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64) * 0.1, torch.randn(96)
    projection = make_projection([weight], bias, weights_format)  # type: ignore[arg-type]
    x = torch.randn(7, 64)
    expected = x.to(torch.bfloat16).float() @ projection.dequantized().t() + bias  # type: ignore[operator]
    if weights_format == "fp32":
        expected = x @ weight.t() + bias
    y = projection(x)
    assert y.dtype == torch.float32 and y.shape == (7, 96)
    torch.testing.assert_close(y, expected, rtol=2e-2, atol=2e-2)
    # Close to the float weight too: int4 to its 4-bit step, the others finer.
    step = {"fp32": 1e-6, "bf16": 0.05, "int8": 0.05, "int4": 0.4}[weights_format]
    assert (projection.dequantized() - weight).abs().max() <= step * weight.abs().max()  # type: ignore[operator]


def test_int8_rows_serve_as_an_embedding_table() -> None:
    weight = torch.randn(40, 64)
    table = Int8Linear(weight, None)
    ids = torch.tensor([3, 0, 39, 3])
    torch.testing.assert_close(table.embed(ids), table.dequantized()[ids])
    assert (table.embed(ids) - weight[ids]).abs().max() <= weight.abs().max() / 127


def test_q8_0_blocks_decode_to_what_gguf_dequantizes() -> None:
    weight = np.random.default_rng(6).normal(0, 0.1, (4, 64)).astype(np.float32)
    blocks = quants.quantize(weight, GGMLQuantizationType.Q8_0)
    decoded = decode_q8_0(blocks, 4, 64)
    reference = quants.dequantize(blocks, GGMLQuantizationType.Q8_0).reshape(4, 64)
    np.testing.assert_allclose(decoded.dense().numpy(), reference, rtol=0, atol=1e-7)


def test_a_q8_0_head_multiplies_by_its_codes_as_two_4_bit_halves() -> None:
    torch.manual_seed(1)
    codes = torch.randint(-127, 128, (208, 64), dtype=torch.int8)
    codes[0, :32] = 127  # the extremes of both halves
    codes[1, :32] = -127
    groups = Int8Groups(codes, torch.rand(208, 2) * 0.01 + 1e-4)
    head = Int8GroupLinear(groups, None)
    # What it multiplies by: the stored codes times their group scale rounded to bfloat16, nothing else.
    bf16_scales = groups.scales.bfloat16().float().repeat_interleave(32, dim=1)
    assert torch.equal(head.dequantized(), codes.float() * bf16_scales)
    x = torch.randn(5, 64)
    expected = x.to(torch.bfloat16).float() @ head.dequantized().t()
    torch.testing.assert_close(head(x), expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))
    ids = torch.tensor([0, 1, 207, 0])
    assert torch.equal(head.embed(ids), head.dequantized()[ids])


def test_int4_falls_back_to_int8_where_torch_cannot_pack_the_outputs() -> None:
    weight = torch.randn(97, 64)  # 97 outputs: torch's int4 layout needs a multiple of 16
    projection = make_projection([weight], None, "int4")
    assert isinstance(projection, Int8Linear)
    assert isinstance(make_projection([torch.randn(96, 64)], None, "int4"), Int4Linear)


def test_int4_refuses_an_input_width_off_its_groups() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Groups.quantize(torch.randn(8, 48))


def test_int4_without_its_reference_says_so() -> None:
    linear = Int4Linear(Int4Groups.quantize(torch.randn(32, 64)), None)
    linear.drop_reference()
    with pytest.raises(RuntimeError, match="dropped"):
        linear.dequantized()


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=[f for f in WEIGHTS_FORMATS if f != "fp32"])
def quantized_pair(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """(format, our model in it, transformers on the weights our model multiplies by)."""
    hf = make_hf_llama(seed=5, num_hidden_layers=3, tie_word_embeddings=True, **QUANTISABLE_LLAMA)
    config = ModelConfig.from_hf(hf.config)
    ours = build_model(config, hf.state_dict(), request.param, keep_reference=True)
    reference = make_hf_llama(seed=5, num_hidden_layers=3, tie_word_embeddings=True, **QUANTISABLE_LLAMA)
    reference.load_state_dict(dequantized_hf_state(ours), strict=False)
    reference.tie_weights()
    return request.param, ours, reference


def test_every_format_builds_the_projections_it_names(quantized_pair) -> None:  # type: ignore[no-untyped-def]
    weights_format, model, _ = quantized_pair
    assert isinstance(model, LlamaModel) and model.weights_format == weights_format
    layer_projection = type(model.layers[0].feed_forward.gate_up_proj).__name__
    assert (
        layer_projection == {"bf16": "Bf16Linear", "int8": "Int8Linear", "int4": "Int4Linear"}[weights_format]
    )
    # The head doubles as the tied embedding table: int4 keeps it int8.
    assert type(model.lm_head).__name__ == ("Int8Linear" if weights_format == "int4" else layer_projection)


def test_logits_match_transformers_on_the_same_weights(quantized_pair) -> None:  # type: ignore[no-untyped-def]
    _, model, reference = quantized_pair
    tokens = prompt(21, seed=2)
    runner = ModelRunner(model, num_blocks=16, block_size=4)
    ours = runner.execute([SequenceChunk(tokens, 0, list(range(6)), LogitsFor.ALL)])
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]
    spread = float(expected.max() - expected.min())
    assert (ours - expected).abs().max() <= 0.05 * spread
    assert (ours.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.95


def assert_greedy_on(reference, prompt_ids: list[int], output: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Each token we chose is transformers' argmax on the same weights, or within bfloat16 rounding of it
    (3% of that step's logit spread): on random tiny models near-ties are common and may flip."""
    tokens = list(prompt_ids)
    for token in output:
        with torch.no_grad():
            logits = reference(torch.tensor([tokens])).logits[0, -1]
        best, spread = float(logits.max()), float(logits.max() - logits.min())
        assert float(logits[token]) >= best - 0.03 * spread, (len(tokens) - len(prompt_ids), token)
        tokens.append(token)


@pytest.mark.parametrize("chunk_size", [None, 4], ids=["one-go", "chunked"])
def test_greedy_follows_transformers_with_and_without_prefix_reuse(quantized_pair, chunk_size) -> None:  # type: ignore[no-untyped-def]
    _, model, reference = quantized_pair
    block_size = 4
    shared = prompt(12, seed=7)  # three full blocks
    tails = [prompt(5, seed=8), prompt(9, seed=9)]

    cold_runner = ModelRunner(model, num_blocks=64, block_size=block_size)
    cold = run_greedy(
        cold_runner, BlockAllocator(64), [ToySequence(shared + t, NEW_TOKENS) for t in tails], chunk_size
    )
    for tail, output in zip(tails, cold, strict=True):
        assert_greedy_on(reference, shared + tail, output)

    # Warm: an earlier request left the shared prefix in three blocks; the later ones start after it and
    # choose the same tokens as cold.
    warm_runner = ModelRunner(model, num_blocks=64, block_size=block_size)
    allocator = BlockAllocator(64)
    earlier = ToySequence(shared + prompt(3, seed=10), 1)
    run_greedy(warm_runner, allocator, [earlier], chunk_size)
    later = [
        ToySequence(shared + t, NEW_TOKENS, list(earlier.block_table[:3]), num_computed=12) for t in tails
    ]
    assert run_greedy(warm_runner, allocator, later, chunk_size) == cold


def test_auto_picks_the_fastest_small_format_not_slower_when_busy() -> None:
    batch16 = {"fp32": 400.0, "bf16": 150.0, "int8": 500.0, "int4": 350.0}
    # int4 and int8 are equally fast alone; int8 is slower than fp32 when busy, int4 is smaller anyway.
    assert pick({"fp32": 130.0, "bf16": 110.0, "int8": 50.0, "int4": 52.0}, batch16)[0] == "int4"
    # Where low-precision kernels are slow (AVX2-only CPUs), float32 stays.
    slow = {"fp32": 130.0, "bf16": 650.0, "int8": 900.0, "int4": 2000.0}
    assert pick(slow, {"fp32": 400.0, "bf16": 2000.0, "int8": 9000.0, "int4": 9000.0})[0] == "fp32"
    # A format not timed when busy (it was too slow alone) is never picked.
    assert (
        pick({"fp32": 130.0, "bf16": 650.0, "int8": 110.0, "int4": 60.0}, {"fp32": 400.0, "int8": 390.0})[0]
        == "int8"
    )
    # bf16 wins only where it is the fastest alone by more than 10%.
    assert pick({"fp32": 130.0, "bf16": 60.0, "int8": 90.0, "int4": 95.0}, batch16)[0] == "bf16"
