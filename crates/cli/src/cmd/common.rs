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
    /// Context size in tokens (default: the model's trained context, limited by the KV cache that
    /// fits in memory).
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// Memory for the KV cache, e.g. `8G`, `512M` (powers of 1024; default: what is available
    /// after the weights, less 1 GiB of headroom).
    #[arg(long, value_parser = parse_size)]
    pub kv_budget: Option<u64>,
    /// KV cache element type: f16, f32, or llama.cpp's `-ctk/-ctv` block formats q8_0 and q4_0
    /// (for heads that are multiples of 32 elements).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_type: KvTypeArg,
    /// How the weights are held: `read` copies the file into memory on 2 MiB pages (decoding streams
    /// them faster), `mmap` maps the file (pages read on first use, shared with other processes,
    /// dropped by the kernel under memory pressure), `auto` reads when the file fits in the
    /// available memory with 2 GiB to spare and the OS has transparent huge pages, else maps.
    #[arg(long, value_enum, default_value = "auto")]
    pub load: LoadArg,
}

/// `--load`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadArg {
    /// `read` when the file fits with room to spare and huge pages exist, else `mmap`.
    Auto,
    /// Read the whole file into memory (on 2 MiB pages where the OS has them).
    Read,
    /// Map the file.
    Mmap,
}

/// `--kv-type`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum KvTypeArg {
    /// Half precision (llama.cpp's default).
    F16,
    /// Single precision.
    F32,
    /// 8-bit blocks of 32 (34 bytes per 32 elements), as llama.cpp's q8_0.
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks of 32 (18 bytes per 32 elements), as llama.cpp's q4_0.
    #[value(name = "q4_0")]
    Q4_0,
}

impl From<KvTypeArg> for KvType {
    fn from(k: KvTypeArg) -> KvType {
        match k {
            KvTypeArg::F16 => KvType::F16,
            KvTypeArg::F32 => KvType::F32,
            KvTypeArg::Q8_0 => KvType::Q8_0,
            KvTypeArg::Q4_0 => KvType::Q4_0,
        }
    }
}

/// A model ready to run.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub pool: ThreadPool,
    pub n_ctx: usize,
    /// Token positions of the KV pool shared by the server's sequences.
    pub pool_tokens: usize,
    pub kv_type: KvType,
    /// How the weights are held, and why (`--load`), for logs and `hearth bench`.
    pub weights: String,
}

/// Memory kept free beside the weights and the KV cache (scratch, the allocator, the OS).
const HEADROOM_BYTES: u64 = 1 << 30;

/// Memory that `--load auto` leaves free beside a file it reads into memory: the weights cannot be
/// paged out once read, so the KV cache, scratch and the rest of the machine need this much room.
const READ_SPARE_BYTES: u64 = 2 << 30;

/// How `--load` holds the weights.
#[derive(Debug, PartialEq, Eq)]
struct Residency {
    /// Read into memory ([`Gguf::open_resident`]) rather than mapped.
    read: bool,
    /// Why, for the log.
    why: String,
}

/// Decides `--load` for a file of `file` bytes with `available` bytes of memory free, on an OS whose
/// transparent huge pages are `thp` (`None`: unknown or absent). Reading a file that does not fit is
/// refused even when asked for: the process would be killed for memory instead.
fn choose_load(
    mode: LoadArg,
    file: u64,
    available: Option<u64>,
    thp: Option<bool>,
) -> Result<Residency> {
    let gb = |b: u64| b as f64 / 1e9;
    let read = |why: &str| Residency {
        read: true,
        why: format!("read into memory ({why})"),
    };
    let map = |why: String| Residency { read: false, why };
    Ok(match mode {
        LoadArg::Mmap => map("mapped from the file (--load mmap)".into()),
        LoadArg::Read => {
            if let Some(a) = available {
                anyhow::ensure!(
                    file <= a,
                    "--load read: the file is {:.2} GB, more than the {:.2} GB of memory \
                     available; --load mmap maps it instead",
                    gb(file),
                    gb(a)
                );
            }
            read("--load read")
        }
        LoadArg::Auto => match (thp, available) {
            (Some(true), Some(a)) if file.saturating_add(READ_SPARE_BYTES) <= a => {
                read("2 MiB pages; --load mmap maps it instead")
            }
            (Some(true), Some(a)) => map(format!(
                "mapped from the file: {:.2} GB does not fit in the {:.2} GB available with \
                 {:.2} GB to spare (--load read reads it anyway)",
                gb(file),
                gb(a),
                gb(READ_SPARE_BYTES)
            )),
            (Some(true), None) => map("mapped from the file: available memory unknown".into()),
            _ => map("mapped from the file: the OS has no transparent huge pages".into()),
        },
    })
}

