//! Behaviour of the public API beyond the reference vectors: special tokens only on request,
//! streaming detokenization in whole characters, bad ids and odd input never panic, clear errors,
//! and speed on a 4 KB prompt.

use hearth_tokenizer::{Tokenizer, TokenizerError, VocabSpec};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

fn shared(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/")).join(rel)
}

fn load(rel: &str) -> Tokenizer {
    let g = hearth_gguf::Gguf::open(shared(rel)).unwrap();
    Tokenizer::from_gguf(g.metadata()).unwrap()
}

fn tiny() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("fixtures/tiny-qwen3.q4_0.gguf"))
}

fn qwen2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("tokenizers/llama.cpp-vocab/ggml-vocab-qwen2.gguf"))
}

fn spm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("tokenizers/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"))
}

#[test]
fn control_tokens_are_parsed_only_on_request() {
    let t = tiny();
    let im_end = t.token_id("<|im_end|>").unwrap();
    assert_eq!(t.encode("<|im_end|>", true), vec![im_end]);
    let plain = t.encode("<|im_end|>", false);
    assert!(!plain.contains(&im_end));
    assert_eq!(t.decode(&plain, false), "<|im_end|>");
    // Rendering: control tokens are empty unless asked for.
    assert!(t.token_to_piece(im_end, false).is_empty());
    assert_eq!(t.token_to_piece(im_end, true), b"<|im_end|>");
    assert_eq!(t.decode(&[im_end], false), "");
    // Around text, with the gaps tokenized normally.
    let ids = t.encode("a<|im_start|>user\nhi<|im_end|>", true);
    assert_eq!(ids[1], t.token_id("<|im_start|>").unwrap());
    assert_eq!(*ids.last().unwrap(), im_end);
    assert_eq!(t.decode(&ids, true), "a<|im_start|>user\nhi<|im_end|>");
}

#[test]
fn end_of_generation_ids() {
    let t = tiny();
    for s in ["<|im_end|>", "<|endoftext|>"] {
        assert!(t.is_eog(t.token_id(s).unwrap()), "{s}");
    }
    assert!(!t.is_eog(t.token_id("<|im_start|>").unwrap()));
    assert!(!t.is_eog(u32::MAX));
    assert!(t.eos_id().is_some_and(|e| t.is_eog(e)));
    // SentencePiece: </s> and add_bos by default.
    let s = spm();
    assert!(s.add_bos());
    assert_eq!(s.bos_id(), Some(1));
    assert!(s.is_eog(2));
    assert_eq!(s.encode_with_specials("Hi", true, false)[0], 1);
    assert_eq!(
        s.decode(&s.encode("Hello world", false), false),
        "Hello world"
    );
}

#[test]
fn prompt_line_convention() {
    let t = tiny();
    let ids = t.encode_prompt_line("<|im_start|>user\\nHi<|im_end|>\\n");
    assert_eq!(ids, t.encode("<|im_start|>user\nHi<|im_end|>\n", true));
    // Only "\n" is unescaped.
    assert_eq!(t.decode(&t.encode_prompt_line("a\\tb"), true), "a\\tb");
}

