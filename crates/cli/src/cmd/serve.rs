//! `hearth serve`: load a model and serve it over the OpenAI, Anthropic and Ollama HTTP APIs.
//!
//! The socket is bound first, so `/health` answers `{"status": "loading"}` (503) while the model
//! loads, then `{"status": "ok"}`. SIGTERM or Ctrl-C stops accepting connections and requests, lets
//! replies in flight finish within `--grace` seconds, and exits 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use hearth_engine::disk_cache::{model_identity, DiskCacheConfig};
use hearth_engine::scheduler::{Scheduler, SchedulerConfig};
use hearth_engine::{Backend, ModelInfo};
use hearth_server::listen::{self, ConnConfig};
use hearth_server::scripted::Script;
use hearth_server::stream::StreamConfig;
use hearth_server::{AppState, ServerConfig};
use hearth_tokenizer::template::ChatTemplate;

use super::common::{parse_size, ModelArgs};

/// Arguments of `hearth serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded together (also the most `n` choices of one request).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free sequence; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 16 << 20)]
    max_body: usize,
    /// Most tokens any reply may generate, whatever the request asks (default: no cap beyond the
    /// context; llama-server's `-n`).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Require this API key (as `Authorization: Bearer KEY` or `x-api-key: KEY`).
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from this file (first line).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Model name shown to clients (default: the file's general.name, else its stem).
    #[arg(long)]
    alias: Option<String>,
    /// Use this Jinja chat template instead of the model's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Seconds replies in flight may take to finish after SIGTERM / Ctrl-C.
    #[arg(long, default_value_t = 30)]
    grace: u64,
    /// Seconds a client may take to send a request's headers (a connection that sends nothing is
    /// closed after this too).
    #[arg(long, default_value_t = 20)]
    header_timeout: u64,
    /// Seconds a keep-alive connection may wait idle for its next request.
    #[arg(long, default_value_t = 30)]
    idle_timeout: u64,
    /// Seconds a request body may stall before the request fails (408).
    #[arg(long, default_value_t = 30)]
    body_timeout: u64,
    /// Seconds a reply may wait for a client that stopped reading before the connection is closed
    /// (a streamed reply is cancelled, freeing its sequence).
    #[arg(long, default_value_t = 60)]
    write_timeout: u64,
    /// Most open connections (default: 512, or fewer to stay below the open-file limit); at the
    /// limit the longest-idle connection is closed, and when all are busy new ones get 503.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Keep prefix-cache blocks (evicted and finished ones) in files under this directory, keyed by
    /// the model file, the KV type and the tokens, so they are reloaded after an eviction or a
    /// restart. Created if missing; refused at start if it cannot be written.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Most bytes the disk cache may use, e.g. `20G`, `512M` (default: 10% of the free space of
    /// --cache-dir's filesystem, at most 64G).
    #[arg(long, value_parser = parse_size, requires = "cache_dir")]
    cache_disk: Option<u64>,
    /// Testing: play this file's text instead of running the model. Several replies are separated
    /// by a line holding only `--- next reply ---`: reply k answers a prompt that already holds k
    /// assistant turns, and the last one repeats (so an agent sees a tool call, then after the
    /// tool result a final answer).
    #[arg(long, hide = true)]
    scripted: Option<PathBuf>,
}

impl Args {
    fn api_key(&self) -> Result<Option<String>> {
        if let Some(k) = &self.api_key {
            anyhow::ensure!(!k.is_empty(), "--api-key must not be empty");
            return Ok(Some(k.clone()));
        }
        if let Some(f) = &self.api_key_file {
            let s = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            let k = s.lines().next().unwrap_or("").trim().to_string();
            anyhow::ensure!(!k.is_empty(), "{} holds no key", f.display());
            return Ok(Some(k));
        }
        Ok(None)
    }

    /// `--cache-dir` and `--cache-disk`: the directory is created and checked for writing now, so a
    /// bad one stops the server at start with its path rather than failing every write later.
    fn disk_cache(&self) -> Result<Option<DiskCacheConfig>> {
        let Some(dir) = &self.cache_dir else {
            return Ok(None);
        };
        let mut cfg = DiskCacheConfig {
            dir: dir.clone(),
            limit: 0,
        };
        cfg.check().context("--cache-dir")?;
        cfg.limit = match self.cache_disk {
            Some(n) => n,
            None => {
                let free = free_space(dir).with_context(|| {
                    format!(
                        "cannot read the free space of {}; give --cache-disk SIZE",
                        dir.display()
                    )
                })?;
                let limit = default_cache_disk(free);
                tracing::info!(
                    "disk cache: --cache-disk {} MiB, 10% of the {} MiB free on the filesystem of {} (at most {} GiB)",
                    limit >> 20,
                    free >> 20,
                    dir.display(),
                    CACHE_DISK_CAP >> 30
                );
                limit
            }
        };
        Ok(Some(cfg))
    }

