"""OpenAI's completion objects as plain dicts: a stream's chunks folded into the whole object, and a whole
object unfolded into chunks again.

The cache stores each answer as the whole object the backend sent (`chat.completion` or `text_completion`):
every choice with its whole message (content, tool calls, refusal, reasoning fields, annotations, audio),
logprobs, `finish_reason` as sent, `system_fingerprint`, `usage` with its details. A streamed miss is folded
here the way the official SDK's stream helper folds it (`openai.lib.streaming.chat`), so that what is stored
is what the client's SDK ended up with; a streamed hit is unfolded into a chunk sequence that the same helper
folds back into the stored object. Knows dicts only: no HTTP, no cache.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# A stored text is replayed in pieces of about this many characters, cut at spaces.
REPLAY_PIECE_CHARS = 24
# Fields of a choice's message that are text, streamed piece by piece on a replay.
_STREAMED_TEXT = ("content", "refusal", "reasoning_content", "reasoning")
# Fields that belong to the whole object, not to its choices, repeated on each chunk as OpenAI does.
_CHUNK_FIELDS = ("system_fingerprint", "service_tier")

Payload = dict[str, Any]


def accumulate_chat(chunks: Sequence[Mapping[str, Any]]) -> Payload:
    """The `chat.completion` a stream of `chat.completion.chunk`s adds up to."""
    whole: Payload = {}
    choices: dict[int, Payload] = {}
    for chunk in chunks:
        for name, value in chunk.items():
            if name not in ("choices", "object", "usage", "obfuscation"):
                whole[name] = value
        if chunk.get("usage") is not None:
            whole["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index", 0))
            snapshot = choices.setdefault(index, {"index": index, "message": {}})
            accumulate_delta(snapshot["message"], dict(choice.get("delta") or {}))
            for name, value in choice.items():
                if name in ("delta", "index", "logprobs") or value is None:
                    continue
                snapshot[name] = value
            _accumulate_logprobs(snapshot, choice.get("logprobs"))
    whole["object"] = "chat.completion"
    whole["choices"] = [_finished_choice(choices[index]) for index in sorted(choices)]
    whole.setdefault("usage", None)
    return whole


def accumulate_text(chunks: Sequence[Mapping[str, Any]]) -> Payload:
    """The `text_completion` a stream of legacy completion chunks adds up to."""
    whole: Payload = {}
    choices: dict[int, Payload] = {}
    for chunk in chunks:
        for name, value in chunk.items():
            if name not in ("choices", "usage"):
                whole[name] = value
        if chunk.get("usage") is not None:
            whole["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index", 0))
            snapshot = choices.setdefault(index, {"index": index, "text": "", "logprobs": None})
            snapshot["text"] += choice.get("text") or ""
            if choice.get("logprobs") is not None:
                snapshot["logprobs"] = accumulate_delta(snapshot["logprobs"] or {}, dict(choice["logprobs"]))
            if choice.get("finish_reason") is not None:
                snapshot["finish_reason"] = choice["finish_reason"]
    whole["object"] = "text_completion"
    whole["choices"] = [{"finish_reason": None, **choices[index]} for index in sorted(choices)]
    whole.setdefault("usage", None)
    return whole


def accumulate_delta(into: Payload, delta: Mapping[str, Any]) -> Payload:
    """Fold one delta into a snapshot as the SDK does: strings and numbers add up, objects merge, lists of
    objects merge by their `index`, other lists extend; `index` and `type` are replaced, never added."""
    for name, value in delta.items():
        current = into.get(name)
        if current is None or name in ("index", "type"):
            into[name] = copy.deepcopy(value)
        elif isinstance(current, str) and isinstance(value, str):
            into[name] = current + value
        elif isinstance(current, dict) and isinstance(value, dict):
            accumulate_delta(current, value)
        elif isinstance(current, list) and isinstance(value, list):
            for entry in value:
                position = entry.get("index") if isinstance(entry, dict) else None
                if (
                    isinstance(position, int)
                    and position < len(current)
                    and isinstance(current[position], dict)
                ):
                    accumulate_delta(current[position], entry)
                elif isinstance(position, int):
                    current.insert(position, copy.deepcopy(entry))
                else:
                    current.append(copy.deepcopy(entry))
        elif isinstance(current, int | float) and isinstance(value, int | float):
            into[name] = current + value
        else:
            into[name] = copy.deepcopy(value)
    return into


def chat_chunks(whole: Mapping[str, Any], include_usage: bool) -> Iterator[Payload]:
    """`chat.completion.chunk`s that fold (`accumulate_chat`, or the SDK's stream helper) into `whole`:
    per choice the role, then each text field in pieces (with its share of logprobs), each tool call (its
    id, type and name, then its arguments in pieces), the rest of the message, the finish reason; last the
    usage, when the client asked for it."""
    head = {name: whole[name] for name in ("id", "created", "model") if name in whole}
    head["object"] = "chat.completion.chunk"
    head |= {name: whole[name] for name in _CHUNK_FIELDS if name in whole}

    def chunk(choice: Payload) -> Payload:
        return {**head, "choices": [choice]}

    for choice in whole.get("choices") or []:
        index = choice.get("index", 0)
        message = dict(choice.get("message") or {})
        logprobs = choice.get("logprobs") or {}
        opening: Payload = {"role": message.pop("role", "assistant")}
        if isinstance(message.get("content"), str):
            opening["content"] = ""  # as OpenAI's first chunk carries it
        yield chunk({"index": index, "delta": opening, "finish_reason": None})
        for field in _STREAMED_TEXT:
            text = message.pop(field, None)
            if isinstance(text, str):
                token_logprobs = logprobs.get(field) if field in ("content", "refusal") else None
                for piece, piece_logprobs in _text_pieces(text, token_logprobs):
                    delta_chunk: Payload = {"index": index, "delta": {field: piece}, "finish_reason": None}
                    if piece_logprobs is not None:
                        delta_chunk["logprobs"] = {field: piece_logprobs}
                    yield chunk(delta_chunk)
        for position, call in enumerate(message.pop("tool_calls", None) or []):
            function = dict(call.get("function") or {})
            arguments = function.pop("arguments", "")
            call_opening = {key: value for key, value in call.items() if key != "function"}
            call_opening["index"] = position
            call_opening["function"] = {**function, "arguments": ""}
            yield chunk({"index": index, "delta": {"tool_calls": [call_opening]}, "finish_reason": None})
            for piece in replay_pieces(arguments or ""):
                tool_delta = {"index": position, "function": {"arguments": piece}}
                yield chunk({"index": index, "delta": {"tool_calls": [tool_delta]}, "finish_reason": None})
        rest = {name: value for name, value in message.items() if value is not None}
        if rest:
            yield chunk({"index": index, "delta": rest, "finish_reason": None})
        yield chunk({"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")})
    if include_usage:
        yield {**head, "choices": [], "usage": whole.get("usage")}


def text_chunks(whole: Mapping[str, Any], include_usage: bool) -> Iterator[Payload]:
    """Legacy completion chunks that fold (`accumulate_text`) into `whole`."""
    head = {name: whole[name] for name in ("id", "object", "created", "model") if name in whole}
    head |= {name: whole[name] for name in _CHUNK_FIELDS if name in whole}
    for choice in whole.get("choices") or []:
        index = choice.get("index", 0)
        logprobs = choice.get("logprobs")
        pieces = list(replay_pieces(choice.get("text") or "")) or [""]
        for number, piece in enumerate(pieces):
            last = number == len(pieces) - 1
            yield {
                **head,
                "choices": [
                    {
                        "index": index,
                        "text": piece,
                        # Logprobs travel whole with the last piece: their offsets count from the answer's start.
                        "logprobs": logprobs if last else None,
                        "finish_reason": choice.get("finish_reason") if last else None,
                    }
                ],
            }
    if include_usage:
        yield {**head, "choices": [], "usage": whole.get("usage")}


def replay_pieces(text: str) -> Iterator[str]:
    """`text` cut into stream-sized pieces at spaces (the exact text, reassembled)."""
    start = 0
    while start < len(text):
        end = min(len(text), start + REPLAY_PIECE_CHARS)
        if end < len(text):
            space = text.rfind(" ", start + 1, end)
            end = space if space > start else end
        yield text[start:end]
        start = end


def refused(whole: Mapping[str, Any]) -> bool:
    """Some choice is a refusal (its message's `refusal` is set)."""
    return any((choice.get("message") or {}).get("refusal") for choice in whole.get("choices") or [])


def finish_reasons(whole: Mapping[str, Any]) -> list[str]:
    return [str(choice.get("finish_reason")) for choice in whole.get("choices") or []]


def plain_text(whole: Mapping[str, Any]) -> bool:
    """One choice whose answer is text alone: no tool call, refusal or audio (what a semantic hit may serve)."""
    choices = whole.get("choices") or []
    if len(choices) != 1:
        return False
    choice = choices[0]
    if "text" in choice:
        return choice.get("logprobs") is None
    message = choice.get("message") or {}
    return (
        not message.get("tool_calls")
        and not message.get("function_call")
        and not message.get("refusal")
        and not message.get("audio")
        and choice.get("logprobs") is None
    )


def _text_pieces(text: str, token_logprobs: list[Any] | None) -> Iterator[tuple[str, list[Any] | None]]:
    """Pieces of a text field; with logprobs, one piece per token so each carries its own logprob."""
    if token_logprobs and "".join(str(entry.get("token", "")) for entry in token_logprobs) == text:
        for entry in token_logprobs:
            yield str(entry.get("token", "")), [entry]
        return
    pieces = list(replay_pieces(text)) or [""]
    for number, piece in enumerate(pieces):
        # Logprobs whose tokens do not spell the text travel whole with the first piece.
        yield piece, (token_logprobs if number == 0 and token_logprobs else None)


def _accumulate_logprobs(snapshot: Payload, logprobs: Mapping[str, Any] | None) -> None:
    if logprobs is None:
        return
    current = snapshot.get("logprobs")
    if current is None:
        snapshot["logprobs"] = copy.deepcopy(dict(logprobs))
        return
    for field in ("content", "refusal"):
        if logprobs.get(field):
            current[field] = (current.get(field) or []) + copy.deepcopy(logprobs[field])


def _finished_choice(snapshot: Payload) -> Payload:
    message = snapshot["message"]
    for call in message.get("tool_calls") or []:
        call.pop("index", None)  # a delta's position, not part of the whole message
    return {"index": snapshot["index"], "message": message, "logprobs": None, "finish_reason": None} | {
        name: value for name, value in snapshot.items() if name not in ("index", "message")
    }


def whole_from_text(
    *,
    chat: bool,
    model: str,
    text: str,
    finish_reason: str,
    usage: Mapping[str, Any],
    response_id: str,
    created: int,
) -> Payload:
    """The whole object for an answer known only as text (the engine's, or an entry stored before whole objects
    were): one choice, as kvgate's own routes have always rendered it."""
    if chat:
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": dict(usage),
            "system_fingerprint": None,
        }
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
        "usage": dict(usage),
    }


def answer_text(whole: Mapping[str, Any]) -> str:
    """The first choice's text (chat content or completion text), '' when it has none."""
    choices = whole.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return str(choice.get("text") or "")
    return str((choice.get("message") or {}).get("content") or "")