/// Whether transparent huge pages can back an `madvise(MADV_HUGEPAGE)` region: the setting in
/// /sys/kernel/mm/transparent_hugepage/enabled is `always` or `madvise` (`None`: not Linux, or a
/// kernel without them).
pub fn thp_enabled() -> Option<bool> {
    parse_thp(&std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?)
}

/// The bracketed choice of `always [madvise] never`.
fn parse_thp(s: &str) -> Option<bool> {
    let chosen = s.split('[').nth(1)?.split(']').next()?;
    Some(matches!(chosen, "always" | "madvise"))
}

/// Contexts are rounded down to a multiple of this.
const CTX_ROUND: usize = 256;

/// The context per sequence, the KV pool shared by the sequences, and why.
#[derive(Debug)]
pub struct ContextSize {
    pub n_ctx: usize,
    /// Token positions of the KV pool (all sequences together; blocks are taken as needed).
    pub pool_tokens: usize,
    pub why: String,
}

/// KV cache bytes per position of one sequence.
pub fn kv_bytes_per_token(model: &Model, kv_type: KvType) -> u64 {
    let c = &model.config;
    (c.n_layer * (kv_type.row_bytes(c.k_dim()) + kv_type.row_bytes(c.v_dim()))) as u64
}

/// Chooses the KV pool and the context per sequence. The pool is what the budget holds
/// (`--kv-budget`, or the memory `available` before the weights were loaded, less the weights and
/// [`HEADROOM_BYTES`]); it is shared by the `parallel` sequences, any of which may grow to the
/// context: `-c` when given, else the model's trained context limited by the pool.
pub fn context_size(
    model: &Model,
    kv_type: KvType,
    parallel: usize,
    ctx: Option<usize>,
    budget: Option<u64>,
    available: Option<u64>,
) -> Result<ContextSize> {
    choose_context(
        &Facts {
            per_token: kv_bytes_per_token(model, kv_type),
            trained: model.config.n_ctx_train,
            weights: model.gguf().bytes().len() as u64,
            available,
            kind: kv_type.name().to_string(),
        },
        parallel,
        ctx,
        budget,
    )
}

/// What the context choice depends on.
struct Facts {
    /// KV bytes per position of one sequence.
    per_token: u64,
    /// The trained context.
    trained: usize,
    /// The model file's size.
    weights: u64,
    /// Memory available now (`None`: unknown on this system).
    available: Option<u64>,
    /// The KV type's name.
    kind: String,
}

fn choose_context(
    f: &Facts,
    parallel: usize,
    ctx: Option<usize>,
    budget: Option<u64>,
) -> Result<ContextSize> {
    let per_token = f.per_token.max(1);
    let parallel = parallel.max(1);
    let trained = f.trained.max(1);
    let gb = |b: u64| b as f64 / 1e9;
    let kv_of = |n: usize| (n as u64).saturating_mul(per_token);
    let kind = &f.kind;
    let explicit = budget.is_some();
    let (budget, source) = match budget {
        Some(b) => (b, "--kv-budget".to_string()),
        None => match f.available {
            Some(avail) => {
                let weights = f.weights;
                (
                    avail.saturating_sub(weights).saturating_sub(HEADROOM_BYTES),
                    format!(
                        "{:.2} GB available less {:.2} GB of weights and {:.2} GB of headroom",
                        gb(avail),
                        gb(weights),
                        gb(HEADROOM_BYTES)
                    ),
                )
            }
            // No /proc/meminfo (not Linux): the trained context, at most 8192, for each sequence.
            None => {
                let n = ctx.unwrap_or(trained.min(8192));
                anyhow::ensure!(n >= 1, "--ctx must be at least 1");
                return Ok(ContextSize {
                    n_ctx: n,
                    pool_tokens: n.saturating_mul(parallel),
                    why: format!(
                        "context {n} tokens per sequence x {parallel} sequence(s) \
                         (available memory unknown here; set -c or --kv-budget)"
                    ),
                });
            }
        },
    };
    let fit = (budget / per_token).min(usize::MAX as u64 / 2) as usize;
    if let Some(c) = ctx {
        anyhow::ensure!(c >= 1, "--ctx must be at least 1");
        anyhow::ensure!(
            !explicit || kv_of(c) <= budget,
            "-c {c} needs {:.2} GB of {kind} KV cache, more than --kv-budget {:.2} GB",
            gb(kv_of(c)),
            gb(budget)
        );
        // The pool holds at least one whole context, whatever the memory estimate says.
        let pool = fit.max(c);
        return Ok(ContextSize {
            n_ctx: c,
            pool_tokens: pool,
            why: format!(
                "context {c} tokens per sequence (-c); KV pool {pool} tokens ({:.2} GB of {kind}) \
                 shared by {parallel} sequence(s), from {:.2} GB ({source})",
                gb(kv_of(pool)),
                gb(budget)
            ),
        });
    }
    let n = fit.min(trained);
    let n = if n == trained {
        n
    } else {
        n / CTX_ROUND * CTX_ROUND
    };
    anyhow::ensure!(
        n >= CTX_ROUND.min(trained),
        "not enough memory for a KV cache: {:.2} GB ({source}) holds {fit} tokens at {per_token} \
         bytes per token; set -c or --kv-budget",
        gb(budget)
    );
    let limited = if n == trained {
        "the trained context".to_string()
    } else {
        format!("the trained context is {trained}; limited by the pool")
    };
    Ok(ContextSize {
        n_ctx: n,
        pool_tokens: fit,
        why: format!(
            "context {n} tokens per sequence ({limited}); KV pool {fit} tokens ({:.2} GB of {kind}) \
             shared by {parallel} sequence(s): {source}; -c or --kv-budget overrides",
            gb(kv_of(fit))
        ),
    })
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// A size: a number with an optional unit `K`, `M`, `G`, `T` (powers of 1024; `KiB`, `MB`, ... are
/// read the same), e.g. `8G`, `1.5G`, `512M`, `1073741824`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size such as 8G or 512M"))?;
    let mult = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("`{s}`: the unit must be K, M, G or T")),
    };
    let v = x * mult as f64;
    if !v.is_finite() || v < 1.0 || v > u64::MAX as f64 / 2.0 {
        return Err(format!("`{s}` is not a usable size"));
    }
    Ok(v as u64)
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