    /// Loads the model (or the scripted stand-in) and starts the backend.
    fn backend(&self, disk: Option<DiskCacheConfig>) -> Result<(Arc<dyn Backend>, ChatTemplate)> {
        anyhow::ensure!(self.parallel >= 1, "--parallel must be at least 1");
        let path = &self.model.model;
        if let Some(script) = &self.scripted {
            let text = std::fs::read_to_string(script)
                .with_context(|| format!("cannot read {}", script.display()))?;
            let n_ctx = self.model.ctx.unwrap_or(4096);
            let replies: Vec<_> = split_replies(&text)
                .into_iter()
                .map(hearth_server::scripted::Script::new)
                .collect();
            let first = replies.first().cloned().unwrap_or_else(|| Script::new(""));
            let (b, tpl) = hearth_server::scripted::ScriptedBackend::from_gguf(
                path,
                n_ctx,
                self.parallel,
                first,
            )
            .with_context(|| format!("cannot open {}", path.display()))?;
            b.set_replies(replies);
            let template = self.template(tpl.as_deref(), None)?;
            return Ok((Arc::new(b), template));
        }
        let loaded = self.model.load_for(self.parallel)?;
        let meta = loaded.model.gguf().metadata();
        let src = meta.get_str("tokenizer.chat_template").map(str::to_string);
        let template = self.template(src.as_deref(), Some(loaded.model.config.arch.name))?;
        let info = ModelInfo::describe(
            &loaded.model,
            path,
            loaded.n_ctx,
            self.parallel,
            self.alias.clone(),
            Some(template.source().to_string()),
        );
        // The disk tier's files are only valid for this exact file (a copy elsewhere is the same).
        let model_identity = match &disk {
            Some(_) => model_identity(path)
                .with_context(|| format!("cannot read {} to key the disk cache", path.display()))?,
            None => 0,
        };
        let cfg = SchedulerConfig {
            parallel: self.parallel,
            n_ctx: loaded.n_ctx,
            queue: self.queue,
            kv_type: loaded.kv_type,
            threads: self.model.n_threads()?,
            pool_tokens: loaded.pool_tokens,
            disk,
            model_identity,
            ..SchedulerConfig::default()
        };
        let backend = Scheduler::start(
            Arc::new(loaded.model),
            Arc::new(loaded.tokenizer),
            info,
            cfg,
        );
        Ok((backend, template))
    }

    /// `--chat-template`, else the file's template, else the architecture's known format, else
    /// ChatML; rendered in isolated workers. One that cannot render a sample
    /// conversation is reported now; the server still starts (its other endpoints work), and chat
    /// requests get the same error.
    fn template(&self, from_file: Option<&str>, arch: Option<&str>) -> Result<ChatTemplate> {
        let template = if let Some(f) = &self.chat_template {
            ChatTemplate::from_path(f).with_context(|| format!("chat template {}", f.display()))?
        } else {
            match from_file {
                Some(src) => ChatTemplate::new(src).context("the model's chat template")?,
                None => {
                    let (template, note) = super::common::fallback_template(arch.unwrap_or(""));
                    tracing::warn!("{note}");
                    template
                }
            }
        };
        let template = super::common::isolate(template);
        if let Err(e) = template.check() {
            tracing::error!("the chat template fails on a sample conversation: {e}; chat requests will fail (use --chat-template to replace it)");
        }
        Ok(template)
    }
}

/// The most `--cache-disk` defaults to.
const CACHE_DISK_CAP: u64 = 64 << 30;

/// `--cache-disk` when not given: 10% of the free space, at most [`CACHE_DISK_CAP`].
fn default_cache_disk(free: u64) -> u64 {
    (free / 10).min(CACHE_DISK_CAP)
}

/// Bytes available to this (unprivileged) process on the filesystem holding `dir`.
#[cfg(unix)]
fn free_space(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: all-zero bytes are a valid `statvfs` (integers only), which the call overwrites.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and statvfs writes only the
    // struct it is given.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The field types differ between libcs (u32 on some 32-bit targets).
    #[allow(clippy::useless_conversion)]
    let (avail, frsize) = (u64::from(s.f_bavail), u64::from(s.f_frsize));
    Ok(avail.saturating_mul(frsize))
}

#[cfg(not(unix))]
fn free_space(_dir: &std::path::Path) -> std::io::Result<u64> {
    Err(std::io::Error::other("free space is only known on unix"))
}

/// The line that separates the replies of a `--scripted` file.
const NEXT_REPLY: &str = "--- next reply ---";

