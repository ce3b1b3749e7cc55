"""Chained, tagged block hashes: stable bytes, namespaced chains, unambiguous encodings."""

import pytest

from prefix.hashing import (
    NO_EXTRA_KEYS,
    BlockHash,
    ExtraKey,
    ExtraKeys,
    adapter_key,
    blake2b_128,
    hash_block_tokens,
    model_key,
    tenant_key,
)

SMOL = model_key("HuggingFaceTB/SmolLM2-135M", "main", "bfloat16")


def root(token_ids: list[int], extra_keys: ExtraKeys = NO_EXTRA_KEYS) -> BlockHash:
    return hash_block_tokens(blake2b_128, None, token_ids, extra_keys)


def test_golden_values_pin_the_byte_layout() -> None:
    # Hashes must match across processes and releases (they may be persisted or sent to a router);
    # if this fails, the encoding changed: bump the scheme version in prefix/hashing.py.
    keys = ExtraKeys.of(SMOL, tenant_key("acme"))
    first = hash_block_tokens(blake2b_128, None, [1, 2, 3, 4], keys)
    second = hash_block_tokens(blake2b_128, first, [5, 6, 7, 8])
    assert first.hex() == "6524402e7de363c982a09c5e34736547"
    assert second.hex() == "b4aea45b57f1c98aa742b4de7199c00a"


def test_default_hash_is_128_bit() -> None:
    assert len(root([1, 2, 3])) == 16


def test_same_input_same_hash() -> None:
    assert root([7, 8, 9], ExtraKeys.of(SMOL)) == root([7, 8, 9], ExtraKeys.of(SMOL))


def test_tokens_and_their_order_matter() -> None:
    assert root([1, 2, 3]) != root([1, 2, 4])
    assert root([1, 2, 3]) != root([3, 2, 1])
    assert root([1, 2]) != root([1, 2, 0])


def test_parent_enters_the_child() -> None:
    parent_a, parent_b = root([1]), root([2])
    assert hash_block_tokens(blake2b_128, parent_a, [5]) != hash_block_tokens(blake2b_128, parent_b, [5])


def test_a_first_block_never_equals_a_child_block() -> None:
    # Domain separation: no parent and an empty namespace is not the same as some parent.
    assert root([5]) != hash_block_tokens(blake2b_128, root([]), [5])


def test_extra_keys_namespace_the_whole_chain() -> None:
    first_a = root([1, 2], ExtraKeys.of(SMOL, tenant_key("a")))
    first_b = root([1, 2], ExtraKeys.of(SMOL, tenant_key("b")))
    assert first_a != first_b
    assert hash_block_tokens(blake2b_128, first_a, [3, 4]) != hash_block_tokens(blake2b_128, first_b, [3, 4])


def test_tags_keep_equal_values_apart() -> None:
    assert root([1], ExtraKeys.of(tenant_key("x"))) != root([1], ExtraKeys.of(adapter_key("x")))


def test_model_identity_covers_name_revision_and_dtype() -> None:
    hashes = {
        root([1], ExtraKeys.of(model_key("m", "r1", "bfloat16"))),
        root([1], ExtraKeys.of(model_key("m", "r2", "bfloat16"))),
        root([1], ExtraKeys.of(model_key("m", "r1", "float16"))),
        root([1], ExtraKeys.of(model_key("n", "r1", "bfloat16"))),
        root([1]),
    }
    assert len(hashes) == 5


def test_string_boundaries_are_unambiguous() -> None:
    assert root([1], ExtraKeys.of(ExtraKey("k", ("ab", "c")))) != root(
        [1], ExtraKeys.of(ExtraKey("k", ("a", "bc")))
    )
    assert root([1], ExtraKeys.of(ExtraKey("ab", ("c",)))) != root([1], ExtraKeys.of(ExtraKey("a", ("bc",))))


def test_key_order_does_not_matter() -> None:
    assert ExtraKeys.of(SMOL, tenant_key("t")) == ExtraKeys.of(tenant_key("t"), SMOL)
    assert root([1], ExtraKeys.of(SMOL, tenant_key("t"))) == root([1], ExtraKeys.of(tenant_key("t"), SMOL))


def test_room_for_more_keys() -> None:
    image = ExtraKey("image", ("sha256:abc",))
    assert root([1], ExtraKeys.of(SMOL, image)) != root([1], ExtraKeys.of(SMOL))


def test_duplicate_tags_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        ExtraKeys.of(tenant_key("a"), tenant_key("b"))


def test_unsorted_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="sorted"):
        ExtraKeys((tenant_key("a"), adapter_key("b")))


def test_bad_extra_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ExtraKey("", ("x",))
    with pytest.raises(TypeError):
        ExtraKey("tenant", ["x"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ExtraKey("tenant", (1,))  # type: ignore[arg-type]


def test_extra_keys_on_a_child_block_are_refused() -> None:
    with pytest.raises(ValueError, match="first block"):
        hash_block_tokens(blake2b_128, root([1]), [2], ExtraKeys.of(SMOL))


@pytest.mark.parametrize("bad_token", [-1, 2**32])
def test_token_ids_outside_uint32_are_refused(bad_token: int) -> None:
    with pytest.raises(ValueError, match="token ids"):
        root([1, bad_token])


def test_hash_function_is_injectable() -> None:
    seen: list[bytes] = []

    def recording_hash(data: bytes) -> bytes:
        seen.append(data)
        return b"\x00"

    assert hash_block_tokens(recording_hash, None, [1, 2]) == b"\x00"
    assert len(seen) == 1 and seen[0].endswith(bytes([1, 0, 0, 0, 2, 0, 0, 0]))
