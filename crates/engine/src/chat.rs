//! Chat prompts: render a conversation through the chat template and tokenize it so that the
//! template's own markup is parsed as special tokens but message content never is. A user who types
//! `<|im_end|>` gets those characters as text, not a control token.
//!
//! How: before rendering, every control token's text inside message strings is broken by a Unicode
//! noncharacter (U+FDD0, which never occurs in text), so it cannot match a special token; after
//! rendering, the text is split at the control tokens that remain (the template's), and the pieces in
//! between are tokenized as plain text with the marker removed.

use hearth_tokenizer::template::{ChatInput, ChatTemplate, TemplateError};
use hearth_tokenizer::Tokenizer;
use serde_json::Value;

const MARK: char = '\u{FDD0}';

/// Renders and tokenizes chat prompts for one tokenizer.
pub struct ChatEncoder {
    controls: Vec<(String, u32)>, // control tokens' texts, longest first
}

impl ChatEncoder {
    /// Collects the tokenizer's control tokens.
    pub fn new(tok: &Tokenizer) -> ChatEncoder {
        let mut controls: Vec<(String, u32)> = (0..tok.vocab_size() as u32)
            .filter(|&id| tok.is_control(id) && !tok.token_text(id).is_empty())
            .map(|id| (tok.token_text(id).to_string(), id))
            .collect();
        controls.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        ChatEncoder { controls }
    }

    /// Escapes control-token texts in every string of `v` (message contents, tool arguments…).
    pub fn escape(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if s.contains(MARK) {
                    *s = s.replace(MARK, "");
                }
                for (text, _) in &self.controls {
                    if s.contains(text.as_str()) {
                        let mut broken = String::with_capacity(text.len() + 3);
                        let mut chars = text.chars();
                        broken.extend(chars.next());
                        broken.push(MARK);
                        broken.extend(chars);
                        *s = s.replace(text.as_str(), &broken);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.escape(x)),
            Value::Object(o) => o.values_mut().for_each(|x| self.escape(x)),
            _ => {}
        }
    }

    /// Renders `input` (its message strings escaped) and returns the text the template produced,
    /// still carrying the escape marks; [`ChatEncoder::encode`] turns it into tokens.
    pub fn render(
        &self,
        template: &ChatTemplate,
        input: &ChatInput,
    ) -> Result<String, TemplateError> {
        let mut input = input.clone();
        input.messages.iter_mut().for_each(|m| self.escape(m));
        if let Some(tools) = input.tools.as_mut() {
            tools.iter_mut().for_each(|t| self.escape(t));
        }
        template.render(&input)
    }

    /// Tokenizes rendered text: control tokens written by the template become their ids, everything
    /// else is text. BOS is added when the model asks for it and the template did not write it.
    pub fn encode(&self, tok: &Tokenizer, rendered: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut gap = String::new();
        let mut rest = rendered;
        let flush = |gap: &mut String, out: &mut Vec<u32>| {
            if !gap.is_empty() {
                out.extend(tok.encode(&gap.replace(MARK, ""), false));
                gap.clear();
            }
        };
        while let Some(c) = rest.chars().next() {
            if let Some((text, id)) = self
                .controls
                .iter()
                .find(|(t, _)| rest.starts_with(t.as_str()))
            {
                flush(&mut gap, &mut out);
                out.push(*id);
                rest = &rest[text.len()..];
            } else {
                gap.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        flush(&mut gap, &mut out);
        if tok.add_bos() {
            if let Some(bos) = tok.bos_id() {
                if out.first() != Some(&bos) {
                    out.insert(0, bos);
                }
            }
        }
        out
    }

    /// Renders and tokenizes in one step.
    pub fn prompt(
        &self,
        tok: &Tokenizer,
        template: &ChatTemplate,
        input: &ChatInput,
    ) -> Result<Vec<u32>, TemplateError> {
        Ok(self.encode(tok, &self.render(template, input)?))
    }
}
