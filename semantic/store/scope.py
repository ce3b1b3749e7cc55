"""The canonical partition key of a request: which stored answers it may ever be compared with.

A semantic hit is only possible inside one scope: same tenant, endpoint, model, embedder, the same
earlier turns (system prompts included), tools / tool_choice / response_format, and the same
generation parameters that change an answer. Only the last user turn is left out of the scope: it is
the text the semantic layer compares. The exact key hashes the scope together with that text.

Works from the OpenAI request body as a plain dict, so the gateway can call it without this module
knowing its pydantic models. Knows nothing about Redis, FAISS, embeddings or HTTP.

Canonical means: JSON key order, `null` values, parameters at their OpenAI defaults and fields that
cannot change an answer (`stream`, `stream_options`, `user`, `metadata`, ...) do not change the key.
Unknown fields are kept in the scope: a parameter we do not know might change the answer, and a
missed hit is cheap where a wrong one is not.

Scope ids and exact keys are internal (Redis keys): they are keyed BLAKE2b digests that include the
tenant, so two tenants never share one, and they are never shown to users (entry ids are random).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SCOPE_VERSION = 1

# Fields that never change what the model answers: delivery, accounting and tracing.
IGNORED_FIELDS = frozenset(
    {
        "messages",
        "prompt",
        "model",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "service_tier",
    }
)

# Parameters whose OpenAI default is the same as leaving them out.
DEFAULTS: dict[str, Any] = {
    "n": 1,
    "temperature": 1,
    "top_p": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "echo": False,
    "best_of": 1,
    "parallel_tool_calls": True,
}


@dataclass(frozen=True, slots=True)
class RequestScope:
    """Where a request's answer may be looked up and stored.

    `prompt` is the text compared semantically (the last user turn, or the completions prompt).
    `semantic_refusal` says why the semantic layer is off for this request (`None` when it is on): the
    exact layer still works. `tenant` and `model` are kept in clear for purge selectors and stats.
    """

    tenant: str
    model: str
    endpoint: str
    scope_id: str
    exact_key: str
    prompt: str
    semantic_refusal: str | None = None

    @property
    def semantic(self) -> bool:
        return self.semantic_refusal is None


def build_scope(
    request: Mapping[str, Any],
    *,
    tenant: str,
    embedder: str | Callable[[str], str],
    secret: bytes = b"",
    endpoint: str | None = None,
) -> RequestScope:
    """The scope of an OpenAI chat (`messages`) or completions (`prompt`) request body.

    `embedder` is the embedder's identity (its name), or a function of the compared prompt giving it (one
    embedder per language, `semantic/language_routing.py`): vectors of two embedders are not
    comparable, so they never share a scope.
    `secret` keys the digests; every replica sharing a Redis must use the same one.
    Raises `ValueError` for a body that is neither a chat nor a completions request. `endpoint` names another
    API whose one input is given as `prompt` (e.g. one input of an embeddings request): a scope of its own.
    """
    model = str(request.get("model", ""))
    if "messages" in request:
        endpoint = endpoint or "chat"
        context, prompt, refusal = _split_chat(request["messages"])
    elif "prompt" in request:
        endpoint = endpoint or "completions"
        context, prompt, refusal = [], *_completions_prompt(request["prompt"])
    else:
        raise ValueError("request has neither `messages` nor `prompt`")
    params = canonical_params(request)
    refusal = refusal or exact_only_reason(request)
    scope = {
        "v": SCOPE_VERSION,
        "tenant": tenant,
        "endpoint": endpoint,
        "model": model,
        "embedder": embedder if isinstance(embedder, str) else embedder(prompt),
        "context": context,
        "params": params,
    }
    scope_id = _digest(canonical_json(scope), secret)
    exact_key = _digest(scope_id + "\x00" + prompt, secret)
    return RequestScope(tenant, model, endpoint, scope_id, exact_key, prompt, refusal)


def exact_only_reason(request: Mapping[str, Any]) -> str | None:
    """Why a request whose last turn is plain text still gets exact hits only, or None.

    The rule was measured on plain-text questions answered in one text: with tools in play, tool results in
    the conversation, log-probabilities, several choices or audio asked for, the answer is not a text that a
    reworded question may share (its tool calls, token scores or choices belong to this exact request).
    """
    if request.get("tools") or request.get("functions"):
        return "tools in play"
    messages = request.get("messages")
    if isinstance(messages, list) and any(
        isinstance(message, Mapping) and message.get("role") in ("tool", "function") for message in messages
    ):
        return "tool results in the conversation"
    if request.get("logprobs") or request.get("top_logprobs"):
        return "log-probabilities asked"
    if (request.get("n") or 1) != 1 or (request.get("best_of") or 1) != 1:
        return "several choices asked"
    if request.get("echo") or request.get("suffix"):
        return "echo or suffix asked"
    modalities = request.get("modalities")
    if request.get("audio") or (isinstance(modalities, list) and "audio" in modalities):
        return "audio asked"
    return None


def canonical_params(request: Mapping[str, Any]) -> dict[str, Any]:
    """Every field but the prompt, model and ignored ones, with defaults and synonyms folded."""
    params: dict[str, Any] = {}
    for name, value in request.items():
        if name in IGNORED_FIELDS or value is None:
            continue
        params[name] = _canonical_value(value)
    if "max_completion_tokens" in params and "max_tokens" not in params:
        params["max_tokens"] = params.pop("max_completion_tokens")
    stop = params.get("stop")
    if isinstance(stop, str):
        params["stop"] = [stop]
    for name in ("stop", "logit_bias", "tools"):
        if params.get(name) in ([], {}):
            del params[name]
    for name, default in DEFAULTS.items():
        if name in params and params[name] == default and type(params[name]) is type(default):
            del params[name]
    return params


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: one spelling per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_text(content: Any) -> str | None:
    """The text of a message's content: a string, or a list of text parts joined by newlines.

    `None` when the content holds anything but text (images, audio, files): such a turn is compared
    exactly, never semantically.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "\n".join(part["text"] for part in content)
    return None


def _split_chat(messages: Any) -> tuple[list[Any], str, str | None]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("`messages` must be a non-empty list")
    canonical = [_canonical_message(message) for message in messages]
    last = canonical[-1]
    if last.get("role") != "user":
        return canonical, "", "last message is not a user turn"
    text = content_text(last.get("content"))
    if text is None:
        return canonical[:-1], canonical_json(last), "last user turn is not plain text"
    rest = {name: value for name, value in last.items() if name not in ("role", "content")}
    if rest:  # e.g. a `name` on the last turn: it belongs to the scope, not to the compared text
        canonical[-1] = {"role": "user", **rest}
        return canonical, text, None
    return canonical[:-1], text, None


def _completions_prompt(prompt: Any) -> tuple[str, str | None]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, None
    return canonical_json(_canonical_value(prompt)), "prompt is not a single string"


def _canonical_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ValueError("each message must be an object")
    canonical = {name: _canonical_value(value) for name, value in message.items() if value is not None}
    text = content_text(canonical.get("content"))
    if text is not None:
        canonical["content"] = text
    return canonical


def _canonical_value(value: Any) -> Any:
    """Integral floats as ints (`1.0` == `1`), recursively; mappings become plain dicts."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(key): _canonical_value(item) for key, item in value.items() if item is not None}
    if isinstance(value, list | tuple):
        return [_canonical_value(item) for item in value]
    return value


def _digest(text: str, secret: bytes) -> str:
    return hashlib.blake2b(text.encode("utf-8"), key=secret[:64], digest_size=16).hexdigest()
