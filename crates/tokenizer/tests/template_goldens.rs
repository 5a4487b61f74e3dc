//! Chat templates render byte-identical to transformers' `apply_chat_template`.
//!
//! The goldens in testdata/templates are written by tools/gen_template_goldens.py, which renders
//! each conversation with jinja2 set up exactly as transformers sets it up. A case holds either the
//! expected text or the Python error; in the latter case rendering must fail here too.

use hearth_tokenizer::template::{ChatInput, ChatTemplate};
use serde_json::Value;
use std::path::PathBuf;

const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/templates");
const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared");

struct Golden {
    source: Option<String>,
    cases: Vec<Value>,
}

fn load(stem: &str) -> Golden {
    let path = PathBuf::from(TESTDATA).join(format!("{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run tools/gen_template_goldens.py)",
            path.display()
        )
    });
    let doc: Value = serde_json::from_str(&text).expect("golden file is JSON");
    let source = doc["source"].as_str().map(str::to_owned);
    // A template taken from ../shared is also read in place, so the golden cannot drift from it.
    if let (Some(src), Some(shared)) = (&source, doc["shared_path"].as_str()) {
        let shared_path = PathBuf::from(SHARED).join(shared);
        let on_disk = std::fs::read_to_string(&shared_path)
            .unwrap_or_else(|e| panic!("{}: {e}", shared_path.display()));
        assert_eq!(
            &on_disk,
            src,
            "{} differs from the golden's source",
            shared_path.display()
        );
    }
    let cases = doc["cases"].as_array().expect("cases").clone();
    Golden { source, cases }
}

fn input(case: &Value) -> ChatInput {
    let str_field = |k: &str| case[k].as_str().unwrap_or_default().to_owned();
    ChatInput {
        messages: case["messages"].as_array().cloned().unwrap_or_default(),
        tools: case["tools"].as_array().cloned(),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
        bos_token: str_field("bos_token"),
        eos_token: str_field("eos_token"),
    }
}

/// Renders every case with `template` (or the case's own source) and returns the failures.
fn check(stem: &str, golden: &Golden, template: Option<&ChatTemplate>) -> Vec<String> {
    let mut failures = Vec::new();
    for case in &golden.cases {
        let name = case["name"].as_str().unwrap_or("?");
        let own;
        let template = match (case["source"].as_str(), template) {
            (Some(src), _) => match ChatTemplate::new(src) {
                Ok(t) => {
                    own = t;
                    &own
                }
                Err(e) => {
                    failures.push(format!("{stem}/{name}: does not compile: {e}"));
                    continue;
                }
            },
            (None, Some(t)) => t,
            (None, None) => panic!("{stem}/{name}: no template"),
        };
        let got = template.render(&input(case));
        match (case["expected"].as_str(), got) {
            (Some(want), Ok(got)) if want == got => {}
            (Some(want), Ok(got)) => failures.push(format!(
                "{stem}/{name}: differs at byte {}\n  want: {want:?}\n  got:  {got:?}",
                want.bytes()
                    .zip(got.bytes())
                    .position(|(a, b)| a != b)
                    .unwrap_or(want.len().min(got.len()))
            )),
            (Some(_), Err(e)) => failures.push(format!("{stem}/{name}: error {e}")),
            (None, Ok(got)) => failures.push(format!(
                "{stem}/{name}: rendered {got:?}, Python failed with {}",
                case["error"]
            )),
            (None, Err(_)) => {}
        }
    }
    failures
}

fn run(stem: &str, min_rendered: usize) {
    let golden = load(stem);
    let template = golden
        .source
        .as_deref()
        .map(|src| ChatTemplate::new(src).unwrap_or_else(|e| panic!("{stem}: {e}")));
    let rendered = golden
        .cases
        .iter()
        .filter(|c| c["expected"].is_string())
        .count();
    assert!(
        rendered >= min_rendered,
        "{stem}: only {rendered} rendered cases"
    );
    let failures = check(stem, &golden, template.as_ref());
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        golden.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_matches_transformers() {
    run("qwen3", 20);
}

#[test]
fn qwen3_coder_matches_transformers() {
    run("qwen3-coder", 20);
}

#[test]
fn gguf_chatml_matches_transformers() {
    run("chatml-tiny-qwen3", 20);
}

#[test]
fn smollm2_matches_transformers() {
    run("smollm2", 20);
}

/// A ChatML dialect taking content as parts, `{% generation %}`, `tojson` options, macros.
#[test]
fn content_parts_template_matches_transformers() {
    run("chatml-parts", 20);
}

#[test]
fn python_behaviours_match_jinja2() {
    run("features", 15);
}

/// The built-in fallback is the same ChatML as the tiny fixture's, so its goldens apply.
#[test]
fn chatml_fallback_matches_gguf_chatml() {
    let golden = load("chatml-tiny-qwen3");
    assert_eq!(
        golden.source.as_deref(),
        Some(hearth_tokenizer::template::CHATML_TEMPLATE)
    );
    let failures = check("chatml-fallback", &golden, Some(&ChatTemplate::chatml()));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
