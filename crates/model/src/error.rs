//! Errors of model loading and running.

use hearth_quant::GgmlType;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The GGUF file itself is invalid.
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
    /// `general.architecture` is missing.
    #[error("the file has no general.architecture")]
    NoArchitecture,
    /// An architecture Hearth does not implement (refusing to guess).
    #[error("unsupported architecture '{0}' (supported: {names})", names = crate::arch::arch_names())]
    UnsupportedArchitecture(String),
    /// A required hyperparameter is missing or has the wrong type.
    #[error("missing or invalid hyperparameter '{key}'{}", .detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Hyperparameter {
        /// The metadata key.
        key: String,
        /// What was wrong, when more than absence.
        detail: Option<String>,
    },
    /// Some tensors are missing, mis-shaped or of an unusable type; every problem is listed.
    #[error("the model's tensors do not match its architecture:\n  {}", .0.join("\n  "))]
    Tensors(Vec<String>),
    /// A tensor type Hearth cannot compute with.
    #[error("tensor '{name}' has type {ty}, which Hearth does not support")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A quantized KV cache for heads that are not whole 32-element blocks.
    #[error("a {ty} KV cache stores each head as blocks of 32 elements, but this model's heads have {head_dim} (K) and {head_dim_v} (V): use f16 or f32")]
    KvType {
        /// The KV type's name.
        ty: &'static str,
        /// K head dimension.
        head_dim: usize,
        /// V head dimension.
        head_dim_v: usize,
    },
    /// A batch that does not fit the buffers or the KV cache.
    #[error("invalid batch: {0}")]
    Batch(String),
}
