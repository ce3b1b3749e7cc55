"""What a model server's client asks of kvgate in engine mode, tried with the official openai SDK against a
running gateway (`make serve`, default settings), counted and printed: issue 35's acceptance.

    make serve &   # then, once /healthz answers:
    .venv/bin/python bench/engine/check_sdk_features.py [--base-url http://127.0.0.1:8000]

Each check is a count of prompts that passed out of those tried. Every call sends `Cache-Control: no-store`
so that it reaches the engine. The last part measures what `n = 4` costs against `n = 1` on a long, fresh
prompt with one new token each: one prefill makes the ratio near 1, four would make it near 4; and the
engine's prompt-token counter (`/metrics`) must grow by the prompt once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

import httpx
import jsonschema
import openai
from pydantic import BaseModel

FRESH = {"Cache-Control": "no-cache, no-store"}
QUESTIONS = [
    "What is the capital of France?",
    "Tell me about Japan's capital.",
    "Which city is the capital of Kenya?",
    "Name the capital of Brazil.",
    "What is Canada's capital city?",
    "Where is the seat of government of Australia?",
    "Which city is Egypt's capital?",
    "What is the capital of Germany?",
    "Tell me the capital of India.",
    "What's the capital of Peru?",
]
POPULATION_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "city_population",
        "description": "The population of a city in a given year.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "metro_area": {"type": "boolean"},
            },
            "required": ["city", "year", "metro_area"],
            "additionalProperties": False,
        },
    },
}


class Capital(BaseModel):
    country: str
    capital: str
    continent: Literal["Europe", "Asia", "Africa", "Americas", "Oceania"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="local", max_retries=0, timeout=120)
    checks = Checks(client, args.model, args.base_url)
    weights = httpx.get(args.base_url + "/healthz").json()["generator"]["weights"] or {}
    print(f"decode: {weights.get('decode')}\n")
    print("| check | passed |\n|---|---|")
    for name, check in checks.all().items():
        passed, tried = check()
        print(f"| {name} | {passed} / {tried} |", flush=True)
    for note in checks.notes:
        print(f"- {note}")
    print()
    checks.n_costs_one_prefill()


class Checks:
    def __init__(self, client: openai.OpenAI, model: str, base_url: str) -> None:
        self.client, self.model, self.base_url = client, model, base_url
        self.notes: list[str] = []  # what a failed check saw

    def all(self) -> dict[str, Callable[[], tuple[int, int]]]:
        return {
            "parse() with a pydantic model gives a valid object": self.parse,
            "json_object answers parse, or are cut at max_tokens and say so (`length`)": self.json_object,
            "top_logprobs=3: greedy token is the top one, tokens join to the text": self.logprobs,
            "n=3 gives 3 choices, the prompt counted once": self.three_choices,
            "a seed gives the same text alone and beside others": self.seed,
            "penalties change a greedy answer": self.penalties,
            "logit_bias -100 on the greedy first token changes it": self.logit_bias,
            "tool_choice=required returns a valid call": self.tool_call,
        }

    def chat(self, question: str, **fields: Any) -> Any:
        return self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": question}],
            extra_headers=FRESH,
            **{"max_tokens": 40, **fields},
        )

    def parse(self) -> tuple[int, int]:
        passed = 0
        for question in QUESTIONS:
            completion = self.client.chat.completions.parse(
                model=self.model,
                messages=[{"role": "user", "content": question}],
                response_format=Capital,
                temperature=0,
                max_tokens=80,
                extra_headers=FRESH,
            )
            choice = completion.choices[0]
            passed += choice.finish_reason == "stop" and isinstance(choice.message.parsed, Capital)
        return passed, len(QUESTIONS)

    def json_object(self) -> tuple[int, int]:
        passed = 0
        for question in QUESTIONS:
            # Room to finish: an answer cut by max_tokens is reported as `length` and need not parse.
            answer = self.chat(
                f"{question} Answer in JSON.", response_format={"type": "json_object"}, max_tokens=400
            )
            parsed = False
            with contextlib.suppress(ValueError):
                parsed = isinstance(json.loads(answer.choices[0].message.content or ""), dict)
            cut = answer.choices[0].finish_reason == "length"
            passed += parsed or cut
            if not parsed:
                self.notes.append(
                    f"json_object: {'cut at max_tokens, reported as length' if cut else 'does not parse'} "
                    f"(finish_reason={answer.choices[0].finish_reason}, "
                    f"{answer.usage.completion_tokens if answer.usage else '?'} tokens)"
                )
        return passed, len(QUESTIONS)

    def logprobs(self) -> tuple[int, int]:
        passed = 0
        for question in QUESTIONS:
            choice = self.chat(question, temperature=0, logprobs=True, top_logprobs=3, max_tokens=16).choices[
                0
            ]
            content = choice.logprobs.content if choice.logprobs else None
            passed += bool(
                content
                and all(len(token.top_logprobs) == 3 for token in content)
                and all(token.token == token.top_logprobs[0].token for token in content)
                and "".join(token.token for token in content) == choice.message.content
            )
        return passed, len(QUESTIONS)

    def three_choices(self) -> tuple[int, int]:
        passed = 0
        for question in QUESTIONS:
            before = self.counter("prompt_tokens")
            answer = self.chat(question, n=3, temperature=1.0, max_tokens=12)
            grew = self.counter("prompt_tokens") - before
            passed += (
                len(answer.choices) == 3 and answer.usage is not None and grew == answer.usage.prompt_tokens
            )
        return passed, len(QUESTIONS)

    def seed(self) -> tuple[int, int]:
        passed = 0
        for number, question in enumerate(QUESTIONS):
            seeded = {"temperature": 1.0, "seed": 100 + number, "max_tokens": 20}
            alone = self.chat(question, **seeded).choices[0].message.content
            others: list[tuple[str, dict[str, Any]]] = [
                ("Tell me about dogs.", {"temperature": 0.8, "max_tokens": 20}),
                ("Tell me about birds.", {"temperature": 0, "max_tokens": 20, "frequency_penalty": 1.0}),
                ("Tell me about fish.", {"temperature": 1.0, "n": 2, "max_tokens": 20}),
                (question, seeded),
            ]
            with concurrent.futures.ThreadPoolExecutor(len(others)) as pool:
                answers = list(pool.map(lambda item: self.chat(item[0], **item[1]), others))
            passed += answers[-1].choices[0].message.content == alone
        return passed, len(QUESTIONS)

    def penalties(self) -> tuple[int, int]:
        passed = 0
        for question in QUESTIONS:
            # Penalties act on tokens the answer has already produced (as OpenAI and vLLM define them): a
            # paragraph long enough to repeat words gives them something to act on.
            prompt = f"{question} Tell me about it in a long paragraph."
            plain = self.chat(prompt, temperature=0, max_tokens=64).choices[0].message.content
            penalised = self.chat(
                prompt, temperature=0, max_tokens=64, frequency_penalty=1.0, presence_penalty=1.0
            )
            passed += penalised.choices[0].message.content != plain
        return passed, len(QUESTIONS)

    def logit_bias(self) -> tuple[int, int]:
        passed = 0
        tokenizer_ids = self.token_ids
        for question in QUESTIONS:
            greedy = self.chat(question, temperature=0, logprobs=True, max_tokens=4).choices[0]
            first = greedy.logprobs.content[0].token
            ids = tokenizer_ids(first)
            if len(ids) != 1:
                continue
            banned = self.chat(
                question, temperature=0, logprobs=True, max_tokens=4, logit_bias={str(ids[0]): -100}
            )
            passed += banned.choices[0].logprobs.content[0].token != first
        return passed, len(QUESTIONS)

    def tool_call(self) -> tuple[int, int]:
        passed = 0
        schema = POPULATION_TOOL["function"]["parameters"]
        for question in QUESTIONS:
            choice = self.chat(
                f"{question} And how many people lived there in 2020?",
                tools=[POPULATION_TOOL],
                tool_choice="required",
                temperature=0,
                max_tokens=60,
            ).choices[0]
            calls = choice.message.tool_calls or []
            try:
                valid = (
                    len(calls) == 1
                    and jsonschema.validate(json.loads(calls[0].function.arguments), schema) is None
                )
            except (ValueError, jsonschema.ValidationError):
                valid = False
            passed += choice.finish_reason == "tool_calls" and valid
        return passed, len(QUESTIONS)

    def token_ids(self, text: str) -> list[int]:
        """The engine's token ids for `text`, from the tokenizer in the model folder the gateway serves."""
        from transformers import AutoTokenizer  # only this check needs it

        if not hasattr(self, "_tokenizer"):
            from engine.weights.loader import ensure_hf_folder
            from engine.weights.model_files import resolve_generator
            from gateway.runtime.settings import Settings

            settings = Settings()
            folder = ensure_hf_folder(
                resolve_generator(settings.generator, settings.model_dir), settings.model_dir
            )
            self._tokenizer = AutoTokenizer.from_pretrained(folder)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def counter(self, name: str) -> float:
        text = httpx.get(self.base_url + "/metrics").text
        match = re.search(rf"^kvgate_engine_{name}_total (\S+)$", text, re.MULTILINE)
        if match is None:
            raise SystemExit(f"/metrics has no kvgate_engine_{name}_total")
        return float(match.group(1))

    def n_costs_one_prefill(self, rounds: int = 5) -> None:
        """Wall time of n=4 against n=1, one new token each, on fresh ~400-token prompts (no prefix shared)."""
        times: dict[int, list[float]] = {1: [], 4: []}
        grew: dict[int, list[float]] = {1: [], 4: []}
        for round_number in range(rounds):
            for n in (1, 4):
                words = " ".join(f"item{round_number}-{n}-{i}" for i in range(120))
                question = f"Round {round_number}, n {n}. Count these: {words}"
                before = self.counter("prompt_tokens")
                started = time.perf_counter()
                answer = self.chat(question, n=n, temperature=1.0, max_tokens=1)
                times[n].append(time.perf_counter() - started)
                assert answer.usage is not None and len(answer.choices) == n
                grew[n].append((self.counter("prompt_tokens") - before) / answer.usage.prompt_tokens)
        one, four = statistics.median(times[1]), statistics.median(times[4])
        print(
            f"n=4 against n=1, one new token on a fresh prompt, median of {rounds}: {four * 1000:.0f} ms against "
            f"{one * 1000:.0f} ms ({four / one:.2f}x); prompt tokens counted per prompt token: n=1 "
            f"{statistics.mean(grew[1]):.2f}, n=4 {statistics.mean(grew[4]):.2f}"
        )


if __name__ == "__main__":
    main()
