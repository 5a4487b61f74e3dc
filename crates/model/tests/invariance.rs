//! Batch invariance: a sequence's logits are bit-identical alone or in a batch with other sequences,
//! prefilled in one piece, in chunks or token by token, and with 1 or 2 threads.

mod common;

use std::path::Path;

use hearth_model::{Batch, KvCache, KvType, Model, Scratch, ThreadPool};

fn fixture(name: &str) -> Model {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name);
    Model::open(&path).unwrap()
}

/// Prompts as (sequence slot, tokens).
fn prompts(n_vocab: u32) -> Vec<Vec<u32>> {
    let a: Vec<u32> = (0..37).map(|i| (i * 7 + 3) % n_vocab).collect();
    let b: Vec<u32> = (0..23).map(|i| (i * 13 + 100) % n_vocab).collect();
    vec![a, b]
}

/// Runs the sequences through the model, `chunk` tokens of each per step, all sequences' chunks in
/// one batch when `together`; returns every position's logits per sequence.
fn run(
    model: &Model,
    threads: usize,
    chunk: usize,
    together: bool,
    kv_type: KvType,
) -> Vec<Vec<Vec<f32>>> {
    run_wanting(model, threads, chunk, together, kv_type, |_| true)
}

/// [`run`], asking for the logits of the positions `want` accepts only.
fn run_wanting(
    model: &Model,
    threads: usize,
    chunk: usize,
    together: bool,
    kv_type: KvType,
    wanted: impl Fn(usize) -> bool,
) -> Vec<Vec<Vec<f32>>> {
    let seqs = prompts(model.config.n_vocab as u32);
    run_prompts(model, &seqs, threads, chunk, together, kv_type, wanted)
}

/// [`run_wanting`] on the given prompts.
fn run_prompts(
    model: &Model,
    seqs: &[Vec<u32>],
    threads: usize,
    chunk: usize,
    together: bool,
    kv_type: KvType,
    wanted: impl Fn(usize) -> bool,
) -> Vec<Vec<Vec<f32>>> {
    let c = &model.config;
    let pool = ThreadPool::new(threads);
    let longest = seqs.iter().map(Vec::len).max().unwrap();
    let n_ctx = longest.next_multiple_of(64);
    let mut kv = KvCache::new(seqs.len(), c.n_layer, n_ctx, c.kv_dims(), kv_type);
    let mut scratch = Scratch::new(model, (chunk * seqs.len()).max(64));
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); seqs.len()];
    for start in (0..longest).step_by(chunk) {
        let groups: Vec<Vec<usize>> = if together {
            vec![(0..seqs.len()).collect()]
        } else {
            (0..seqs.len()).map(|s| vec![s]).collect()
        };
        for group in groups {
            let (mut tokens, mut pos, mut seq, mut want) = (vec![], vec![], vec![], vec![]);
            for &s in &group {
                for (p, &t) in seqs[s].iter().enumerate().skip(start).take(chunk) {
                    tokens.push(t);
                    pos.push(p);
                    seq.push(s);
                    want.push(wanted(p));
                }
            }
            if tokens.is_empty() {
                continue;
            }
            let batch = Batch {
                tokens: &tokens,
                pos: &pos,
                seq: &seq,
                logits: &want,
            };
            let logits = model
                .forward(&pool, &mut kv, &mut scratch, &batch, None)
                .unwrap();
            let wanted_seqs = seq.iter().zip(&want).filter(|(_, &w)| w).map(|(s, _)| s);
            for (row, &s) in logits.chunks_exact(c.n_vocab).zip(wanted_seqs) {
                out[s].push(row.to_vec());
            }
        }
    }
    out
}

fn assert_invariant(name: &str) {
    assert_model_invariant(name, &fixture(name));
}

