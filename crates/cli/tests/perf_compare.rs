//! `scripts/perf-compare --self-test`: the script that writes docs/PERFORMANCE.md renders a
//! synthetic results set (three tools, two depths, two labels, and the same set in the old schema)
//! into a temporary directory and checks its figures. Standard-library Python, well under a second;
//! skipped with a note where no Python is found.

use std::path::{Path, PathBuf};
use std::process::Command;

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
        eprintln!("note: no Python (HEARTH_PYTHON or python3); skipping perf-compare --self-test");
        None
    }
}

#[test]
fn perf_compare_renders_a_synthetic_results_set() {
    let Some(py) = python() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/perf-compare");
    let out = Command::new(py)
        .arg(&script)
        .arg("--self-test")
        .output()
        .expect("running scripts/perf-compare --self-test");
    assert!(
        out.status.success(),
        "perf-compare --self-test: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
