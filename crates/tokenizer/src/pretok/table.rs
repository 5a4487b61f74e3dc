//! The regexes of each `tokenizer.ggml.pre`, as llama.cpp's `llm_tokenizer_bpe` lists them, and the
//! flags its `load` sets alongside (`clean_spaces`, `ignore_merges`, default `add_bos`).

/// GPT-2's regex; llama.cpp matches it with a hand-written splitter.
pub(super) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's regex (case-insensitive contractions spelled out); hand-written splitter in llama.cpp.
pub(super) const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The same regex as in the tokenizer.json of Llama 3; llama.cpp routes it to the same splitter.
pub(super) const LLAMA3_ORIG: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// DeepSeek LLM's letters and punctuation, code point for code point as in llama-vocab.cpp (spelled
// with escapes: several of these code points have canonical singleton decompositions that any
// normalizing editor would silently change, e.g. U+2126 OHM SIGN -> U+03A9).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
const DEEPSEEK_LLM_PUNCT: &str =
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+";
// [一-龥ࠀ-一가-퟿]+, spelled with escapes so that no editor or normalizer can touch it.
const CJK: &str = "[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const UFAKZEKA: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a `tokenizer.ggml.pre` value selects in llama.cpp (llama-vocab.cpp, `load`).
#[derive(Clone, Debug)]
pub struct PreConfig {
    /// The regexes, applied in order.
    pub regexes: Vec<&'static str>,
    /// `clean_spaces`: detokenizer removes spaces before punctuation (`clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// `ignore_merges`: a word that is a whole token is taken as is, without BPE.
    pub ignore_merges: bool,
    /// Default of `add_bos` before `tokenizer.ggml.add_bos_token` overrides it.
    pub add_bos: bool,
    /// The BOS token is disabled by default (ChatGLM).
    pub no_bos: bool,
}

/// The configuration of a pre-tokenizer name, or `None` when llama.cpp does not know it (or we do
/// not support it: then we refuse to guess rather than tokenize differently).
pub fn pre_config(name: &str) -> Option<PreConfig> {
    let cfg = |regexes: Vec<&'static str>, clean_spaces: bool| PreConfig {
        regexes,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
    };
    let default = || vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];
    let starcoder = || vec![r"\p{N}", GPT2];
    Some(match name {
        // llama.cpp warns and uses `default` when the key is missing; we get "" for a missing key.
        "" | "default" => cfg(default(), true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..cfg(vec![LLAMA3], true)
        },
        "deepseek-llm" => cfg(
            vec![
                "[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                DEEPSEEK_LLM_PUNCT,
                r"\s+$",
                CJK,
                r"\p{N}+",
            ],
            false,
        ),
        "deepseek-coder" => cfg(
            vec!["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => cfg(
            vec![
                r"\p{N}{1,3}",
                "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
                DEEPSEEK3_MAIN,
            ],
            false,
        ),
        "falcon" => cfg(
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            true,
        ),
        "mpt" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
        | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "olmo" | "jais" => {
            cfg(vec![GPT2], true)
        }
        "trillion" | "granite-docling" => cfg(vec![GPT2], false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            cfg(starcoder(), true)
        }
        "command-r" | "smollm" => cfg(starcoder(), false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
            cfg(vec![QWEN2], false)
        }
        "megrez" | "stablelm2" => cfg(vec![QWEN2], true),
        "qwen35" => cfg(vec![QWEN35], false),
        "dbrx" | "smaug-bpe" => cfg(vec![LLAMA3], true),
        "poro-chat" => cfg(vec![PORO], false),
        "bloom" | "gpt3-finnish" => cfg(vec![PORO], true),
        "glm4" | "chatglm-bpe" => PreConfig {
            no_bos: true,
            ..cfg(vec![LLAMA3], true)
        },
        "viking" => cfg(vec![PORO, r"\p{N}"], false),
        "tekken" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..cfg(vec![TEKKEN], false)
        },
        "chameleon" => PreConfig {
            add_bos: true,
            ..cfg(
                vec![
                    "<sentinel:[0-9]+>",
                    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                    "([\\t\\n]|    |  )",
                    r"\p{N}",
                    r"[\p{P}!-/:-@\[-`{-~]",
                    GPT2,
                ],
                false,
            )
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => cfg(vec![GPT4O], false),
        "seed-coder" => cfg(vec![SEED_CODER], false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => cfg(vec![BAILINGMOE], false),
        "grok-2" => cfg(vec![QWEN2], false),
        "ufakzeka" => cfg(vec![UFAKZEKA], false),
        _ => return None,
    })
}
