"""The decode step in one native call, for models stored in int4 (`engine/model/native/decode_step.c`).

A batch-1 decode step in torch is ~1,650 eager op dispatches over 30 layers and torch's weight-only int4
kernel; on this project's CPUs that step was 20 ms against llama.cpp's 14 (docs/benchmarks.md). This runs
the whole step — every layer, the paged-KV write and read, the head — in one call into C that multiplies
the 4-bit weights as llama.cpp does (activations rounded to 8 bits per group of 32, integer dot products),
and releases the GIL while it runs (ctypes does), so the gateway's event loop keeps serving.

It reads what the torch model holds: the same codes, scales and zeros (`Int4Linear.blocks`), the same head
codes, norms and KV cache tensors; it writes K/V where torch's step would. `ModelRunner` sends it every
decode row of a step, however many and whatever else the step holds, so that a sequence's tokens never
depend on what it is batched with; prefill chunks stay on torch's path.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence as SequenceOf
from typing import Literal

import torch

from engine.model.attention import KVCache
from engine.model.llama import LlamaModel, rope_cos_sin
from engine.model.native_build import DEFAULT_FORM
from engine.model.native_forms import FormChoice, choose_form
from engine.model.paging import PagingMetadata, SequenceChunk, build_paging_metadata
from engine.model.quantized import GROUP_SIZE, Int4Linear, Int8GroupLinear, Int8Linear

DecodeKernel = Literal["auto", "native", "torch"]


class _Q4(ctypes.Structure):
    _fields_ = [
        ("blocks", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
    ]


class _Q8(ctypes.Structure):
    _fields_ = [
        ("codes", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attention_norm", ctypes.c_void_p),
        ("feed_forward_norm", ctypes.c_void_p),
        ("qkv", _Q4),
        ("o", _Q4),
        ("gate_up", _Q4),
        ("down", _Q4),
        ("key_cache", ctypes.c_void_p),
        ("value_cache", ctypes.c_void_p),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("num_layers", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("layers", ctypes.POINTER(_Layer)),
        ("norm", ctypes.c_void_p),
        ("head", _Q8),
    ]


class NativeDecoder:
    """Runs pure-decode steps of one int4 `LlamaModel` over one `KVCache` in native code."""

    def __init__(
        self,
        library: ctypes.CDLL,
        isa: str,
        model: LlamaModel,
        kv_cache: KVCache,
        form: FormChoice | str = DEFAULT_FORM,
    ) -> None:
        self.isa = isa
        self.form = form if isinstance(form, FormChoice) else FormChoice(isa, form)
        self._library = library
        self._model = model
        self._keep: list[torch.Tensor] = []  # every tensor the C struct points into stays alive with it
        config = model.config
        layers = (_Layer * config.num_layers)()
        for i, layer in enumerate(model.layers):
            layers[i] = _Layer(
                self._pointer(layer.attention_norm.detach()),
                self._pointer(layer.feed_forward_norm.detach()),
                self._q4(layer.attention.qkv_proj),
                self._q4(layer.attention.o_proj),
                self._q4(layer.feed_forward.gate_up_proj),
                self._q4(layer.feed_forward.down_proj),
                self._pointer(kv_cache.keys[i]),
                self._pointer(kv_cache.values[i]),
            )
        self._layers = layers
        self._struct = _Model(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.intermediate_size,
            config.num_layers,
            kv_cache.block_size,
            config.rms_norm_eps,
            layers,
            self._pointer(model.norm.detach()),
            self._q8(model.lm_head),
        )

    @classmethod
    def create(
        cls, model: LlamaModel, kv_cache: KVCache, kernel: DecodeKernel = "auto"
    ) -> NativeDecoder | None:
        """The native decoder for `model`, or None where `kernel` or the model rules it out or it cannot be
        built. `native` raises instead of falling back."""
        if kernel == "torch":
            return None
        reason = unsupported(model, kv_cache)
        chosen = None
        if reason is None:
            # Each build of the step (instruction set, dot form) measured on this CPU the first time
            # (engine.model.native_forms).
            chosen = choose_form(
                model,
                kv_cache.block_size,
                _threads(),
                lambda library, build, cache: cls(library, build.isa, model, cache, build),
            )
        if chosen is None:
            if kernel == "native":
                raise RuntimeError(
                    f"the native decode step cannot run here: {reason or 'this CPU has no AVX2, or it could not be built'}"
                )
            return None
        library, build = chosen
        return cls(library, build.isa, model, kv_cache, build)

    @torch.inference_mode()
    def decode(self, input_ids: torch.Tensor, metadata: PagingMetadata) -> torch.Tensor:
        """(B,) token ids, one new token per sequence -> (B, vocab) float32 logits; K/V written."""
        rows = int(input_ids.shape[0])
        x = self._model.embed(input_ids).float().contiguous()
        cos, signed_sin = rope_cos_sin(metadata.positions, self._model.inv_freq)
        cos, signed_sin = cos[:, 0].contiguous(), signed_sin[:, 0].contiguous()
        slots = metadata.slot_mapping.to(torch.int64).contiguous()
        block_tables = metadata.block_tables.to(torch.int64).contiguous()
        context_lens = metadata.context_lens.to(torch.int64).contiguous()
        logits = torch.empty(rows, self._model.config.vocab_size, dtype=torch.float32)
        status = self._library.kvgate_decode_step(
            ctypes.byref(self._struct),
            ctypes.c_int64(rows),
            ctypes.c_void_p(x.data_ptr()),
            ctypes.c_void_p(cos.data_ptr()),
            ctypes.c_void_p(signed_sin.data_ptr()),
            ctypes.c_void_p(slots.data_ptr()),
            ctypes.c_void_p(block_tables.data_ptr()),
            ctypes.c_int64(block_tables.shape[1]),
            ctypes.c_void_p(context_lens.data_ptr()),
            ctypes.c_void_p(logits.data_ptr()),
            ctypes.c_int(_threads()),
        )
        if status != 0:
            raise MemoryError("the native decode step could not allocate its scratch memory")
        return logits

    @property
    def bursts(self) -> bool:
        """Can `decode_burst` run this model? It embeds tokens from the head's codes: a tied int8 head."""
        return bool(self._model.config.tie_word_embeddings) and isinstance(
            self._model.lm_head, (Int8GroupLinear, Int8Linear)
        )

    @torch.inference_mode()
    def decode_burst(
        self, chunk: SequenceChunk, block_size: int, steps: int, stop_ids: SequenceOf[int]
    ) -> list[int]:
        """Up to `steps` greedy tokens after the chunk's one token, in one native call: each step embeds the
        token before it, decodes it at the next position and takes the first largest logit (torch.argmax's
        choice), as `steps` single decode steps and argmaxes would; it stops after a token of `stop_ids`.
        Every position it writes K/V for must lie in the chunk's block table (the caller's guarantee)."""
        [token] = chunk.token_ids
        first = chunk.num_cached_tokens
        # The positions and slots of `steps` tokens from the chunk's on (and the check that its blocks hold
        # them): the metadata of one chunk of that many tokens.
        metadata = build_paging_metadata(
            [SequenceChunk([token] * steps, first, chunk.block_table)], block_size
        )
        cos, signed_sin = rope_cos_sin(metadata.positions, self._model.inv_freq)
        cos, signed_sin = cos[:, 0].contiguous(), signed_sin[:, 0].contiguous()
        slots = metadata.slot_mapping.contiguous()
        block_table = metadata.block_tables[0].contiguous()
        stops = torch.tensor(list(stop_ids), dtype=torch.int64)
        logits = torch.empty(self._model.config.vocab_size, dtype=torch.float32)
        tokens = torch.empty(steps, dtype=torch.int64)
        produced = self._library.kvgate_decode_burst(
            ctypes.byref(self._struct),
            ctypes.c_int64(steps),
            ctypes.c_int64(token),
            ctypes.c_void_p(cos.data_ptr()),
            ctypes.c_void_p(signed_sin.data_ptr()),
            ctypes.c_void_p(slots.data_ptr()),
            ctypes.c_void_p(block_table.data_ptr()),
            ctypes.c_int64(block_table.shape[0]),
            ctypes.c_int64(first + 1),
            ctypes.c_void_p(stops.data_ptr()),
            ctypes.c_int64(len(stops)),
            ctypes.c_void_p(logits.data_ptr()),
            ctypes.c_void_p(tokens.data_ptr()),
            ctypes.c_int(_threads()),
        )
        if produced < 0:
            raise MemoryError("the native decode step could not allocate its scratch memory")
        return [int(token) for token in tokens[:produced].tolist()]

    def _pointer(self, tensor: torch.Tensor) -> int:
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        self._keep.append(tensor)
        return int(tensor.data_ptr())

    def _q4(self, projection: torch.nn.Module) -> _Q4:
        assert isinstance(projection, Int4Linear) and projection.blocks is not None
        bias = None if projection.bias is None else self._pointer(projection.bias.detach().float())
        return _Q4(self._pointer(projection.blocks), bias, projection.out_features, projection.in_features)

    def _q8(self, head: torch.nn.Module) -> _Q8:
        if isinstance(head, Int8GroupLinear):
            scales = head.scales  # (N, K / 32) bfloat16
        else:
            assert isinstance(head, Int8Linear)
            groups = head.in_features // GROUP_SIZE
            scales = head.scales[:, None].expand(-1, groups).contiguous()  # one per row, repeated per group
        return _Q8(self._pointer(head.codes), self._pointer(scales), head.out_features, head.in_features)


