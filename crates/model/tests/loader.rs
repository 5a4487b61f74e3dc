//! The loader checks every required tensor, shape, type and hyperparameter up front and names every
//! problem in one error; per-layer attributes come from the metadata as llama.cpp derives them.

mod common;

use std::path::Path;
use std::sync::Arc;

use hearth_gguf::{Gguf, GgufBuilder, Value};
use hearth_model::{Model, ModelError};
use hearth_quant::GgmlType;

/// Rebuilds a fixture with its metadata and tensors passed through `edit_kv` / `edit_tensor`
/// (returning `None` drops the entry).
fn rebuilt(
    name: &str,
    edit_kv: impl Fn(&str, &Value) -> Option<Value>,
    edit_tensor: impl Fn(&str, GgmlType, &[u64]) -> Option<(GgmlType, Vec<u64>)>,
) -> Result<Model, ModelError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name);
    let src = Gguf::open(path).unwrap();
    let mut b = GgufBuilder::new();
    for (k, v) in src.metadata().iter() {
        if k == "general.alignment" {
            continue;
        }
        if let Some(v) = edit_kv(k, v) {
            b = b.kv(k, v);
        }
    }
    for t in src.tensors() {
        if let Some((ty, dims)) = edit_tensor(&t.name, t.ty, &t.dims) {
            let n: u64 = dims.iter().product();
            let bytes = ty.row_bytes(dims[0]).unwrap() * (n / dims[0]);
            let mut data = src.tensor_data(t).to_vec();
            data.resize(bytes as usize, 0);
            b = b.tensor(t.name.clone(), ty, &dims, data);
        }
    }
    Model::load(Arc::new(Gguf::from_bytes(b.build().unwrap()).unwrap()))
}

fn keep_kv(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

fn keep_tensor(_: &str, ty: GgmlType, dims: &[u64]) -> Option<(GgmlType, Vec<u64>)> {
    Some((ty, dims.to_vec()))
}

#[test]
fn unchanged_fixture_loads() {
    let m = rebuilt("tiny-qwen3moe.q4_k_m.gguf", keep_kv, keep_tensor).unwrap();
    assert_eq!(m.config.moe.as_ref().unwrap().n_expert, 8);
    assert_eq!(m.config.head_dim, 64);
}

#[test]
fn every_tensor_problem_is_listed() {
    let err = rebuilt(
        "tiny-qwen3moe.q4_k_m.gguf",
        keep_kv,
        |name, ty, dims| match name {
            "blk.1.attn_k_norm.weight" | "blk.0.ffn_gate_exps.weight" => None,
            "blk.0.ffn_up_exps.weight" => Some((ty, vec![dims[0], dims[1], 4])),
            "blk.1.attn_q.weight" => Some((ty, vec![dims[0], 256])),
            _ => Some((ty, dims.to_vec())),
        },
    )
    .err()
    .expect("a broken model must not load");
    let text = err.to_string();
    for needle in [
        "missing tensor blk.1.attn_k_norm.weight",
        "missing tensor blk.0.ffn_gate_exps.weight",
        "tensor blk.0.ffn_up_exps.weight has shape [256, 256, 4], expected [256, 256, 8]",
        "tensor blk.1.attn_q.weight has shape [256, 256], expected [256, 512]",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
}

#[test]
fn unsupported_weight_type_is_named() {
    let err = rebuilt("tiny-qwen3.q4_0.gguf", keep_kv, |name, ty, dims| {
        Some((
            if name == "blk.0.ffn_down.weight" {
                GgmlType::IQ2_XXS
            } else {
                ty
            },
            dims.to_vec(),
        ))
    })
    .err()
    .unwrap();
    assert!(
        err.to_string()
            .contains("blk.0.ffn_down.weight has type IQ2_XXS"),
        "{err}"
    );
}

#[test]
fn hyperparameter_errors_name_the_key() {
    type Edit = Box<dyn Fn(&str, &Value) -> Option<Value>>;
    let set = |key: &'static str, to: Value| -> Edit {
        Box::new(move |k, v| Some(if k == key { to.clone() } else { v.clone() }))
    };
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "tiny-qwen3moe.q4_k_m.gguf",
            set("general.architecture", Value::String("gptj".into())),
            "unsupported architecture 'gptj'",
        ),
        (
            "tiny-qwen3moe.q4_k_m.gguf",
            Box::new(|k, v| (k != "qwen3moe.block_count").then(|| v.clone())),
            "qwen3moe.block_count",
        ),
        (
            "tiny-qwen3moe.q4_k_m.gguf",
            set("qwen3moe.expert_used_count", Value::U32(9)),
            "9 is more than expert_count 8",
        ),
        (
            "tiny-qwen3moe.q4_k_m.gguf",
            set("qwen3moe.attention.head_count_kv", Value::U32(3)),
            "not a multiple of 3 KV heads",
        ),
        (
            "tiny-qwen3moe.q4_k_m.gguf",
            set("qwen3moe.attention.value_length", Value::U32(0)),
            "qwen3moe.attention.value_length",
        ),
        (
            "tiny-qwen3-yarn.q8_0.gguf",
            set("qwen3.rope.scaling.type", Value::String("longrope".into())),
            "unsupported RoPE scaling 'longrope'",
        ),
        (
            "tiny-qwen3-yarn.q8_0.gguf",
            set("qwen3.rope.scaling.factor", Value::F32(f32::NAN)),
            "qwen3.rope.scaling.factor",
        ),
    ];
    for (file, edit, needle) in cases {
        let err = rebuilt(file, edit, keep_tensor)
            .err()
            .unwrap_or_else(|| panic!("{file} loaded despite: {needle}"));
        assert!(
            err.to_string().contains(needle),
            "expected `{needle}`: {err}"
        );
    }
}

