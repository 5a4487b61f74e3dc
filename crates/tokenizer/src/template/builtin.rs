//! The chat formats of architectures whose files often carry no `tokenizer.chat_template` (the
//! Gemma 3 GGUFs of the `gemma3-270m` fixture, many community conversions), written as templates
//! that render what llama.cpp's built-in C++ formats (`src/llama-chat.cpp`) write. A caller with a
//! template-less file asks [`for_architecture`] before falling back to ChatML.

/// A built-in chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownFormat {
    /// llama.cpp's name of the format (`--chat-template gemma`).
    pub name: &'static str,
    /// The Jinja source.
    pub source: &'static str,
}

/// Gemma (llama.cpp's `LLM_CHAT_TEMPLATE_GEMMA`): `<start_of_turn>{role}\n{content}<end_of_turn>\n`
/// per message with `assistant` spelled `model`, contents trimmed; Gemma has no system turn, so
/// system messages are trimmed and gathered, then written at the head of the next non-model turn,
/// followed by a blank line; `<start_of_turn>model\n` when a generation prompt is asked for. A
/// content given as a list of parts contributes its text parts, concatenated (as llama.cpp's server
/// flattens them for its built-in formats).
pub const GEMMA: KnownFormat = KnownFormat {
    name: "gemma",
    source: concat!(
        "{%- set ns = namespace(system='') -%}",
        "{%- for message in messages -%}",
        "{%- set parts = namespace(text='') -%}",
        "{%- if message['content'] is string -%}",
        "{%- set parts.text = message['content'] -%}",
        "{%- elif message['content'] is iterable -%}",
        "{%- for part in message['content'] if part['type'] == 'text' -%}",
        "{%- set parts.text = parts.text + part['text'] -%}",
        "{%- endfor -%}",
        "{%- endif -%}",
        "{%- set content = parts.text | trim -%}",
        "{%- if message['role'] == 'system' -%}",
        "{%- set ns.system = ns.system + content -%}",
        "{%- else -%}",
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}",
        "{{- '<start_of_turn>' + role + '\\n' -}}",
        "{%- if ns.system != '' and role != 'model' -%}",
        "{{- ns.system + '\\n\\n' -}}",
        "{%- set ns.system = '' -%}",
        "{%- endif -%}",
        "{{- content + '<end_of_turn>\\n' -}}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}",
    ),
};

/// Architectures (`general.architecture`) and the format their instruction-tuned models use.
const BY_ARCHITECTURE: &[(&str, KnownFormat)] =
    &[("gemma", GEMMA), ("gemma2", GEMMA), ("gemma3", GEMMA)];

/// The known chat format of an architecture, if it has one.
pub fn for_architecture(arch: &str) -> Option<KnownFormat> {
    BY_ARCHITECTURE
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(_, f)| *f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{ChatInput, ChatTemplate};
    use serde_json::json;

    fn render(messages: serde_json::Value, gen: bool) -> String {
        let t = ChatTemplate::new(GEMMA.source).unwrap();
        let input = ChatInput {
            messages: messages.as_array().unwrap().clone(),
            add_generation_prompt: gen,
            ..ChatInput::default()
        };
        t.render(&input).unwrap()
    }

    #[test]
    fn gemma_renders_as_llama_cpp_builtin() {
        // What llama_chat_apply_template(tmpl = "gemma") writes for the same messages.
        let got = render(
            json!([
                {"role": "system", "content": "  Be brief. "},
                {"role": "user", "content": "Hi there\n"},
                {"role": "assistant", "content": " Hello! "},
                {"role": "user", "content": "Name a colour."},
            ]),
            true,
        );
        assert_eq!(
            got,
            "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nName a colour.<end_of_turn>\n\
             <start_of_turn>model\n"
        );
        assert_eq!(
            render(json!([{"role": "user", "content": "x"}]), false),
            "<start_of_turn>user\nx<end_of_turn>\n"
        );
    }

    #[test]
    fn system_waits_for_a_non_model_turn_and_parts_are_joined() {
        let got = render(
            json!([
                {"role": "system", "content": "A."},
                {"role": "system", "content": "B."},
                {"role": "assistant", "content": "first"},
                {"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "image"}, {"type": "text", "text": "two"}]},
                {"role": "assistant", "content": null},
            ]),
            false,
        );
        assert_eq!(
            got,
            "<start_of_turn>model\nfirst<end_of_turn>\n\
             <start_of_turn>user\nA.B.\n\none two<end_of_turn>\n\
             <start_of_turn>model\n<end_of_turn>\n"
        );
    }

    #[test]
    fn architectures() {
        assert_eq!(for_architecture("gemma3"), Some(GEMMA));
        assert_eq!(for_architecture("gemma2").map(|f| f.name), Some("gemma"));
        assert_eq!(for_architecture("llama"), None);
    }
}