/// The replies of a `--scripted` file, in order. The line breaks around a separator line belong to
/// the separator, so a reply's text ends where its last line does.
fn split_replies(text: &str) -> Vec<&str> {
    let mut replies = Vec::new();
    let mut start = 0;
    let mut line_start = 0;
    while line_start <= text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i);
        let line = text[line_start..line_end].trim_end_matches('\r');
        if line == NEXT_REPLY {
            // The reply ends before the line break that precedes the separator.
            let end = line_start.saturating_sub(1).max(start);
            let end = if text[start..end].ends_with('\r') {
                end - 1
            } else {
                end
            };
            replies.push(&text[start..end]);
            start = (line_end + 1).min(text.len());
        }
        line_start = line_end + 1;
    }
    replies.push(&text[start..]);
    replies
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Runs `hearth serve`.
pub fn run(args: Args) -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let disk = args.disk_cache()?;
    let positive = |name: &str, v: u64| {
        anyhow::ensure!(v > 0, "--{name} must be at least 1 second");
        Ok(Duration::from_secs(v))
    };
    let conn = ConnConfig {
        header_timeout: positive("header-timeout", args.header_timeout)?,
        idle_timeout: positive("idle-timeout", args.idle_timeout)?,
        body_timeout: positive("body-timeout", args.body_timeout)?,
        write_timeout: positive("write-timeout", args.write_timeout)?,
        max_connections: match args.max_connections {
            Some(0) => anyhow::bail!("--max-connections must be at least 1"),
            Some(n) => {
                if let Some(limit) = listen::fd_limit() {
                    if n as u64 + 16 > limit {
                        tracing::warn!("--max-connections {n} is close to the open-file limit {limit}; accept may fail before the limit is reached");
                    }
                }
                n
            }
            None => listen::default_max_connections(),
        },
    };
    let config = ServerConfig {
        api_key: args.api_key()?,
        max_body: args.max_body,
        max_tokens: match args.max_tokens {
            Some(0) => anyhow::bail!("--max-tokens must be at least 1"),
            n => n,
        },
        stream: StreamConfig {
            write_timeout: positive("write-timeout", args.write_timeout)?,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let state = AppState::loading(config);
        let app = hearth_server::app(state.clone());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut stop_rx2 = stop_rx.clone();
        let conn_stats = state.connections().clone();
        let server = tokio::spawn(async move {
            let mut rx = stop_rx;
            listen::serve(listener, app, conn, conn_stats, async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await
        });
        eprintln!("hearth: listening on http://{local} (loading the model)");
        let loaded = tokio::task::spawn_blocking(move || args.backend(disk).map(|b| (b, args.grace)));
        let (backend, grace) = tokio::select! {
            r = loaded => {
                let ((backend, template), grace) = r.context("model loading panicked")??;
                state.set_backend(backend.clone(), template);
                (Some(backend), grace)
            }
            _ = shutdown_signal() => (None, 0),
        };
        if let Some(b) = &backend {
            tracing::info!(model = %b.info().alias, n_ctx = b.info().n_ctx, parallel = b.info().parallel, "ready on http://{local}");
            eprintln!("hearth: ready on http://{local}");
            shutdown_signal().await;
            tracing::info!("shutting down: finishing replies in flight (up to {grace} s)");
            b.shutdown();
        }
        let _ = stop_tx.send(true);
        let _ = stop_rx2.changed().await;
        match tokio::time::timeout(Duration::from_secs(grace), server).await {
            Ok(r) => r.context("server task")?,
            Err(_) => tracing::warn!("grace period over; exiting with replies still in flight"),
        }
        // The engine's last work: the disk cache's writes (bounded by the engine itself).
        if let Some(b) = backend {
            let join = tokio::task::spawn_blocking(move || b.join());
            if tokio::time::timeout(Duration::from_secs(grace + 15), join)
                .await
                .is_err()
            {
                tracing::warn!("the engine did not finish in time; exiting");
            }
        }
        anyhow::Ok(())
    });
    // Do not wait for a model load still running on a blocking thread (SIGTERM while loading).
    rt.shutdown_background();
    result
}

#[cfg(test)]
mod tests {
    use super::{default_cache_disk, split_replies};

    #[test]
    fn the_default_disk_cache_is_a_tenth_of_the_free_space_at_most_64g() {
        assert_eq!(default_cache_disk(100 << 30), 10 << 30);
        assert_eq!(default_cache_disk(10 << 40), 64 << 30);
        assert_eq!(default_cache_disk(0), 0);
        #[cfg(unix)]
        {
            use super::free_space;
            assert!(free_space(std::path::Path::new("/")).unwrap() > 0);
            assert!(free_space(std::path::Path::new("/no/such/dir")).is_err());
        }
    }

    #[test]
    fn replies_are_split_at_separator_lines() {
        assert_eq!(split_replies("one reply\n"), vec!["one reply\n"]);
        assert_eq!(split_replies(""), vec![""]);
        assert_eq!(
            split_replies("<tool_call>\nx\n</tool_call>\n--- next reply ---\nDone.\n"),
            vec!["<tool_call>\nx\n</tool_call>", "Done.\n"]
        );
        assert_eq!(
            split_replies("a\r\n--- next reply ---\r\nb\n--- next reply ---\nc"),
            vec!["a", "b", "c"]
        );
        // At the very start and end, and a separator-like line that is not one.
        assert_eq!(
            split_replies("--- next reply ---\nx --- next reply ---\n--- next reply ---"),
            vec!["", "x --- next reply ---", ""]
        );
    }
}
