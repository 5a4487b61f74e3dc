//! Conversion of a Hugging Face `tokenizer.json` into `tokenizer.ggml.*` metadata.
