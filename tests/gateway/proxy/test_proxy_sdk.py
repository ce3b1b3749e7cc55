"""Real apps behind kvgate (reverse-proxy mode, default settings): each `openai` SDK flow gets the same object
through kvgate as from the upstream directly, on the miss and on the exact hit that follows (but for `id`
and `created`), and the hit never reaches the upstream."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from gateway.http.app import create_app
from tests.gateway.conftest import make_settings
from tests.gateway.live_server import serve
from tests.gateway.openai_upstream import MODEL, build_openai_upstream

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# A 1x1 PNG, sent as a data URL the way vision apps send images.
PIXEL = (
    "data:image/png;base64,"
    + base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")).decode()
)


class Capital(BaseModel):
    country: str
    capital: str


class Proxy:
    def __init__(
        self, kvgate: openai.OpenAI, direct: openai.OpenAI, calls: list[dict[str, Any]], app: Any
    ) -> None:
        self.kvgate, self.direct, self.calls, self.app = kvgate, direct, calls, app

    @property
    def served_from_memo(self) -> int:
        """Exact hits answered from the in-process copy (gateway/apis/exact_memo.py)."""
        return int(self.app.state.exact_memo.served)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    calls: list[dict[str, Any]] = []
    with serve(build_openai_upstream(calls)) as upstream_url:
        settings = make_settings(
            tmp_path_factory.mktemp("proxy"), api_keys=None, upstream_url=upstream_url + "/v1"
        )
        app = create_app(settings)
        with (
            serve(app) as url,
            openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as kvgate,
            openai.OpenAI(base_url=upstream_url + "/v1", api_key="x", max_retries=0) as direct,
        ):
            yield Proxy(kvgate, direct, calls, app)


def same_but_ids(first: BaseModel, second: BaseModel) -> bool:
    return first.model_dump(exclude={"id", "created"}) == second.model_dump(exclude={"id", "created"})


def chat_twice(proxy: Proxy, **request: Any) -> tuple[Any, Any, Any]:
    """The direct answer, then kvgate's miss and its exact hit (checked: the hit did not reach the upstream),
    and the same hit once more, answered from the in-process copy: the same object but for the ids."""
    direct = proxy.direct.chat.completions.create(model=MODEL, **request)
    miss = proxy.kvgate.chat.completions.with_raw_response.create(model=MODEL, **request)
    calls = len(proxy.calls)
    hit = proxy.kvgate.chat.completions.with_raw_response.create(model=MODEL, **request)
    assert miss.headers["x-kvgate-cache"] == "miss"
    assert hit.headers["x-kvgate-cache"] == "exact-hit" and len(proxy.calls) == calls
    served = proxy.served_from_memo
    copied = proxy.kvgate.chat.completions.with_raw_response.create(model=MODEL, **request)
    assert copied.headers["x-kvgate-cache"] == "exact-hit" and len(proxy.calls) == calls
    assert proxy.served_from_memo == served + 1
    assert copied.parse().model_dump(exclude={"id", "created"}) == hit.parse().model_dump(
        exclude={"id", "created"}
    )
    return direct, miss.parse(), hit.parse()


FLOWS: dict[str, Callable[[], dict[str, Any]]] = {
    "tools": lambda: {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    },
    "tool result turn": lambda: {
        "messages": [
            {"role": "user", "content": "Weather in Lyon?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "21 C and sunny"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "logprobs": lambda: {
        "messages": [{"role": "user", "content": "Say hello"}],
        "logprobs": True,
        "top_logprobs": 1,
    },
    "n=2": lambda: {"messages": [{"role": "user", "content": "Name a colour"}], "n": 2},
    "image part": lambda: {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image_url", "image_url": {"url": PIXEL}},
                ],
            }
        ]
    },
    "reasoning": lambda: {"messages": [{"role": "user", "content": "think: what is 6 x 7?"}]},
    "json_object": lambda: {
        "messages": [{"role": "user", "content": "JSON please"}],
        "response_format": {"type": "json_object"},
    },
}


@pytest.mark.parametrize("flow", sorted(FLOWS))
def test_a_flow_gets_the_upstream_object_on_a_miss_and_on_a_hit(proxy: Proxy, flow: str) -> None:
    direct, miss, hit = chat_twice(proxy, **FLOWS[flow]())
    assert same_but_ids(miss, direct) and same_but_ids(hit, direct)
    assert hit.id != miss.id


@pytest.mark.parametrize("flow", sorted(FLOWS))
def test_a_streamed_flow_folds_into_the_upstream_object_on_a_miss_and_on_a_hit(
    proxy: Proxy, flow: str
) -> None:
    request = FLOWS[flow]() | {"stream_options": {"include_usage": True}}
    direct = proxy.direct.chat.completions.create(model=MODEL, **request)
    with proxy.kvgate.chat.completions.stream(model=MODEL, **request) as miss_stream:
        miss = miss_stream.get_final_completion()
    calls = len(proxy.calls)
    with proxy.kvgate.chat.completions.stream(model=MODEL, **request) as hit_stream:
        hit = hit_stream.get_final_completion()
    assert len(proxy.calls) == calls
    with proxy.direct.chat.completions.stream(model=MODEL, **request) as direct_stream:
        streamed_direct = direct_stream.get_final_completion()
    assert same_but_ids(miss, streamed_direct) and same_but_ids(hit, streamed_direct)
    streamed, whole = hit.choices[0].message, direct.choices[0].message  # and what a JSON request gets
    assert (streamed.content, streamed.refusal) == (whole.content, whole.refusal)
    assert [call.function.arguments for call in streamed.tool_calls or []] == [
        call.function.arguments  # type: ignore[union-attr]
        for call in whole.tool_calls or []
    ]


def test_parse_with_a_pydantic_model(proxy: Proxy) -> None:
    request = {"messages": [{"role": "user", "content": "Capital of France?"}], "response_format": Capital}
    direct = proxy.direct.chat.completions.parse(model=MODEL, **request)
    miss = proxy.kvgate.chat.completions.parse(model=MODEL, **request)
    calls = len(proxy.calls)
    hit = proxy.kvgate.chat.completions.parse(model=MODEL, **request)
    assert len(proxy.calls) == calls
    assert miss.choices[0].message.parsed == direct.choices[0].message.parsed == hit.choices[0].message.parsed
    assert isinstance(hit.choices[0].message.parsed, Capital)


def test_a_refusal_reaches_the_client_as_a_refusal_and_is_never_stored(proxy: Proxy) -> None:
    request = {"messages": [{"role": "user", "content": "Please refuse this one"}]}
    for _ in range(2):
        answer = proxy.kvgate.chat.completions.with_raw_response.create(model=MODEL, **request)
        assert answer.headers["x-kvgate-cache"] == "miss"  # asked again: never replayed, never empty
        message = answer.parse().choices[0].message
        assert message.refusal == "I'm sorry, I can't help with that." and message.content is None


def test_a_content_filtered_answer_is_never_stored(proxy: Proxy) -> None:
    request = {"messages": [{"role": "user", "content": "filter me"}]}
    for _ in range(2):
        answer = proxy.kvgate.chat.completions.with_raw_response.create(model=MODEL, **request)
        assert answer.headers["x-kvgate-cache"] == "miss"
        assert answer.parse().choices[0].finish_reason == "content_filter"


def test_the_body_goes_upstream_as_sent_with_unknown_fields(proxy: Proxy) -> None:
    proxy.kvgate.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Unknown fields?"}],
        extra_body={"vendor_knob": {"level": 3}},
        max_completion_tokens=50,
    )
    assert proxy.calls[-1]["vendor_knob"] == {"level": 3} and proxy.calls[-1]["max_completion_tokens"] == 50
    assert "stream" not in proxy.calls[-1]


def test_a_plain_text_request_reworded_is_a_semantic_hit(proxy: Proxy) -> None:
    proxy.kvgate.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a fruit"}])
    again = proxy.kvgate.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a fruit, please?"}]
    )
    assert again.headers["x-kvgate-cache"] == "semantic-hit"


@pytest.mark.parametrize("flow", ["tools", "tools not called", "logprobs", "n=2", "image part"])
def test_no_semantic_hit_for_requests_whose_answer_is_not_a_shareable_text(proxy: Proxy, flow: str) -> None:
    if flow == "tools not called":  # a plain-text answer, but tools were in play
        request = {
            "messages": [{"role": "user", "content": "Weather in Rome?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "none",
        }
    else:
        request = FLOWS[flow]()
    proxy.kvgate.chat.completions.create(model=MODEL, **request)
    reworded = request | {"messages": [*request["messages"][:-1], _reworded(request["messages"][-1])]}
    again = proxy.kvgate.chat.completions.with_raw_response.create(model=MODEL, **reworded)
    assert again.headers["x-kvgate-cache"] == "miss"


def test_a_legacy_completion_round_trips(proxy: Proxy) -> None:
    direct = proxy.direct.completions.create(model=MODEL, prompt="Once upon a time", n=2)
    miss = proxy.kvgate.completions.create(model=MODEL, prompt="Once upon a time", n=2)
    hit = proxy.kvgate.completions.with_raw_response.create(model=MODEL, prompt="Once upon a time", n=2)
    assert hit.headers["x-kvgate-cache"] == "exact-hit"
    assert same_but_ids(miss, direct) and same_but_ids(hit.parse(), direct)


def _reworded(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str):
        return {**message, "content": content.rstrip("?") + ", please?"}
    return {**message, "content": [{**content[0], "text": content[0]["text"] + " Please."}, *content[1:]]}


def test_langchain_bind_tools_invoke_and_stream(proxy: Proxy) -> None:
    from langchain_openai import ChatOpenAI

    def model(base_url: str) -> Any:
        return ChatOpenAI(model=MODEL, base_url=base_url, api_key="x", max_retries=0)  # type: ignore[arg-type]

    kvgate, direct = model(str(proxy.kvgate.base_url)), model(str(proxy.direct.base_url))
    question = "Weather in Madrid?"
    expected = direct.bind_tools([WEATHER_TOOL]).invoke(question)
    miss = kvgate.bind_tools([WEATHER_TOOL]).invoke(question)
    calls = len(proxy.calls)
    hit = kvgate.bind_tools([WEATHER_TOOL]).invoke(question)
    assert len(proxy.calls) == calls
    assert (
        miss.tool_calls == hit.tool_calls == expected.tool_calls
        and hit.tool_calls[0]["name"] == "get_weather"
    )

    assert kvgate.invoke("Capital of Spain?").content == direct.invoke("Capital of Spain?").content
    streamed = "".join(str(chunk.content) for chunk in kvgate.stream("Capital of Spain?"))  # a hit, streamed
    assert streamed == direct.invoke("Capital of Spain?").content
    assert len(proxy.calls) == calls + 3  # two direct calls, and kvgate's miss: its streamed repeat was a hit


def test_embeddings_are_cached_per_input(proxy: Proxy) -> None:
    from tests.gateway.openai_upstream import EMBEDDING_MODEL

    seen = [f"seen text {index}" for index in range(3)]
    proxy.kvgate.embeddings.create(model=EMBEDDING_MODEL, input=seen)
    batch = [seen[0], "new one", seen[1], "new two", seen[2]]
    calls = len(proxy.calls)
    answer = proxy.kvgate.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=batch)
    assert proxy.calls[calls:] == [
        {"model": EMBEDDING_MODEL, "input": ["new one", "new two"], "encoding_format": "base64"}
    ]
    assert answer.headers["x-kvgate-cached-inputs"] == "3/5" and answer.headers["x-kvgate-cache"] == "miss"
    direct = proxy.direct.embeddings.create(model=EMBEDDING_MODEL, input=batch)
    assert [item.embedding for item in answer.parse().data] == [item.embedding for item in direct.data]
    assert [item.index for item in answer.parse().data] == [0, 1, 2, 3, 4]

    again = proxy.kvgate.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=batch)
    assert again.headers["x-kvgate-cache"] == "exact-hit" and len(proxy.calls) == calls + 2
    floats = proxy.kvgate.embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL, input=batch, encoding_format="float", dimensions=4
    )  # another format and size: other keys
    assert floats.headers["x-kvgate-cached-inputs"] == "0/5"
    assert len(floats.parse().data[0].embedding) == 4


def test_responses_json_and_stream_miss_then_hit(proxy: Proxy) -> None:
    request = {"input": "What is the Responses API?", "instructions": "Be brief."}
    direct = proxy.direct.responses.create(model=MODEL, **request)
    miss = proxy.kvgate.responses.with_raw_response.create(model=MODEL, **request)
    calls = len(proxy.calls)
    hit = proxy.kvgate.responses.with_raw_response.create(model=MODEL, **request)
    assert miss.headers["x-kvgate-cache"] == "miss" and hit.headers["x-kvgate-cache"] == "exact-hit"
    assert len(proxy.calls) == calls
    assert miss.parse() == direct and hit.parse() == direct  # the upstream's object, its id included
    assert hit.parse().output_text == "response to: What is the Responses API?"

    with proxy.kvgate.responses.stream(model=MODEL, **request) as stream:  # a streamed hit
        events = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert len(proxy.calls) == calls
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.output_text.delta" in events and streamed.output_text == direct.output_text

    fresh = {"input": "Stream this first", "instructions": "Be brief."}
    with proxy.kvgate.responses.stream(model=MODEL, **fresh) as stream:  # a streamed miss, relayed
        first = stream.get_final_response()
    again = proxy.kvgate.responses.with_raw_response.create(model=MODEL, **fresh)
    assert again.headers["x-kvgate-cache"] == "exact-hit"
    assert (again.parse().id, again.parse().output_text, again.parse().usage) == (
        first.id,
        first.output_text,
        first.usage,
    )


def test_responses_with_tools_and_state(proxy: Proxy) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    }
    call = proxy.kvgate.responses.create(model=MODEL, input="Weather in Oslo?", tools=[tool])  # type: ignore[list-item]
    assert call.output[0].type == "function_call"
    hit = proxy.kvgate.responses.with_raw_response.create(model=MODEL, input="Weather in Oslo?", tools=[tool])  # type: ignore[list-item]
    assert hit.headers["x-kvgate-cache"] == "exact-hit" and hit.parse() == call
    reworded = proxy.kvgate.responses.with_raw_response.create(
        model=MODEL, input="Weather in Oslo, please?", tools=[tool]
    )  # type: ignore[list-item]
    assert reworded.headers["x-kvgate-cache"] == "miss"  # tools in play: exact only

    for _ in range(2):  # stateful: the upstream holds the state, so every call goes there
        chained = proxy.kvgate.responses.with_raw_response.create(
            model=MODEL, input="And tomorrow?", previous_response_id=call.id
        )
        assert chained.headers["x-kvgate-cache"] == "bypass"
        assert proxy.calls[-1]["previous_response_id"] == call.id


def test_listed_paths_pass_through_and_others_do_not(proxy: Proxy) -> None:
    import httpx

    base = str(proxy.kvgate.base_url).rstrip("/")
    with httpx.Client() as http:
        for _ in range(2):  # listed by default: passed on each time, never cached
            moderation = proxy.kvgate.moderations.with_raw_response.create(input="hello")
            assert moderation.headers["x-kvgate-cache"] == "bypass" and proxy.calls[-1] == {"input": "hello"}
            assert moderation.parse().results[0].flagged is False
        audio = http.post(f"{base}/audio/speech", json={"input": "hi"}, headers={"Authorization": "Bearer x"})
        assert (
            audio.status_code == 404 and audio.headers["x-kvgate-cache"] == "bypass"
        )  # the upstream's own 404
        files = http.get(f"{base}/files", headers={"Authorization": "Bearer x"})
        assert (
            files.status_code == 404 and files.json()["error"]["code"] == "unknown_url"
        )  # never unless listed
        assert "x-kvgate-cache" not in files.headers


@pytest.fixture(scope="module")
def claude(proxy: Proxy) -> Iterator[tuple[Any, Any]]:
    import anthropic

    kvgate_url = str(proxy.kvgate.base_url).removesuffix("/").removesuffix("/v1")
    direct_url = str(proxy.direct.base_url).removesuffix("/").removesuffix("/v1")
    with (
        anthropic.Anthropic(base_url=kvgate_url, api_key="x", max_retries=0) as kvgate,
        anthropic.Anthropic(base_url=direct_url, api_key="x", max_retries=0) as direct,
    ):
        yield kvgate, direct


def test_anthropic_messages_json_stream_and_tools(proxy: Proxy, claude: tuple[Any, Any]) -> None:
    kvgate, direct = claude
    request = {
        "model": MODEL,
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hello Claude"}],
    }
    expected = direct.messages.create(**request)
    miss = kvgate.messages.with_raw_response.create(**request)
    calls = len(proxy.calls)
    hit = kvgate.messages.with_raw_response.create(**request)
    assert miss.headers["x-kvgate-cache"] == "miss" and hit.headers["x-kvgate-cache"] == "exact-hit"
    assert (
        len(proxy.calls) == calls
        and proxy.calls[-1]["version"] == miss.http_request.headers["anthropic-version"]
    )
    for answer in (miss.parse(), hit.parse()):
        assert answer.model_dump(exclude={"id"}) == expected.model_dump(exclude={"id"})

    with kvgate.messages.stream(**request) as stream:  # a streamed hit
        streamed = stream.get_final_message()
    assert len(proxy.calls) == calls and streamed.model_dump(exclude={"id"}) == expected.model_dump(
        exclude={"id"}
    )
    fresh = request | {"messages": [{"role": "user", "content": "Stream me, Claude"}]}
    with kvgate.messages.stream(**fresh) as stream:  # a streamed miss, relayed
        relayed = stream.get_final_message()
    assert relayed.content[0].text == "claude-ish answer to: Stream me, Claude"
    assert kvgate.messages.with_raw_response.create(**fresh).headers["x-kvgate-cache"] == "exact-hit"

    tool = {
        "name": "get_weather",
        "description": "Weather",
        "input_schema": {"type": "object", "properties": {}},
    }
    with_tools = request | {"tools": [tool], "messages": [{"role": "user", "content": "Weather in Rome?"}]}
    used = kvgate.messages.create(**with_tools)
    assert used.stop_reason == "tool_use" and used.content[0].type == "tool_use"
    with kvgate.messages.stream(**with_tools) as stream:  # the stored tool_use, streamed as input_json deltas
        assert stream.get_final_message().content[0].input == {"city": "Paris"}
    reworded = with_tools | {"messages": [{"role": "user", "content": "Weather in Rome, please?"}]}
    assert kvgate.messages.with_raw_response.create(**reworded).headers["x-kvgate-cache"] == "miss"


def test_anthropic_errors_keep_anthropics_shape(proxy: Proxy, claude: tuple[Any, Any]) -> None:
    import anthropic
    import httpx

    kvgate, _ = claude
    with pytest.raises(anthropic.BadRequestError) as error:  # max_tokens missing (the SDK would not send it)
        kvgate.messages.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert (
        error.value.body["type"] == "error" and error.value.body["error"]["type"] == "invalid_request_error"
    )
    assert "max_tokens" in error.value.body["error"]["message"]
    refusal = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "please refuse"}]}
    for _ in range(2):  # a refusal is never stored
        assert kvgate.messages.with_raw_response.create(**refusal).headers["x-kvgate-cache"] == "miss"
    base = str(proxy.kvgate.base_url).rstrip("/")
    raw = httpx.post(f"{base}/messages", content=b"{not json", headers={"x-api-key": "x"})
    assert raw.status_code == 400 and raw.json()["type"] == "error"


def test_admin_stats_count_hits_by_route(proxy: Proxy) -> None:
    import httpx

    from tests.gateway.conftest import admin

    proxy.kvgate.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count me"}])
    proxy.kvgate.responses.create(model=MODEL, input="Count me too")
    proxy.kvgate.embeddings.create(model="upstream-embed", input="count me as well")
    base = str(proxy.kvgate.base_url).removesuffix("/").removesuffix("/v1")
    routes = httpx.get(f"{base}/admin/stats", headers=admin()).json()["since_start"]["by_route"]
    assert {"chat", "responses", "embeddings"} <= routes.keys()
    assert all(routes[name]["requests"] >= 1 for name in ("chat", "responses", "embeddings"))


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_an_openai_agents_agent_with_a_function_tool(proxy: Proxy, api: str) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # nothing leaves this machine
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"18 C in {city}"

    async with openai.AsyncOpenAI(base_url=str(proxy.kvgate.base_url), api_key="x", max_retries=0) as client:
        model = (
            OpenAIResponsesModel(MODEL, client)
            if api == "responses"
            else OpenAIChatCompletionsModel(MODEL, client)
        )
        agent = Agent(
            name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model
        )
        first = await Runner.run(agent, f"Weather in Paris via {api}?")
        calls = len(proxy.calls)
        second = await Runner.run(agent, f"Weather in Paris via {api}?")
    assert asked == ["Paris", "Paris"]  # the tool ran each time: the cache replays the model, not the tool
    assert first.final_output == second.final_output and "18 C in Paris" in str(first.final_output)
    assert len(proxy.calls) == calls  # both model turns of the second run were exact hits


def test_a_large_embeddings_batch_sends_only_its_new_inputs(proxy: Proxy) -> None:
    from tests.gateway.openai_upstream import EMBEDDING_MODEL

    inputs = [f"batch document {index}" for index in range(100)]
    proxy.kvgate.embeddings.create(
        model=EMBEDDING_MODEL, input=[text for i, text in enumerate(inputs) if i % 10]
    )
    calls = len(proxy.calls)
    answer = proxy.kvgate.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=inputs)
    assert answer.headers["x-kvgate-cached-inputs"] == "90/100" and len(answer.parse().data) == 100
    assert [len(call["input"]) for call in proxy.calls[calls:]] == [10]