#[test]
fn gemma3_layers_from_the_metadata() {
    use common::{bools, Tiny};
    let layers = |t: Tiny| {
        let m = Model::load(t.build(1)).unwrap();
        let c = m.config;
        let w: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
        let bases: Vec<f32> = c.layers.iter().map(|l| c.ropes[l.rope].freq_base).collect();
        (w, bases, c.layers[0].attn_scale, c.logit_softcap)
    };
    // Five sliding layers per global one; local RoPE base 10,000 unless the file says.
    let (w, bases, scale, cap) = layers(Tiny::gemma3());
    let (s, g) = (Some(5), None);
    assert_eq!(w, [s, s, s, s, s, g, s]);
    assert_eq!(bases, [1e4, 1e4, 1e4, 1e4, 1e4, 1e6, 1e4]);
    assert_eq!((scale, cap), (1.0 / 32f32.sqrt(), None));
    // The pattern as a period, as a list; a window of 0 turns sliding off; the file's local base.
    let (w, ..) = layers(Tiny::gemma3().with("attention.sliding_window_pattern", Value::U32(3)));
    assert_eq!(w, [s, s, g, s, s, g, s]);
    let pattern = bools(&[false, true, false, false, false, false, true]);
    let (w, ..) = layers(Tiny::gemma3().with("attention.sliding_window_pattern", pattern));
    assert_eq!(w, [g, s, g, g, g, g, s]);
    let (w, bases, ..) = layers(Tiny::gemma3().with("attention.sliding_window", Value::U32(0)));
    assert_eq!((w, bases), (vec![None; 7], vec![1e6; 7]));
    let (_, bases, ..) = layers(Tiny::gemma3().with("rope.freq_base_swa", Value::F32(500.0)));
    assert_eq!(bases[..2], [500.0, 500.0]);
    let (.., cap) = layers(Tiny::gemma3().with("final_logit_softcapping", Value::F32(30.0)));
    assert_eq!(cap, Some(30.0));
    // Gemma 3 27B (62 layers): query_pre_attn_scalar is n_embd / n_head, not head_dim.
    let big = Tiny {
        n_layer: 62,
        ..Tiny::gemma3()
    };
    let (.., scale, _) = layers(big);
    assert_eq!(scale, 1.0 / ((64 / 2) as f32).sqrt());
    // A llama file's window is not read.
    let m = Model::load(
        Tiny::llama()
            .with("attention.sliding_window", Value::U32(4))
            .build(1),
    )
    .unwrap();
    assert!(m.config.layers.iter().all(|l| l.window.is_none()));

    for (key, value, needle) in [
        (
            "attention.sliding_window_pattern",
            bools(&[true, false]),
            "2 entries for 7 layers",
        ),
        (
            "final_logit_softcapping",
            Value::F32(-1.0),
            "gemma3.final_logit_softcapping",
        ),
        (
            "rope.freq_base_swa",
            Value::F32(f32::NAN),
            "gemma3.rope.freq_base_swa",
        ),
    ] {
        let err = Model::load(Tiny::gemma3().with(key, value).build(1))
            .err()
            .unwrap_or_else(|| panic!("loaded despite {key}"));
        assert!(
            err.to_string().contains(needle),
            "expected `{needle}`: {err}"
        );
    }
}