fn check_stream(t: &Tokenizer, text: &str) {
    let ids = t.encode(text, false);
    let mut dec = t.stream_decoder(false).at_text_start();
    let mut out = String::new();
    for &id in &ids {
        let s = dec.push(id);
        assert!(!s.contains('\u{FFFD}'), "{text:?}: partial char emitted");
        out.push_str(&s);
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
    assert_eq!(out, t.decode(&ids, false));
}

#[test]
fn stream_decoder_emits_whole_characters() {
    // The tiny vocabulary has no multi-byte merges: every emoji is four byte tokens.
    let t = tiny();
    let ids = t.encode("é🦙", false);
    assert!(ids.len() >= 6, "{ids:?}");
    let mut dec = t.stream_decoder(false);
    assert_eq!(dec.push(ids[0]), "");
    assert_eq!(dec.pending_bytes().len(), 1);
    assert_eq!(dec.push(ids[1]), "é");
    let rest: String = ids[2..].iter().map(|&id| dec.push(id)).collect();
    assert_eq!(rest, "🦙");
    assert_eq!(dec.finish(), "");
    for text in ["Grüße, 世界! 🚀🦙 ok", "😶‍🌫️ ąčę", " leading", ""] {
        check_stream(t, text);
        check_stream(qwen2(), text);
        check_stream(spm(), text);
    }
}

#[test]
fn stream_decoder_keeps_the_space_of_a_continuation() {
    let s = spm();
    let ids = s.encode("Hello world", false);
    let mut dec = s.stream_decoder(false);
    let text: String = ids.iter().map(|&id| dec.push(id)).collect();
    assert_eq!(text, " Hello world");
    let mut dec = s.stream_decoder(false).at_text_start();
    let text: String = ids.iter().map(|&id| dec.push(id)).collect();
    assert_eq!(text, "Hello world");
}

#[test]
fn stream_decoder_flushes_incomplete_bytes() {
    let t = tiny();
    let ids = t.encode("🦙", false);
    let mut dec = t.stream_decoder(false);
    assert_eq!(dec.push(ids[0]), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
    // An invalid byte in the middle is replaced at once, and the rest still decodes.
    let mut dec = t.stream_decoder(false);
    let cont = ids[1]; // a continuation byte cannot start a character
    assert_eq!(dec.push(cont), "\u{FFFD}");
    let a = t.encode("a", false);
    assert_eq!(dec.push(a[0]), "a");
}

#[test]
fn bad_ids_never_panic() {
    for t in [tiny(), qwen2(), spm()] {
        let n = t.vocab_size() as u32;
        for id in [n, n + 1, u32::MAX, i32::MAX as u32] {
            assert!(t.token_to_piece(id, true).is_empty());
            assert_eq!(t.token_text(id), "");
            assert!(!t.is_eog(id));
        }
        assert_eq!(t.decode(&[u32::MAX, n], true), "");
        let mut dec = t.stream_decoder(true);
        assert_eq!(dec.push(u32::MAX), "");
        assert!(t.token_id("definitely not a token \u{1}").is_none());
    }
}

#[test]
fn odd_input_never_panics() {
    // Deterministic pseudo-random strings over a mix of code point ranges.
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let ranges: [(u32, u32); 6] = [
        (0, 0x80),
        (0x80, 0x800),
        (0x2000, 0x2100),
        (0xD7F0, 0xE010),
        (0xFFF0, 0x10000),
        (0x1F300, 0x1F700),
    ];
    for _ in 0..300 {
        let len = next() % 40;
        let s: String = (0..len)
            .filter_map(|_| {
                let (lo, hi) = ranges[(next() % 6) as usize];
                char::from_u32(lo + (next() % u64::from(hi - lo)) as u32)
            })
            .collect();
        for t in [tiny(), qwen2(), spm()] {
            for parse in [false, true] {
                let ids = t.encode(&s, parse);
                assert!(ids.iter().all(|&id| (id as usize) < t.vocab_size()));
                let _ = t.decode(&ids, true);
            }
        }
        // Byte-level BPE round-trips everything (no clean-up for qwen2).
        assert_eq!(qwen2().decode(&qwen2().encode(&s, false), false), s);
    }
}

#[test]
fn unknown_model_or_pre_is_an_error_naming_it() {
    let spec = |model: &str, pre: Option<&str>| VocabSpec {
        model: model.into(),
        pre: pre.map(str::to_string),
        tokens: vec!["a".into(), "b".into()],
        merges: Some(vec![]),
        ..VocabSpec::default()
    };
    let e = Tokenizer::from_spec(spec("gpt2", Some("mystery-pre"))).unwrap_err();
    assert!(matches!(&e, TokenizerError::UnknownPre(p) if p == "mystery-pre"));
    let msg = e.to_string();
    assert!(
        msg.contains("mystery-pre") && msg.contains("refusing to guess"),
        "{msg}"
    );
    let e = Tokenizer::from_spec(spec("bert-ish", None)).unwrap_err();
    assert!(e.to_string().contains("bert-ish"), "{e}");
    // Duplicate tokens and a missing merges list are refused too.
    let mut dup = spec("gpt2", Some("qwen2"));
    dup.tokens = vec!["a".into(), "a".into()];
    assert!(matches!(
        Tokenizer::from_spec(dup),
        Err(TokenizerError::DuplicateToken { .. })
    ));
    let mut no_merges = spec("gpt2", Some("qwen2"));
    no_merges.merges = None;
    assert!(Tokenizer::from_spec(no_merges).is_err());
    // add_bos_token without a BOS id.
    let mut no_bos = spec("gpt2", Some("qwen2"));
    no_bos.add_bos = Some(true);
    no_bos.bos = Some(99);
    let t = Tokenizer::from_spec(no_bos);
    // 99 is out of range, so llama.cpp falls back to its default BOS (11), also out of range.
    assert!(matches!(t, Err(TokenizerError::MissingSpecial { .. })));
}

#[test]
fn four_kilobyte_prompt_is_fast() {
    let t = qwen2();
    let unit =
        "The quick brown fox, 12345 times: «ça va?» — 日本語のテキスト 🦙 fn main() { x += 1; }\n";
    let mut text = String::new();
    while text.len() < 4096 {
        text.push_str(unit);
    }
    // Cold (no cached words) and warm.
    let fresh = load("tokenizers/llama.cpp-vocab/ggml-vocab-qwen2.gguf");
    let t0 = Instant::now();
    let ids = fresh.encode(&text, true);
    let cold = t0.elapsed();
    let t0 = Instant::now();
    let again = t.encode(&text, true);
    let warm = t0.elapsed();
    assert_eq!(ids, again);
    eprintln!(
        "4 KB prompt: {} tokens, {cold:?} cold, {warm:?} warm",
        ids.len()
    );
    assert!(
        cold.as_millis() < 300,
        "4 KB took {cold:?} cold ({warm:?} warm)"
    );
    // A single 4 KB "word" (no pre-tokenizer splits) stays fast too.
    let word = "x".repeat(4096);
    let t0 = Instant::now();
    let _ = fresh.encode(&word, false);
    assert!(t0.elapsed().as_millis() < 300, "{:?}", t0.elapsed());
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    let t = qwen2();
    let want = t.encode("shared across threads 🦙", false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert_eq!(t.encode("shared across threads 🦙", false), want));
        }
    });
}
