"""A counter per scope that moves whenever an entry of the scope may have gone or been replaced: deleted or
purged here or in another process (the change stream), replaced under max-age, or every scope at once when the
index is rebuilt (events were missed). A copy of an entry kept outside Redis (the gateway's exact-hit memo)
is good while its scope's epoch has not moved since it was read."""

from __future__ import annotations

Epoch = tuple[int, int]


class ChangeEpochs:
    def __init__(self) -> None:
        self._all = 0
        self._scopes: dict[str, int] = {}
        self.moves = 0
        """Every move of any scope so far: read before a lookup, it says whether anything moved during it."""

    def of(self, scope_id: str) -> Epoch:
        return self._all, self._scopes.get(scope_id, 0)

    def moved(self, scope_id: str) -> None:
        """An entry of `scope_id` may have gone or been replaced."""
        self._scopes[scope_id] = self._scopes.get(scope_id, 0) + 1
        self.moves += 1

    def all_moved(self) -> None:
        """Any entry may have gone (a rebuild after missed events)."""
        self._all += 1
        self.moves += 1
        self._scopes.clear()  # bounded by the scopes deleted from between two rebuilds
