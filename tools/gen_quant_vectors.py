#!/usr/bin/env python3
"""Test vectors for the hearth-quant crate, from the gguf Python package (llama.cpp's numpy reference).

Writes, under crates/quant/tests/data/:

  dequant_blocks.txt   random blocks of every dequantizable type and gguf's dequantization of them:
                       `TYPE N_ELEMENTS SRC_HEX F32_LE_HEX` (Q8_1 and Q8_K, which gguf cannot dequantize,
                       use a numpy transcription of ggml's `d * q`)
  quantize_rows.txt    seeded f32 rows and gguf's quantization of them, for every type gguf-py can
                       quantize and Hearth has a quantizer for: `TYPE N_ELEMENTS F32_LE_HEX DST_HEX`
  tensors.txt          every tensor of every fixture model and of SmolLM2:
                       `FILE NAME TYPE DATA_OFFSET N_ELEMENTS HASH` where FILE is `fixtures/<name>` (under
                       /work/shared) or `$HEARTH_SMOLLM2`, and HASH is `hash_f32` (below) of gguf's
                       dequantization, as 16 hex digits

hash_f32 (mirrored in the Rust tests): over the f32 bit patterns b_i of the dequantized tensor,
sum over i (mod 2^64) of splitmix64_finalize(b_i ^ (i << 32)). Order-sensitive, cheap in numpy.

Run: .venv/bin/python tools/gen_quant_vectors.py   (deterministic: seeded, no clock)
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "quant", "tests", "data")
SHARED = os.path.abspath(os.path.join(ROOT, "..", "shared"))
SMOLLM2 = os.environ.get("HEARTH_SMOLLM2", os.path.join(ROOT, ".cache", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))

# Type -> (block elements, block bytes, byte offsets of f16 fields). Q8_1 is ggml's 36-byte layout
# (gguf-py still lists an old 40-byte one).
LAYOUT = {
    "Q4_0": (32, 18, [0]),
    "Q4_1": (32, 20, [0, 2]),
    "Q5_0": (32, 22, [0]),
    "Q5_1": (32, 24, [0, 2]),
    "Q8_0": (32, 34, [0]),
    "Q8_1": (32, 36, [0, 2]),
    "Q2_K": (256, 84, [80, 82]),
    "Q3_K": (256, 110, [108]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
    "Q8_K": (256, 292, []),
    "IQ4_NL": (32, 18, [0]),
    "IQ4_XS": (256, 136, [0]),
}

# f16 scale values worth covering: zero, negative zero, smallest subnormal, a subnormal, largest
# finite, a negative, one.
EDGE_F16 = np.array([0.0, -0.0, 2.0**-24, 3 * 2.0**-20, 65504.0, -0.75, 1.0], dtype=np.float16)


def hexs(a: np.ndarray) -> str:
    return np.ascontiguousarray(a).tobytes().hex()


def hash_f32(x: np.ndarray) -> int:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).ravel()
    total = np.uint64(0)
    step = 1 << 22
    with np.errstate(over="ignore"):
        for start in range(0, bits.size, step):
            b = bits[start:start + step].astype(np.uint64)
            i = np.arange(start, start + b.size, dtype=np.uint64)
            z = b ^ (i << np.uint64(32))
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            total = total + np.sum(z, dtype=np.uint64)
    return int(total)


def random_f16_finite(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    # exponent 31 is inf/NaN: clear its top exponent bit to keep the value finite
    bad = (bits & 0x7C00) == 0x7C00
    bits[bad] &= np.uint16(0xBFFF)
    return bits.view(np.float16)


def dequant_reference(name: str, raw: np.ndarray) -> np.ndarray:
    if name == "Q8_1":
        blocks = raw.reshape(-1, 36)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 4:].copy().view(np.int8).astype(np.float32)
        return (q * d).ravel()
    if name == "Q8_K":
        blocks = raw.reshape(-1, 292)
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).ravel()
    return quants.dequantize(raw, T[name]).astype(np.float32).ravel()


def gen_dequant_blocks(rng: np.random.Generator) -> list[str]:
    lines = []
    for name, (bs, size, f16_offsets) in LAYOUT.items():
        for case in range(3):
            nb = 4 if bs == 32 else 2
            raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
            for off in f16_offsets:
                if case == 0:
                    vals = EDGE_F16[rng.integers(0, EDGE_F16.size, size=nb)]
                else:
                    vals = (rng.standard_normal(nb) * 10.0 ** rng.uniform(-4, 1, size=nb)).astype(np.float16)
                raw[:, off:off + 2] = vals.reshape(nb, 1).view(np.uint8).reshape(nb, 2)
            if name == "Q8_K":
                d = (rng.standard_normal(nb) * 1e-2).astype(np.float32)
                raw[:, 0:4] = d.reshape(nb, 1).view(np.uint8).reshape(nb, 4)
            raw = raw.ravel()
            out = dequant_reference(name, raw)
            assert out.size == nb * bs
            lines.append(f"{name} {out.size} {hexs(raw)} {hexs(out)}")
    # plain float rows
    n = 96
    for name in ("F32", "F16", "BF16"):
        if name == "F32":
            vals = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, size=n)).astype(np.float32)
            raw = vals.view(np.uint8)
            out = vals
        elif name == "F16":
            vals = np.concatenate([random_f16_finite(rng, n - EDGE_F16.size), EDGE_F16])
            raw = vals.view(np.uint8)
            out = quants.dequantize(raw, T.F16).astype(np.float32)
        else:
            bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
            bits[(bits & 0x7F80) == 0x7F80] &= np.uint16(0xBFFF)
            raw = bits.view(np.uint8)
            out = quants.dequantize(raw, T.BF16).astype(np.float32).ravel()
        lines.append(f"{name} {n} {hexs(raw)} {hexs(out)}")
    return lines


def quant_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Rows of 256 f32 each, covering ordinary and awkward blocks."""
    rows = []
    for scale in (1.0, 1e-3, 300.0):
        rows.append((rng.standard_normal(256) * scale).astype(np.float32))
    rows.append(rng.uniform(-1, 1, 256).astype(np.float32))
    rows.append(rng.uniform(0.5, 2.0, 256).astype(np.float32))  # all positive: min > 0
    edge = np.zeros(256, dtype=np.float32)  # block 0 all zero
    edge[32:64] = 0.25  # constant block
    edge[64:96] = np.arange(32, dtype=np.float32) - 16  # integers: exact ties after scaling
    edge[96:128] = -np.arange(32, dtype=np.float32) / 7
    edge[128:160] = rng.standard_normal(32).astype(np.float32) * 1e-30  # tiny
    edge[160] = 1e4  # one outlier
    edge[161:192] = rng.standard_normal(31).astype(np.float32)
    edge[192:224] = np.float32(1.0) + np.arange(32, dtype=np.float32) * np.float32(2.0**-11)  # f16 ties
    edge[224:256] = -3.0
    rows.append(edge)
    return rows


