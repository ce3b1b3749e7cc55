"""wrk Lua scripts for the hit-path bench: one fixed body, or a fresh variant of a stored prompt per request.

wrk (Debian's package) runs the Lua once per thread: `request()` builds each request, `response()` tallies
what the server said it was (kvgate's `x-kvgate-cache` header, or GPTCache's answer being null), and
`done()` prints the tallies as one JSON line for the bench to read. Every variant flips the case of some
letters of a stored prompt (and, for `verified`, adds filler words): never sent twice, so that kvgate's
remembered wordings do not turn the class into exact hits.
"""

from __future__ import annotations

import json
from pathlib import Path

_TALLY = """
tallies = {}
function response(status, headers, body)
  local kind = tostring(status)
  if status == 200 then
    if mode == "gptcache" then
      if string.find(body, '"answer":null', 1, true) then kind = "miss" else kind = "hit" end
    else
      kind = headers["x-kvgate-cache"] or headers["X-Kvgate-Cache"] or "none"
    end
  end
  tallies[kind] = (tallies[kind] or 0) + 1
end

function done(summary, latency, requests)
  -- wrk gives done() no access to the threads' tallies unless they are shared through thread objects.
  local merged = {}
  for _, thread in ipairs(threads) do
    local counts = thread:get("tallies")
    for kind, count in pairs(counts) do merged[kind] = (merged[kind] or 0) + count end
  end
  local parts = {}
  for kind, count in pairs(merged) do table.insert(parts, string.format('"%s": %d', kind, count)) end
  io.write(string.format('WRK_RESULT {"requests": %d, "seconds": %.3f, "p50_ms": %.3f, "p99_ms": %.3f, "errors": %d, "kinds": {%s}}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status,
    table.concat(parts, ", ")))
end

threads = {}
function setup(thread)
  table.insert(threads, thread)
end
"""

_VARIANT = """
local counter = 0
local fillers = {"please", "quick question:", "hey,", "hi,", "thanks!", "thank you", "so", "ok"}

local function flip_case(text)
  local out = {}
  for index = 1, #text do
    local char = text:sub(index, index)
    if char:match("%a") and math.random() < 0.3 then
      if char == char:lower() then char = char:upper() else char = char:lower() end
    end
    out[index] = char
  end
  return table.concat(out)
end

local function escape(text)
  return (text:gsub('\\\\', '\\\\\\\\'):gsub('"', '\\\\"'))
end

function request()
  counter = counter + 1
  local prompt = flip_case(prompts[math.random(#prompts)])
  if verified then
    prompt = fillers[math.random(#fillers)] .. " " .. prompt .. " " .. fillers[math.random(#fillers)]
  end
  local body
  if mode == "gptcache" then
    body = '{"prompt": "' .. escape(prompt) .. '"}'
  else
    body = '{"model": "' .. model .. '", "messages": [{"role": "user", "content": "' .. escape(prompt) .. '"}]}'
  end
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end
"""


def fixed_body_script(folder: Path, path: str, body: dict[str, object], mode: str) -> Path:
    """Every request the same POST (the exact-hit class)."""
    text = json.dumps(body)
    script = (
        f'mode = "{mode}"\n'
        f'wrk.method = "POST"\nwrk.path = "{path}"\nwrk.body = {_lua_string(text)}\n'
        'wrk.headers["Content-Type"] = "application/json"\n' + _TALLY
    )
    return _write(folder / f"fixed-{mode}.lua", script)


def variant_script(
    folder: Path,
    path: str,
    prompts: list[str],
    mode: str,
    model: str = "",
    verified: bool = False,
    seed: int = 1,
) -> Path:
    """A fresh variant of a random stored prompt per request (the semantic-hit class)."""
    listing = ",\n".join(_lua_string(prompt) for prompt in prompts)
    script = (
        f'mode = "{mode}"\nmodel = "{model}"\npath = "{path}"\nverified = {str(verified).lower()}\n'
        f"math.randomseed({seed})\nprompts = {{\n{listing}\n}}\n" + _VARIANT + _TALLY
    )
    return _write(folder / f"variant-{mode}-{'verified' if verified else 'plain'}.lua", script)


def _lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
