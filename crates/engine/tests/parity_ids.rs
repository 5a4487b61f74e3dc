//! Decoder parity on the golden token ids (independent of the tokenizer): every golden of
//! ../shared/fixtures through the match rule of ../shared/tools/compare_golden.py.

use std::io::Write;
use std::path::{Path, PathBuf};

use hearth_engine::logits_report;
use hearth_model::{KvType, Model, Scratch, ThreadPool};

fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

fn check(model_file: &Path, golden: &Path) {
    let model = Model::open(model_file).unwrap_or_else(|e| panic!("{}: {e}", model_file.display()));
    let pool = ThreadPool::new(2);
    let mut scratch = Scratch::new(&model, 256);
    let gold = std::fs::read_to_string(golden).unwrap();
    let mut out = tempfile::NamedTempFile::new().unwrap();
    for line in gold.lines().filter(|l| !l.trim().is_empty()) {
        let g: serde_json::Value = serde_json::from_str(line).unwrap();
        let prompt: Vec<u32> = g["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let n_gen = g["greedy"].as_array().unwrap().len();
        let r = logits_report(&model, &pool, &mut scratch, KvType::F16, &prompt, true, n_gen).unwrap();
        writeln!(out, "{}", serde_json::to_string(&r).unwrap()).unwrap();
    }
    out.flush().unwrap();
    let res = std::process::Command::new("python3")
        .arg(shared().join("tools/compare_golden.py"))
        .arg(out.path())
        .arg(golden)
        .output()
        .expect("python3 runs compare_golden.py");
    let text = String::from_utf8_lossy(&res.stdout);
    println!("{}: {}", golden.file_name().unwrap().to_string_lossy(), text.trim());
    assert!(res.status.success(), "{} does not match:\n{text}", golden.display());
}

fn fixture(name: &str) {
    let dir = shared().join("fixtures");
    let golden = dir.join(format!("{name}.golden.jsonl"));
    let model = dir.join(format!("{}.gguf", name.trim_end_matches(".long")));
    check(&model, &golden);
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

#[test]
fn smollm2() {
    let path = std::env::var("HEARTH_SMOLLM2")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf").into());
    assert!(Path::new(&path).exists(), "{path} is missing: run scripts/test, which fetches it");
    check(Path::new(&path), &shared().join("fixtures/smollm2-135m-instruct.q4_1.golden.jsonl"));
}
