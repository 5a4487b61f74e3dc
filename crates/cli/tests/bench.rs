//! `hearth bench --json` on a tiny synthetic MoE: llama-bench's keys for both tests (and at a depth), a measured
//! bandwidth and roofline, and a peak RSS that leaves out the 1 GiB bandwidth probe (it once did not).

use std::process::Command;

use serde_json::Value;

fn hearth(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("running hearth");
    assert!(
        out.status.success(),
        "hearth {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A synthetic tiny Qwen3-MoE file in a temporary directory (kept while the guard lives).
fn tiny_model() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf").to_str().unwrap().to_string();
    hearth(&["synth", "qwen3-moe-tiny", "-o", &model]);
    (dir, model)
}

#[test]
fn json_has_llama_bench_keys_and_peak_rss_excludes_the_probe() {
    let (_dir, model) = tiny_model();
    let model = model.as_str();
    let out = hearth(&[
        "bench", model, "-t", "2", "-p", "8", "-n", "4", "-r", "2", "--json",
    ]);
    let tests: Vec<Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    assert_eq!(tests.len(), 2);
    let (pp, tg) = (&tests[0], &tests[1]);
    assert_eq!(
        (pp["n_prompt"].as_u64(), pp["n_gen"].as_u64()),
        (Some(8), Some(0))
    );
    assert_eq!(
        (tg["n_prompt"].as_u64(), tg["n_gen"].as_u64()),
        (Some(0), Some(4))
    );
    for t in &tests {
        for key in [
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
            "n_batch",
            "n_ubatch",
            "type_k",
            "type_v",
            "n_depth",
            "test_time",
            "avg_ns",
            "stddev_ns",
            "stddev_ts",
        ] {
            assert!(t.get(key).is_some(), "missing {key} in {t}");
        }
        assert_eq!(t["n_threads"].as_u64(), Some(2));
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0);
        assert_eq!(t["samples_ts"].as_array().unwrap().len(), 2);
    }

    assert!(tg["read_bandwidth_gbs"].as_f64().unwrap() > 0.0);
    assert_eq!(tg["read_bandwidth_threads"].as_u64(), Some(2));
    assert!(tg["read_bandwidth_buffer_bytes"].as_u64().unwrap() >= 64 << 20);
    assert!(tg["roofline_ts"].as_f64().unwrap() > 0.0);
    assert!(tg["weight_bytes_per_token"].as_u64().unwrap() > 0);

    let rss = tg["peak_rss_bytes"].as_u64().unwrap();
    let bound = tg["peak_rss_bound_bytes"].as_u64().unwrap();
    assert!(rss > 0);
    if tg["peak_rss_includes_probe"] == Value::Bool(false) {
        // A tiny model needs a few tens of MB, under the 300 MB slack; the 1 GiB probe would not be.
        assert!(rss <= bound, "peak RSS {rss} over the bound {bound}");
    }
}

