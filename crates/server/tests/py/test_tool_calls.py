"""Tool calls that never break a client, through the official SDKs: every case of the agents issue's
"tool calls" item, parsed by `openai` (chat completions, and Responses with `responses.create`
whole and streamed and `responses.stream`), `anthropic` (`messages` and `beta.messages`, whole and
streamed) and `ollama` (whole and streamed).

Run by crates/cli/tests/serve_clients.rs against `hearth serve --scripted tool_call_replies.txt`
(HEARTH_SCRIPTED_TOOLS=1). That file holds one reply per case; the server answers reply k to a
conversation that already holds k assistant turns, so each case is asked for with k earlier
exchanges:

0. Qwen3-Coder XML: text before the calls, two calls, parameters typed by the schema (integer,
   number, boolean, object, array) and a multi-line string holding `<` and `</parameter>` verbatim.
1. Qwen3 JSON: two calls, string values converted to the declared types.
2. A call to a tool the request did not offer: the text comes back as the answer.
3. A call that does not parse: the text comes back as the answer.
4. A call cut off by the token limit: the text comes back, the reply ends for length.
"""

import json
import os

import anthropic
import ollama
import openai
import pytest

URL = os.environ.get("HEARTH_URL", "http://127.0.0.1:8080")
pytestmark = pytest.mark.skipif(os.environ.get("HEARTH_SCRIPTED_TOOLS") != "1",
                                reason="needs hearth serve --scripted tool_call_replies.txt")

SEP = "\n--- next reply ---\n"
with open(os.path.join(os.path.dirname(__file__), "tool_call_replies.txt")) as f:
    REPLIES = f.read().split(SEP)

CODE = ("fn main() {\n    if a < b && c > d { println!(\"</parameter>\"); }\n    let tag = \"<parameter=x>\"; "
        "// </function>\n}\n</parameter> is how a value closes\n")

PARAMS = {
    "write": {"path": {"type": "string"}, "content": {"type": "string"}},
    "run": {"command": {"type": "string"}, "timeout": {"type": "integer"}, "ratio": {"type": "number"},
            "background": {"type": "boolean"}, "env": {"type": "object"}, "args": {"type": "array"}},
}
SCHEMAS = {name: {"type": "object", "properties": p, "required": list(p)[:1]} for name, p in PARAMS.items()}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": n, "parameters": s}} for n, s in SCHEMAS.items()]
RESPONSES_TOOLS = [{"type": "function", "name": n, "description": n, "parameters": s} for n, s in SCHEMAS.items()]
ANTHROPIC_TOOLS = [{"name": n, "description": n, "input_schema": s} for n, s in SCHEMAS.items()]

# What every client must see: (answer text, [(tool, arguments)], why it ended).
CASES = [
    ("I'll write it, then build.",
     [("write", {"path": "src/main.rs", "content": CODE}),
      ("run", {"command": "cargo build", "timeout": 600, "ratio": 0.5, "background": False,
               "env": {"RUST_LOG": "debug"}, "args": ["--release", 2]})],
     "tools"),
    ("Running it.",
     [("run", {"command": "ls -la\n\tpwd", "timeout": 30, "background": True}),
      ("write", {"path": "a.txt", "content": "x < y"})],
     "tools"),
    (REPLIES[2], [], "stop"),
    (REPLIES[3], [], "stop"),
    (None, [], "length"),  # a prefix of REPLIES[4] that stops inside the call
]
CUT_TOKENS = 20


def turns(k):
    """A conversation with k earlier exchanges, so the server answers reply k."""
    msgs = []
    for _ in range(k):
        msgs += [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "ok"}]
    return msgs + [{"role": "user", "content": "Go."}]


def limit(k):
    return CUT_TOKENS if k == 4 else 1000


def check(k, seen, what):
    content, calls, finish = CASES[k]
    got_content, got_calls, got_finish = seen
    if content is None:
        # Cut off: the text as far as it went, tags included, and no call.
        assert REPLIES[4].startswith(got_content) and "<tool_call>" in got_content, (what, got_content)
        assert len(got_content) < len(REPLIES[4]), what
    else:
        assert got_content == content, what
    assert got_calls == calls, what
    assert got_finish == finish, what


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0)


