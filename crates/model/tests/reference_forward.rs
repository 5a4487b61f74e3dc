//! The decoder against the naive reference forward ([`reference`]) on random tiny models of every
//! architecture: two sequences batched together, a prefill chunk then token-by-token decode, every
//! position's logits compared.
//!
//! Tolerance. The tiny models have F32 weights, so the decoder's products run on f32 activations
//! (no 8-bit activation quantization) and an f32 KV cache is used; what remains is rounding: f32
//! sums in another order than the reference's f64 sums, the decoder's polynomial `exp`, RoPE angles
//! by repeated f32 multiplication (ggml's way) against the reference's f64 powers. Measured, these
//! put every logit within 3e-7 to 3.4e-6 of the reference (relative to the largest logit's
//! magnitude, at least 1; the most over 150 positions). The bound is 1e-4: thirty times that, and
//! far below what a wrong formula does —
//! [`a_wrong_reading_of_the_file_is_caught`] shows each Gemma-specific switch flipped (a window one
//! wider, or none; the local RoPE base; the activation; the embedding scale; soft-capping) moves the
//! logits by 0.27 or more.

mod common;
mod reference;

use common::{bools, Tiny};
use hearth_gguf::Value;
use hearth_model::{Batch, KvCache, KvType, Model, Scratch, ThreadPool};
use reference::Reference;

const TOLERANCE: f32 = 1e-4;

fn sequences(n_vocab: usize) -> Vec<Vec<u32>> {
    let a = (0..23).map(|i| ((i * 37 + 11) % n_vocab) as u32).collect();
    let b = (0..14).map(|i| ((i * 53 + 5) % n_vocab) as u32).collect();
    vec![a, b]
}

/// Every position's logits `[seq][pos][n_vocab]` from the decoder: the first `prefill` tokens of
/// every sequence in one batch, then one token of each per step.
fn decoder(model: &Model, seqs: &[Vec<u32>], prefill: usize) -> Vec<Vec<Vec<f32>>> {
    let c = &model.config;
    let pool = ThreadPool::new(2);
    let longest = seqs.iter().map(Vec::len).max().unwrap();
    let mut kv = KvCache::new(seqs.len(), c.n_layer, longest, c.kv_dims(), KvType::F32);
    let mut scratch = Scratch::new(model, seqs.len() * prefill.max(1));
    let mut out = vec![Vec::new(); seqs.len()];
    let mut start = 0;
    while start < longest {
        let end = if start == 0 { prefill } else { start + 1 };
        let (mut tokens, mut pos, mut seq) = (vec![], vec![], vec![]);
        for (s, toks) in seqs.iter().enumerate() {
            for (p, &t) in toks.iter().enumerate().take(end).skip(start) {
                tokens.push(t);
                pos.push(p);
                seq.push(s);
            }
        }
        let want = vec![true; tokens.len()];
        let batch = Batch {
            tokens: &tokens,
            pos: &pos,
            seq: &seq,
            logits: &want,
        };
        let logits = model
            .forward(&pool, &mut kv, &mut scratch, &batch, None)
            .unwrap();
        for (row, &s) in logits.chunks_exact(c.n_vocab).zip(&seq) {
            out[s].push(row.to_vec());
        }
        start = end;
    }
    out
}

fn reference(r: &Reference, seqs: &[Vec<u32>]) -> Vec<Vec<Vec<f32>>> {
    seqs.iter()
        .map(|toks| {
            let mut s = r.sequence();
            toks.iter().map(|&t| r.step(&mut s, t)).collect()
        })
        .collect()
}

/// The largest difference between two runs, relative to the largest reference logit (at least 1).
fn worst(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    let mut worst = 0f32;
    for (sa, sb) in a.iter().zip(b) {
        assert_eq!(sa.len(), sb.len());
        for (ra, rb) in sa.iter().zip(sb) {
            let scale = rb.iter().fold(1f32, |m, v| m.max(v.abs()));
            for (x, y) in ra.iter().zip(rb) {
                worst = worst.max((x - y).abs() / scale);
            }
        }
    }
    worst
}

