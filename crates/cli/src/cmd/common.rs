//! What every model-running command shares: the model path, threads, context, loading with a
//! progress indicator, the chat template.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use hearth_gguf::Gguf;
use hearth_model::{KvType, Model, ThreadPool};
use hearth_tokenizer::template::{isolated, ChatTemplate};
use hearth_tokenizer::Tokenizer;

/// The model file and how to run it (`-c` and `-t` mean the same in every command).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Threads for the forward pass (default: all available cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's trained context, at most 8192).
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// KV cache element type.
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_type: KvTypeArg,
}

/// `--kv-type`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum KvTypeArg {
    /// Half precision (llama.cpp's default).
    F16,
    /// Single precision.
    F32,
}

impl From<KvTypeArg> for KvType {
    fn from(k: KvTypeArg) -> KvType {
        match k {
            KvTypeArg::F16 => KvType::F16,
            KvTypeArg::F32 => KvType::F32,
        }
    }
}

/// A model ready to run.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub pool: ThreadPool,
    pub n_ctx: usize,
    pub kv_type: KvType,
}

/// A spinner on stderr while `f` runs; hidden when stderr is not a terminal.
pub fn with_spinner<T>(msg: &str, f: impl FnOnce() -> T) -> T {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    let out = f();
    pb.finish_and_clear();
    out
}

/// A progress bar of `len` steps on stderr; hidden when stderr is not a terminal.
pub fn progress_bar(len: u64, msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

impl ModelArgs {
    /// Threads to use.
    pub fn n_threads(&self) -> Result<usize> {
        match self.threads {
            Some(0) => anyhow::bail!("--threads must be at least 1"),
            Some(t) => Ok(t),
            None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        }
    }

    /// Opens the file, binds the model and builds the tokenizer.
    pub fn load(&self) -> Result<Loaded> {
        let path = &self.model;
        let n_threads = self.n_threads()?;
        let (model, tokenizer) =
            with_spinner(&format!("loading {}", path.display()), || -> Result<_> {
                let gguf = Arc::new(
                    Gguf::open(path).with_context(|| format!("cannot open {}", path.display()))?,
                );
                let tokenizer = Tokenizer::from_gguf(gguf.metadata())
                    .with_context(|| format!("{}: tokenizer", path.display()))?;
                let model =
                    Model::load(gguf).with_context(|| format!("cannot load {}", path.display()))?;
                Ok((model, tokenizer))
            })?;
        let n_ctx = match self.ctx {
            Some(0) => anyhow::bail!("--ctx must be at least 1"),
            Some(c) => c,
            None => model.config.n_ctx_train.min(8192),
        };
        Ok(Loaded {
            model,
            tokenizer,
            pool: ThreadPool::new(n_threads),
            n_ctx,
            kv_type: self.kv_type.into(),
        })
    }
}

/// The template of a model file without one: its architecture's known format (Gemma's), else
/// ChatML; with the note to log about it.
pub fn fallback_template(arch: &str) -> (ChatTemplate, String) {
    if let Some(f) = hearth_tokenizer::template::builtin::for_architecture(arch) {
        if let Ok(t) = ChatTemplate::new(f.source) {
            let note = format!(
                "the model has no chat template; using the built-in '{}' format of {arch} models",
                f.name
            );
            return (t, note);
        }
    }
    let note = "the model has no chat template; using ChatML".to_string();
    (ChatTemplate::chatml(), note)
}

/// The chat template: `--chat-template FILE`, else the file's, else [`fallback_template`]
/// (noted); rendered in isolated workers (see [`isolated`]).
pub fn chat_template(loaded: &Loaded, file: Option<&PathBuf>) -> Result<ChatTemplate> {
    let template = if let Some(f) = file {
        let src = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read chat template {}", f.display()))?;
        ChatTemplate::new(&src).with_context(|| format!("chat template {}", f.display()))?
    } else {
        match loaded
            .model
            .gguf()
            .metadata()
            .get_str("tokenizer.chat_template")
        {
            Some(src) => ChatTemplate::new(src).context("the model's chat template")?,
            None => {
                let (template, note) = fallback_template(loaded.model.config.arch.name);
                eprintln!("note: {note}");
                template
            }
        }
    };
    let template = isolate(template);
    template
        .check()
        .context("the chat template cannot render a sample conversation")?;
    Ok(template)
}

/// `template` rendered in worker processes of this binary (`hearth render-worker`), so a template
/// that exhausts memory fails its render instead of the process.
pub fn isolate(template: ChatTemplate) -> ChatTemplate {
    match std::env::current_exe() {
        Ok(exe) => template.isolate(isolated::WorkerCommand::new(
            exe,
            vec!["render-worker".into()],
        )),
        Err(e) => {
            tracing::warn!(
                "cannot find the running binary ({e}); chat templates render in process"
            );
            template
        }
    }
}
