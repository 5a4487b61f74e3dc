"""Structured output through the official clients against a running `hearth serve` on a tiny
random-weight model (run by crates/cli/tests/serve_clients.rs with the Qwen3 chat template, so
forced tool calls have a syntax).

A random model writes whatever the grammar allows, which is the hardest case for a constraint:
every reply that ends with `stop` must parse and validate (PyPI `jsonschema`), for 12 bounded
schemas of growing difficulty (every string has maxLength, every array maxItems), 20 seeded
requests each at temperature 0.8; forced tool calls likewise. A reply cut by `max_tokens` must say
`length`. By hand: `HEARTH_URL=http://127.0.0.1:8080 HEARTH_STRUCTURED_N=200 HEARTH_MAX_TOKENS=300
.venv/bin/python -m pytest crates/server/tests/py/test_structured.py -q -s` prints the figures.
"""

import concurrent.futures
import json
import os
import re

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest

URL = os.environ.get("HEARTH_URL", "http://127.0.0.1:8080")
N = int(os.environ.get("HEARTH_STRUCTURED_N", "20"))
MAX_TOKENS = int(os.environ.get("HEARTH_MAX_TOKENS", "200"))
MSGS = [{"role": "user", "content": "Reply with the JSON object asked for."}]
CHECK = jsonschema.FormatChecker()


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=120)


S = {"type": "string", "maxLength": 10}
SCHEMAS = [
    ("enum", {"type": "string", "enum": ["red", "green", "blue"]}),
    ("boolean", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
    ("integer_range", {"type": "object", "properties": {"n": {"type": "integer", "minimum": -10, "maximum": 1000}},
                       "required": ["n"]}),
    ("strings", {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10}, "city": S},
                 "required": ["name", "city"]}),
    ("const_enum_optional", {"type": "object", "properties": {
        "kind": {"const": "point"}, "color": {"enum": ["r", "g", "b", None]}, "label": {"type": "string", "maxLength": 5},
        "weight": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["kind", "color"]}),
    ("array_of_strings", {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                                                      "minItems": 1, "maxItems": 4}}, "required": ["tags"]}),
    ("nested_object", {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                 "required": ["name", "age"]},
        "active": {"type": "boolean"}}, "required": ["user", "active"]}),
    ("defs_ref", {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                                                                     "y": {"type": "integer", "minimum": 0, "maximum": 99}},
                                   "required": ["x", "y"]}},
                  "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
                  "required": ["from", "to"]}),
    ("array_of_objects", {"type": "object", "properties": {"rows": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "name": S},
        "required": ["id", "name"]}}}, "required": ["rows"]}),
    ("any_of", {"anyOf": [
        {"type": "object", "properties": {"cat": {"type": "string", "maxLength": 6}}, "required": ["cat"]},
        {"type": "object", "properties": {"dog": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["dog"]}]}),
    ("pattern_format_number", {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "day": {"type": "string", "format": "date"},
        "price": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["code", "day", "price"]}),
    ("order", {"$defs": {"item": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 9},
        "opts": {"type": "array", "maxItems": 2, "items": {"enum": ["gift", "fast", "eco"]}}}, "required": ["sku", "qty"]}},
        "type": "object", "properties": {
            "title": {"type": "string", "maxLength": 20}, "items": {"type": "array", "minItems": 1, "maxItems": 3,
                                                                      "items": {"$ref": "#/$defs/item"}},
            "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
            "shipping": {"type": "object", "properties": {"mode": {"enum": ["air", "sea"]}, "days": {
                "type": "integer", "minimum": 1, "maximum": 60}}, "required": ["mode"]}},
        "required": ["title", "items", "shipping"]}),
]


def run_many(fn, n):
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        return list(ex.map(fn, range(n)))


def report(name, finishes, valid):
    stops = finishes.count("stop")
    print(f"\n{name}: n={len(finishes)} stop={100 * stops / len(finishes):.1f}% "
          f"valid={100 * valid / max(stops, 1):.1f}% of stop")


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_json_schema_replies_validate(name, schema):
    c = oai()
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}

    def one(i):
        r = c.chat.completions.create(model="x", messages=MSGS, response_format=rf, temperature=0.8, seed=i,
                                      max_tokens=MAX_TOKENS)
        ch = r.choices[0]
        assert ch.finish_reason in ("stop", "length"), ch.finish_reason
        if ch.finish_reason == "stop":
            jsonschema.validate(json.loads(ch.message.content), schema, format_checker=CHECK)
        return ch.finish_reason

    finishes = run_many(one, N)
    report(name, finishes, finishes.count("stop"))
    # Bounded schemas end well within the budget; a random model still wanders into long numbers
    # now and then, so not every reply has to.
    assert finishes.count("stop") >= N // 2, finishes


