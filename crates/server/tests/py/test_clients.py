"""The official OpenAI, Anthropic and Ollama Python clients against a running `hearth serve`.

Run by crates/cli/tests/serve_clients.rs, which starts the server on a tiny fixture model and sets
HEARTH_URL. By hand: `hearth serve MODEL --port 8080 &` then
`HEARTH_URL=http://127.0.0.1:8080 .venv/bin/python -m pytest crates/server/tests/py -q`.

With HEARTH_SCRIPTED=1 the server plays a fixed Qwen3 reply (reasoning and a tool call) instead of
running the model, and only the tests marked `scripted` run: random-weight models never think or
call tools, so those paths are driven this way through the real clients.
"""

import concurrent.futures
import json
import os
import re
import threading
import time

import anthropic
import httpx
import ollama
import openai
import pytest

URL = os.environ.get("HEARTH_URL", "http://127.0.0.1:8080")
SCRIPTED = os.environ.get("HEARTH_SCRIPTED") == "1"
SOAK_SECONDS = float(os.environ.get("HEARTH_SOAK_SECONDS", "10"))
# The server's --api-key, when it has one: OpenAI's client sends it as a Bearer token, Anthropic's
# as x-api-key, Ollama's in the headers we give it.
KEY = os.environ.get("HEARTH_API_KEY")
ALIAS = os.environ.get("HEARTH_ALIAS")

real = pytest.mark.skipif(SCRIPTED, reason="needs the real model")
scripted = pytest.mark.skipif(not SCRIPTED, reason="needs the scripted backend")

MSGS = [{"role": "user", "content": "Write a short poem about the sea."}]


def oai(key=None):
    return openai.OpenAI(base_url=URL + "/v1", api_key=key or KEY or "none", max_retries=0)


def ant(key=None):
    return anthropic.Anthropic(base_url=URL, api_key=key or KEY or "none", max_retries=0)


def oll():
    return ollama.Client(host=URL, headers={"Authorization": f"Bearer {KEY}"} if KEY else None)


def auth():
    return {"Authorization": f"Bearer {KEY}"} if KEY else {}


# ---------------------------------------------------------------- OpenAI


@real
def test_openai_models():
    models = oai().models.list()
    assert len(models.data) == 1
    assert models.data[0].id == (ALIAS or models.data[0].id)


@real
def test_openai_chat_streamed_equals_non_streamed():
    c = oai()
    whole = c.chat.completions.create(model="x", messages=MSGS, max_tokens=24, temperature=0)
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    text = ""
    usage = None
    finish = None
    for chunk in c.chat.completions.create(
        model="x", messages=MSGS, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


@real
def test_openai_responses_streamed_equals_whole():
    c = oai()
    whole = c.responses.create(model="x", input="Write a short poem about the sea.", max_output_tokens=24,
                               temperature=0, reasoning={"effort": "none"})
    assert whole.status in ("completed", "incomplete")
    assert whole.usage.output_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    text, final, seqs = "", None, []
    with c.responses.stream(model="x", input="Write a short poem about the sea.", max_output_tokens=24,
                            temperature=0, reasoning={"effort": "none"}) as stream:
        for ev in stream:
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            # The SDK's get_final_response() takes only `response.completed`; a reply cut by
            # max_output_tokens ends in `response.incomplete`, as OpenAI's own does.
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert seqs == list(range(len(seqs)))
    assert text == whole.output_text == final.output_text
    assert final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    # Continued from the stored response: the whole conversation is the prompt.
    follow = c.responses.create(model="x", input="Another one.", previous_response_id=whole.id, max_output_tokens=4,
                                reasoning={"effort": "none"})
    assert follow.usage.input_tokens > whole.usage.input_tokens + whole.usage.output_tokens
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="x", input="x", previous_response_id="resp_unknown")