def _threads() -> int:
    """The engine's thread setting (`KVGATE_TORCH_THREADS`, torch's intra-op threads), never more than the
    cores this process may use: a participant waiting for a core stalls every product of the step."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(torch.get_num_threads(), cores)


def unsupported(model: LlamaModel, kv_cache: KVCache) -> str | None:
    """Why the native step cannot run this model and cache, or None when it can."""
    config = model.config
    if model.weights_format != "int4":
        return f"the weights are {model.weights_format}, not int4"
    if kv_cache.keys[0].dtype != torch.float32 or kv_cache.keys[0].device.type != "cpu":
        return "the KV cache is not float32 on the CPU"
    if not config.tie_word_embeddings and model.embed_tokens.device.type != "cpu":
        return "the model is not on the CPU"
    for layer in model.layers:
        for projection in (
            layer.attention.qkv_proj,
            layer.attention.o_proj,
            layer.feed_forward.gate_up_proj,
            layer.feed_forward.down_proj,
        ):
            if not isinstance(projection, Int4Linear) or projection.blocks is None:
                return f"a layer projection is {type(projection).__name__}, not 4-bit"
    if (
        not isinstance(model.lm_head, Int8GroupLinear | Int8Linear)
        or getattr(model.lm_head, "bias", None) is not None
    ):
        return f"the head is {type(model.lm_head).__name__}, not int8"
    if config.head_dim % 2 or config.num_heads % config.num_kv_heads:
        return "the attention heads do not split evenly"
    return None
