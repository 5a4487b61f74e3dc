#!/usr/bin/env python3
"""Check a `hearth synth` file with the `gguf` package (an independent reader and dequantizer).

    check_synth.py FILE --preset NAME --quant Q [--layers N] [--vocab N]

- metadata: architecture, every hyperparameter of the preset, file type, tokenizer arrays of the
  vocabulary size (padding tokens `[PAD{i}]` of type UNUSED);
- every tensor present with its shape, and the type llama-quantize's rules give it (re-derived here
  from src/llama-quant.cpp, independently of the Rust code);
- values: dequantized, norms near 1 (std ~0.02), matrices mean ~0 with std ~1/sqrt(fan_in) (token
  embeddings: 1), no NaN/Inf.
Exits 1 with every problem listed.
"""
import argparse
import math
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

PRESETS = {
    "qwen3-moe-30b-a3b": dict(arch="qwen3moe", n_layer=48, d=2048, ff=6144, heads=32, kv=4, hd=128, ctx=262144,
                              rope=1e7, eps=1e-6, vocab=151936, experts=(128, 8, 768), tied=False),
    "qwen3-moe-tiny": dict(arch="qwen3moe", n_layer=4, d=256, ff=512, heads=8, kv=2, hd=64, ctx=4096,
                           rope=1e6, eps=1e-6, vocab=None, experts=(8, 2, 256), tied=False),
    "qwen3-dense-0.6b": dict(arch="qwen3", n_layer=28, d=1024, ff=3072, heads=16, kv=8, hd=128, ctx=40960,
                             rope=1e6, eps=1e-6, vocab=151936, experts=None, tied=True),
    "gemma3-tiny": dict(arch="gemma3", n_layer=8, d=256, ff=512, heads=4, kv=1, hd=64, ctx=2048,
                        rope=1e6, eps=1e-6, vocab=None, experts=None, tied=True, swa=16, post_norms=True),
    "gemma2-tiny": dict(arch="gemma2", n_layer=4, d=256, ff=512, heads=4, kv=2, hd=64, ctx=2048,
                        rope=1e4, eps=1e-6, vocab=None, experts=None, tied=True, swa=16, post_norms=True,
                        qk_norm=False, softcaps=(1.5, 3.0)),
}
FILE_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q6_k": 18}
DEFAULT = {"f16": T.F16, "q4_0": T.Q4_0, "q8_0": T.Q8_0, "q4_k_m": T.Q4_K, "q6_k": T.Q6_K}
BLOCK = {T.F32: 1, T.F16: 1, T.Q4_0: 32, T.Q5_0: 32, T.Q5_1: 32, T.Q8_0: 32, T.Q4_K: 256, T.Q5_K: 256, T.Q6_K: 256}


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_type(p, quant, name, layer, n_layer, cols, ndim):
    """llama_tensor_get_type for the file types synth writes."""
    if ndim == 1 or "ffn_gate_inp" in name:
        return T.F32
    ty = DEFAULT[quant]
    if quant == "f16":
        return ty
    n_expert = p["experts"][0] if p["experts"] else 0
    if name == "output.weight" or (p["tied"] and name == "token_embd.weight"):
        if cols % BLOCK[ty]:
            ty = T.Q8_0
        elif ty != T.Q8_0:
            ty = T.Q6_K
    elif name == "token_embd.weight":
        pass
    elif "attn_v.weight" in name:
        if quant == "q4_k_m" and use_more_bits(layer, n_layer):
            ty = T.Q6_K
        if n_expert == 8:
            ty = T.Q8_0
    elif "attn_k.weight" in name:
        if n_expert == 8:
            ty = T.Q8_0
    elif "ffn_down" in name:
        if quant == "q4_k_m" and use_more_bits(layer, n_layer):
            ty = T.Q6_K
    elif "attn_output.weight" in name:
        if n_expert == 8 and quant == "q4_k_m":
            ty = T.Q5_K
    if cols % BLOCK[ty]:
        ty = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}.get(ty, ty)
        if cols % BLOCK[ty]:
            ty = T.F16
    return ty