def ant():
    return anthropic.Anthropic(base_url=URL, api_key="none", max_retries=0)


@pytest.mark.parametrize("k", range(len(CASES)))
def test_openai_chat_completions(k):
    c = oai()
    finish_of = {"tool_calls": "tools", "stop": "stop", "length": "length"}
    whole = c.chat.completions.create(model="x", messages=turns(k), tools=CHAT_TOOLS, max_tokens=limit(k))
    m = whole.choices[0].message
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls or []]
    check(k, (m.content or "", calls, finish_of[whole.choices[0].finish_reason]), "whole")
    content, parts, finish = "", {}, None
    for chunk in c.chat.completions.create(model="x", messages=turns(k), tools=CHAT_TOOLS, max_tokens=limit(k),
                                           stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                p = parts.setdefault(tc.index, ["", ""])
                p[0] += tc.function.name or ""
                p[1] += tc.function.arguments or ""
    calls = [(n, json.loads(a)) for n, a in (parts[i] for i in sorted(parts))]
    check(k, (content, calls, finish_of[finish]), "streamed")


def responses_seen(r):
    finish = {"completed": "stop", "incomplete": "length"}[r.status]
    calls = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
    if calls:
        finish = "tools"
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    return r.output_text, calls, finish


@pytest.mark.parametrize("k", range(len(CASES)))
def test_openai_responses(k):
    c = oai()
    ask = {"model": "x", "input": turns(k), "tools": RESPONSES_TOOLS, "max_output_tokens": limit(k)}
    whole = c.responses.create(**ask)
    check(k, responses_seen(whole), "whole")
    # Streamed through `create(stream=True)`: the events, then the final response they carry.
    final, args, done_items = None, {}, []
    for ev in c.responses.create(stream=True, **ask):
        if ev.type == "response.function_call_arguments.delta":
            args[ev.item_id] = args.get(ev.item_id, "") + ev.delta
        elif ev.type == "response.output_item.done":
            done_items.append(ev.item)
        elif ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    check(k, responses_seen(final), "create(stream=True)")
    for item in done_items:
        if item.type == "function_call":
            assert json.loads(args[item.id]) == json.loads(item.arguments)
    assert [o.type for o in final.output] == [o.type for o in whole.output]
    # And through the SDK's stream helper, which rebuilds the response from the deltas (it returns a
    # final response only for `response.completed`).
    with c.responses.stream(**ask) as stream:
        for ev in stream:
            if ev.type == "response.incomplete":
                final = ev.response
        if k != 4:
            final = stream.get_final_response()
    check(k, responses_seen(final), "responses.stream")


def anthropic_seen(m):
    text = "".join(b.text for b in m.content if b.type == "text")
    calls = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
    finish = {"tool_use": "tools", "end_turn": "stop", "max_tokens": "length"}[m.stop_reason]
    return text, calls, finish


@pytest.mark.parametrize("k", range(len(CASES)))
def test_anthropic_messages_and_beta_messages(k):
    c = ant()
    ask = {"model": "x", "messages": turns(k), "tools": ANTHROPIC_TOOLS, "max_tokens": limit(k)}
    for api, what in ((c.messages, "messages"), (c.beta.messages, "beta.messages")):
        check(k, anthropic_seen(api.create(**ask)), what)
        with api.stream(**ask) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        seen = anthropic_seen(final)
        assert text == seen[0], what
        check(k, seen, what + " streamed")


@pytest.mark.parametrize("k", range(len(CASES)))
def test_ollama_chat(k):
    c = ollama.Client(host=URL)
    opts = {"num_predict": limit(k)}

    def seen(content, calls, reason):
        calls = [(t.function.name, dict(t.function.arguments)) for t in calls]
        return content, calls, "tools" if calls else reason

    whole = c.chat(model="x", messages=turns(k), tools=CHAT_TOOLS, options=opts)
    check(k, seen(whole.message.content, whole.message.tool_calls or [], whole.done_reason), "whole")
    content, calls, reason = "", [], None
    for part in c.chat(model="x", messages=turns(k), tools=CHAT_TOOLS, options=opts, stream=True):
        content += part.message.content or ""
        calls += part.message.tool_calls or []
        reason = part.done_reason or reason
    check(k, seen(content, calls, reason), "streamed")
