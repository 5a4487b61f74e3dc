//! `hearth synth`: a `qwen3-moe-tiny` file of every `--quant` loads in Hearth and generates, reads back
//! through the `gguf` Python package with the types llama-quantize would give it and sane values
//! (tools/check_synth.py, when a Python with `gguf` is around), and the same seed writes the same bytes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hearth_model::Model;

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("running hearth")
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn synth(dir: &Path, file: &str, args: &[&str]) -> PathBuf {
    let path = dir.join(file);
    let mut all = vec!["synth"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", path.to_str().unwrap()]);
    ok(hearth(&all), &all.join(" "));
    path
}

/// `HEARTH_PYTHON`, else the repo's venv; `None` (with a note) when neither exists.
fn python() -> Option<PathBuf> {
    let p = std::env::var_os("HEARTH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "note: no Python with gguf at {} (set HEARTH_PYTHON); skipping the gguf read-back",
            p.display()
        );
        None
    }
}

fn check_with_gguf(path: &Path, preset: &str, quant: &str, extra: &[&str]) {
    let Some(py) = python() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/check_synth.py");
    let mut cmd = Command::new(py);
    cmd.arg(script)
        .arg(path)
        .args(["--preset", preset, "--quant", quant])
        .args(extra);
    let out = cmd.output().expect("running check_synth.py");
    assert!(
        out.status.success(),
        "check_synth.py {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn tiny_loads_generates_and_reads_back_for_every_quant() {
    let dir = tempfile::tempdir().unwrap();
    for quant in ["q4_k_m", "q8_0", "q4_0", "q6_k", "f16"] {
        let path = synth(
            dir.path(),
            &format!("tiny-{quant}.gguf"),
            &["qwen3-moe-tiny", "--quant", quant, "-t", "2"],
        );
        let model = Model::open(&path).unwrap_or_else(|e| panic!("{quant}: {e}"));
        let c = &model.config;
        assert_eq!(
            (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim),
            (4, 256, 8, 2, 64)
        );
        let moe = c.moe.as_ref().expect("a MoE model");
        assert_eq!((moe.n_expert, moe.n_expert_used, moe.n_ff_exp), (8, 2, 256));
        assert!(moe.norm_topk);

        let out = ok(
            hearth(&[
                "run",
                path.to_str().unwrap(),
                "-p",
                "hello",
                "-n",
                "8",
                "--temp",
                "0",
                "-t",
                "2",
            ]),
            quant,
        );
        assert!(!out.stdout.is_empty(), "{quant}: nothing generated");
        check_with_gguf(&path, "qwen3-moe-tiny", quant, &[]);

        // Activations stay in range and the router spreads tokens over the experts.
        let out = ok(
            hearth(&[
                "trace",
                path.to_str().unwrap(),
                "-p",
                "The quick brown fox jumps over the lazy dog again and again",
                "--json",
            ]),
            quant,
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            json["anomalies"].as_array().unwrap().is_empty(),
            "{quant}: {}",
            json["anomalies"]
        );
        for l in json["layers"].as_array().unwrap() {
            let std = l["l_out"]["std"].as_f64().unwrap();
            assert!(std > 0.3 && std < 5.0, "{quant}: l_out std {std}");
            let moe = &l["moe"];
            assert_eq!(moe["unused"], 0, "{quant}: {moe}");
            assert!(moe["entropy"].as_f64().unwrap() > 0.9, "{quant}: {moe}");
        }
    }
}

#[test]
fn gemma3_tiny_loads_and_reads_back() {
    // The sliding-window layers as Gemma 3's pattern makes them, post-norms bound, tied output.
    let dir = tempfile::tempdir().unwrap();
    let path = synth(
        dir.path(),
        "gemma3.gguf",
        &["gemma3-tiny", "--quant", "q8_0"],
    );
    let model = Model::open(&path).unwrap();
    let c = &model.config;
    assert_eq!(c.arch.name, "gemma3");
    let windows: Vec<_> = c.layers.iter().map(|l| l.window).collect();
    let (s, g) = (Some(16), None);
    assert_eq!(windows, [s, s, s, s, s, g, s, s]);
    assert_eq!(c.ropes[c.layers[0].rope].freq_base, 10_000.0);
    assert_eq!(c.ropes[c.layers[5].rope].freq_base, 1e6);
    assert_eq!(c.embd_scale, 16.0);
    assert!(model.output.is_none());
    assert!(model
        .layers
        .iter()
        .all(|l| l.attn_post_norm.is_some() && l.ffn_post_norm.is_some()));
    check_with_gguf(&path, "gemma3-tiny", "q8_0", &[]);
}

#[test]
fn gemma2_tiny_loads_and_reads_back() {
    // Every other layer slides, at the global RoPE base; scores and logits soft-capped.
    let dir = tempfile::tempdir().unwrap();
    let path = synth(
        dir.path(),
        "gemma2.gguf",
        &["gemma2-tiny", "--quant", "q8_0"],
    );
    let model = Model::open(&path).unwrap();
    let c = &model.config;
    assert_eq!(c.arch.name, "gemma2");
    let windows: Vec<_> = c.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    assert_eq!(c.ropes.len(), 1);
    assert_eq!(
        (c.layers[0].attn_softcap, c.logit_softcap),
        (Some(1.5), Some(3.0))
    );
    assert!(model
        .layers
        .iter()
        .all(|l| l.q_norm.is_none() && l.attn_post_norm.is_some()));
    check_with_gguf(&path, "gemma2-tiny", "q8_0", &[]);
}

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let a = synth(
        dir.path(),
        "a.gguf",
        &["qwen3-moe-tiny", "--seed", "7", "-t", "1"],
    );
    let b = synth(
        dir.path(),
        "b.gguf",
        &["qwen3-moe-tiny", "--seed", "7", "-t", "2"],
    );
    let c = synth(
        dir.path(),
        "c.gguf",
        &["qwen3-moe-tiny", "--seed", "8", "-t", "2"],
    );
    let (a, b, c) = (
        std::fs::read(a).unwrap(),
        std::fs::read(b).unwrap(),
        std::fs::read(c).unwrap(),
    );
    assert!(a == b, "one thread and two threads wrote different files");
    assert_eq!(a.len(), c.len());
    assert!(a != c, "another seed wrote the same file");
}

