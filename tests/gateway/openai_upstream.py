"""A test upstream that speaks OpenAI's APIs as a real server does: JSON or SSE as asked, usage only when
asked, `n` choices, tools and tool calls, structured output, log-probabilities, image parts, reasoning
content, refusals, embeddings. Every object it sends is validated against the `openai` SDK's own types
first, so a test through kvgate compares kvgate against objects a real server could have sent.

What it answers depends on the last user turn: "refuse" gets a refusal, "think" reasoning content, "filter"
a `content_filter` finish; tools get a call of the first tool (or the named one); a `json_schema` format gets
a JSON object with the schema's required string fields. `calls` records every request body it received.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from anthropic.types import Message as AnthropicMessage_
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response as Response_
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.api.anthropic_objects import message_events
from gateway.api.chunks import chat_chunks, text_chunks
from gateway.api.response_objects import response_events

ResponseStreamEvent_: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
MODEL = "upstream-gpt"
EMBEDDING_MODEL = "upstream-embed"
FINGERPRINT = "fp_upstream_1"


def build_openai_upstream(calls: list[dict[str, Any]], seconds_per_input: float = 0.0) -> FastAPI:
    """`seconds_per_input`: time an embeddings request spends per input (a bench upstream's fixed cost)."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [
            {"id": name, "object": "model", "created": 1, "owned_by": "test"}
            for name in (MODEL, EMBEDDING_MODEL)
        ]
        return {"object": "list", "data": cards}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        calls.append(body)
        whole = ChatCompletion.model_validate(chat_answer(body)).model_dump(mode="json", exclude_unset=True)
        return reply(body, whole, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        calls.append(body)
        text = f"completion of: {body['prompt']}"
        whole = {
            "id": "cmpl-up",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {"index": index, "text": text, "logprobs": None, "finish_reason": "stop"}
                for index in range(body.get("n", 1))
            ],
            "usage": usage(len(str(body["prompt"]).split()), len(text.split())),
        }
        return reply(
            body, Completion.model_validate(whole).model_dump(mode="json", exclude_unset=True), chat=False
        )

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await request.json()
        calls.append(body)
        whole = Response_.model_validate(response_answer(body)).model_dump(mode="json", exclude_unset=True)
        if not body.get("stream"):
            return JSONResponse(whole)

        async def events() -> AsyncIterator[str]:
            for event in response_events(whole):
                ResponseStreamEvent_.validate_python(event)
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = await request.json()
        calls.append(
            body
            | {
                "x-api-key": request.headers.get("x-api-key"),
                "version": request.headers.get("anthropic-version"),
            }
        )
        if request.headers.get("anthropic-version") is None:
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "anthropic-version required"},
            }
            return JSONResponse(error, status_code=400)
        whole = AnthropicMessage_.model_validate(message_answer(body)).model_dump(
            mode="json", exclude_unset=True
        )
        if not body.get("stream"):
            return JSONResponse(whole)

        async def events() -> AsyncIterator[str]:
            for event in message_events(whole):
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/moderations")
    async def moderations(request: Request) -> dict[str, Any]:
        body = await request.json()
        calls.append(body)
        flagged = "hate" in str(body["input"])
        return {
            "id": "modr-1",
            "model": "omni-moderation-latest",
            "results": [{"flagged": flagged, "categories": {}, "category_scores": {}}],
        }

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        calls.append(body)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if seconds_per_input:
            await asyncio.sleep(seconds_per_input * len(inputs))
        dimensions = int(body.get("dimensions") or 8)
        data = []
        for index, text in enumerate(inputs):
            vector = embed(str(text), dimensions)
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(str(text).split()) for text in inputs)
        whole = {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        if body.get("encoding_format") != "base64":
            CreateEmbeddingResponse.model_validate(whole)
        return JSONResponse(whole)

    return app


def chat_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The whole `chat.completion` this upstream gives `body`."""
    last = body["messages"][-1]
    question = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
    choices = [choice(body, question, index) for index in range(body.get("n") or 1)]
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body["model"],
        "system_fingerprint": FINGERPRINT,
        "service_tier": "default",
        "choices": choices,
        "usage": {
            **usage(len(question.split()), 6),
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 3 if "think" in question else 0,
                "audio_tokens": 0,
            },
        },
    }


def choice(body: dict[str, Any], question: str, index: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
    finish = "stop"
    tools = body.get("tools") or []
    forced = body.get("tool_choice")
    if body["messages"][-1]["role"] == "tool":
        message["content"] = f"Given the tool's answer {body['messages'][-1]['content']}: done."
    elif "refuse" in question:
        message["refusal"] = "I'm sorry, I can't help with that."
    elif tools and forced != "none":
        name = forced["function"]["name"] if isinstance(forced, dict) else tools[0]["function"]["name"]
        arguments = json.dumps({"city": "Paris", "question": question[:40]})
        message["tool_calls"] = [
            {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}
        ]
        finish = "tool_calls"
    elif (body.get("response_format") or {}).get("type") == "json_schema":
        schema = body["response_format"]["json_schema"]["schema"]
        message["content"] = json.dumps(
            {field: f"{field} of {question[:20]}" for field in schema.get("required", [])}
        )
    elif (body.get("response_format") or {}).get("type") == "json_object":
        message["content"] = json.dumps({"answer": question[:30]})
    else:
        message["content"] = f"answer {index} to: {question}"
        if "filter" in question:
            finish = "content_filter"
    if "think" in question:
        message["reasoning_content"] = "Let me think about it step by step."
    result: dict[str, Any] = {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
    if body.get("logprobs") and message["content"]:
        tokens = [piece + " " for piece in message["content"].split(" ")]
        tokens[-1] = tokens[-1][:-1]
        top = int(body.get("top_logprobs") or 0)
        result["logprobs"] = {
            "content": [
                {
                    "token": token,
                    "logprob": -0.1 * (position + 1),
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {"token": token, "logprob": -0.1 * (position + 1), "bytes": list(token.encode())}
                    ][:top],
                }
                for position, token in enumerate(tokens)
            ],
            "refusal": None,
        }
    return result


def response_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The whole `response` this upstream gives a Responses request: a function call when tools are given,
    else a text message."""
    question = body["input"] if isinstance(body["input"], str) else json.dumps(body["input"])[:60]
    tools = body.get("tools") or []
    output: list[dict[str, Any]]
    if tools and not any(
        isinstance(item, dict) and item.get("type") == "function_call_output" for item in body["input"] or []
    ):
        arguments = json.dumps({"city": "Paris"})
        output = [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_r1",
                "name": tools[0]["name"],
                "arguments": arguments,
                "status": "completed",
            }
        ]
    else:
        outputs = [
            str(item.get("output"))
            for item in (body["input"] if isinstance(body["input"], list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        text = f"The tool says: {outputs[-1]}" if outputs else f"response to: {question}"
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        output = [
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": content}
        ]
    return {
        "id": f"resp_{hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": tools,
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "usage": {
            "input_tokens": 5,
            "output_tokens": 4,
            "total_tokens": 9,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "text": {"format": {"type": "text"}},
        "error": None,
        "incomplete_details": None,
        "metadata": {},
    }


def message_answer(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's `message` for a Messages request: a tool_use block when tools are given, else text."""
    last = body["messages"][-1]["content"]
    question = last if isinstance(last, str) else json.dumps(last)[:60]
    tool_result = isinstance(last, list) and any(block.get("type") == "tool_result" for block in last)
    if body.get("tools") and not tool_result:
        content = [
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": body["tools"][0]["name"],
                "input": {"city": "Paris"},
            }
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": f"claude-ish answer to: {question}"}]
        stop = "refusal" if "refuse" in question else "end_turn"
    return {
        "id": "msg_up_1",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 11,
            "output_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def reply(body: dict[str, Any], whole: dict[str, Any], *, chat: bool) -> Response:
    """JSON, or the stream a server sends for it: `usage: null` on each chunk and a usage chunk last when
    the client asked for usage, neither when it did not."""
    if not body.get("stream"):
        return JSONResponse(whole)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    chunks = list((chat_chunks if chat else text_chunks)(whole, include_usage))

    async def events() -> AsyncIterator[str]:
        for chunk in chunks:
            if include_usage and chunk.get("choices"):
                chunk = {**chunk, "usage": None}
            if chat:
                ChatCompletionChunk.model_validate(chunk)
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def embed(text: str, dimensions: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round((digest[index % len(digest)] - 128) / 128, 6) for index in range(dimensions)]


def text_whole(model: str, text: str, prompt_tokens: int = 7, completion_tokens: int = 3) -> dict[str, Any]:
    """A one-choice `chat.completion` answering `text` (for the simpler test upstreams)."""
    whole = {
        "id": "chatcmpl-simple",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }
    return ChatCompletion.model_validate(whole).model_dump(mode="json", exclude_unset=True)
