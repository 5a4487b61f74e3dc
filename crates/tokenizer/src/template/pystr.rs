//! Python methods on template values (`content.split('</think>')[-1].lstrip('\n')`).
//!
//! MiniJinja has no methods on strings; `minijinja_contrib::pycompat` supplies most of them. The
//! ones whose results differ from Python are done here first: argument-less `strip()` and `split()`
//! use Python's whitespace set (which includes `\x1c`-`\x1f`, unlike Rust's), `split` and `rsplit`
//! take `maxsplit`, and `find` / `rfind` / `index` / `rindex` count characters, not bytes.
//! Everything else falls through to pycompat.

use minijinja::value::{from_args, Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

/// The unknown-method callback installed on the environment.
pub(crate) fn method_callback(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        if let Some(result) = string_method(s, method, args)? {
            return Ok(result);
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.isspace()` for one character (`Py_UNICODE_ISSPACE`).
pub(crate) fn is_py_space(c: char) -> bool {
    matches!(c,
        '\t'..='\r' | '\u{1c}'..=' ' | '\u{85}' | '\u{a0}' | '\u{1680}'
        | '\u{2000}'..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}')
}

/// Python `s.strip(chars)`, `lstrip`, `rstrip`: `chars` of None means whitespace.
pub(crate) fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_space(c),
    };
    let s = if left { s.trim_start_matches(strip) } else { s };
    if right {
        s.trim_end_matches(strip)
    } else {
        s
    }
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let result = match method {
        "strip" | "lstrip" | "rstrip" => {
            let (chars,): (Option<Value>,) = from_args(args)?;
            let chars = optional_str(chars.as_ref(), method)?;
            let left = method != "rstrip";
            let right = method != "lstrip";
            Value::from(py_strip(s, chars, left, right))
        }
        "split" | "rsplit" => {
            let (sep, maxsplit, kwargs): (Option<Value>, Option<Value>, Kwargs) = from_args(args)?;
            let sep = sep.or(kwargs.get::<Option<Value>>("sep")?);
            let maxsplit = maxsplit.or(kwargs.get::<Option<Value>>("maxsplit")?);
            kwargs.assert_all_used()?;
            let sep = optional_str(sep.as_ref(), method)?;
            let maxsplit = match maxsplit {
                Some(v) if !v.is_none() => i64::try_from(v)?,
                _ => -1,
            };
            let parts = if method == "split" {
                py_split(s, sep, maxsplit)?
            } else {
                py_rsplit(s, sep, maxsplit)?
            };
            Value::from(parts.into_iter().map(Value::from).collect::<Vec<_>>())
        }
        "find" | "rfind" | "index" | "rindex" => {
            let (sub,): (&str,) = from_args(args)?;
            let byte = if method.starts_with('r') {
                s.rfind(sub)
            } else {
                s.find(sub)
            };
            match byte {
                Some(b) => Value::from(s[..b].chars().count()),
                None if method.ends_with("find") => Value::from(-1),
                None => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "substring not found",
                    ))
                }
            }
        }
        "isspace" => {
            let () = from_args(args)?;
            Value::from(!s.is_empty() && s.chars().all(is_py_space))
        }
        _ => return Ok(None),
    };
    Ok(Some(result))
}

/// A `None`-or-string argument (`strip(None)` is `strip()`).
fn optional_str<'a>(v: Option<&'a Value>, method: &str) -> Result<Option<&'a str>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => match v.as_str() {
            Some(s) if v.kind() == ValueKind::String => Ok(Some(s)),
            _ => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("{method} arg must be None or str, not {}", v.kind()),
            )),
        },
    }
}

/// Python `s.split(sep, maxsplit)`; `maxsplit < 0` means no limit.
fn py_split<'a>(s: &'a str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<&'a str>, Error> {
    match sep {
        Some("") => Err(empty_separator()),
        Some(sep) => Ok(match usize::try_from(maxsplit) {
            Ok(n) => s.splitn(n.saturating_add(1), sep).collect(),
            Err(_) => s.split(sep).collect(),
        }),
        None => {
            // CPython's split_whitespace: runs of whitespace separate, ends are dropped; once
            // maxsplit is reached the rest (left-stripped) is one last item.
            let mut parts = Vec::new();
            let mut rest = s.trim_start_matches(is_py_space);
            let mut left = maxsplit;
            while !rest.is_empty() {
                if left == 0 {
                    parts.push(rest);
                    break;
                }
                let end = rest.find(is_py_space).unwrap_or(rest.len());
                parts.push(&rest[..end]);
                rest = rest[end..].trim_start_matches(is_py_space);
                left -= 1;
            }
            Ok(parts)
        }
    }
}

/// Python `s.rsplit(sep, maxsplit)`.
fn py_rsplit<'a>(s: &'a str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<&'a str>, Error> {
    let mut parts = match sep {
        Some("") => return Err(empty_separator()),
        Some(sep) => match usize::try_from(maxsplit) {
            Ok(n) => s.rsplitn(n.saturating_add(1), sep).collect::<Vec<_>>(),
            Err(_) => s.rsplit(sep).collect(),
        },
        None => {
            let mut parts = Vec::new();
            let mut rest = s.trim_end_matches(is_py_space);
            let mut left = maxsplit;
            while !rest.is_empty() {
                if left == 0 {
                    parts.push(rest);
                    break;
                }
                let start = rest.rfind(is_py_space).map_or(0, |i| {
                    i + rest[i..].chars().next().map_or(1, char::len_utf8)
                });
                parts.push(&rest[start..]);
                rest = rest[..start].trim_end_matches(is_py_space);
                left -= 1;
            }
            parts
        }
    };
    parts.reverse();
    Ok(parts)
}

fn empty_separator() -> Error {
    Error::new(ErrorKind::InvalidOperation, "empty separator")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_python() {
        // Expected lists are Python 3's.
        assert_eq!(py_split(" a  b \t c ", None, -1).unwrap(), ["a", "b", "c"]);
        assert_eq!(py_split(" a  b  c ", None, 1).unwrap(), ["a", "b  c "]);
        assert_eq!(py_split("   ", None, -1).unwrap(), Vec::<&str>::new());
        assert_eq!(
            py_split("a,b,,c", Some(","), -1).unwrap(),
            ["a", "b", "", "c"]
        );
        assert_eq!(py_split("a,b,c", Some(","), 1).unwrap(), ["a", "b,c"]);
        assert_eq!(py_split("a,b,c", Some(","), 0).unwrap(), ["a,b,c"]);
        assert_eq!(py_split("", Some(","), -1).unwrap(), [""]);
        assert_eq!(py_rsplit("a,b,c", Some(","), 1).unwrap(), ["a,b", "c"]);
        assert_eq!(py_rsplit(" a  b  c ", None, 1).unwrap(), [" a  b", "c"]);
        assert_eq!(py_rsplit("a\u{3000}b", None, -1).unwrap(), ["a", "b"]);
        assert!(py_split("a", Some(""), -1).is_err());
    }

    #[test]
    fn strip_matches_python() {
        assert_eq!(py_strip("\u{1f} x \n", None, true, true), "x");
        assert_eq!(py_strip("\n\nx\n", Some("\n"), true, false), "x\n");
        assert_eq!(py_strip("xyhixy", Some("xy"), false, true), "xyhi");
    }
}
