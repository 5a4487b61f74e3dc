//! `hearth inspect` acceptance: on every shared model and on SmolLM2-135M-Instruct Q4_1, `--json` lists the
//! metadata and every tensor (type, shape, absolute offset, bytes) exactly as the `gguf` Python package
//! reads them. The expected files come from tools/gen_inspect_expected.py.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hearth_gguf::{GgmlType, GgufBuilder, Value};
use serde_json::Value as Json;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/inspect");
const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared");

fn smollm2() -> PathBuf {
    std::env::var_os("HEARTH_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("running hearth")
}

fn inspect_json(path: &Path) -> Json {
    let out = hearth(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: stdout is not JSON: {e}", path.display()))
}

fn model_path(source: &Json) -> PathBuf {
    if let Some(rel) = source["shared"].as_str() {
        return Path::new(SHARED).join(rel);
    }
    assert_eq!(source["env"], "HEARTH_SMOLLM2", "unknown source {source}");
    let p = smollm2();
    assert!(
        p.exists(),
        "{} is missing: run scripts/test to fetch SmolLM2-135M-Instruct Q4_1",
        p.display()
    );
    p
}

#[test]
fn json_matches_the_gguf_package() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(DATA)
        .expect("test data dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    // 15 fixtures, 6 vocab files, SmolLM2.
    assert!(
        files.len() >= 22,
        "expected files missing: run tools/gen_inspect_expected.py ({files:?})"
    );
    for file in files {
        let expected: Json =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let model = model_path(&expected["source"]);
        let got = inspect_json(&model);
        let name = model.display();
        for k in ["version", "alignment", "data_offset"] {
            assert_eq!(got[k], expected[k], "{name}: {k}");
        }
        assert_eq!(got["valid"], true, "{name}");

        let (gm, em) = (
            got["metadata"].as_object().unwrap(),
            expected["metadata"].as_object().unwrap(),
        );
        let gk: Vec<&String> = gm.keys().collect();
        let ek: Vec<&String> = em.keys().collect();
        assert_eq!(gk, ek, "{name}: metadata keys (in file order)");
        for (k, v) in em {
            assert_eq!(&gm[k], v, "{name}: metadata {k}");
        }

        let (gt, et) = (
            got["tensors"].as_array().unwrap(),
            expected["tensors"].as_array().unwrap(),
        );
        assert_eq!(gt.len(), et.len(), "{name}: tensor count");
        for (g, e) in gt.iter().zip(et) {
            assert_eq!(g, e, "{name}: tensor");
        }
    }
}

#[test]
fn human_report_has_every_section() {
    let path = Path::new(SHARED).join("fixtures/tiny-qwen3moe.q4_k_m.gguf");
    let out = hearth(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "architecture                             qwen3moe",
        "expert_used_count                        2",
        "pre                                      qwen2",
        "vocab size                               503",
        "chat template                            yes",
        "tokenizer.ggml.tokens",
        "blk.1.ffn_down_exps.weight",
        "Totals by type",
        "Validation: structure OK; every tensor type is supported for compute",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn unsupported_types_are_listed_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("iq2.gguf");
    let bytes = GgufBuilder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .tensor("w", GgmlType::IQ2_XXS, &[256, 2], vec![0; 132])
        .tensor("n", GgmlType::F32, &[4], vec![0; 16])
        .build()
        .unwrap();
    std::fs::write(&path, bytes).unwrap();
    let json = inspect_json(&path);
    assert_eq!(json["valid"], true);
    assert_eq!(json["supported_for_compute"], false);
    assert_eq!(json["unsupported_types"], serde_json::json!(["IQ2_XXS"]));
    assert_eq!(json["tensors"][0]["type"], "IQ2_XXS");
    let out = hearth(&["inspect", path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("not supported for compute: IQ2_XXS"),
        "{text}"
    );
}

#[test]
fn invalid_file_exits_non_zero_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("magic.gguf", b"GGML\x03\0\0\0".to_vec()),
        ("truncated.gguf", {
            let b = GgufBuilder::new()
                .tensor("w", GgmlType::F32, &[64], vec![0; 256])
                .build()
                .unwrap();
            b[..b.len() - 10].to_vec()
        }),
        ("empty.gguf", Vec::new()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        for json in [false, true] {
            let mut args = vec!["inspect", path.to_str().unwrap()];
            if json {
                args.push("--json");
            }
            let out = hearth(&args);
            assert!(!out.status.success(), "{name}");
            assert!(
                out.stdout.is_empty(),
                "{name}: printed {:?}",
                String::from_utf8_lossy(&out.stdout)
            );
            let err = String::from_utf8(out.stderr).unwrap();
            assert_eq!(err.lines().count(), 1, "{name}: {err:?}");
            assert!(
                err.starts_with("error: invalid GGUF file"),
                "{name}: {err:?}"
            );
        }
    }
    let out = hearth(&["inspect", "/nonexistent/model.gguf"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err:?}");
    // The OS error is said once, not repeated by the cause chain.
    assert_eq!(err.matches("os error").count(), 1, "{err:?}");
}