#[test]
fn hf_tokenizer_is_padded_to_the_preset_vocabulary() {
    // qwen3-dense-0.6b with one layer: the real Qwen3 tokenizer, 151,669 tokens padded to 151,936.
    let dir = tempfile::tempdir().unwrap();
    let tok = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/tokenizers/qwen3"
    );
    let path = synth(
        dir.path(),
        "dense.gguf",
        &[
            "qwen3-dense-0.6b",
            "--layers",
            "1",
            "--quant",
            "q8_0",
            "--tokenizer",
            tok,
        ],
    );
    let model = Model::open(&path).unwrap();
    assert_eq!(model.config.n_vocab, 151_936);
    assert!(model.output.is_none(), "tied embeddings");
    let meta = model.gguf().metadata();
    assert!(meta
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("enable_thinking"));
    let (
        Some(hearth_gguf::Value::Array(hearth_gguf::Array::String(tokens))),
        Some(hearth_gguf::Value::Array(hearth_gguf::Array::I32(types))),
    ) = (
        meta.get("tokenizer.ggml.tokens"),
        meta.get("tokenizer.ggml.token_type"),
    )
    else {
        panic!("tokenizer arrays")
    };
    assert_eq!(tokens.len(), 151_936);
    assert_eq!(tokens[151_668], "</think>");
    assert_eq!(
        (tokens[151_669].as_str(), types[151_669]),
        ("[PAD151669]", 5)
    );
    assert_eq!(
        (tokens[151_935].as_str(), types[151_935]),
        ("[PAD151935]", 5)
    );
    ok(
        hearth(&[
            "run",
            path.to_str().unwrap(),
            "-p",
            "hello",
            "-n",
            "4",
            "--temp",
            "0",
        ]),
        "dense run",
    );
    // (The gguf package's reader needs ~20 s for 151,936 token strings; the tiny test covers it.)
}

#[test]
fn bad_arguments_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let o = out.to_str().unwrap();
    let r = hearth(&["synth", "qwen3-moe-huge", "-o", o]);
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("qwen3-moe-tiny"),
        "the error lists the presets"
    );
    assert!(
        !hearth(&["synth", "qwen3-moe-tiny", "--layers", "5", "-o", o])
            .status
            .success()
    );
    assert!(
        !hearth(&["synth", "qwen3-moe-tiny", "--layers", "0", "-o", o])
            .status
            .success()
    );
    assert!(
        !hearth(&["synth", "qwen3-moe-tiny", "--quant", "q3_k", "-o", o])
            .status
            .success()
    );
}
