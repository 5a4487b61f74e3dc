#!/usr/bin/env python3
"""Expected `hearth inspect --json` output, as the `gguf` package (GGUFReader, gguf==0.19.0) reads it.

For every *.gguf in ../shared/fixtures and ../shared/tokenizers/llama.cpp-vocab, and for SmolLM2-135M-Instruct
Q4_1 (path from $HEARTH_SMOLLM2, default .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf), writes
crates/cli/tests/data/inspect/<name>.json with:

  source       where the test finds the model: {"shared": "fixtures/x.gguf"} or {"env": "HEARTH_SMOLLM2"}
  version, alignment, data_offset
  metadata     key -> value in file order, formatted as inspect formats it: scalars as JSON values (f32
               widened exactly to a double), arrays of at most 16 elements as lists, longer arrays as
               {"type", "len", "head": first 16}
  tensors      [{"name", "type" (GGMLQuantizationType name), "shape" (ne0 first), "offset" (absolute),
               "bytes"}]

Run from the repository root: .venv/bin/python tools/gen_inspect_expected.py
"""

import json
import os
import sys
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
OUT = ROOT / "crates" / "cli" / "tests" / "data" / "inspect"
HEAD = 16

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}


def field_json(field):
    types = field.types
    value = field.contents()
    if types[0] != GGUFValueType.ARRAY:
        return value
    if len(types) != 2:
        sys.exit(f"{field.name}: nested arrays are not handled by this script")
    if len(value) <= HEAD:
        return value
    return {"type": TYPE_NAMES[types[1]], "len": len(value), "head": value[:HEAD]}


def expected(path, source):
    r = GGUFReader(path)
    metadata = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's pseudo-fields for the header
        metadata[key] = field_json(field)
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(d) for d in t.shape],
            "offset": int(t.data_offset),
            "bytes": int(t.n_bytes),
        }
        for t in r.tensors
    ]
    return {
        "source": source,
        "version": int(r.fields["GGUF.version"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": metadata,
        "tensors": tensors,
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    models = []
    for sub in ("fixtures", "tokenizers/llama.cpp-vocab"):
        for p in sorted((SHARED / sub).glob("*.gguf")):
            models.append((p, {"shared": f"{sub}/{p.name}"}, p.stem))
    smollm2 = Path(os.environ.get("HEARTH_SMOLLM2", ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not smollm2.exists():
        sys.exit(f"{smollm2} is missing: run scripts/test to fetch SmolLM2-135M-Instruct Q4_1")
    models.append((smollm2, {"env": "HEARTH_SMOLLM2"}, "SmolLM2-135M-Instruct.Q4_1"))
    for path, source, stem in models:
        out = OUT / f"{stem}.json"
        with open(out, "w", encoding="utf-8") as f:
            json.dump(expected(str(path), source), f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
