//! Times mask computation on a real vocabulary, by hand:
//! `cargo run --release -p hearth-constrain --example mask_timing -- MODEL.gguf SCHEMA.json`.
//! Follows the schema with the first allowed token that is not end of generation, printing the
//! time of each mask.

use std::sync::Arc;
use std::time::Instant;

use hearth_constrain::{Constrainer, Spec};
use hearth_tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(model), Some(schema)) = (args.get(1), args.get(2)) else {
        return Err("usage: mask_timing MODEL.gguf SCHEMA.json".into());
    };
    let tok = Arc::new(Tokenizer::open(model)?);
    let n_vocab = tok.vocab_size();
    let t = Instant::now();
    let c = Constrainer::new(tok.clone(), n_vocab)?;
    eprintln!("trie: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let schema = serde_json::from_str(&std::fs::read_to_string(schema)?)?;
    let t = Instant::now();
    let g = c.compile(&Spec::JsonSchema(schema))?;
    eprintln!("compile: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut s = g.start();
    let mut logits = vec![0.0f32; n_vocab];
    let mut total = 0.0;
    let mut text = Vec::new();
    for step in 0..200 {
        let t = Instant::now();
        s.compute_mask()?;
        let dt = t.elapsed().as_secs_f64() * 1e3;
        total += dt;
        logits.fill(0.0);
        s.apply(&mut logits)?;
        let allowed: Vec<u32> = (0..n_vocab as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        // The longest allowed token, to move through the schema like a real model would.
        let Some(&next) = allowed
            .iter()
            .filter(|&&i| !tok.is_eog(i))
            .max_by_key(|&&i| (tok.token_to_piece(i, false).len(), std::cmp::Reverse(i)))
        else {
            break;
        };
        eprintln!("step {step}: {dt:.3} ms, {} allowed", allowed.len());
        s.commit(next)?;
        text.extend_from_slice(tok.token_to_piece(next, false));
        if s.is_finished() {
            break;
        }
    }
    eprintln!(
        "{}\ntotal mask time {total:.1} ms",
        String::from_utf8_lossy(&text)
    );
    Ok(())
}
