"""The free list: exact order after every operation."""

import pytest

from prefix.free_queue import FreeBlockQueue


def test_starts_in_the_given_order() -> None:
    assert list(FreeBlockQueue(range(4))) == [0, 1, 2, 3]


def test_popleft_takes_the_front() -> None:
    queue = FreeBlockQueue(range(3))
    assert queue.popleft() == 0
    assert list(queue) == [1, 2]
    assert len(queue) == 2


def test_append_goes_to_the_back_and_appendleft_to_the_front() -> None:
    queue = FreeBlockQueue([1, 2])
    queue.append(7)
    queue.appendleft(9)
    assert list(queue) == [9, 1, 2, 7]


def test_remove_from_the_middle() -> None:
    queue = FreeBlockQueue(range(5))
    queue.remove(2)
    assert list(queue) == [0, 1, 3, 4]
    assert 2 not in queue
    queue.append(2)
    assert list(queue) == [0, 1, 3, 4, 2]


def test_remove_front_and_back() -> None:
    queue = FreeBlockQueue(range(3))
    queue.remove(0)
    queue.remove(2)
    assert list(queue) == [1]


def test_pop_from_empty_raises() -> None:
    queue = FreeBlockQueue()
    with pytest.raises(IndexError):
        queue.popleft()


def test_removing_a_block_that_is_not_free_raises() -> None:
    queue = FreeBlockQueue([1])
    with pytest.raises(KeyError, match="not free"):
        queue.remove(5)


@pytest.mark.parametrize("add", ["append", "appendleft"])
def test_a_block_cannot_be_free_twice(add: str) -> None:
    queue = FreeBlockQueue([1, 2])
    with pytest.raises(ValueError, match="already free"):
        getattr(queue, add)(2)
    assert list(queue) == [1, 2]