@real
def test_openai_chat_options_n_logprobs_stop():
    c = oai()
    r = c.chat.completions.create(
        model="x", messages=MSGS, max_tokens=6, temperature=0.7, seed=5, n=2, logprobs=True, top_logprobs=3,
        top_p=0.9, presence_penalty=0.1, frequency_penalty=0.1, logit_bias={"1": -100},
        extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert len(r.choices) == 2
    for ch in r.choices:
        assert len(ch.logprobs.content) >= 1
        assert len(ch.logprobs.content[0].top_logprobs) == 3
    again = c.chat.completions.create(model="x", messages=MSGS, max_tokens=6, temperature=0.7, seed=5, n=2, top_p=0.9,
                                      presence_penalty=0.1, frequency_penalty=0.1, logit_bias={"1": -100},
                                      extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1,
                                                  "chat_template_kwargs": {"enable_thinking": False}})
    assert [x.message.content for x in again.choices] == [x.message.content for x in r.choices], "same seed, same text"
    base = c.chat.completions.create(model="x", messages=MSGS, max_tokens=24, temperature=0).choices[0].message.content
    if len(base) > 4:
        stop = base[2:4]
        cut = c.chat.completions.create(model="x", messages=MSGS, max_tokens=24, temperature=0, stop=[stop])
        assert cut.choices[0].message.content == base[: base.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


@real
def test_openai_completions_streamed_equals_non_streamed():
    c = oai()
    whole = c.completions.create(model="x", prompt="The capital of France is", max_tokens=16, temperature=0, logprobs=2)
    assert whole.choices[0].logprobs.tokens
    text = "".join(
        ch.text for chunk in c.completions.create(model="x", prompt="The capital of France is", max_tokens=16, temperature=0, stream=True)
        for ch in chunk.choices
    )
    assert text == whole.choices[0].text


@real
def test_openai_errors():
    c = oai()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSGS, n=99)
    assert "parallel" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="x", messages=MSGS, max_tokens=-1)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="x", messages=MSGS, temperature=-1)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=[{"role": "user", "content": "word " * 5000}])
    assert "context" in e.value.body["message"]


@real
def test_concurrent_answers_equal_alone():
    c = oai()
    prompts = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(8)]
    alone = [c.chat.completions.create(model="x", messages=p, max_tokens=16, temperature=0).choices[0].message.content for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda p: c.chat.completions.create(model="x", messages=p, max_tokens=16, temperature=0).choices[0].message.content, prompts))
    assert together == alone
    # And once more with the prefix cache hot.
    hot = [c.chat.completions.create(model="x", messages=p, max_tokens=16, temperature=0).choices[0].message.content for p in prompts]
    assert hot == alone


# ---------------------------------------------------------------- Anthropic


@real
def test_anthropic_messages_streamed_equals_non_streamed():
    c = ant()
    whole = c.messages.create(model="claude-x", max_tokens=24, system="Be brief.", messages=MSGS, extra_body={"temperature": 0})
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in whole.content if b.type == "text")
    with c.messages.stream(model="claude-x", max_tokens=24, system="Be brief.", messages=MSGS, extra_body={"temperature": 0}) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    n = c.messages.count_tokens(model="claude-x", system="Be brief.", messages=MSGS)
    # As Anthropic counts: the prompt is input_tokens + cache_read_input_tokens (+ cache creation).
    assert n.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens


@real
def test_anthropic_errors():
    c = ant()
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="x", max_tokens=-3, messages=MSGS)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- Ollama


@real
def test_ollama_chat_and_generate():
    c = oll()
    opts = {"temperature": 0, "num_predict": 20, "seed": 1, "top_k": 40, "top_p": 0.9, "num_ctx": 2048}
    whole = c.chat(model="x", messages=MSGS, options=opts)
    assert whole.done and whole.done_reason in ("stop", "length")
    streamed = "".join(part.message.content for part in c.chat(model="x", messages=MSGS, options=opts, stream=True))
    assert streamed == whole.message.content
    g = c.generate(model="x", prompt="Once upon a time", options=opts)
    gs = "".join(part.response for part in c.generate(model="x", prompt="Once upon a time", options=opts, stream=True))
    assert gs == g.response
    raw = c.generate(model="x", prompt="Once upon a time", raw=True, options=opts)
    assert raw.eval_count > 0
    no_think = c.chat(model="x", messages=MSGS, options=opts, think=False)
    assert no_think.done


