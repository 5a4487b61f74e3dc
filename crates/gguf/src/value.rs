//! Typed metadata: the 13 GGUF value types, arrays (possibly nested), and the ordered key → value map.

use std::collections::HashMap;

/// A GGUF value type id as stored on disk (`gguf_type` in gguf.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type with on-disk id `id`, or `None` past 12.
    pub fn from_u32(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case name: `u8`, `i32`, `f64`, `bool`, `string`, `array`.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Bytes of one element on disk for fixed-size types; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can take on disk: a string is at least its u64 length, an
    /// array at least its u32 element type and u64 count. Used to bound counts read from the file.
    pub fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array. The element type is kept even when the array is empty, so a file
/// round-trips exactly.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Nested arrays; each inner array has its own element type.
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The GGUF type name: `u8`, ..., `string`, `array`.
    pub fn type_name(&self) -> &'static str {
        self.value_type().name()
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer value as i128 (wide enough for every GGUF integer type without loss).
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type whose value is a non-negative number that fits in u64. Booleans and floats are not
    /// integers here.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type whose value fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer type whose value fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An f32, f64 (rounded to f32) or any integer (converted).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self.as_i128().map(|v| v as f32),
        }
    }

    /// An f32 (widened), f64 or any integer (converted).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The boolean, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, if this is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

macro_rules! array_as {
    ($(#[$doc:meta] $fn:ident, $variant:ident, $t:ty;)*) => {
        $(
            #[$doc]
            pub fn $fn(&self) -> Option<&[$t]> {
                match self {
                    Array::$variant(v) => Some(v),
                    _ => None,
                }
            }
        )*
    };
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The GGUF type name of the elements: `u8`, ..., `string`, `array`.
    pub fn type_name(&self) -> &'static str {
        self.elem_type().name()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Value`] (cloned), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    array_as! {
        /// The elements, if this is a u8 array.
        as_u8s, U8, u8;
        /// The elements, if this is an i8 array.
        as_i8s, I8, i8;
        /// The elements, if this is a u16 array.
        as_u16s, U16, u16;
        /// The elements, if this is an i16 array.
        as_i16s, I16, i16;
        /// The elements, if this is a u32 array.
        as_u32s, U32, u32;
        /// The elements, if this is an i32 array (`tokenizer.ggml.token_type`).
        as_i32s, I32, i32;
        /// The elements, if this is an f32 array (`tokenizer.ggml.scores`).
        as_f32s, F32, f32;
        /// The elements, if this is a bool array.
        as_bools, Bool, bool;
        /// The elements, if this is a string array (`tokenizer.ggml.tokens`, `merges`).
        as_strings, String, String;
        /// The inner arrays, if this is an array of arrays.
        as_arrays, Array, Array;
        /// The elements, if this is a u64 array.
        as_u64s, U64, u64;
        /// The elements, if this is an i64 array.
        as_i64s, I64, i64;
        /// The elements, if this is an f64 array.
        as_f64s, F64, f64;
    }
}

/// The metadata key/value pairs of a file, in file order, with an index by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty map.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds a pair; returns the value back if the key is already present (the map is unchanged then).
    pub fn insert(&mut self, key: String, value: Value) -> Result<(), Value> {
        if self.index.contains_key(&key) {
            return Err(value);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// All pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer value that is non-negative and fits u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any integer value that fits u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// Any integer value that fits i64.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// An f32, f64 or integer value, as f32.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// An f32, f64 or integer value, as f64.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key)?.as_array()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_getters_convert_when_they_fit() {
        let mut m = Metadata::new();
        m.insert("a".into(), Value::I32(-1)).unwrap();
        m.insert("b".into(), Value::U64(u64::MAX)).unwrap();
        m.insert("c".into(), Value::U8(7)).unwrap();
        m.insert("d".into(), Value::F64(0.5)).unwrap();
        m.insert("e".into(), Value::Bool(true)).unwrap();
        assert_eq!(m.get_u64("a"), None);
        assert_eq!(m.get_i64("a"), Some(-1));
        assert_eq!(m.get_u64("b"), Some(u64::MAX));
        assert_eq!(m.get_u32("b"), None);
        assert_eq!(m.get_i64("b"), None);
        assert_eq!(m.get_u32("c"), Some(7));
        assert_eq!(m.get_f32("c"), Some(7.0));
        assert_eq!(m.get_f32("d"), Some(0.5));
        assert_eq!(m.get_u64("e"), None);
        assert_eq!(m.get_bool("e"), Some(true));
        assert_eq!(m.get_str("c"), None);
        assert!(m.insert("a".into(), Value::U8(0)).is_err());
        let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b", "c", "d", "e"]);
    }
}
