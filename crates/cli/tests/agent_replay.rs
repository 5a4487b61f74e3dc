//! `scripts/agent-replay` against a real `hearth serve`: the first two requests of two recorded
//! Codex sessions (Responses API, ~6k tokens each: the smallest first turns of the recorded
//! clients), interleaved on one sequence (more conversations than `--parallel`), on a one-layer
//! synthetic Qwen3-MoE with the real Qwen3 vocabulary (so the prompts tokenize as on the real
//! model). Checks the report's shape (the table, the JSON of every turn and the totals) and that
//! each conversation's second turn is served from the prefix cache, though the other conversation
//! ran on the sequence in between (the pool keeps finished prompts' blocks). Also runs `--self-test` (the parser on canned
//! replies of hearth and llama-server in every API). Standard-library Python; skipped with a note
//! where no Python is found.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// `HEARTH_PYTHON` (the test venv, as scripts/test sets it), else `python3` on the PATH.
fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HEARTH_PYTHON").map(PathBuf::from) {
        if p.exists() {
            return Some(p);
        }
    }
    let found = Command::new("python3").arg("--version").output();
    if found.is_ok_and(|o| o.status.success()) {
        Some(PathBuf::from("python3"))
    } else {
        eprintln!("note: no Python (HEARTH_PYTHON or python3); skipping agent-replay");
        None
    }
}

fn script() -> PathBuf {
    Path::new(ROOT).join("scripts/agent-replay")
}

/// A one-layer Qwen3-MoE with the real Qwen3 tokenizer and template, written once per run.
fn model() -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("agent-replay-qwen3-vocab.gguf");
    if !path.exists() {
        let tmp = path.with_extension("tmp");
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args([
                "synth",
                "qwen3-moe-tiny",
                "--layers",
                "1",
                "--quant",
                "q8_0",
            ])
            .args(["--tokenizer", &format!("{ROOT}/../shared/tokenizers/qwen3")])
            .arg("-o")
            .arg(&tmp)
            .output()
            .expect("running hearth synth");
        assert!(
            out.status.success(),
            "hearth synth: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

#[test]
fn agent_replay_self_test() {
    let Some(py) = python() else { return };
    let out = Command::new(py)
        .arg(script())
        .arg("--self-test")
        .output()
        .expect("running scripts/agent-replay --self-test");
    assert!(
        out.status.success(),
        "agent-replay --self-test: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn agent_replay_against_hearth_serve() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("replay.json");
    let sessions = format!("{ROOT}/scripts/agent-sessions");
    let out = Command::new(py)
        .arg(script())
        .arg(format!("{sessions}/codex-fix-divide.jsonl.xz"))
        .arg(format!("{sessions}/codex-todo-done.jsonl.xz"))
        .args([
            "--turns",
            "2",
            "--parallel",
            "1",
            "-t",
            "2",
            "--ctx",
            "32768",
        ])
        .args(["--start-hearth", env!("CARGO_BIN_EXE_hearth"), "--model"])
        .arg(model())
        .arg("--json")
        .arg(&json)
        .output()
        .expect("running scripts/agent-replay");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let what = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "agent-replay: {what}");
    assert!(stdout.contains("hit rate"), "no totals line: {what}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let turns = report["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 4, "{report:#}");
    for t in turns {
        for k in [
            "conversation",
            "session",
            "turn",
            "api",
            "prompt_tokens",
            "cached_tokens",
            "ttft_s",
            "total_s",
        ] {
            assert!(!t[k].is_null(), "turn without {k}: {t}");
        }
        assert!(t["error"].is_null(), "{t}");
        assert_eq!(t["api"], "responses");
        assert!(t["prompt_tokens"].as_u64().unwrap() > 1000, "{t}");
        assert!(t["ttft_s"].as_f64().unwrap() <= t["total_s"].as_f64().unwrap());
        if t["turn"] == 1 {
            // The previous turn's prompt is still in the pool's prefix cache: only the new tool
            // call and its result are prefilled.
            let (p, c) = (
                t["prompt_tokens"].as_f64().unwrap(),
                t["cached_tokens"].as_f64().unwrap(),
            );
            assert!(c >= 0.9 * p, "a later turn mostly cached: {t}");
        }
    }
    let tot = &report["totals"];
    assert_eq!(tot["turns"], 4);
    assert_eq!(tot["failed"], 0);
    let later = tot["hit_rate_after_first"].as_f64().unwrap();
    assert!(later >= 0.9, "turns after the first mostly cached: {tot}");
}
