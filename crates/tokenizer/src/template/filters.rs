//! jinja2's built-in filters where MiniJinja's differ in output: `string`, `items`, `trim`, `join`,
//! `round`, `length` / `count`. Each follows jinja2 3.1's `filters.py` (named in its comment).

use super::{pyrepr, pystr};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `do_string` / `soft_str`: Python `str()`. A string passes through unchanged (keeping a safe
/// string safe).
pub(crate) fn string(value: &Value) -> Result<Value, Error> {
    if value.kind() == ValueKind::String {
        Ok(value.clone())
    } else {
        Ok(Value::from(pyrepr::py_str(value)?))
    }
}

/// `do_items`: undefined gives nothing, a mapping its pairs, anything else is an error.
pub(crate) fn items(value: &Value) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(Value::from(Vec::<Value>::new())),
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push(Value::from(vec![key, item]));
            }
            Ok(Value::from(pairs))
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("Can only get item pairs from a mapping, not {kind}"),
        )),
    }
}

/// `do_trim(value, chars=None)`: `str(value).strip(chars)` with Python's whitespace set.
pub(crate) fn trim(value: &Value, chars: Option<&str>, kwargs: Kwargs) -> Result<Value, Error> {
    let chars = chars.or(kwargs.get::<Option<&str>>("chars")?);
    kwargs.assert_all_used()?;
    let s = pyrepr::py_str(value)?;
    Ok(Value::from(pystr::py_strip(&s, chars, true, true)))
}

/// `do_join(value, d='', attribute=None)`: `str(d).join(map(str, value))`, items optionally
/// replaced by an attribute path first (`join(attribute='name')`, dotted paths and indices allowed).
pub(crate) fn join(
    value: &Value,
    d: Option<Value>,
    attribute: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let d = d.or(kwargs.get::<Option<Value>>("d")?);
    let attribute = attribute.or(kwargs.get::<Option<Value>>("attribute")?);
    kwargs.assert_all_used()?;
    let sep = match &d {
        Some(d) => pyrepr::py_str(d)?,
        None => String::new(),
    };
    let mut out = String::new();
    if value.is_undefined() {
        return Ok(out);
    }
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(&sep);
        }
        let item = match &attribute {
            Some(attr) => attribute_path(&item, attr)?,
            None => item,
        };
        out.push_str(&pyrepr::py_str(&item)?);
    }
    Ok(out)
}

/// jinja2's `make_attrgetter`: a dotted path whose integer parts are indices.
fn attribute_path(item: &Value, path: &Value) -> Result<Value, Error> {
    let Some(path) = path.as_str() else {
        return item.get_item(path);
    };
    let mut current = item.clone();
    for part in path.split('.') {
        let key = match part.parse::<i64>() {
            Ok(i) => Value::from(i),
            Err(_) => Value::from(part),
        };
        current = current.get_item(&key)?;
    }
    Ok(current)
}

/// `do_round(value, precision=0, method='common')`. `common` is Python's `round()`: half to even on
/// the exact binary value (`round(2.5) == 2.0`, `round(2.675, 2) == 2.67`), an int stays an int;
/// `ceil` and `floor` scale, round and scale back.
pub(crate) fn round(
    value: &Value,
    precision: Option<i32>,
    method: Option<&str>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let precision = match precision {
        Some(p) => p,
        None => kwargs.get::<Option<i32>>("precision")?.unwrap_or(0),
    };
    let method = match method {
        Some(m) => m,
        None => kwargs.get::<Option<&str>>("method")?.unwrap_or("common"),
    };
    kwargs.assert_all_used()?;
    if !matches!(method, "common" | "ceil" | "floor") {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "method must be common, ceil or floor",
        ));
    }
    if value.is_integer() && method == "common" && precision >= 0 {
        return Ok(value.clone());
    }
    let x = f64::try_from(value.clone())?;
    let scale = 10f64.powi(precision);
    let rounded = match method {
        "ceil" => (x * scale).ceil() / scale,
        "floor" => (x * scale).floor() / scale,
        _ if precision >= 0 => round_half_even(x, usize::try_from(precision).unwrap_or(0)),
        _ => (x * scale).round_ties_even() / scale,
    };
    Ok(Value::from(rounded))
}

/// Rounds to `digits` decimals, ties to even, on the exact binary value: Rust's fixed-precision
/// formatting is correctly rounded with ties to even, as CPython's `round()` is.
fn round_half_even(x: f64, digits: usize) -> f64 {
    if !x.is_finite() || digits > 300 {
        return x;
    }
    format!("{x:.digits$}").parse().unwrap_or(x)
}

/// `length` / `count`: Python `len()`; undefined has length 0.
pub(crate) fn length(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    value.len().map(Value::from).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("object of type {} has no len()", value.kind()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_python() {
        // Expected values are Python 3's round().
        for (x, digits, want) in [
            (2.5, 0, 2.0),
            (3.5, 0, 4.0),
            (-2.5, 0, -2.0),
            (0.125, 2, 0.12),
            (0.375, 2, 0.38),
            (2.675, 2, 2.67),
            (1.0 / 3.0, 4, 0.3333),
        ] {
            assert_eq!(round_half_even(x, digits), want, "round({x}, {digits})");
        }
    }
}
