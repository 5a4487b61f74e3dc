//! Chat-template failure modes: syntax errors name their place, runaway templates end in errors
//! quickly instead of hanging or exhausting memory, and the ChatML fallback is the standard one.

use hearth_tokenizer::template::{ChatInput, ChatTemplate, Limits, TemplateError};
use serde_json::json;
use std::time::{Duration, Instant};

fn conversation() -> ChatInput {
    ChatInput {
        messages: vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
        ],
        add_generation_prompt: true,
        ..ChatInput::default()
    }
}

fn render(source: &str) -> Result<String, TemplateError> {
    ChatTemplate::new(source)?.render(&conversation())
}

/// Runs `f` and checks it finished within a few seconds (a hang would time the test out anyway,
/// but this states the intent: errors must be quick).
fn quickly<T>(f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    out
}

#[test]
fn syntax_errors_name_line_and_column() {
    let err =
        ChatTemplate::new("{% for m in messages %}\n  {{ m.role }\n{% endfor %}").unwrap_err();
    match &err {
        TemplateError::Syntax { line, column, .. } => {
            assert_eq!(*line, 2, "{err}");
            assert!(*column >= 1, "{err}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    assert!(err.to_string().contains("line 2"), "{err}");

    for bad in [
        "{% for m in messages %}no end",
        "{% if %}{% endif %}",
        "{{ messages | }}",
        "{% endfor %}",
        "{% macro %}",
    ] {
        assert!(
            matches!(ChatTemplate::new(bad), Err(TemplateError::Syntax { .. })),
            "{bad:?} compiled"
        );
    }
}

#[test]
fn runaway_loops_run_out_of_fuel() {
    // jinja2 would run this for hours; here it is an error, not a hang.
    let err = quickly(|| {
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    })
    .unwrap_err();
    assert!(matches!(err, TemplateError::OutOfFuel { .. }), "{err}");

    // A billion-step range is refused outright.
    let err = quickly(|| render("{% for i in range(10**9) %}x{% endfor %}")).unwrap_err();
    assert!(
        matches!(
            err,
            TemplateError::Render { .. } | TemplateError::OutOfFuel { .. }
        ),
        "{err}"
    );

    // Fuel is per render: the same template renders again after a failure elsewhere.
    let t = ChatTemplate::new("{% for m in messages %}{{ m.role }};{% endfor %}").unwrap();
    for _ in 0..3 {
        assert_eq!(t.render(&conversation()).unwrap(), "system;user;");
    }
}

#[test]
fn runaway_recursion_is_an_error() {
    let err =
        quickly(|| render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")).unwrap_err();
    assert!(
        matches!(
            err,
            TemplateError::Render { .. } | TemplateError::OutOfFuel { .. }
        ),
        "{err}"
    );
}

#[test]
fn huge_output_is_an_error() {
    let err =
        quickly(|| render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")).unwrap_err();
    assert!(
        matches!(err, TemplateError::OutputTooLarge { limit } if limit == 16 << 20),
        "{err}"
    );
    let err = quickly(|| render("{{ 'x' * 20000000 }}")).unwrap_err();
    assert!(matches!(err, TemplateError::OutputTooLarge { .. }), "{err}");

    // The limits are the caller's to choose.
    let limits = Limits {
        max_output_bytes: 10,
        ..Limits::default()
    };
    let t = ChatTemplate::with_limits("{{ 'x' * 11 }}", limits).unwrap();
    assert!(matches!(
        t.render(&conversation()),
        Err(TemplateError::OutputTooLarge { limit: 10 })
    ));
    let t = ChatTemplate::with_limits("{{ 'x' * 10 }}", limits).unwrap();
    assert_eq!(t.render(&conversation()).unwrap(), "xxxxxxxxxx");

    let tight = Limits {
        fuel: 50,
        ..Limits::default()
    };
    let t =
        ChatTemplate::with_limits("{% for i in range(1000) %}{{ i }}{% endfor %}", tight).unwrap();
    assert!(matches!(
        t.render(&conversation()),
        Err(TemplateError::OutOfFuel { fuel: 50 })
    ));
}

#[test]
fn huge_source_is_refused() {
    let source = "x".repeat(hearth_tokenizer::template::MAX_SOURCE_BYTES + 1);
    assert!(matches!(
        ChatTemplate::new(&source),
        Err(TemplateError::SourceTooLarge { .. })
    ));
}

#[test]
fn template_files_are_read() {
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/templates/Qwen3-Coder.jinja"
    ));
    let t = ChatTemplate::from_path(path).unwrap();
    assert!(t.source().contains("<tool_call>"));
    assert!(t
        .render(&conversation())
        .unwrap()
        .ends_with("<|im_start|>assistant\n"));
    let missing = std::path::Path::new("/nonexistent/template.jinja");
    assert!(matches!(
        ChatTemplate::from_path(missing),
        Err(TemplateError::Read { .. })
    ));
}

#[test]
fn raise_exception_reports_the_message() {
    let err = render(
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
    )
    .unwrap_err();
    match err {
        TemplateError::Raised(message) => assert_eq!(message, "System role not supported"),
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn undefined_misuse_is_an_error() {
    for source in [
        "{{ messages[0].nope.deeper }}",
        "{{ 'a' + messages[0].nope }}",
        "{{ messages[5].role }}",
        "{{ nope() }}",
        "{{ messages | no_such_filter }}",
    ] {
        assert!(render(source).is_err(), "{source:?} rendered");
    }
    // ... but printing an undefined value or testing it is fine, as in jinja2.
    assert_eq!(
        render("[{{ nope }}]{{ nope is defined }}{% for x in nope %}x{% endfor %}").unwrap(),
        "[]False"
    );
}

#[test]
fn chatml_fallback_renders_standard_chatml() {
    let got = ChatTemplate::chatml().render(&conversation()).unwrap();
    assert_eq!(
        got,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut input = conversation();
    input.add_generation_prompt = false;
    input
        .messages
        .push(json!({"role": "assistant", "content": "Hello!"}));
    assert_eq!(
        ChatTemplate::chatml().render(&input).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );
}

#[test]
fn variables_are_passed_as_transformers_does() {
    let mut input = conversation();
    input.bos_token = "<s>".into();
    input.eos_token = "</s>".into();
    input.kwargs.insert("enable_thinking".into(), json!(false));
    let t = ChatTemplate::new(
        "{{ bos_token }}|{{ eos_token }}|{{ enable_thinking }}|{{ tools is defined }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}",
    )
    .unwrap();
    assert_eq!(
        t.render(&input).unwrap(),
        "<s>|</s>|False|True|True|True|True"
    );

    // Keyword arguments override the special tokens, like `{**special_tokens_map, **kwargs}`.
    input.kwargs.insert("bos_token".into(), json!("[BOS]"));
    assert!(t.render(&input).unwrap().starts_with("[BOS]|</s>|"));

    // ... but not the variables transformers passes by name (Python raises a TypeError).
    for key in ["messages", "tools", "documents", "add_generation_prompt"] {
        let mut bad = conversation();
        bad.kwargs.insert(key.into(), json!(1));
        assert!(
            matches!(t.render(&bad), Err(TemplateError::InvalidInput(_))),
            "{key}"
        );
    }

    input.tools = Some(vec![json!({"type": "function", "function": {"name": "f"}})]);
    let t = ChatTemplate::new("{{ tools | length }} {{ tools[0].function.name }}").unwrap();
    assert_eq!(t.render(&input).unwrap(), "1 f");
}

#[test]
fn strftime_now_formats_the_current_date() {
    let got = render("{{ strftime_now('%Y-%m-%d|%d %b %Y') }}").unwrap();
    let (iso, human) = got.split_once('|').unwrap();
    let parts: Vec<&str> = iso.split('-').collect();
    assert_eq!(parts.len(), 3, "{got}");
    let year: u32 = parts[0].parse().unwrap();
    assert!(year >= 2024, "{got}");
    assert!(
        human.ends_with(parts[0]) && human.starts_with(parts[2]),
        "{got}"
    );
}

#[test]
fn generation_blocks_render_their_body() {
    assert_eq!(
        render(
            "{% for m in messages %}{% generation %}{{ m.role }}{% endgeneration %}\n{% endfor %}"
        )
        .unwrap(),
        // trim_blocks eats the newline after the end tag, as in jinja2.
        "systemuser"
    );
}

#[test]
fn loop_controls_are_enabled() {
    assert_eq!(
        render("{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}")
            .unwrap(),
        "023"
    );
}

#[test]
fn templates_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
}

/// Renders queued behind busy workers wait at most one render's time limit: with one worker that
/// never answers (a stand-in that sleeps) and three renders at once, each ends within about two
/// time limits, the one rendering with `Timeout` and those that never got the worker with `Busy`.
#[cfg(unix)]
#[test]
fn renders_waiting_for_a_busy_worker_give_up() {
    use hearth_tokenizer::template::isolated::WorkerCommand;
    use std::sync::Arc;
    let mut cmd = WorkerCommand::new("sh".into(), vec!["-c".into(), "exec sleep 30".into()]);
    cmd.timeout = Duration::from_millis(800);
    cmd.max_workers = 1;
    let t = Arc::new(
        ChatTemplate::new("{{ messages[0].content }}")
            .unwrap()
            .isolate(cmd),
    );
    let start = Instant::now();
    let results: Vec<_> = (0..3)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || t.render(&conversation()))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    let busy = results
        .iter()
        .filter(|r| matches!(r, Err(TemplateError::Busy { .. })))
        .count();
    let timed_out = results
        .iter()
        .filter(|r| matches!(r, Err(TemplateError::Timeout { .. })))
        .count();
    assert!(busy >= 1 && timed_out >= 1, "{results:?}");
    assert_eq!(busy + timed_out, 3, "{results:?}");
}