@real
def test_ollama_listing():
    c = oll()
    tags = c.list()
    assert len(tags.models) == 1
    name = tags.models[0].model
    shown = c.show(name)
    assert shown.details.format == "gguf"
    assert "completion" in shown.capabilities
    assert len(c.ps().models) == 1
    assert httpx.get(URL + "/api/version", headers=auth()).json()["version"]
    assert httpx.get(URL + "/", headers=auth()).status_code == 200
    assert httpx.head(URL + "/", headers=auth()).status_code == 200
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="x", messages=MSGS, options={"top_p": 5})
    assert e.value.status_code == 400


# ---------------------------------------------------------------- utility


@real
def test_tokenize_detokenize_health():
    toks = httpx.post(URL + "/tokenize", headers=auth(), json={"content": "Hello world"}).json()["tokens"]
    assert toks
    assert httpx.post(URL + "/detokenize", headers=auth(), json={"tokens": toks}).json()["content"] == "Hello world"
    r = httpx.post(URL + "/detokenize", headers=auth(), json={"tokens": [10**9]})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    r = httpx.get(URL + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def metric(name):
    text = httpx.get(URL + "/metrics", headers=auth()).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def long_prompt(tag):
    """A prompt of several 64-token KV blocks, its own from the first token on (so no earlier
    request shares a block of it), and the same on every call with the same tag."""
    words = " ".join(f"{tag}{i} is a word of the {tag} list." for i in range(40))
    return f"{tag}: remember these. {words}"


@real
def test_cached_prompt_tokens_are_reported_in_every_api():
    """The second of two identical requests is served from the prefix cache, and each API reports
    it in its own field: all but the prompt's last partial block is cached."""
    before = {m: metric(m) for m in ("hearth_cached_prompt_tokens_total", "hearth_prefix_cache_queries_total",
                                      "hearth_prefix_cache_query_tokens_total")}
    c = oai()
    msgs = [{"role": "user", "content": long_prompt("chat")}]
    first, again = (c.chat.completions.create(model="x", messages=msgs, max_tokens=2, temperature=0) for _ in range(2))
    n = first.usage.prompt_tokens
    assert n > 128 and again.usage.prompt_tokens == n
    # The first request may share the chat template's opening with earlier requests, not a block of
    # the prompt's own text.
    assert first.usage.prompt_tokens_details.cached_tokens < 64
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert n - 64 <= cached < n, (cached, n)
    total_cached = cached

    first, again = (c.responses.create(model="x", input=long_prompt("responses"), max_output_tokens=2,
                                       temperature=0, reasoning={"effort": "none"}) for _ in range(2))
    n = first.usage.input_tokens
    assert first.usage.input_tokens_details.cached_tokens < 64
    cached = again.usage.input_tokens_details.cached_tokens
    assert n - 64 <= cached < n and again.usage.input_tokens == n, (cached, n)
    total_cached += cached

    a = ant()
    msgs = [{"role": "user", "content": long_prompt("anthropic")}]
    first, again = (a.messages.create(model="x", max_tokens=2, messages=msgs, extra_body={"temperature": 0})
                    for _ in range(2))
    # Anthropic counts the prompt as input_tokens + cache_read_input_tokens.
    n = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert first.usage.cache_read_input_tokens < 64 and n > 128
    cached = again.usage.cache_read_input_tokens
    assert n - 64 <= cached < n and again.usage.input_tokens == n - cached, (again.usage, n)
    assert a.messages.count_tokens(model="x", messages=msgs).input_tokens == n
    total_cached += cached

    o = oll()
    msgs = [{"role": "user", "content": long_prompt("ollama")}]
    first, again = (o.chat(model="x", messages=msgs, options={"temperature": 0, "num_predict": 2}) for _ in range(2))
    # prompt_eval_count is the tokens evaluated: the whole prompt, then only what the cache lacks.
    n = first.prompt_eval_count
    assert n > 128 and 0 < again.prompt_eval_count <= 64, (n, again.prompt_eval_count)
    for r in (first, again):
        assert 1 <= r.eval_count <= 2
        assert r.prompt_eval_duration > 0 and r.eval_duration > 0
        assert r.total_duration >= r.prompt_eval_duration + r.eval_duration
        assert r.load_duration == 0
    total_cached += n - again.prompt_eval_count

    after = {m: metric(m) for m in before}
    assert after["hearth_cached_prompt_tokens_total"] - before["hearth_cached_prompt_tokens_total"] >= total_cached
    assert after["hearth_prefix_cache_queries_total"] - before["hearth_prefix_cache_queries_total"] >= 8
    assert after["hearth_prefix_cache_query_tokens_total"] - before["hearth_prefix_cache_query_tokens_total"] >= 8 * 128


@real
def test_soak_streaming_clients():
    """16 clients stream short replies for a while; none fails and no sequence is left behind."""
    c = oai()
    errors = []
    done = [0]
    lock = threading.Lock()
    deadline = time.time() + SOAK_SECONDS

    def client(i):
        while time.time() < deadline:
            try:
                text = ""
                finish = None
                for chunk in c.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": f"client {i} says hi"}], max_tokens=8,
                    temperature=0.8, seed=i, stream=True,
                ):
                    for ch in chunk.choices:
                        text += ch.delta.content or ""
                        finish = ch.finish_reason or finish
                if finish not in ("stop", "length"):
                    raise AssertionError(f"finish {finish}")
                with lock:
                    done[0] += 1
            except Exception as e:  # noqa: BLE001 - collect every failure
                with lock:
                    errors.append(repr(e))

    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        list(ex.map(client, range(16)))
    assert not errors, errors[:5]
    assert done[0] >= 16
    for _ in range(50):
        if metric("hearth_active_sequences") == 0 and metric("hearth_queue_depth") == 0:
            break
        time.sleep(0.1)
    assert metric("hearth_active_sequences") == 0
    assert metric("hearth_queue_depth") == 0
    assert metric("hearth_generated_tokens_total") > 0