def expected_tensors(p, n_layer, n_vocab):
    """name -> (shape in ggml order, std or None for norms). Projections into the residual stream
    (attn_output, ffn_down) carry GPT-2's extra 1/sqrt(2 n_layer)."""
    d, qd, kd = p["d"], p["heads"] * p["hd"], p["kv"] * p["hd"]
    rs = 1 / math.sqrt(2 * n_layer)
    # Tied embeddings double as the LM head: std 1/sqrt(d) like every matrix; otherwise unit rows.
    t = {"token_embd.weight": ([d, n_vocab], 1 / math.sqrt(d) if p["tied"] else 1.0), "output_norm.weight": ([d], None)}
    if not p["tied"]:
        t["output.weight"] = ([d, n_vocab], 1 / math.sqrt(d))
    for l in range(n_layer):
        b = f"blk.{l}."
        t[b + "attn_norm.weight"] = ([d], None)
        t[b + "attn_q.weight"] = ([d, qd], 1 / math.sqrt(d))
        t[b + "attn_k.weight"] = ([d, kd], 1 / math.sqrt(d))
        t[b + "attn_v.weight"] = ([d, kd], 1 / math.sqrt(d))
        t[b + "attn_output.weight"] = ([qd, d], rs / math.sqrt(qd))
        if p.get("qk_norm", True):
            t[b + "attn_q_norm.weight"] = ([p["hd"]], None)
            t[b + "attn_k_norm.weight"] = ([p["hd"]], None)
        t[b + "ffn_norm.weight"] = ([d], None)
        if p.get("post_norms"):
            t[b + "post_attention_norm.weight"] = ([d], None)
            t[b + "post_ffw_norm.weight"] = ([d], None)
        if p["experts"]:
            n, _, ff = p["experts"]
            t[b + "ffn_gate_inp.weight"] = ([d, n], 1 / math.sqrt(d))
            t[b + "ffn_gate_exps.weight"] = ([d, ff, n], 1 / math.sqrt(d))
            t[b + "ffn_up_exps.weight"] = ([d, ff, n], 1 / math.sqrt(d))
            t[b + "ffn_down_exps.weight"] = ([ff, d, n], rs / math.sqrt(ff))
        else:
            ff = p["ff"]
            t[b + "ffn_gate.weight"] = ([d, ff], 1 / math.sqrt(d))
            t[b + "ffn_up.weight"] = ([d, ff], 1 / math.sqrt(d))
            t[b + "ffn_down.weight"] = ([ff, d], rs / math.sqrt(ff))
    return t


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--quant", required=True, choices=sorted(FILE_TYPE))
    ap.add_argument("--layers", type=int)
    ap.add_argument("--vocab", type=int, help="expected vocabulary size (default: the preset's)")
    ap.add_argument("--max-rows", type=int, default=4096, help="rows dequantized per tensor")
    a = ap.parse_args()
    p = PRESETS[a.preset]
    n_layer = a.layers or p["n_layer"]
    r = GGUFReader(a.file)
    problems = []

    tokens = field(r, "tokenizer.ggml.tokens") or []
    n_vocab = a.vocab or p["vocab"] or len(tokens)
    arch = p["arch"]
    want_meta = {
        "general.architecture": arch,
        "general.file_type": FILE_TYPE[a.quant],
        "general.quantization_version": 2,
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": p["ctx"],
        f"{arch}.embedding_length": p["d"],
        f"{arch}.feed_forward_length": p["ff"],
        f"{arch}.attention.head_count": p["heads"],
        f"{arch}.attention.head_count_kv": p["kv"],
        f"{arch}.attention.key_length": p["hd"],
        f"{arch}.attention.value_length": p["hd"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
    }
    if p.get("swa"):
        want_meta[f"{arch}.attention.sliding_window"] = p["swa"]
    if p["experts"]:
        n, k, ff = p["experts"]
        want_meta.update({f"{arch}.expert_count": n, f"{arch}.expert_used_count": k,
                          f"{arch}.expert_feed_forward_length": ff})
    for k, v in want_meta.items():
        got = field(r, k)
        if got != v:
            problems.append(f"metadata {k} = {got!r}, expected {v!r}")
    floats = [(f"{arch}.rope.freq_base", p["rope"]), (f"{arch}.attention.layer_norm_rms_epsilon", p["eps"])]
    if p.get("softcaps"):
        floats += [(f"{arch}.attn_logit_softcapping", p["softcaps"][0]),
                   (f"{arch}.final_logit_softcapping", p["softcaps"][1])]
    for k, v in floats:
        got = field(r, k)
        if got is None or abs(got - v) > 1e-6 * v:
            problems.append(f"metadata {k} = {got!r}, expected {v!r}")
    if field(r, "tokenizer.chat_template") is None:
        problems.append("no tokenizer.chat_template")
    types = field(r, "tokenizer.ggml.token_type") or []
    if len(tokens) != n_vocab or len(types) != n_vocab:
        problems.append(f"{len(tokens)} tokens / {len(types)} types, expected {n_vocab}")
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if tok.startswith("[PAD") and (tok != f"[PAD{i}]" or ty != 5):
            problems.append(f"padding token {i}: {tok!r} of type {ty}")
            break
    for s in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        if s not in tokens:
            problems.append(f"special {s} missing")

    want = expected_tensors(p, n_layer, n_vocab)
    have = {t.name: t for t in r.tensors}
    for name in sorted(set(have) - set(want)):
        problems.append(f"unexpected tensor {name}")
    for name, (shape, std) in want.items():
        t = have.get(name)
        if t is None:
            problems.append(f"missing tensor {name}")
            continue
        got_shape = [int(x) for x in t.shape]
        if got_shape != shape:
            problems.append(f"{name}: shape {got_shape}, expected {shape}")
            continue
        layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
        ety = expected_type(p, a.quant, name, layer, n_layer, shape[0], len(shape))
        if t.tensor_type != ety:
            problems.append(f"{name}: type {t.tensor_type.name}, expected {ety.name}")
            continue
        # Dequantize up to max_rows rows (the data is [rows, row bytes] for every type).
        rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        n = min(rows, a.max_rows)
        raw = np.asarray(t.data).reshape(rows, -1)[:n] if len(shape) > 1 else np.asarray(t.data).reshape(1, -1)
        v = dequantize(raw, t.tensor_type).astype(np.float64).ravel()
        if not np.all(np.isfinite(v)):
            problems.append(f"{name}: non-finite values")
            continue
        mean, sd = float(v.mean()), float(v.std())
        if std is None:
            ok = abs(mean - 1) < 0.01 and 0.01 < sd < 0.04
            want_s = "mean 1, std 0.02"
        else:
            ok = abs(mean) < 0.05 * std + 3 * std / math.sqrt(v.size) and abs(sd / std - 1) < 0.1
            want_s = f"mean 0, std {std:.4g}"
        if not ok:
            problems.append(f"{name}: mean {mean:.4g}, std {sd:.4g}, expected {want_s}")
    if problems:
        for pr in problems:
            print("PROBLEM", pr)
        sys.exit(1)
    print(f"ok: {a.file}: {len(want)} tensors, {n_vocab} tokens, {a.preset} {a.quant} {n_layer} layers")


if __name__ == "__main__":
    main()