def test_streamed_equals_whole_and_length_is_reported():
    c = oai()
    name, schema = SCHEMAS[8]
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    whole = c.chat.completions.create(model="x", messages=MSGS, response_format=rf, temperature=0.8, seed=3, max_tokens=MAX_TOKENS)
    text, finish = "", None
    for chunk in c.chat.completions.create(model="x", messages=MSGS, response_format=rf, temperature=0.8, seed=3,
                                           max_tokens=MAX_TOKENS, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert (text, finish) == (whole.choices[0].message.content, whole.choices[0].finish_reason)
    cut = c.chat.completions.create(model="x", messages=MSGS, response_format=rf, temperature=0.8, seed=3, max_tokens=3)
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.choices[0].message.content)


def test_json_object_mode_and_completions():
    c = oai()

    def one(i):
        r = c.chat.completions.create(model="x", messages=MSGS, response_format={"type": "json_object"}, temperature=0.8,
                                      seed=i, max_tokens=MAX_TOKENS)
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict)
        p = c.completions.create(model="x", prompt="JSON:", temperature=0.8, seed=i, max_tokens=MAX_TOKENS,
                                 extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": SCHEMAS[0][1]}}})
        if p.choices[0].finish_reason == "stop":
            assert json.loads(p.choices[0].text) in ("red", "green", "blue")
        return ch.finish_reason

    run_many(one, 10)


def test_gbnf_grammar():
    c = oai()
    grammar = 'root ::= "It is " num " " unit "."\nnum ::= [1-9] [0-9]{0,2}\nunit ::= "cm" | "m" | "km"\n'

    def one(i):
        r = c.chat.completions.create(model="x", messages=MSGS, temperature=0.8, seed=i, max_tokens=MAX_TOKENS,
                                      extra_body={"grammar": grammar})
        ch = r.choices[0]
        assert ch.finish_reason == "stop"
        assert re.fullmatch(r"It is [1-9][0-9]{0,2} (cm|m|km)\.", ch.message.content), ch.message.content

    run_many(one, 10)


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 12},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}},
]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_validate(choice):
    c = oai()
    schemas = {"get_weather": WEATHER, "get_time": TIME}

    def one(i):
        r = c.chat.completions.create(model="x", messages=MSGS, tools=TOOLS, tool_choice=choice, temperature=0.8, seed=i,
                                      max_tokens=MAX_TOKENS)
        ch = r.choices[0]
        assert ch.finish_reason in ("tool_calls", "length"), (ch.finish_reason, ch.message)
        if ch.finish_reason == "tool_calls":
            (call,) = ch.message.tool_calls
            if isinstance(choice, dict):
                assert call.function.name == "get_time"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            return "stop"
        return "length"

    finishes = run_many(one, N)
    report(f"tool_choice={choice}", finishes, finishes.count("stop"))
    assert finishes.count("stop") >= N // 2, finishes


def test_anthropic_forced_tool_use():
    c = anthropic.Anthropic(base_url=URL, api_key="none", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]

    def one(i):
        m = c.messages.create(model="x", max_tokens=MAX_TOKENS, messages=MSGS, tools=tools,
                              tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0.8, "seed": i})
        assert m.stop_reason in ("tool_use", "max_tokens"), m
        if m.stop_reason == "tool_use":
            (use,) = [b for b in m.content if b.type == "tool_use"]
            assert use.name == "get_weather"
            jsonschema.validate(use.input, WEATHER)

    run_many(one, 10)


def test_ollama_format():
    c = ollama.Client(host=URL)
    name, schema = SCHEMAS[6]
    for i in range(6):
        r = c.chat(model="x", messages=MSGS, format=schema, options={"temperature": 0.8, "seed": i, "num_predict": MAX_TOKENS})
        if r.done_reason == "stop":
            jsonschema.validate(json.loads(r.message.content), schema)
        g = c.generate(model="x", prompt="JSON:", format="json", options={"temperature": 0.8, "seed": i, "num_predict": MAX_TOKENS})
        if g.done_reason == "stop":
            assert isinstance(json.loads(g.response), dict)


def test_bad_schemas_and_grammars_are_400():
    c = oai()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSGS, response_format={"type": "json_schema", "json_schema": {
            "name": "u", "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSGS, extra_body={"grammar": 'root ::= "a" | \nx ::= [b'})
    assert "line 2" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic.Anthropic(base_url=URL, api_key="none", max_retries=0).messages.create(
            model="x", max_tokens=5, messages=MSGS, tool_choice={"type": "any"},
            tools=[{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "wat"}}}}])
    assert "wat" in e.value.body["error"]["message"]
    r = httpx.post(URL + "/api/chat", json={"model": "x", "messages": MSGS, "format": {"type": "array", "contains": {}}})
    assert r.status_code == 400 and "contains" in r.json()["error"]