/// `-d` (llama-bench's `--n-depth`): the tests again after a context of that many tokens, named and
/// keyed as llama-bench does, with the KV cache sized for the deepest run; a depth whose cache
/// cannot fit is refused before anything is allocated.
#[test]
fn depth_runs_each_test_after_a_context() {
    let (_dir, model) = tiny_model();
    let model = model.as_str();
    let out = hearth(&[
        "bench", model, "-t", "2", "-p", "8", "-n", "4", "-r", "1", "-d", "0,40", "--json",
    ]);
    let tests: Vec<Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let got: Vec<(u64, u64, u64)> = tests
        .iter()
        .map(|t| {
            let k = |key: &str| t[key].as_u64().unwrap();
            (k("n_prompt"), k("n_gen"), k("n_depth"))
        })
        .collect();
    assert_eq!(got, [(8, 0, 0), (0, 4, 0), (8, 0, 40), (0, 4, 40)]);
    let kv = tests[3]["kv_cache_bytes"].as_u64().unwrap();
    // 40 + 8 + 1 positions of K and V, in one block of the pool's 64.
    assert!(kv > 0 && kv.is_multiple_of(64), "KV cache of {kv} bytes");

    let table = hearth(&[
        "bench", model, "-t", "2", "-p", "8", "-n", "0", "-r", "1", "-d", "40",
    ]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("pp8 @ d40"), "{table}");
    assert!(table.contains("at depth 40"), "{table}");

    // A decode-only run prefills its context in batches too (it once went a token at a time).
    let out = hearth(&[
        "bench", model, "-t", "2", "-p", "0", "-n", "2", "-r", "1", "-d", "40",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("depth 40: context prefilled") && err.contains("batches of 40"),
        "{err}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["bench", model, "-t", "2", "-d", "99999999999999"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("KV cache") && err.contains("memory available"),
        "{err}"
    );
}

/// `--kv-type q8_0|q4_0`: the KV bytes reported are the block formats' (34 and 18 bytes per 32
/// elements against f16's 64), and a 4096-token context runs on a q8_0 cache, reported at 65
/// blocks of 64 positions (4096 + 2 + 1 positions) where -d 40 needs one.
#[test]
fn quantized_kv_types_report_their_bytes() {
    let (_dir, model) = tiny_model();
    let model = model.as_str();
    let bench = |kv: &str, depth: &str| -> Value {
        let out = hearth(&[
            "bench",
            model,
            "-t",
            "2",
            "-p",
            "2",
            "-n",
            "1",
            "-r",
            "1",
            "-d",
            depth,
            "--json",
            "--kv-type",
            kv,
        ]);
        let tests: Vec<Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
        tests.last().unwrap().clone()
    };
    let bytes = |t: &Value| t["kv_cache_bytes"].as_u64().unwrap();
    let f16 = bytes(&bench("f16", "40"));
    let q8 = bench("q8_0", "40");
    assert_eq!(
        (q8["type_k"].as_str(), q8["type_v"].as_str()),
        (Some("q8_0"), Some("q8_0"))
    );
    assert_eq!(bytes(&q8) * 64, f16 * 34);
    assert_eq!(bytes(&bench("q4_0", "40")) * 64, f16 * 18);
    let deep = bench("q8_0", "4096");
    assert_eq!(deep["n_depth"].as_u64(), Some(4096));
    assert_eq!(bytes(&deep), 65 * bytes(&q8));
}

/// `--parallel S`: the generation test decodes S sequences together, each after its own context;
/// its tokens per second count every sequence's tokens, and `n_parallel` says how many there were.
#[test]
fn parallel_decodes_several_sequences_per_step() {
    let (_dir, model) = tiny_model();
    let model = model.as_str();
    let out = hearth(&[
        "bench",
        model,
        "-t",
        "2",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-d",
        "8",
        "--parallel",
        "3",
        "--json",
    ]);
    let tests: Vec<Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    assert_eq!(tests.len(), 2);
    // The prefill test stays one sequence.
    assert_eq!(tests[0]["n_parallel"].as_u64(), Some(1));
    let tg = &tests[1];
    assert_eq!(tg["n_parallel"].as_u64(), Some(3));
    assert_eq!(
        (tg["n_gen"].as_u64(), tg["n_depth"].as_u64()),
        (Some(4), Some(8))
    );
    let (ts, ns) = (
        tg["samples_ts"].as_array().unwrap(),
        tg["samples_ns"].as_array().unwrap(),
    );
    for (ts, ns) in ts.iter().zip(ns) {
        let tokens = ts.as_f64().unwrap() * ns.as_f64().unwrap() / 1e9;
        assert!(
            (tokens - 12.0).abs() < 1e-3,
            "{tokens} tokens per repetition, not 4 x 3"
        );
    }

    let table = hearth(&[
        "bench",
        model,
        "-t",
        "2",
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "--parallel",
        "3",
    ]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("tg4 x3"), "{table}");

    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["bench", model, "--parallel", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `--load`: `read` holds the weights in memory (on 2 MiB pages where the OS has them; the tiny file
/// may be smaller than one), `mmap` maps the file; the JSON and the text say which, and both decode
/// the same logits (the bit-identity is the model crate's; here the run simply succeeds).
#[test]
fn load_reads_or_maps_the_weights() {
    let (_dir, model) = tiny_model();
    let model = model.as_str();
    for (mode, resident) in [("read", true), ("mmap", false)] {
        let args = [
            "bench", model, "-t", "1", "-p", "0", "-n", "2", "-r", "1", "--load", mode,
        ];
        let out = hearth(&[&args[..], &["--json"]].concat());
        let tests: Vec<Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
        assert_eq!(
            tests[0]["weights_resident"],
            Value::Bool(resident),
            "{mode}"
        );
        let text = String::from_utf8(hearth(&args).stdout).unwrap();
        let line = text.lines().find(|l| l.starts_with("weights: ")).unwrap();
        assert!(line.contains(&format!("--load {mode}")), "{line}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["bench", model, "-p", "0", "-n", "1", "--load", "copy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--load"));
}