/// Past one chunk of attention's depth split (256 keys): decode steps split a row's context over
/// tasks of one or more chunks (more with fewer threads) and merge the chunks' states afterwards,
/// prefill tasks fold them as they go; the logits are the same bits whichever ran, with any thread
/// count and batch mix. Past 8
/// chunks (2048 keys) a decode task with 2 threads takes all KV heads of its chunk.
fn assert_depth_invariant(name: &str, model: &Model) {
    let n_vocab = model.config.n_vocab as u32;
    let seqs: Vec<Vec<u32>> = vec![
        (0..2200).map(|i| (i * 7 + 3) % n_vocab).collect(),
        (0..300).map(|i| (i * 13 + 100) % n_vocab).collect(),
    ];
    // The positions past the first chunk, where the formulations could differ.
    let late = |p: usize| p >= 250 && p.is_multiple_of(7) || p > 2100;
    for kv_type in [KvType::F16, KvType::Q8_0] {
        let reference = run_prompts(model, &seqs, 1, 64, false, kv_type, late);
        for (threads, chunk, together) in [(2, 1, false), (2, 1, true), (3, 64, true), (1, 9, true)]
        {
            let got = run_prompts(model, &seqs, threads, chunk, together, kv_type, late);
            assert!(
                got == reference,
                "{name}: logits at depth differ with {threads} threads, chunks of {chunk}, \
                 batched together: {together}, {kv_type:?}"
            );
        }
    }
}

#[test]
fn attention_depth_split_is_invariant() {
    for name in ["tiny-qwen3moe.q4_k_m.gguf", "tiny-llama3.q4_k_m.gguf"] {
        assert_depth_invariant(name, &fixture(name));
    }
}

/// Eight sequences decoding a token each in one batch (the server's step), where attention gives
/// each sequence one task over all its KV heads (from 4 single-row sequences per thread): the same
/// bits as each sequence alone, on 1 and 2 threads, past one KV block (64 positions) and with the
/// sequences at different depths.
#[test]
fn many_sequences_decoding_together_are_batch_invariant() {
    for name in ["tiny-qwen3moe.q4_k_m.gguf", "tiny-llama3.q4_k_m.gguf"] {
        let model = fixture(name);
        let n_vocab = model.config.n_vocab as u32;
        let seqs: Vec<Vec<u32>> = (0..8u32)
            .map(|s| {
                (0..70 + 9 * s)
                    .map(|i| (i * (5 + 2 * s) + 17 * s) % n_vocab)
                    .collect()
            })
            .collect();
        for kv_type in [KvType::F16, KvType::Q8_0] {
            let reference = run_prompts(&model, &seqs, 1, 64, false, kv_type, |_| true);
            for threads in [1, 2] {
                let got = run_prompts(&model, &seqs, threads, 1, true, kv_type, |_| true);
                assert!(
                    got == reference,
                    "{name}: logits of 8 sequences decoding together differ, {threads} threads, \
                     {kv_type:?}"
                );
            }
        }
    }
}

fn assert_model_invariant(name: &str, model: &Model) {
    for kv_type in KvType::ALL {
        let reference = run(model, 1, 64, false, kv_type);
        for (threads, chunk, together) in [
            (2, 64, false),
            (1, 64, true),
            (2, 5, true),
            (2, 1, false),
            (1, 1, true),
            (2, 16, false),
        ] {
            let got = run(model, threads, chunk, together, kv_type);
            assert!(
                got == reference,
                "{name}: logits differ with {threads} threads, chunks of {chunk}, batched together: {together}, {kv_type:?}"
            );
        }
        // Asking for fewer rows' logits (the last layer's FFN then runs on those alone, and on none
        // in a chunk without any) changes none of them.
        let every_third = |p: usize| p % 3 == 2;
        let want: Vec<Vec<Vec<f32>>> = reference
            .iter()
            .map(|rows| {
                let kept = rows.iter().enumerate().filter(|(p, _)| every_third(*p));
                kept.map(|(_, r)| r.clone()).collect()
            })
            .collect();
        for chunk in [5, 2] {
            let got = run_wanting(model, 2, chunk, true, kv_type, every_third);
            assert!(
                got == want,
                "{name}: logits differ when only some rows want them"
            );
        }
    }
}

