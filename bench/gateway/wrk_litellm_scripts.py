"""wrk Lua scripts for bench_vs_litellm: a fresh prompt per request (the miss class) or one fixed body (the
exact-hit class), with a gateway's own headers (LiteLLM wants its key).

wrk runs the Lua once per thread (the bench uses -t1). `response()` tallies each answer by kind: kvgate's
`x-kvgate-cache` header when present, else `hit` when LiteLLM names the cache key it answered from, else
the status; `done()` prints the tallies and latencies as one `WRK_RESULT` JSON line, in the shape
wrk_scripts.py's scripts print, so that bench_hit_path.wrk reads both. A fresh prompt is four words of
`WORDS` and a counter behind a tag that names the round and the target: never sent twice in a run, and far
enough from one another that kvgate's semantic lookup finds nothing to serve (the tallies would show it).
`fresh_prompt` makes the same prompts in Python, for the single-client latencies.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = """
anchor apple arctic badger bakery balloon bamboo banjo barley basalt beacon beetle bicycle biscuit blizzard
bonsai bramble bronze cactus camel canoe canyon carnival cedar cello chalk cheetah chimney cinnamon citadel
cobalt comet compass copper coral cricket crystal cypress dolphin dragonfly dune ember falcon fern ferry
fiddle fjord flamingo fossil fountain galaxy garnet geyser ginger glacier granite harbor harp hazel hedgehog
heron iceberg igloo indigo jasmine jungle kayak kettle lagoon lantern lava lemon lighthouse lizard lotus
magnet mango maple marble meadow meteor mosaic nebula nectar nutmeg oasis obsidian octopus orchid otter
paddle pagoda papyrus parrot pebble pepper pine planet prairie quartz quill raven reef saffron satchel
sequoia sextant sparrow spruce squid tambourine thimble thistle thunder tulip tundra turtle valley velvet
violin volcano walnut whale willow windmill yacht zebra zeppelin
""".split()  # noqa: SIM905


_TALLY = """
tallies = {}
function response(status, headers, body)
  local kind = tostring(status)
  if status == 200 then
    kind = headers["x-kvgate-cache"] or headers["X-Kvgate-Cache"]
    if kind == nil then
      local key = headers["x-litellm-cache-key"] or headers["X-Litellm-Cache-Key"]
      if key ~= nil and key ~= "" then kind = "hit" else kind = "200" end
    end
  end
  tallies[kind] = (tallies[kind] or 0) + 1
end

threads = {}
function setup(thread)
  table.insert(threads, thread)
end

function done(summary, latency, requests)
  local merged = {}
  for _, thread in ipairs(threads) do
    for kind, count in pairs(thread:get("tallies")) do merged[kind] = (merged[kind] or 0) + count end
  end
  local parts = {}
  for kind, count in pairs(merged) do table.insert(parts, string.format('"%s": %d', kind, count)) end
  io.write(string.format('WRK_RESULT {"requests": %d, "seconds": %.3f, "p50_ms": %.3f, "p99_ms": %.3f, "errors": %d, "kinds": {%s}}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status,
    table.concat(parts, ", ")))
end
"""

_FRESH = """
local counter = 0
function request()
  counter = counter + 1
  local picked = {}
  while #picked < 4 do
    local word = words[math.random(#words)]
    local seen = false
    for _, other in ipairs(picked) do if other == word then seen = true end end
    if not seen then table.insert(picked, word) end
  end
  local prompt = string.format("%s #%d: how would a %s and a %s explain %s to a %s?",
    tag, counter, picked[1], picked[2], picked[3], picked[4])
  local body = '{"model": "' .. model .. '", "messages": [{"role": "user", "content": "' .. prompt .. '"}]}'
  return wrk.format("POST", path, headers, body)
end
"""


def fresh_prompt(rng: random.Random, tag: str, number: int) -> str:
    first, second, third, fourth = rng.sample(WORDS, 4)
    return f"{tag} #{number}: how would a {first} and a {second} explain {third} to a {fourth}?"


def fresh_prompt_script(folder: Path, tag: str, path: str, model: str, headers: dict[str, str]) -> Path:
    """A POST of a fresh prompt per request; `tag` must be new to the run."""
    words = ", ".join(f'"{word}"' for word in WORDS)
    script = (
        f'tag = "{tag}"\nmodel = "{model}"\npath = "{path}"\n'
        f"headers = {_lua_headers(headers)}\nwords = {{{words}}}\n"
        f"math.randomseed({random.randrange(1 << 30)})\n" + _FRESH + _TALLY
    )
    return _write(folder / f"fresh-{tag}.lua", script)


def fixed_body_script(
    folder: Path, name: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> Path:
    """Every request the same POST."""
    script = (
        f'wrk.method = "POST"\nwrk.path = "{path}"\nwrk.body = [==[{json.dumps(body)}]==]\n'
        f"wrk.headers = {_lua_headers(headers)}\n" + _TALLY
    )
    return _write(folder / f"fixed-{name}.lua", script)


def _lua_headers(headers: dict[str, str]) -> str:
    every = {"Content-Type": "application/json", **headers}
    return "{" + ", ".join(f'["{name}"] = "{value}"' for name, value in every.items()) + "}"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