/// A progress bar of bytes on stderr (its length set as it runs); hidden when stderr is not a
/// terminal.
pub fn bytes_progress_bar(msg: &str) -> indicatif::ProgressBar {
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
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

    /// Opens the file, binds the model and builds the tokenizer, for one sequence.
    pub fn load(&self) -> Result<Loaded> {
        self.load_for(1)
    }

    /// [`ModelArgs::load`] for `parallel` sequences of the context chosen.
    pub fn load_for(&self, parallel: usize) -> Result<Loaded> {
        self.load_sized(Some(parallel))
    }

    /// [`ModelArgs::load`] for a command that sizes its own KV cache (`bench`): no context is
    /// chosen (`n_ctx` is the trained context) and memory is not checked.
    pub fn load_unsized(&self) -> Result<Loaded> {
        self.load_sized(None)
    }

    fn load_sized(&self, parallel: Option<usize>) -> Result<Loaded> {
        let path = &self.model;
        let n_threads = self.n_threads()?;
        // Measured before the weights take their share (read into memory, they leave it).
        let available = mem_available_bytes();
        // A file that cannot be stat'ed is mapped, and opening it reports why.
        let residency = match std::fs::metadata(path) {
            Ok(m) => choose_load(self.load, m.len(), available, thp_enabled())?,
            Err(_) => Residency {
                read: false,
                why: String::new(),
            },
        };
        let gguf = if residency.read {
            let pb = bytes_progress_bar(&format!("reading {}", path.display()));
            let g = Gguf::open_resident(path, &mut |done, total| {
                pb.set_length(total);
                pb.set_position(done);
            });
            pb.finish_and_clear();
            g
        } else {
            Gguf::open(path)
        };
        let gguf = Arc::new(gguf.with_context(|| format!("cannot open {}", path.display()))?);
        tracing::info!("weights: {}", residency.why);
        let (model, tokenizer) =
            with_spinner(&format!("loading {}", path.display()), || -> Result<_> {
                let tokenizer = Tokenizer::from_gguf(gguf.metadata())
                    .with_context(|| format!("{}: tokenizer", path.display()))?;
                let model =
                    Model::load(gguf).with_context(|| format!("cannot load {}", path.display()))?;
                Ok((model, tokenizer))
            })?;
        let interleaved = model.gguf().n_rewritten();
        if interleaved > 0 {
            tracing::info!(
                "weights: {interleaved} matrices laid out in groups of rows for the {} kernels",
                hearth_quant::kernel_isa()
            );
        }
        let kv_type: KvType = self.kv_type.into();
        kv_type
            .check_heads(model.config.head_dim, model.config.head_dim_v)
            .with_context(|| format!("--kv-type {}", kv_type.name()))?;
        let sizing = match parallel {
            Some(p) => context_size(&model, kv_type, p, self.ctx, self.kv_budget, available)?,
            None => ContextSize {
                n_ctx: model.config.n_ctx_train,
                pool_tokens: model.config.n_ctx_train,
                why: String::new(),
            },
        };
        if !sizing.why.is_empty() {
            tracing::info!("{}", sizing.why);
        }
        Ok(Loaded {
            model,
            tokenizer,
            pool: ThreadPool::new(n_threads),
            n_ctx: sizing.n_ctx,
            pool_tokens: sizing.pool_tokens,
            kv_type,
            weights: residency.why,
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

#[cfg(test)]
mod tests {
    use super::{choose_context, choose_load, parse_size, parse_thp, Facts, LoadArg};

    const GB: u64 = 1 << 30;

    fn facts(available: Option<u64>) -> Facts {
        // Qwen3-30B-A3B: 48 layers x (512 + 512) f16 = 96 KiB per token; 262,144 trained.
        Facts {
            per_token: 48 * 1024 * 2,
            trained: 262_144,
            weights: 18 * GB,
            available,
            kind: "f16".into(),
        }
    }

    #[test]
    fn the_context_is_the_trained_one_limited_by_the_pool() {
        // 24 GB machine: 5 GB after 18 GB of weights and 1 GB headroom: 54,613 tokens of pool,
        // shared by the sequences, each of which may use it all.
        let one = choose_context(&facts(Some(24 * GB)), 1, None, None).unwrap();
        assert_eq!((one.n_ctx, one.pool_tokens), (54_528, 54_613));
        let four = choose_context(&facts(Some(24 * GB)), 4, None, None).unwrap();
        assert_eq!((four.n_ctx, four.pool_tokens), (54_528, 54_613));
        assert!(
            four.why.contains("trained context is 262144"),
            "{}",
            four.why
        );
        // Plenty of memory: the trained context.
        let big = choose_context(&facts(Some(200 * GB)), 4, None, None).unwrap();
        assert_eq!(big.n_ctx, 262_144);
        assert!(big.pool_tokens > 262_144 * 2);
        // --kv-budget replaces the memory estimate; -c wins over both, within the budget.
        let b = choose_context(&facts(Some(24 * GB)), 1, None, Some(12 * GB)).unwrap();
        assert_eq!((b.n_ctx, b.pool_tokens), (131_072, 131_072));
        let c = choose_context(&facts(Some(24 * GB)), 2, Some(5000), None).unwrap();
        assert_eq!((c.n_ctx, c.pool_tokens), (5000, 54_613));
        assert!(choose_context(&facts(None), 2, Some(200_000), Some(GB)).is_err());
        // Unknown memory: the old default, for each sequence.
        let u = choose_context(&facts(None), 4, None, None).unwrap();
        assert_eq!((u.n_ctx, u.pool_tokens), (8192, 4 * 8192));
        // Not even 256 tokens fit: a clear error.
        let e = choose_context(&facts(Some(19 * GB)), 4, None, None).unwrap_err();
        assert!(e.to_string().contains("not enough memory"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("").is_err());
        assert!(parse_size("8X").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("1e400").is_err());
    }

    #[test]
    fn load_reads_what_fits_with_room_to_spare() {
        let auto = |file, avail, thp| choose_load(LoadArg::Auto, file, avail, thp).unwrap().read;
        assert!(auto(GB, Some(24 * GB), Some(true)));
        // 18.6 GB on a 24 GB machine: 2 GiB to spare is met at 20.8 GB available, not at 20.5.
        assert!(auto(18_600_000_000, Some(20_800_000_000), Some(true)));
        assert!(!auto(18_600_000_000, Some(20_500_000_000), Some(true)));
        // No huge pages, or no idea of the memory: mapped.
        assert!(!auto(GB, Some(24 * GB), Some(false)));
        assert!(!auto(GB, Some(24 * GB), None));
        assert!(!auto(GB, None, Some(true)));
        let why = choose_load(LoadArg::Auto, 30 * GB, Some(24 * GB), Some(true))
            .unwrap()
            .why;
        assert!(why.contains("--load read"), "{why}");

        // Asked for: read whatever the pages, refused past the memory available, with the way out.
        assert!(choose_load(LoadArg::Read, GB, None, None).unwrap().read);
        assert!(
            choose_load(LoadArg::Read, GB, Some(2 * GB), Some(false))
                .unwrap()
                .read
        );
        let e = choose_load(LoadArg::Read, 30 * GB, Some(24 * GB), Some(true)).unwrap_err();
        assert!(e.to_string().contains("--load mmap"), "{e}");
        assert!(
            !choose_load(LoadArg::Mmap, GB, Some(24 * GB), Some(true))
                .unwrap()
                .read
        );
    }

    #[test]
    fn thp_setting_is_the_bracketed_word() {
        assert_eq!(parse_thp("always [madvise] never\n"), Some(true));
        assert_eq!(parse_thp("[always] madvise never\n"), Some(true));
        assert_eq!(parse_thp("always madvise [never]\n"), Some(false));
        assert_eq!(parse_thp("garbage"), None);
    }
}
