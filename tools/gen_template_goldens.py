#!/usr/bin/env python3
"""Generate chat-template goldens for crates/tokenizer/tests/template_goldens.rs.

Renders chat templates with jinja2 exactly as transformers' `apply_chat_template` does
(transformers/utils/chat_template_utils.py: `_compile_jinja_template` and `render_jinja_template`),
without needing transformers itself:

* `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
  extensions=[AssistantTracker, jinja2.ext.loopcontrols])`, `keep_trailing_newline` left False;
* the `tojson` filter replaced by `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
  sort_keys=False)` (no HTML escaping, key order kept);
* globals `raise_exception(message)` and `strftime_now(format)`;
* `template.render(messages=..., tools=..., documents=None, add_generation_prompt=...,
  **special_tokens, **chat_template_kwargs)`: `tools` and `documents` are always passed (as None when
  absent), so `tools is defined` is true in every render.

Each output file holds one template (its source inline, plus the shared path it was read from) and
its cases: the inputs and either the expected string or the Python error (the Rust side must fail too).

Usage: .venv/bin/python tools/gen_template_goldens.py   (run from the repository root)
"""

import copy
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
OUT = os.path.join(ROOT, "crates", "tokenizer", "testdata", "templates")
SMOLLM2 = os.environ.get("HEARTH_SMOLLM2", os.path.join(ROOT, ".cache", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


# ---------------------------------------------------------------------------------------------
# transformers' environment (copied logic)


class AssistantTracker(Extension):
    """transformers' `{% generation %}` block; with the tracker inactive it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(template, case):
    kwargs = {"bos_token": case["bos_token"], "eos_token": case["eos_token"]}
    kwargs.update(case["kwargs"])
    return template.render(
        messages=copy.deepcopy(case["messages"]),
        tools=copy.deepcopy(case["tools"]),
        documents=None,
        add_generation_prompt=case["add_generation_prompt"],
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# templates


def gguf_template(path):
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# conversations

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location.\n",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "  Unit  ", "default": "celsius"},
            },
            "required": ["location"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — returns \"snippets\" <b>fast</b>",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Query text"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
                "safe": {"type": "boolean", "default": False, "nullable": True},
                "lang": {"type": ["string", "null"], "default": None},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags, e.g. ['a', \"b\"]"},
                "ratio": {"type": "number", "default": 0.5, "exclusiveMinimum": 1e-7, "maximum": 1e21},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}

# A tool given as a bare function schema (no {"type": "function", "function": ...} wrapper).
BARE_TOOL = {
    "name": "calc",
    "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def call(name, arguments, id_=None):
    tc = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if id_ is not None:
        tc["id"] = id_
    return tc


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **extra):
    m = {"role": "assistant", "content": text}
    m.update(extra)
    return m


def tool(text, **extra):
    m = {"role": "tool", "content": text}
    m.update(extra)
    return m


def conversations():
    """(name, messages, tools, add_generation_prompt, kwargs) shared by every template."""
    c = []

    def add(name, messages, tools=None, agp=True, kwargs=None):
        c.append((name, messages, tools, agp, kwargs or {}))

    add("user_only", [user("Hello!")])
    add("user_only_no_gen", [user("Hello!")], agp=False)
    add("system_user", [SYSTEM, user("What is 2+2?")])
    add("system_user_no_gen", [SYSTEM, user("What is 2+2?")], agp=False)
    add("multi_turn", [SYSTEM, user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")])
    add("multi_turn_no_system", [user("Hi"), assistant("Hello!"), user("Bye"), assistant("Goodbye!")], agp=False)
    add("thinking_off", [user("Quick: capital of France?")], kwargs={"enable_thinking": False})
    add("thinking_on", [user("Quick: capital of France?")], kwargs={"enable_thinking": True})
    add("thinking_off_no_gen", [user("Hi")], agp=False, kwargs={"enable_thinking": False})
    add(
        "reasoning_content_history",
        [
            user("What is 17*3?"),
            assistant("51", reasoning_content="17*3 = 51.\n"),
            user("And 17*4?"),
        ],
    )
    add(
        "reasoning_content_last",
        [user("What is 17*3?"), assistant("51", reasoning_content="\nCompute: 17*3 = 51.\n\n")],
        agp=False,
    )
    add(
        "reasoning_content_null",
        [user("Hi"), assistant("Hello", reasoning_content=None), user("Again")],
    )
    add(
        "think_in_content_last",
        [user("Why is the sky blue?"), assistant("<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering.")],
        agp=False,
    )
    add(
        "think_in_content_history",
        [
            SYSTEM,
            user("Why is the sky blue?"),
            assistant("<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."),
            user("And sunsets?"),
        ],
        kwargs={"enable_thinking": True},
    )
    add(
        "think_without_open_tag",
        [user("x"), assistant("pondering...\n</think>\nAnswer.")],
        agp=False,
    )
    add("tools_with_system", [SYSTEM, user("Weather in Paris?")], tools=[WEATHER_TOOL])
    add("tools_without_system", [user("Weather in Paris?")], tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("tools_bare_schema", [user("2+2?")], tools=[BARE_TOOL])
    add("tools_empty_list", [user("Hi")], tools=[])
    add(
        "tool_call_object_args",
        [
            SYSTEM,
            user("Weather in Paris?"),
            assistant("", tool_calls=[call("get_weather", {"location": "Paris, France", "unit": "celsius"}, "call_1")]),
            tool('{"temperature": 21, "condition": "sunny"}', tool_call_id="call_1", name="get_weather"),
        ],
        tools=[WEATHER_TOOL],
    )
    add(
        "tool_call_string_args",
        [
            user("Weather in Paris?"),
            assistant("", tool_calls=[call("get_weather", '{"location": "Paris, France"}', "call_1")]),
            tool("21C, sunny", tool_call_id="call_1"),
        ],
        tools=[WEATHER_TOOL],
    )
    add(
        "tool_calls_parallel_and_consecutive_results",
        [
            SYSTEM,
            user("Compare the weather in Paris and Tokyo, then search for flights."),
            assistant(
                "Let me check both cities.",
                tool_calls=[
                    call("get_weather", {"location": "Paris"}, "a"),
                    call("get_weather", {"location": "Tokyo", "unit": "fahrenheit"}, "b"),
                ],
            ),
            tool("Paris: 21C", tool_call_id="a"),
            tool("Tokyo: 75F", tool_call_id="b"),
            assistant("", tool_calls=[call("search", {"query": "flights Paris Tokyo", "limit": 3, "safe": True, "tags": ["cheap", "direct"]})]),
            tool('[{"flight": "AF276"}]'),
            assistant("Paris is 21C, Tokyo 75F; flight AF276 is available."),
            user("Thanks!"),
        ],
        tools=[WEATHER_TOOL, SEARCH_TOOL],
    )
    add(
        "tool_multi_step_thinking",
        [
            user("Plan my trip."),
            assistant("", reasoning_content="Need weather first.", tool_calls=[call("get_weather", {"location": "Rome"})]),
            tool("Rome: 25C"),
            assistant("<think>\nNow search.\n</think>\n\n", tool_calls=[call("search", {"query": "Rome hotels", "ratio": 0.25})]),
            tool("Hotel Roma"),
            tool("Hotel Milano"),
        ],
        tools=[WEATHER_TOOL, SEARCH_TOOL],
        kwargs={"enable_thinking": True},
    )
    add(
        "tool_call_nested_args",
        [
            user("Do it"),
            assistant(
                "Calling.",
                tool_calls=[
                    call(
                        "search",
                        {
                            "query": "naïve café “quotes” \"escaped\" \\ back\nslash\ttab",
                            "limit": 0,
                            "ratio": 1.0,
                            "tiny": 1e-7,
                            "huge": 1e21,
                            "neg": -2.5,
                            "big_int": 12345678901234567890,
                            "flag": False,
                            "nothing": None,
                            "nested": {"b": [1, 2, {"c": "d"}], "a": {}},
                            "empty_list": [],
                            "emoji": "🦀👍🏽",
                        },
                    )
                ],
            ),
            tool("ok"),
        ],
        tools=[SEARCH_TOOL],
        agp=False,
    )
    add("tool_response_lookalike_user", [user("<tool_response>\nfake\n</tool_response>"), assistant("<think>\nhm\n</think>\n\nok")], agp=False)
    add("empty_content", [user(""), assistant(""), user("")])
    add(
        "unicode_content",
        [
            {"role": "system", "content": "Réponds en français. 日本語も可。"},
            user("Привет! 你好 👋🏽 مرحبا — e\u0301 (combining) \u00a0nbsp \u200b zwsp"),
            assistant("¡Hola! ✓ ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"),
            user("ok 🦀"),
        ],
    )
    add(
        "json_special_chars",
        [
            user('{"key": "value", "list": [1, 2]} \\ \\n "quoted" \'single\' </s> <|im_end|> {{ not_jinja }} {% raw %}'),
            assistant("Line1\nLine2\r\nTab\there\x07bell\x1funit"),
            user("\n\n  leading and trailing whitespace  \n\n"),
        ],
    )
    add("system_in_middle", [user("Hi"), {"role": "system", "content": "Be brief."}, user("Explain gravity.")])
    add("assistant_first", [assistant("I start."), user("OK")])
    add("extra_kwargs_ignored", [user("Hi")], kwargs={"custom_flag": True, "date_string": "26 Jul 2024"})
    add(
        "content_parts",
        [user([{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}])],
    )
    add(
        "content_parts_multi_turn",
        [
            {"role": "system", "content": [{"type": "text", "text": "Describe images."}]},
            user([{"type": "image"}, {"type": "text", "text": "What is this?"}]),
            assistant([{"type": "text", "text": "A cat."}]),
            user([{"type": "text", "text": "And "}, {"type": "text", "text": "this one?"}, {"type": "image"}]),
        ],
    )
    add("content_null_assistant_tool_call", [user("x"), assistant(None, tool_calls=[call("calc", {"expr": "1+1"})]), tool("2")], tools=[BARE_TOOL])
    add("missing_content_key", [{"role": "user"}])
    add("tool_calls_empty_list", [user("Hi"), assistant("Hello", tool_calls=[]), user("Bye")])
    add("unknown_role", [user("Hi"), {"role": "ipython", "content": "result"}, user("next")])
    add("only_system", [SYSTEM], agp=False)
    add("no_messages", [])
    return c


# Small templates that pin down the Python behaviours the Rust side must copy (printing, `string`,
# `tojson` options, str methods, loop controls, `{% generation %}`...). Each is rendered on one input.
FEATURE_INPUT = {
    "messages": [
        {"role": "user", "content": "  Hello, Wörld!  \n", "n": 3, "f": 1.5e-7, "flag": True, "none": None,
         "list": ["a", "it's", 'say "hi"', 1, 2.0, None, False], "map": {"k": "v", "n": 1, "x": [True]},
         "odd": "\u00ad\u200b\u2028\ue000\U000e0001\u0378 \u3000\U0001f980\u0301\x7f\x85"},
        {"role": "assistant", "content": "a<think>b</think>c\n\nd"},
    ],
}

FEATURE_TEMPLATES = [
    ("print_values", "{{ messages[0].n }}|{{ messages[0].f }}|{{ messages[0].flag }}|{{ messages[0].none }}|{{ messages[0].list }}|{{ messages[0].map }}|{{ messages[0].missing }}|{{ 1e16 }}|{{ 2.0 }}|{{ 10 / 4 }}|{{ 7 // 2 }}|{{ 2 ** 10 }}"),
    ("string_filter", "{{ messages[0].flag | string }}|{{ messages[0].none | string }}|{{ messages[0].list | string }}|{{ messages[0].map | string }}|{{ messages[0].f | string }}|{{ (messages[0].flag | string) ~ '!' }}"),
    ("tojson_default", "{{ messages | tojson }}"),
    ("tojson_indent", "{{ messages[0].map | tojson(indent=2) }}\n{{ messages[0].list | tojson(indent=4) }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson(indent=2) }}"),
    ("tojson_separators", "{{ messages[0].map | tojson(separators=(',', ':')) }}|{{ messages[0].map | tojson(indent=1, separators=(', ', ' = ')) }}"),
    ("tojson_sort_keys", "{{ {'b': 1, 'a': {'d': 2, 'c': 3}} | tojson(sort_keys=true) }}"),
    ("tojson_ensure_ascii", "{{ 'naïve 🦀 \"<>&\\'' | tojson(ensure_ascii=true) }}|{{ 'naïve 🦀 <>&' | tojson }}|{{ '\\x00\\x1f\\x7f\\u2028' | tojson }}"),
    ("tojson_scalars", "{{ none | tojson }} {{ true | tojson }} {{ 1.0 | tojson }} {{ 1e-7 | tojson }} {{ 1e21 | tojson }} {{ 123456789.125 | tojson }} {{ -0.0 | tojson }} {{ 0.1 | tojson }}"),
    ("str_strip", "[{{ messages[0].content.strip() }}][{{ messages[0].content.lstrip() }}][{{ messages[0].content.rstrip() }}][{{ messages[0].content.strip(' \\nH!') }}][{{ messages[0].content | trim }}]"),
    ("str_split", "{{ messages[1].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[1].content.split('</think>')[0].split('<think>')[-1] }}|{{ ' a  b \\t c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'abc'.split('x') }}"),
    ("str_methods", "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'hello world'.title() }} {{ 'HeLLo'.lower() }} {{ 'hello'.upper() }} {{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ 'héllo'.find('l') }} {{ 'héllo'.rfind('l') }} {{ 'abc'.find('z') }} {{ 'hello'.capitalize() }} {{ ', '.join(['a', 'b']) }} {{ 'a\\nb\\n'.splitlines() }} {{ 'aaa'.count('a') }}"),
    ("tests", "{{ 'x' is string }} {{ 1 is string }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ 'x' is sequence }} {{ [] is iterable }} {{ none is iterable }} {{ none is none }} {{ false is false }} {{ 0 is false }} {{ x is defined }} {{ messages is defined }} {{ 3 is number }} {{ true is boolean }} {{ 1 is integer }} {{ 1.0 is float }}"),
    ("loops", "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if loop.previtem %}<{{ loop.previtem.role }}{% endif %}{% if loop.nextitem %}>{{ loop.nextitem.role }}{% endif %}{% if not loop.last %},{% endif %}{% endfor %}|{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for m in messages[::-1] %}{{ m.role }}{% endfor %}|{% for k, v in messages[0].map | items %}{{ k }}={{ v }};{% endfor %}|{% for k, v in messages[0].map.items() %}{{ k }};{% endfor %}"),
    ("namespace_macro", "{% macro item(x, sep='-') %}[{{ x }}{{ sep }}]{% endmacro %}{% set ns = namespace(count=0, names='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names + m.role %}{{ item(m.role) }}{% endfor %}{{ ns.count }} {{ ns.names }} {{ item('z', sep='+') }}"),
    ("whitespace_control", "{% if true %}\n  A\n{% endif %}\n  {% for x in [1, 2] %}\n    {{ x }}\n  {% endfor %}\n{%- if true -%}\n  B\n{%- endif %}\n\nend\n\n"),
    ("comments_and_raw", "  {# comment #}\nA\n    {#- c2 -#}   B {# c3 #}\n{% raw %}{{ not rendered }}{% endraw %}\n  {%+ if true %}C{% endif +%}\nD{{ '{{' }}\n"),
    ("generation_whitespace", "{% for m in messages %}\n  {%- generation -%}\n  [{{ m.role }}]\n  {% endgeneration %}\n{% endfor %}"),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"),
    ("raise_exception", "{% if messages | length > 1 %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"),
    ("undefined_attr_error", "{{ messages[0].missing.deeper }}"),
    ("undefined_concat_error", "{{ 'a' + messages[0].missing }}"),
    ("bos_eos", "{{ bos_token }}{{ messages[0].content.strip() }}{{ eos_token }}"),
    ("content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}|{% endfor %}"),
    ("in_operator", "{{ 'think' in messages[1].content }} {{ 'zzz' in messages[1].content }} {{ 'k' in messages[0].map }} {{ 'it\\'s' in messages[0].list }}"),
    ("join_values", "{{ [1, none, true, 'a', 1.5e-7, [1]] | join(',') }}|{{ messages | map(attribute='role') | join }}"),
    ("number_tests", "{{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is integer }} {{ 'a' is number }} {{ 1.5 is float }} {{ none is mapping }} {{ messages[0] is mapping }}"),
    ("map_methods", "{{ messages[0].map.get('k') }} {{ messages[0].map.get('zz', 'dflt') }} {{ messages[0].map.get('zz') }} {{ messages[0].map.keys() | list }} {{ messages[0].map.values() | list }} {{ messages[0]['role'] }}"),
    ("repr_nonprintable", "{{ [messages[0].odd] }}"),
    ("str_edge", "[{{ '\\x1f x \\x1f'.strip() }}][{{ 'hello'[::-1] }}][{{ 'h\u00e9llo'[1:3] }}][{{ messages[0].list[-2:] }}][{{ ['\\u00a0', '\u00e9', '\\x85', '\\t'] }}][{{ 'a b'.rsplit(' ', 1) }}]"),
    ("numeric_filters", "{{ 3.7 | int }} {{ '5' | int + 1 }} {{ 2 | float }} {{ 3.14159 | round(2) }} {{ 2.5 | round }} {{ -3 | abs }} {{ 10 % 3 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 1 / 3 }} {{ 2 ** 0.5 }} {{ 7 / 7 }}"),
    ("default_filter", "[{{ messages[0].missing | default('d') }}][{{ none | default('d') }}][{{ none | default('d', true) }}][{{ '' | default('e', true) }}][{{ nope | length }}]"),
    ("comparisons", "{{ none == none }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ messages[0].flag is true }} {{ not messages[0].none }} {{ 'a' in ['a'] }} {{ (messages | last).role }} {{ messages | first | length }}"),
    ("loop_extras", "{% for m in messages %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.cycle('x', 'y') }}|{% endfor %}{% for x in [] %}never{% else %}empty{% endfor %}"),
    ("format_filter", "{{ '%s - %d' | format('a', 3) }}|{{ messages | tojson(indent=2) | length }}"),
    # `~` uses MiniJinja's own spelling, which matches Python's for these operands (not for floats
    # in exponent form or containers: the module documentation lists that difference).
    ("concat_operator", "{{ 'a' ~ true ~ none ~ 1.5 ~ 42 ~ messages[0].missing ~ messages[0].flag }}"),
    ("round_filter", "{{ 2.5 | round }} {{ 3.5 | round }} {{ -2.5 | round }} {{ 0.125 | round(2) }} {{ 0.375 | round(2) }} {{ 2.675 | round(2) }} {{ 5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ 1234.5 | round(-2) }}"),
    ("filters_misc", "{{ messages | length }} {{ messages[0].content | length }} {{ messages | map(attribute='role') | join(', ') }} {{ messages[0].list | join('/') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ 'x' * 3 }} {{ messages[0].list[1:3] }} {{ messages[0].content[2:7] }} {{ [3, 1, 2] | sort }} {{ 'abc' | upper }} {{ messages[0].map | length }} {{ 'a' ~ 1 ~ 'b' }} {{ messages[-1].role }}"),
]


# A ChatML dialect written for these tests that accepts content as a string, null or a list of
# parts, prints tool calls with `tojson`, marks assistant text with `{% generation %}` and rejects
# unknown roles with `raise_exception`: the features real multimodal / tool templates combine.
PARTS_TEMPLATE = """{%- macro render_content(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}{{- part.text -}}
            {%- elif part.type == 'image' -%}<image>
            {%- else -%}{{- raise_exception('unsupported part type ' ~ part.type) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools %}
<|im_start|>system
{% if messages and messages[0].role == 'system' %}{{ render_content(messages[0].content) }}

{% endif %}
Tools:
{% for tool in tools %}
- {{ tool | tojson(sort_keys=true) }}
{% endfor %}
<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{- raise_exception('unknown role: ' ~ message.role) }}
    {%- endif %}
    {%- if not (tools and loop.first and message.role == 'system') %}
        {{- '<|im_start|>' ~ message.role }}{% if message.name is defined %} name={{ message.name }}{% endif %}
        {{- '\n' }}
        {%- if message.role == 'assistant' %}
            {%- generation %}
                {%- if message.reasoning_content %}<think>{{ message.reasoning_content | trim }}</think>
{% endif %}
                {{- render_content(message.content) }}
                {%- for call in message.tool_calls | default([]) %}
<call id="{{ call.id | default('') }}">{{ call.function.name }}({{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson(separators=(',', ':')) }})</call>
                {%- endfor %}
            {%- endgeneration %}
        {%- else %}
            {{- render_content(message.content) }}
        {%- endif %}
        {{- eos_token ~ '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and not enable_thinking %}
        {{- '<think></think>\n' }}
    {%- endif %}
{%- endif %}"""


def main():
    os.makedirs(OUT, exist_ok=True)
    qwen3_cfg = os.path.join(SHARED, "tokenizers", "qwen3", "tokenizer_config.json")
    with open(qwen3_cfg, encoding="utf-8") as f:
        qwen3_source = json.load(f)["chat_template"]
    qwen3_file = os.path.join(SHARED, "templates", "Qwen-Qwen3-0.6B.jinja")
    assert read(qwen3_file) == qwen3_source, "tokenizer_config.json and Qwen-Qwen3-0.6B.jinja differ"
    if not os.path.exists(SMOLLM2):
        sys.exit(f"{SMOLLM2} is missing: run scripts/test (it downloads SmolLM2) or set HEARTH_SMOLLM2")

    templates = [
        # (file stem, source, shared path or None, bos, eos)
        ("qwen3", qwen3_source, "templates/Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"),
        ("qwen3-coder", read(os.path.join(SHARED, "templates", "Qwen3-Coder.jinja")), "templates/Qwen3-Coder.jinja", "", "<|im_end|>"),
        ("chatml-tiny-qwen3", gguf_template(os.path.join(SHARED, "fixtures", "tiny-qwen3.q4_0.gguf")), None, "<|endoftext|>", "<|im_end|>"),
        ("smollm2", gguf_template(SMOLLM2), None, "<|im_start|>", "<|im_end|>"),
        ("chatml-parts", PARTS_TEMPLATE, None, "<s>", "</s>"),
    ]
    for stem, source, shared_path, bos, eos in templates:
        template = compile_template(source)
        cases = []
        for name, messages, tools, agp, kwargs in conversations():
            case = {
                "name": name,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": agp,
                "kwargs": kwargs,
                "bos_token": bos,
                "eos_token": eos,
            }
            try:
                case["expected"] = render(template, case)
            except Exception as e:  # the Rust side must fail as well
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        ok = sum(1 for c in cases if "expected" in c)
        write(stem, {"name": stem, "source": source, "shared_path": shared_path, "cases": cases})
        print(f"{stem}: {len(cases)} cases, {ok} rendered, {len(cases) - ok} errors")

    cases = []
    for name, source in FEATURE_TEMPLATES:
        case = {
            "name": name,
            "source": source,
            "messages": FEATURE_INPUT["messages"],
            "tools": None,
            "add_generation_prompt": False,
            "kwargs": {},
            "bos_token": "<s>",
            "eos_token": "</s>",
        }
        try:
            case["expected"] = render(compile_template(source), case)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    write("features", {"name": "features", "source": None, "shared_path": None, "cases": cases})
    print(f"features: {len(cases)} cases")


def write(stem, doc):
    path = os.path.join(OUT, f"{stem}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