# ---------------------------------------------------------------- scripted: reasoning and tools

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@scripted
def test_scripted_openai_reasoning_and_tool_calls():
    c = oai()
    whole = c.chat.completions.create(model="x", messages=MSGS, tools=TOOLS, seed=1)
    m = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert m.model_extra["reasoning_content"] == "The user wants weather."
    assert m.tool_calls[0].function.name == "get_weather"
    assert json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris"}
    reasoning, content, args, name = "", "", "", None
    for chunk in c.chat.completions.create(model="x", messages=MSGS, tools=TOOLS, seed=1, stream=True):
        for ch in chunk.choices:
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    assert (reasoning, content or None, name, json.loads(args)) == ("The user wants weather.", m.content, "get_weather", {"city": "Paris"})
    # The tool result goes back through the template.
    follow = c.chat.completions.create(model="x", tools=TOOLS, messages=MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [tc.model_dump() for tc in m.tool_calls]},
        {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny"}])
    assert follow.choices[0].message.tool_calls


@scripted
def test_scripted_openai_responses_reasoning_and_function_calls():
    c = oai()
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    whole = c.responses.create(model="x", input="Weather in Paris?", tools=tools, reasoning={"summary": "auto"})
    kinds = [o.type for o in whole.output]
    assert kinds == ["reasoning", "message", "function_call"], kinds
    assert whole.output[1].content[0].text == "Let me check."
    assert whole.output[0].summary[0].text == "The user wants weather."
    call = whole.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    args, summary = "", ""
    with c.responses.stream(model="x", input="Weather in Paris?", tools=tools, reasoning={"summary": "auto"}) as stream:
        for ev in stream:
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
            elif ev.type == "response.reasoning_summary_text.delta":
                summary += ev.delta
        final = stream.get_final_response()
    assert json.loads(args) == {"city": "Paris"} and summary == "The user wants weather."
    assert [o.type for o in final.output] == kinds
    # The call's output goes back as an item, the reasoning with it.
    follow = c.responses.create(model="x", tools=tools, input=[
        {"role": "user", "content": "Weather in Paris?"},
        *[o.model_dump(exclude_none=True) for o in whole.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.status == "completed"


@scripted
def test_scripted_anthropic_thinking_and_tool_use():
    c = ant()
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    whole = c.messages.create(model="x", max_tokens=200, tools=tools, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 1024})
    kinds = [b.type for b in whole.content]
    assert kinds == ["thinking", "text", "tool_use"], kinds
    assert whole.stop_reason == "tool_use"
    assert whole.content[2].input == {"city": "Paris"}
    with c.messages.stream(model="x", max_tokens=200, tools=tools, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == kinds
    assert final.content[0].thinking == whole.content[0].thinking
    assert final.content[2].input == {"city": "Paris"}
    back = c.messages.create(model="x", max_tokens=200, tools=tools, messages=MSGS + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": whole.content[2].id, "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": whole.content[2].id, "content": "sunny"}]}])
    assert back.stop_reason == "tool_use"


@scripted
def test_scripted_ollama_thinking_and_tool_calls():
    c = oll()
    whole = c.chat(model="x", messages=MSGS, tools=TOOLS, think=True)
    assert whole.message.thinking == "The user wants weather."
    assert whole.message.tool_calls[0].function.name == "get_weather"
    assert whole.message.tool_calls[0].function.arguments == {"city": "Paris"}
    thinking, calls = "", []
    for part in c.chat(model="x", messages=MSGS, tools=TOOLS, think=True, stream=True):
        thinking += part.message.thinking or ""
        calls += part.message.tool_calls or []
    assert thinking == whole.message.thinking
    assert [t.function.arguments for t in calls] == [{"city": "Paris"}]


@pytest.mark.skipif(not KEY, reason="the server has no API key")
def test_api_key_required():
    with pytest.raises(openai.AuthenticationError) as e:
        oai("wrong-key").chat.completions.create(model="x", messages=MSGS, max_tokens=2)
    assert e.value.body["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError) as e:
        ant("wrong-key").messages.create(model="x", max_tokens=2, messages=MSGS)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=URL).list()
    assert e.value.status_code == 401
    assert httpx.get(URL + "/health").status_code == 200
    assert oai().chat.completions.create(model="x", messages=MSGS, max_tokens=2).choices
    assert ant().messages.create(model="x", max_tokens=2, messages=MSGS).content is not None


@real
def test_generation_reaching_the_context_end_is_length():
    n_ctx = oai().models.list().data[0].model_extra["meta"]["n_ctx"]
    r = oai().completions.create(model="x", prompt=[100] * (n_ctx - 3), temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError) as e:
        oai().completions.create(model="x", prompt=[100] * (n_ctx + 5), temperature=0)
    assert str(n_ctx) in e.value.body["message"] and str(n_ctx + 5) in e.value.body["message"]


@real
def test_a_client_that_leaves_frees_its_sequence():
    with httpx.stream("POST", URL + "/v1/chat/completions", headers=auth(), timeout=60,
                      json={"messages": MSGS, "max_tokens": 900, "temperature": 0, "stream": True}) as r:
        lines = r.iter_lines()
        next(lines)
        next(lines)
    for _ in range(100):
        if metric("hearth_active_sequences") == 0:
            break
        time.sleep(0.05)
    assert metric("hearth_active_sequences") == 0