/// Read into memory, the Q4_K and Q6_K matrices are laid out four rows at a time, those of the
/// legacy formats (Q4_0, Q4_1, Q5_1, Q8_0, IQ4_NL here) eight, at load where this CPU's kernels
/// have that layout (`hearth_quant::interleave`; x86-64 at every level from AVX2): the logits are
/// the same bits as from the mapped file's rows, and stay batch invariant. With AVX-512 the
/// prefill chunks of 64 and 5 tokens go through the 512-bit kernels loading the groups, the
/// one-token steps through the 256-bit ones.
#[test]
fn interleaved_weights_give_the_files_logits() {
    use hearth_quant::simd::interleaved_kernels;
    use hearth_quant::{kernel_isa, GgmlType};
    for name in [
        "tiny-qwen3moe.q4_k_m.gguf",
        "tiny-llama3.q4_k_m.gguf",
        "tiny-qwen2.q4_1.gguf",
        "tiny-qwen2.q5_1.gguf",
        "tiny-qwen3moe.q8_0.gguf",
        "tiny-qwen3.q4_0.gguf",
        "tiny-qwen3.iq4_nl.gguf",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures")
            .join(name);
        let g = hearth_gguf::Gguf::open_resident(&path, &mut |_, _| {}).unwrap();
        let model = Model::load(std::sync::Arc::new(g)).unwrap();
        let n = model.gguf().n_rewritten();
        if !interleaved_kernels(kernel_isa(), GgmlType::Q4_K) {
            assert_eq!(n, 0, "{name}: interleaved without kernels for it");
            println!("note: {name}: no interleaved kernels at {}", kernel_isa());
            continue;
        }
        assert!(n > 0, "{name}: no matrix interleaved");
        let q6 = model
            .gguf()
            .tensors()
            .iter()
            .filter(|t| t.ty == GgmlType::Q6_K && model.gguf().is_rewritten(t))
            .count();
        println!("{name}: {n} matrices interleaved, {q6} of them Q6_K");
        if q6 > 0 {
            println!("interleaved Q6_K");
        }
        assert!(
            !model.tok_embd.interleaved(),
            "{name}: token embeddings interleaved"
        );
        let mapped = fixture(name);
        for (threads, chunk, together) in [(1, 64, false), (2, 5, true), (2, 1, false)] {
            assert!(
                run(&model, threads, chunk, together, KvType::F16)
                    == run(&mapped, threads, chunk, together, KvType::F16),
                "{name}: interleaved logits differ, {threads} threads, chunks of {chunk}"
            );
        }
        assert_model_invariant(name, &model);
    }
}

#[test]
fn qwen3moe_is_batch_invariant() {
    assert_invariant("tiny-qwen3moe.q4_k_m.gguf");
}

#[test]
fn qwen2_is_batch_invariant() {
    assert_invariant("tiny-qwen2.q4_1.gguf");
}

#[test]
fn llama_is_batch_invariant() {
    assert_invariant("tiny-llama3.q4_k_m.gguf");
}

#[test]
fn gemma3_is_batch_invariant() {
    // A tiny random Gemma 3 in Q8_0 (8-bit activations, the fused GeGLU pass), a window of 5
    // positions: rows of one task see different key ranges, and chunks start inside windows.
    let tiny = common::Tiny {
        ty: hearth_quant::GgmlType::Q8_0,
        ..common::Tiny::gemma3()
    };
    let model = Model::load(tiny.build(3)).unwrap();
    assert_model_invariant("tiny gemma3 q8_0", &model);
}

#[test]
fn gemma2_is_batch_invariant() {
    // Soft-capped attention scores (the kernels' tanh) and logits, on 8-bit activations.
    let tiny = common::Tiny {
        ty: hearth_quant::GgmlType::Q8_0,
        ..common::Tiny::gemma2()
    };
    let model = Model::load(tiny.build(5)).unwrap();
    assert_model_invariant("tiny gemma2 q8_0", &model);
}