fn agrees(name: &str, tiny: &Tiny) {
    agrees_on(name, tiny, &sequences(tiny.n_vocab), &[9, 1]);
}

fn agrees_on(name: &str, tiny: &Tiny, seqs: &[Vec<u32>], prefills: &[usize]) {
    let gguf = tiny.build(7);
    let model = Model::load(gguf.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = Reference::new(&gguf);
    let want = reference(&r, seqs);
    for &prefill in prefills {
        let got = decoder(&model, seqs, prefill);
        let w = worst(&got, &want);
        println!("{name}, prefill {prefill}: worst relative difference {w:.2e}");
        assert!(
            w < TOLERANCE,
            "{name}, prefill {prefill}: {w:.2e} from the reference"
        );
    }
}

#[test]
fn llama() {
    agrees("llama", &Tiny::llama());
}

#[test]
fn qwen2() {
    agrees("qwen2", &Tiny::qwen2());
}

#[test]
fn qwen3() {
    agrees("qwen3", &Tiny::qwen3());
}

#[test]
fn qwen3moe() {
    agrees("qwen3moe", &Tiny::qwen3moe());
}

#[test]
fn gemma3() {
    agrees("gemma3", &Tiny::gemma3());
}

#[test]
fn gemma2() {
    agrees("gemma2", &Tiny::gemma2());
}

#[test]
fn gemma2_caps_are_caught() {
    // The attention cap (a kernel step) and the final cap each move the logits far past the bound.
    let tiny = Tiny::gemma2();
    let gguf = tiny.build(7);
    let model = Model::load(gguf.clone()).unwrap();
    let seqs = sequences(tiny.n_vocab);
    let got = decoder(&model, &seqs, 9);
    for (what, mutate) in [
        (
            "attention not capped",
            (|h| h.attn_softcap = None) as fn(&mut reference::Hparams),
        ),
        ("logits not capped", |h| h.softcap = None),
        ("every layer global", |h| {
            h.window.iter_mut().for_each(|w| *w = None)
        }),
    ] {
        let mut r = Reference::new(&gguf);
        mutate(&mut r.hp);
        let w = worst(&got, &reference(&r, &seqs));
        println!("{what}: {w:.2e}");
        assert!(
            w > 100.0 * TOLERANCE,
            "{what}: only {w:.2e} from the decoder"
        );
    }
}

#[test]
fn gemma3_with_soft_capping_and_a_listed_pattern() {
    // Gemma 2's final soft-capping (llama.cpp's gemma3 reads the key too), a low cap so it bites;
    // the sliding layers given as a list; a local RoPE base of the file's.
    let t = Tiny::gemma3()
        .with("final_logit_softcapping", Value::F32(2.0))
        .with(
            "attention.sliding_window_pattern",
            bools(&[true, false, true, true, false, true, true]),
        )
        .with("rope.freq_base_swa", Value::F32(500.0));
    agrees("gemma3 soft-capped", &t);
}

#[test]
fn windows_across_key_blocks() {
    // A window of 70 positions over sequences of 150 and 90: windows start inside the second and
    // third blocks of 64 keys, and a prefill of 40 rows puts rows of one task on both sides of a
    // block boundary.
    let t = Tiny::gemma3().with("attention.sliding_window", Value::U32(70));
    let n = t.n_vocab;
    let seqs: Vec<Vec<u32>> = [150, 90]
        .iter()
        .map(|&len| (0..len).map(|i| ((i * 29 + len) % n) as u32).collect())
        .collect();
    agrees_on("gemma3, window 70", &t, &seqs, &[40]);
}

#[test]
fn every_layer_sliding() {
    // Mistral-style: a window on every layer (pattern period 0).
    let t = Tiny::gemma3().with("attention.sliding_window_pattern", Value::U32(0));
    agrees("gemma3, every layer sliding", &t);
}

#[test]
fn a_wrong_reading_of_the_file_is_caught() {
    let tiny = Tiny::gemma3();
    let gguf = tiny.build(7);
    let model = Model::load(gguf.clone()).unwrap();
    let seqs = sequences(tiny.n_vocab);
    let got = decoder(&model, &seqs, 9);
    type Mutation = fn(&mut reference::Hparams);
    let mutations: [(&str, Mutation); 6] = [
        ("window one wider", |h| {
            h.window.iter_mut().flatten().for_each(|w| *w += 1)
        }),
        ("local layers at the global RoPE base", |h| {
            let global = h.rope_base[5];
            h.rope_base.iter_mut().for_each(|b| *b = global)
        }),
        ("SiLU instead of GELU", |h| h.gelu = false),
        ("embeddings not scaled", |h| h.embd_scale = 1.0),
        ("soft-capped at 2", |h| h.softcap = Some(2.0)),
        ("no sliding window", |h| {
            h.window.iter_mut().for_each(|w| *w = None)
        }),
    ];
    for (what, mutate) in mutations {
        let mut r = Reference::new(&gguf);
        mutate(&mut r.hp);
        let w = worst(&got, &reference(&r, &seqs));
        println!("{what}: {w:.2e}");
        assert!(
            w > 100.0 * TOLERANCE,
            "{what}: only {w:.2e} from the decoder"
        );
    }
}

/// By hand, for a real model: the reference's own golden lines (`top_per_pos`, `top`, greedy) for
/// the prompts of an existing golden, to set beside llama.cpp's and the decoder's with
/// compare_golden.py. `HEARTH_REFERENCE_MODEL`, `HEARTH_REFERENCE_GOLDEN`, `HEARTH_REFERENCE_OUT`;
/// slow (every weight row is dequantized as it is used).
#[test]
#[ignore]
fn reference_golden_of_a_real_model() {
    use std::io::Write;
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("set {k}"));
    let gguf = hearth_gguf::Gguf::open(var("HEARTH_REFERENCE_MODEL")).unwrap();
    let r = Reference::new(&gguf);
    let golden = std::fs::read_to_string(var("HEARTH_REFERENCE_GOLDEN")).unwrap();
    let mut out = std::fs::File::create(var("HEARTH_REFERENCE_OUT")).unwrap();
    let top = |lg: &[f32], k: usize| {
        let mut ids: Vec<usize> = (0..lg.len()).collect();
        ids.sort_by(|&a, &b| lg[b].total_cmp(&lg[a]));
        ids[..k].iter().map(|&i| (i, lg[i])).collect::<Vec<_>>()
    };
    for line in golden.lines() {
        let g: serde_json::Value = serde_json::from_str(line).unwrap();
        let prompt: Vec<u32> = g["prompt"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let n_gen = g["greedy"].as_array().unwrap().len();
        let mut s = r.sequence();
        let per_pos: Vec<Vec<f32>> = prompt.iter().map(|&t| r.step(&mut s, t)).collect();
        let mut last = per_pos.last().unwrap().clone();
        let (mut greedy, mut greedy_top) = (vec![], vec![]);
        for i in 0..n_gen {
            let t = top(&last, 5);
            greedy.push(t[0].0);
            greedy_top.push(t);
            if i + 1 < n_gen {
                last = r.step(&mut s, greedy[i] as u32);
            }
        }
        let j = serde_json::json!({
            "prompt": prompt,
            "top_per_pos": per_pos.iter().map(|l| top(l, 5)).collect::<Vec<_>>(),
            "top": top(per_pos.last().unwrap(), 10),
            "greedy": greedy,
            "greedy_top": greedy_top,
        });
        writeln!(out, "{j}").unwrap();
    }
}
