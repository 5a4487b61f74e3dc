//! Low-level decoding of the header: a bounds-checked little-endian cursor, strings and typed values.
//!
//! Every length or count read from the file is checked against the bytes that remain *before* anything
//! is allocated from it, so a hostile count of `u64::MAX` costs nothing but an error.

use crate::error::GgufError;
use crate::value::{Array, Value, ValueType};
use crate::{MAX_ARRAY_LEN, MAX_KEY_LEN, MAX_NESTING, MAX_STRING_LEN};

/// Vectors sized from a (checked) count reserve at most this many elements up front and grow as
/// elements are actually read, so memory follows the bytes parsed, not the count claimed.
pub(crate) const PREALLOC_CAP: usize = 1 << 16;

/// A read position in the file's bytes.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// Absolute offset of the next byte.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left.
    pub(crate) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// The next `n` bytes; `what` names the field for the error (built only on failure).
    pub(crate) fn take(
        &mut self,
        n: u64,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos(),
                needed: n,
                available: self.remaining(),
            });
        }
        // n <= remaining <= usize::MAX, so the cast and the sum cannot overflow.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes.
    pub(crate) fn string(
        &mut self,
        max: u64,
        what: &dyn Fn() -> String,
    ) -> Result<String, GgufError> {
        let len_at = self.pos();
        let len = self.u64(|| format!("length of {}", what()))?;
        let cap = max.min(self.remaining());
        if len > cap {
            return Err(GgufError::StringTooLong {
                what: what(),
                len,
                offset: len_at,
                max: cap,
            });
        }
        let at = self.pos();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: at,
            }),
        }
    }

    /// A count of elements at least `min_size` bytes each, checked against the bytes left.
    pub(crate) fn count(
        &mut self,
        min_size: u64,
        max: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let at = self.pos();
        let count = self.u64(|| format!("count of {}", what()))?;
        self.check_count(count, at, min_size, max, what)
    }

    /// Checks a count read at `at`: at most `max`, and `count` elements of at least `min_size` bytes
    /// each must fit in the bytes left.
    pub(crate) fn check_count(
        &self,
        count: u64,
        at: u64,
        min_size: u64,
        max: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let remaining = self.remaining();
        // count * min_size <= remaining, written without the multiplication so it cannot overflow.
        if count > remaining / min_size.max(1) {
            return Err(GgufError::CountTooLarge {
                what: what(),
                count,
                offset: at,
                remaining,
                min_size,
            });
        }
        if count > max {
            return Err(GgufError::TooMany {
                what: what(),
                count,
                offset: at,
                max,
            });
        }
        // count <= remaining <= usize::MAX.
        Ok(count as usize)
    }

    /// A metadata key: non-empty, at most [`MAX_KEY_LEN`] bytes, UTF-8.
    pub(crate) fn key(&mut self, index: usize) -> Result<String, GgufError> {
        let at = self.pos();
        let key = self.string(MAX_KEY_LEN, &|| format!("key of metadata entry #{index}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: at });
        }
        Ok(key)
    }

    /// A value type id.
    pub(crate) fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let at = self.pos();
        let id = self.u32(|| format!("value type of key {key:?}"))?;
        ValueType::from_u32(id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id: id,
            offset: at,
        })
    }

    /// One value of type `ty` for `key`.
    pub(crate) fn value(
        &mut self,
        key: &str,
        ty: ValueType,
        depth: usize,
    ) -> Result<Value, GgufError> {
        let what = || format!("value of key {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            // Any non-zero byte is true, as ggml reads it (a C bool read from a byte).
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(MAX_STRING_LEN, &what)?),
            ValueType::Array => Value::Array(self.array_value(key, depth + 1)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    /// An array (element type, count, elements) at nesting level `depth` (1 for a top-level array).
    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        let at = self.pos();
        if depth > MAX_NESTING {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
                max: MAX_NESTING,
                offset: at,
            });
        }
        let elem = self.value_type(key)?;
        let count_at = self.pos();
        let raw_count = u64::from_le_bytes(self.array(|| format!("array count of key {key:?}"))?);
        // Fixed-size elements: the exact byte size must not overflow, then must fit what is left.
        if let Some(size) = elem.fixed_size() {
            if raw_count.checked_mul(size).is_none() {
                return Err(GgufError::ArrayOverflow {
                    key: key.to_owned(),
                    count: raw_count,
                    elem_type: elem.name(),
                    offset: count_at,
                });
            }
        }
        let what = || format!("array of key {key:?}");
        let n = self.check_count(raw_count, count_at, elem.min_size(), MAX_ARRAY_LEN, &what)?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const S: usize = std::mem::size_of::<$t>();
                let bytes = self.take(n as u64 * S as u64, what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(S)
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or([0; S])))
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(n as u64, what)?.to_vec()),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::Bool => {
                Array::Bool(self.take(n as u64, what)?.iter().map(|&b| b != 0).collect())
            }
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::String => {
                let mut v = Vec::with_capacity(n.min(PREALLOC_CAP));
                for i in 0..n {
                    v.push(self.string(MAX_STRING_LEN, &|| format!("element {i} of key {key:?}"))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n.min(PREALLOC_CAP));
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}
