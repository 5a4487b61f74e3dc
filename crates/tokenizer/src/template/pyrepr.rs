//! Python's `str()` and `repr()` of template values.
//!
//! jinja2 prints `{{ value }}` and applies `|string` with Python's `str()`, so `{{ true }}` is `True`,
//! `{{ none }}` is `None`, a list prints as `['a', 1]` and a float as `1e-07`. Templates do print such
//! values (Qwen3-Coder writes tool-call arguments and schema fields with `|string`), so MiniJinja's
//! own spelling (`true`, `none`, `["a", 1]`) would change the prompt.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

/// Deepest nesting `str()` / `repr()` / `tojson` walk before giving up. Templates can build nested
/// lists in a loop (`{% set x = [x] %}`), and the walk is recursive, so the depth is capped rather
/// than trusted to fit the stack.
pub(crate) const MAX_DEPTH: usize = 256;

/// Python `str(value)`: strings verbatim, everything else as [`py_repr`] (undefined prints empty,
/// as jinja2's default `Undefined`).
pub(crate) fn py_str(value: &Value) -> Result<String, Error> {
    let mut out = String::new();
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(&mut out, value, 0)?,
    }
    Ok(out)
}

/// Appends Python `repr(value)` to `out`.
fn write_repr(out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item, depth + 1)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key, depth + 1)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?, depth + 1)?;
            }
            out.push('}');
        }
        // Bytes, namespaces, macros, loop objects: MiniJinja's own spelling is as good as any.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

pub(crate) fn too_deep() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("value nested deeper than {MAX_DEPTH} levels"),
    )
}

/// Python `str()` of an int or float.
pub(crate) fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        // Integers of every width print in decimal, as Python's.
        let _ = write!(out, "{value}");
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => write_float(out, f, "nan", "inf"),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    }
}

/// Python `float.__repr__`: the shortest digits that round-trip, in fixed notation when the decimal
/// exponent is in `-4..16` (always with a fractional part, `2.0`), otherwise scientific with a signed
/// two-digit-minimum exponent (`1e-07`, `1.5e+16`). `nan` / `inf` spellings are the caller's
/// (`str()` says `nan`, `json.dumps` says `NaN`).
pub(crate) fn write_float(out: &mut String, f: f64, nan: &str, inf: &str) {
    if f.is_nan() {
        out.push_str(nan);
        return;
    }
    if f.is_infinite() {
        if f < 0.0 {
            out.push('-');
        }
        out.push_str(inf);
        return;
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            // The point goes after exp + 1 digits; pad with zeros when the digits run out.
            let int_len = usize::try_from(exp).unwrap_or(0) + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.push_str(&"0".repeat(int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            let zeros = usize::try_from(-exp - 1).unwrap_or(0);
            out.push_str(&"0".repeat(zeros));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// Python `repr(str)`: single quotes unless the text holds `'` and no `"`; backslash escapes for the
/// quote, backslash, `\t \n \r`, other control characters and non-printable code points.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let cp = u32::from(c);
                let _ = if cp < 0x100 {
                    write!(out, "\\x{cp:02x}")
                } else if cp < 0x10000 {
                    write!(out, "\\u{cp:04x}")
                } else {
                    write!(out, "\\U{cp:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character: everything but the ASCII space in the
/// categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs is escaped by `repr()`. (The Unicode tables may be a
/// version apart from the Python that made the goldens; only newly assigned characters differ.)
fn is_printable(c: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory as G};
    c == ' '
        || !matches!(
            get_general_category(c),
            G::Control
                | G::Format
                | G::Surrogate
                | G::PrivateUse
                | G::Unassigned
                | G::LineSeparator
                | G::ParagraphSeparator
                | G::SpaceSeparator
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(f: f64) -> String {
        let mut s = String::new();
        write_float(&mut s, f, "nan", "inf");
        s
    }

    #[test]
    fn floats_match_python_repr() {
        // Expected strings are Python 3's repr().
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (1e-7, "1e-07"),
            (123456789.125, "123456789.125"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e21, "1e+21"),
            (-3.25e100, "-3.25e+100"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
        ];
        for (f, want) in cases {
            assert_eq!(float(f), want, "{f:e}");
        }
    }

    #[test]
    fn values_match_python_str() {
        let v = Value::from_serialize(serde_json::json!(
            [1, "it's", "say \"hi\"", "both '\"", null, true, 2.0, {"k": "a\nb\u{7}"}]
        ));
        assert_eq!(
            py_str(&v).unwrap(),
            r#"[1, "it's", 'say "hi"', 'both \'"', None, True, 2.0, {'k': 'a\nb\x07'}]"#
        );
        assert_eq!(py_str(&Value::UNDEFINED).unwrap(), "");
        assert_eq!(py_str(&Value::from("x")).unwrap(), "x");
    }
}
