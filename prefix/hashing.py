"""Chained, namespaced hashes of full KV blocks.

A block's hash covers its own token ids and its parent's hash, so equal hashes mean equal prefixes
(up to the hash function's collision resistance). The first block of a chain also covers the
request's extra keys — model identity, tenant salt, adapter, ... — so every block of a chain lives
in that namespace. Extra keys are tagged: a tenant salt "x" and an adapter named "x" encode
differently.

Hashes are bytes from an injectable `HashFn` (default: 128-bit blake2b). They never use Python's
`hash()`, so they are the same across processes, restarts and machines.

This module knows nothing about blocks, pools or sequences; the pool re-checks stored token ids on
every hit, so a collision here can cost a cache miss but never wrong KV.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NewType

BlockHash = NewType("BlockHash", bytes)
"""Digest of one full block, chained through its parent."""

HashFn = Callable[[bytes], bytes]
"""Maps the encoded block to its digest. Must be deterministic across processes."""

# Bump when the byte layout below changes, so old persisted hashes can never match new ones.
_SCHEME = b"kvgate.prefix.v1"
_ROOT = _SCHEME + b"\x00"
_CHILD = _SCHEME + b"\x01"
_MAX_TOKEN_ID = 2**32 - 1


def blake2b_128(data: bytes) -> bytes:
    """The default hash: blake2b with a 16-byte digest (stdlib, fast, collision-resistant)."""
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class ExtraKey:
    """One tagged component of a cache namespace, e.g. `ExtraKey("tenant", ("acme",))`."""

    tag: str
    values: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.tag:
            raise ValueError("extra key tag must be non-empty")
        if not isinstance(self.values, tuple) or not all(isinstance(value, str) for value in self.values):
            raise TypeError(f"extra key {self.tag!r}: values must be a tuple of str, got {self.values!r}")


def model_key(name: str, revision: str, dtype: str) -> ExtraKey:
    """Model identity: KV computed by one model (or one revision, one dtype) is useless to another."""
    return ExtraKey("model", (name, revision, dtype))


def tenant_key(salt: str) -> ExtraKey:
    """Tenant salt: tenants with different salts never share a block, even for identical prompts."""
    return ExtraKey("tenant", (salt,))


def adapter_key(name: str) -> ExtraKey:
    """Adapter (e.g. LoRA) name: the adapter changes the KV of every token."""
    return ExtraKey("adapter", (name,))


@dataclass(frozen=True, slots=True)
class ExtraKeys:
    """A request's namespace: tagged keys, at most one per tag, in canonical (tag-sorted) order.

    Build it with `ExtraKeys.of(...)`; the order of arguments does not matter.
    """

    keys: tuple[ExtraKey, ...]

    def __post_init__(self) -> None:
        tags = [key.tag for key in self.keys]
        if tags != sorted(tags):
            raise ValueError("extra keys must be sorted by tag; build them with ExtraKeys.of(...)")
        if len(set(tags)) != len(tags):
            raise ValueError(f"duplicate extra key tags: {tags}")

    @classmethod
    def of(cls, *keys: ExtraKey) -> ExtraKeys:
        """Build a namespace from keys in any order."""
        return cls(tuple(sorted(keys, key=lambda key: key.tag)))


NO_EXTRA_KEYS = ExtraKeys.of()


def hash_block_tokens(
    hash_fn: HashFn,
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: ExtraKeys = NO_EXTRA_KEYS,
) -> BlockHash:
    """Hash one block. The first block (`parent_hash is None`) covers `extra_keys`; later blocks
    cover them through the parent chain, so `extra_keys` must be left out for them.
    """
    if parent_hash is None:
        head = _ROOT + _encode_keys(extra_keys.keys)
    else:
        if extra_keys.keys:
            raise ValueError("extra keys enter the first block only; later blocks inherit them")
        head = _CHILD + _length(len(parent_hash)) + parent_hash
    return BlockHash(hash_fn(head + encode_token_ids(token_ids)))


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32: fixed width, the same bytes on every platform."""
    try:
        return struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error as error:
        raise ValueError(f"token ids must be ints in [0, {_MAX_TOKEN_ID}]") from error


def _encode_keys(keys: tuple[ExtraKey, ...]) -> bytes:
    # Every string is length-prefixed and every list count-prefixed, so no two different key sets
    # share an encoding ("ab" + "c" never equals "a" + "bc").
    parts = [_length(len(keys))]
    for key in keys:
        parts.append(_text(key.tag))
        parts.append(_length(len(key.values)))
        parts.extend(_text(value) for value in key.values)
    return b"".join(parts)


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return _length(len(data)) + data


def _length(value: int) -> bytes:
    return value.to_bytes(4, "little")
