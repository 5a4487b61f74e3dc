//! `hearth trace`: `--compare` against llama.cpp's layer-by-layer traces finds no divergence on every
//! model that has one, a deliberately wrong comparison is flagged, and `--json` carries per-layer
//! statistics and the MoE routing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value as Json;

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared");

fn smollm2() -> PathBuf {
    let p = std::env::var_os("HEARTH_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(p.exists(), "{} is missing: run scripts/test (or set HEARTH_SMOLLM2) to fetch SmolLM2-135M-Instruct Q4_1", p.display());
    p
}

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("running hearth")
}

/// The first line of a prompt file: the prompt every fixture trace was made with.
fn first_prompt(file: &str) -> String {
    let text = std::fs::read_to_string(format!("{SHARED}/fixtures/{file}")).unwrap();
    text.lines().next().unwrap().to_string()
}

fn compare(model: &Path, trace: &str, prompt: &str) -> (Output, Json) {
    let dir = format!("{SHARED}/fixtures/traces/{trace}");
    let out = hearth(&[
        "trace",
        model.to_str().unwrap(),
        "-t",
        "2",
        "-p",
        prompt,
        "--json",
        "--compare",
        &dir,
    ]);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{trace}: stdout is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

fn assert_no_divergence(model: &Path, trace: &str, prompt: &str) {
    let (out, json) = compare(model, trace, prompt);
    let cmp = &json["compare"];
    assert!(
        out.status.success(),
        "{trace}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        cmp["first_divergence"].is_null(),
        "{trace}: {}",
        cmp["first_divergence"]
    );
    // Every layer's named tensors and the logits were compared, not silently skipped.
    let names: Vec<&str> = cmp["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    let n_layer = json["layers"].as_array().unwrap().len();
    for want in [
        "attn_norm-0",
        "Qcur-0",
        "Kcur-0",
        "Vcur-0",
        "kqv_out-0",
        "ffn_inp-0",
        "ffn_norm-0",
        "result_norm",
        "result_output",
    ] {
        assert!(names.contains(&want), "{trace}: {want} was not compared");
    }
    assert!(
        names.contains(&format!("l_out-{}", n_layer - 1).as_str()),
        "{trace}: last l_out not compared"
    );
    // Real models may legitimately jump in scale (SmolLM2's massive activations at layer 11 are
    // flagged as a std jump); non-finite values never are.
    for a in json["anomalies"].as_array().unwrap() {
        assert!(!a.as_str().unwrap().contains("NaN"), "{trace}: {a}");
    }
}

#[test]
fn compare_tiny_models_without_divergence() {
    let prompt = first_prompt("prompts-synthetic.txt");
    for m in [
        "tiny-qwen3moe.f16",
        "tiny-qwen3moe.q4_k_m",
        "tiny-qwen2.q8_0",
        "tiny-qwen3.q4_k_m",
    ] {
        assert_no_divergence(
            Path::new(&format!("{SHARED}/fixtures/{m}.gguf")),
            m,
            &prompt,
        );
    }
}

#[test]
fn compare_smollm2_without_divergence() {
    assert_no_divergence(
        &smollm2(),
        "smollm2-135m-instruct.q4_1",
        &first_prompt("prompts-smollm2.txt"),
    );
}

#[test]
fn moe_comparison_covers_the_router() {
    let m = format!("{SHARED}/fixtures/tiny-qwen3moe.q4_k_m.gguf");
    let (_, json) = compare(
        Path::new(&m),
        "tiny-qwen3moe.q4_k_m",
        &first_prompt("prompts-synthetic.txt"),
    );
    let rows = json["compare"]["rows"].as_array().unwrap();
    for want in [
        "ffn_moe_logits-1",
        "ffn_moe_probs-1",
        "ffn_moe_weights_norm-1",
        "ffn_moe_out-1",
    ] {
        assert!(
            rows.iter().any(|r| r["name"] == want),
            "{want} was not compared"
        );
    }
    // Hearth's ffn_out of a MoE layer stands for llama.cpp's ffn_moe_out.
    let out = rows.iter().find(|r| r["name"] == "ffn_moe_out-0").unwrap();
    assert_eq!(out["hearth"], "ffn_out-0");
    // Every token of both layers chose llama.cpp's experts (from ffn_moe_argsort).
    let routing = json["compare"]["routing"].as_array().unwrap();
    assert_eq!(routing.len(), 2);
    for r in routing {
        assert_eq!(r["tokens"], 18);
        assert!(r["flipped"].as_array().unwrap().is_empty(), "{r}");
    }
}

#[test]
fn wrong_comparisons_are_flagged() {
    let f = format!("{SHARED}/fixtures");
    let prompt = first_prompt("prompts-synthetic.txt");
    // A different prompt: another token count.
    let (out, json) = compare(
        Path::new(&format!("{f}/tiny-qwen3moe.f16.gguf")),
        "tiny-qwen3moe.f16",
        "Beautiful is better than uglx.",
    );
    assert!(!out.status.success());
    assert!(
        json["compare"]["first_divergence"]
            .as_str()
            .unwrap()
            .starts_with("attn_norm-0"),
        "{}",
        json["compare"]["first_divergence"]
    );
    // A different model of the same shape (other weights, YaRN RoPE): diverges at once.
    let (out, json) = compare(
        Path::new(&format!("{f}/tiny-qwen3-yarn.q8_0.gguf")),
        "tiny-qwen3.q4_k_m",
        &prompt,
    );
    assert!(!out.status.success());
    assert!(!json["compare"]["first_divergence"].is_null());
    // A coarser quantization of the same weights (Q4_0 against the Q4_K_M trace) is caught too.
    let (out, _) = compare(
        Path::new(&format!("{f}/tiny-qwen3.q4_0.gguf")),
        "tiny-qwen3.q4_k_m",
        &prompt,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("parts ways"), "{err}");
}

#[test]
fn json_has_layer_stats_and_experts() {
    let m = format!("{SHARED}/fixtures/tiny-qwen3moe.q4_k_m.gguf");
    let out = hearth(&[
        "trace",
        &m,
        "-t",
        "2",
        "-p",
        "<|im_start|>user\\nhello world<|im_end|>",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Json = serde_json::from_slice(&out.stdout).unwrap();
    let n_tok = json["tokens"].as_array().unwrap().len();
    let layers = json["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for l in layers {
        for s in ["l_out", "attn_out", "ffn_out"] {
            let st = &l[s];
            assert!(st["std"].as_f64().unwrap() > 0.0, "{s}: {st}");
            assert_eq!(st["nan"], 0);
            assert_eq!(st["inf"], 0);
            assert!(st["min"].as_f64().unwrap() <= st["mean"].as_f64().unwrap());
            assert!(st["l2"].as_f64().unwrap() > 0.0);
        }
        let moe = &l["moe"];
        let experts = moe["experts"].as_array().unwrap();
        assert_eq!(experts.len(), n_tok);
        for (t, e) in experts.iter().enumerate() {
            assert_eq!(e.as_array().unwrap().len(), 2, "top-2");
            let w: f64 = moe["weights"][t]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_f64().unwrap())
                .sum();
            assert!((w - 1.0).abs() < 1e-4, "weights renormalised: {w}");
            let mass = moe["mass"][t].as_f64().unwrap();
            assert!(mass > 0.0 && mass <= 1.0 + 1e-6);
        }
        let load: u64 = moe["load"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert_eq!(load as usize, 2 * n_tok);
        assert_eq!(moe["load"].as_array().unwrap().len(), 8);
        assert!(moe["max_over_mean"].as_f64().unwrap() >= 1.0);
        assert!(moe["entropy"].as_f64().unwrap() > 0.0);
    }
    assert!(json["anomalies"].as_array().unwrap().is_empty());
    assert!(json.get("compare").is_none());
}

#[test]
fn human_table() {
    let m = format!("{SHARED}/fixtures/tiny-qwen2.q8_0.gguf");
    let out = hearth(&["trace", &m, "-t", "1", "-p", "hello"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("l_out") && text.contains("anomalies: none"),
        "{text}"
    );
    assert!(
        !text.contains("experts"),
        "a dense model has no expert section"
    );
}
