"""The stored answer: the whole object as JSON text, and entries of the first format read as what they stood for."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletion

from gateway.answers import StoredAnswer
from tests.gateway.openai_upstream import chat_answer


def test_the_whole_object_round_trips_as_its_text() -> None:
    whole = chat_answer(
        {"model": "m", "messages": [{"role": "user", "content": "think: what is 6 x 7?"}], "n": 2}
    )
    stored = StoredAnswer.of(whole, 12, 7, 0.5)
    read = StoredAnswer.from_json(stored.to_json(), chat=True, model="other")
    assert read.whole == whole and read.whole_json == stored.whole_json
    assert (read.prompt_tokens, read.completion_tokens, read.generation_s) == (12, 7, 0.5)
    assert read.finish_reason == "stop" and read.text.startswith("answer 0 to:")


def test_an_entry_of_the_first_format_is_read_as_its_one_choice_object() -> None:
    raw = json.dumps(
        {"text": "Paris.", "finish_reason": "length", "prompt_tokens": 9, "completion_tokens": 2}
    )
    read = StoredAnswer.from_json(raw, chat=True, model="smollm2-135m-instruct")
    completion = ChatCompletion.model_validate(read.whole | {"id": "chatcmpl-x", "created": 1})
    assert (
        completion.choices[0].message.content == "Paris." and completion.choices[0].finish_reason == "length"
    )
    assert completion.usage is not None and completion.usage.total_tokens == 11
    assert read.whole["model"] == "smollm2-135m-instruct"
