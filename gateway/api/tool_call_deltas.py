"""One choice's text of a tool call, `{"name": "f", "arguments": {...}}`, as the deltas of OpenAI's tool-call
stream: the call (its id, type and name) once the name is generated, then its arguments in pieces as they
are generated. `gateway.api.choice_chunks` wraps them in `chat.completion.chunk`s (with the role first and
the finish reason "tool_calls" last); folded (the SDK's stream helper, `gateway.api.chunks.accumulate_chat`)
they make the message `{"role": "assistant", "content": null, "tool_calls": [{"id", "type": "function",
"function": {"name", "arguments": <JSON text>}}]}`.

The grammar generates the call without free whitespace and with `name` first, so the arguments are the text
between `"arguments": ` and the call's closing brace, which is held back until the call is complete.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.api.ids import random_hex

_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')

Delta = dict[str, Any]


class ToolCallDeltas:
    """Folds one choice's text deltas into tool-call deltas."""

    def __init__(self) -> None:
        self.call_id = "call_" + random_hex(12)
        self._text = ""
        self._arguments_start: int | None = None
        self._sent = 0  # characters of the arguments already sent

    def add(self, text: str) -> list[Delta]:
        """Deltas for newly generated text (none while the name is still being written)."""
        self._text += text
        deltas = []
        if self._arguments_start is None:
            head = _HEAD.match(self._text)
            if head is None:
                return []
            self._arguments_start = head.end()
            name = json.loads(head.group(1))
            call = {
                "index": 0,
                "id": self.call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            deltas.append({"tool_calls": [call]})
        # Hold back the last character: it may be the call's own closing brace.
        deltas.extend(self._arguments(len(self._text) - 1))
        return deltas

    def finish(self, complete: bool) -> list[Delta]:
        """The rest of the arguments. `complete`: the call was generated whole (else max_tokens cut it, and
        what there is of it is sent)."""
        if self._arguments_start is None:
            return []
        return self._arguments(len(self._text) - 1 if complete else len(self._text))

    def _arguments(self, end: int) -> list[Delta]:
        assert self._arguments_start is not None
        piece = self._text[self._arguments_start + self._sent : end]
        if not piece:
            return []
        self._sent += len(piece)
        return [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}]