def gen_quantize_rows(rng: np.random.Generator) -> list[str]:
    lines = []
    rows = quant_inputs(rng)
    for name in ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        for row in rows:
            out = quants.quantize(row.reshape(1, -1), T[name])
            lines.append(f"{name} {row.size} {hexs(row)} {hexs(out)}")
    return lines


def gen_tensors() -> list[str]:
    files = [(f"fixtures/{os.path.basename(p)}", p) for p in sorted(glob.glob(os.path.join(SHARED, "fixtures", "*.gguf")))]
    if os.path.exists(SMOLLM2):
        files.append(("$HEARTH_SMOLLM2", SMOLLM2))
    else:
        print(f"warning: {SMOLLM2} missing, SmolLM2 tensors skipped (run scripts/test to fetch it)", file=sys.stderr)
    lines = []
    for label, path in files:
        r = GGUFReader(path)
        for t in r.tensors:
            out = quants.dequantize(t.data, t.tensor_type)
            assert out.size == t.n_elements, (label, t.name)
            lines.append(f"{label} {t.name} {t.tensor_type.name} {t.data_offset} {t.n_elements} {hash_f32(out):016x}")
        print(f"{label}: {len(r.tensors)} tensors", file=sys.stderr)
    return lines


def write(name: str, header: str, lines: list[str]) -> None:
    with open(os.path.join(OUT, name), "w") as f:
        f.write(f"# {header}\n# generated by tools/gen_quant_vectors.py; do not edit\n")
        for line in lines:
            f.write(line + "\n")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20241129)
    write("dequant_blocks.txt", "TYPE N_ELEMENTS SRC_HEX F32_LE_HEX", gen_dequant_blocks(rng))
    write("quantize_rows.txt", "TYPE N_ELEMENTS F32_LE_HEX DST_HEX", gen_quantize_rows(rng))
    write("tensors.txt", "FILE NAME TYPE DATA_OFFSET N_ELEMENTS HASH_F32", gen_tensors())


if __name__ == "__main__":
    main()
