//! `hearth run --json-schema` / `--grammar` on a tiny fixture: sampled output that stops is valid;
//! a bad grammar is refused before anything runs, naming where it is wrong.

use std::process::Command;

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/tiny-qwen3.q4_0.gguf"
);

fn run(extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "run",
            MODEL,
            "-p",
            "JSON:",
            "-n",
            "200",
            "--temp",
            "0.8",
            "-t",
            "2",
            "--verbose",
        ])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn constrained_runs_print_valid_output_and_bad_specs_fail_early() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99},
            "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}}}, "required": ["id", "tags"]}"#,
    )
    .unwrap();
    let schema = schema.to_str().unwrap();
    let mut stopped = 0;
    for seed in ["1", "2", "3"] {
        let (ok, out, err) = run(&["--json-schema", schema, "--seed", seed]);
        assert!(ok, "{err}");
        if err.contains("finish: stop") {
            stopped += 1;
            let v: serde_json::Value =
                serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
            assert!((1..=99).contains(&v["id"].as_i64().unwrap()), "{out}");
            assert!(v["tags"].as_array().unwrap().len() <= 2, "{out}");
        }
    }
    assert!(stopped >= 2, "a bounded schema ends well within 200 tokens");

    let grammar = dir.path().join("g.gbnf");
    std::fs::write(&grammar, "root ::= \"n=\" [0-9]{1,3} \";\"\n").unwrap();
    let (ok, out, err) = run(&["--grammar", grammar.to_str().unwrap(), "--seed", "4"]);
    assert!(ok && err.contains("finish: stop"), "{err}");
    let n = out
        .trim()
        .strip_prefix("n=")
        .and_then(|s| s.strip_suffix(';'))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()),
        "{out}"
    );

    std::fs::write(&grammar, "root ::= \"a\"\nbody := \"b\"\n").unwrap();
    let (ok, _, err) = run(&["--grammar", grammar.to_str().unwrap()]);
    assert!(
        !ok && err.contains("line 2, column 6: expected `::=`"),
        "{err}"
    );
    let (ok, _, err) = run(&[
        "--json-schema",
        schema,
        "--grammar",
        grammar.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}
