//! The `tojson` filter as transformers defines it: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//!
//! transformers replaces jinja2's own `tojson` because that one HTML-escapes `<>&'`; MiniJinja's
//! built-in escapes too and spaces differently, so both are replaced here. The spelling follows
//! CPython's `json` encoder: `", "` and `": "` separators by default (`","` between items once an
//! indent is given), floats as `float.__repr__`, no escaping beyond `"`, `\` and control characters
//! unless `ensure_ascii`, keys in insertion order unless `sort_keys`.

use super::pyrepr::{too_deep, write_float, write_number, MAX_DEPTH};
use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

/// Options of `json.dumps` that transformers' filter exposes.
struct Options {
    ensure_ascii: bool,
    /// `None`: everything on one line; `Some(s)`: a newline and `s` per level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`; arguments may be
/// positional (in that order, as in Python) or keywords.
pub(crate) fn tojson(value: &Value, args: Rest<Value>) -> Result<String, Error> {
    type Args = (
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Kwargs,
    );
    let (ensure_ascii, indent, separators, sort_keys, kwargs): Args = from_args(&args)?;
    let ensure_ascii = arg(ensure_ascii, &kwargs, "ensure_ascii")?;
    let indent = arg(indent, &kwargs, "indent")?;
    let separators = arg(separators, &kwargs, "separators")?;
    let sort_keys = arg(sort_keys, &kwargs, "sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(indent_string(&v)?),
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => separator_pair(&v)?,
        // Python: `(', ', ': ')` without an indent, `(',', ': ')` with one.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let opts = Options {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    encode(&mut out, value, &opts, 0)?;
    Ok(out)
}

/// One `json.dumps` parameter, given positionally or by keyword but not both (Python's TypeError).
fn arg(positional: Option<Value>, kwargs: &Kwargs, name: &str) -> Result<Option<Value>, Error> {
    let keyword: Option<Value> = kwargs.get(name)?;
    match (positional, keyword) {
        (Some(_), Some(_)) => Err(Error::new(
            ErrorKind::TooManyArguments,
            format!("tojson() got multiple values for argument '{name}'"),
        )),
        (p, k) => Ok(p.or(k)),
    }
}

/// Python: an int indent means that many spaces (none when negative), a string is used as is.
fn indent_string(v: &Value) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_owned());
    }
    if matches!(v.kind(), ValueKind::Bool | ValueKind::Number)
        && (v.is_integer() || v.kind() == ValueKind::Bool)
    {
        let n = if v.kind() == ValueKind::Bool {
            i64::from(v.is_true())
        } else {
            i64::try_from(v.clone())?
        };
        // An indent wider than this is a runaway, not a style.
        let n = usize::try_from(n.clamp(0, 1024)).unwrap_or(0);
        return Ok(" ".repeat(n));
    }
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson indent must be an int or a string, not {}", v.kind()),
    ))
}

fn separator_pair(v: &Value) -> Result<(String, String), Error> {
    let parts: Vec<Value> = v.try_iter()?.collect();
    match parts.as_slice() {
        [a, b] => match (a.as_str(), b.as_str()) {
            (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
            _ => Err(bad_separators()),
        },
        _ => Err(bad_separators()),
    }
}

fn bad_separators() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "tojson separators must be a pair of strings (item, key)",
    )
}

fn encode(out: &mut String, value: &Value, opts: &Options, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => write_number(out, value),
        ValueKind::Number => {
            let f = f64::try_from(value.clone())?;
            write_float(out, f, "NaN", "Infinity");
        }
        ValueKind::String => encode_str(out, value.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separator(out, opts, depth + 1, i == 0);
                encode(out, item, opts, depth + 1)?;
            }
            close(out, opts, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                // Code point order, which UTF-8 byte order preserves.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                separator(out, opts, depth + 1, i == 0);
                encode_str(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                encode(out, item, opts, depth + 1)?;
            }
            close(out, opts, depth);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// Before an item: the item separator (not before the first) and, with an indent, a new line.
fn separator(out: &mut String, opts: &Options, level: usize, first: bool) {
    if !first {
        out.push_str(&opts.item_sep);
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn close(out: &mut String, opts: &Options, level: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

/// Python's encoder turns str, int, float, bool and None keys into strings; anything else is a
/// TypeError.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            if key.is_integer() {
                write_number(&mut s, key);
            } else {
                write_float(&mut s, f64::try_from(key.clone())?, "NaN", "Infinity");
            }
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// A JSON string literal as CPython writes it: `"`, `\` and `\b \f \n \r \t` by name, other control
/// characters as `\u00XX`; with `ensure_ascii` everything outside `' '..='~'` as `\uXXXX` (surrogate
/// pairs above the BMP).
fn encode_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