#[test]
fn gemma2_defaults_as_llama_cpp() {
    use common::Tiny;
    // Without the keys: a window of 4096 on every other layer, the global RoPE table for all,
    // attention and logits capped at 50 and 30.
    let bare = Tiny {
        extra: vec![],
        ..Tiny::gemma2()
    };
    let c = Model::load(bare.build(1)).unwrap().config;
    let w: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
    assert_eq!(w, [Some(4096), None, Some(4096), None]);
    assert_eq!(c.ropes.len(), 1);
    assert!(c.layers.iter().all(|l| l.attn_softcap == Some(50.0)));
    assert_eq!(c.logit_softcap, Some(30.0));
    // The file's values; a local base of its own keeps the global scale.
    let c = Model::load(
        Tiny::gemma2()
            .with("rope.freq_base_swa", Value::F32(500.0))
            .build(1),
    )
    .unwrap()
    .config;
    assert_eq!(c.layers[0].window, Some(5));
    assert_eq!(
        (c.layers[0].attn_softcap, c.logit_softcap),
        (Some(2.0), Some(3.0))
    );
    let local = &c.ropes[c.layers[0].rope];
    assert_eq!((local.freq_base, local.freq_scale), (500.0, 1.0));
    assert_eq!(c.ropes[c.layers[1].rope].freq_base, 10_000.0);
}

#[test]
fn quantized_kv_cache_needs_whole_blocks_per_head() {
    // Heads of 24 elements are not whole 32-element blocks: a q8_0 or q4_0 cache is refused by
    // name, before anything is written; f16 runs.
    use hearth_model::{Batch, KvCache, KvType, Scratch, ThreadPool};
    let model = Model::load(common::Tiny::qwen3().build(1)).unwrap();
    let c = &model.config;
    assert_eq!(c.head_dim, 24);
    let pool = ThreadPool::new(1);
    let mut scratch = Scratch::new(&model, 4);
    let batch = Batch {
        tokens: &[1, 2],
        pos: &[0, 1],
        seq: &[0, 0],
        logits: &[false, true],
    };
    for ty in KvType::ALL {
        let mut kv = KvCache::new(1, c.n_layer, 64, c.kv_dims(), ty);
        let got = model.forward(&pool, &mut kv, &mut scratch, &batch, None);
        match ty {
            KvType::F16 | KvType::F32 => assert!(got.is_ok()),
            _ => {
                let e = got.unwrap_err();
                assert!(matches!(e, ModelError::KvType { .. }), "{e}");
                assert!(
                    e.to_string().contains(ty.name()) && e.to_string().contains("24"),
                    "{e}"
                );
            }
        }
    }
}
