//! The tensor index: one [`TensorInfo`] per tensor (name, type, dims, offset), and the checks that make
//! every later `&bytes[start..end]` safe: sizes without overflow, whole blocks per row, aligned offsets,
//! data inside the file and no two tensors overlapping.

use hearth_quant::GgmlType;

use crate::error::GgufError;
use crate::MAX_DIMS;

/// One entry of the tensor index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.ffn_gate_exps.weight`.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order: `dims[0]` is ne0, the contiguous row length.
    pub dims: Vec<u64>,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Product of the dims (1 for a 0-dim scalar, 0 if any dim is 0).
    pub n_elements: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Builds an entry, checking the dims and computing element and byte counts.
    pub fn new(
        name: String,
        ty: GgmlType,
        dims: Vec<u64>,
        offset: u64,
    ) -> Result<TensorInfo, GgufError> {
        if dims.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                name,
                n_dims: dims.len() as u32,
            });
        }
        let Some(n_elements) = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
            return Err(GgufError::ElementCountOverflow { name, dims });
        };
        let ne0 = dims.first().copied().unwrap_or(1);
        let block_size = ty.block_size();
        if ne0 % block_size as u64 != 0 {
            return Err(GgufError::RowNotBlockMultiple {
                name,
                ty,
                ne0,
                block_size,
            });
        }
        // Bytes = whole blocks of each row times the number of rows; each step checked.
        let n_bytes = ty.row_bytes(ne0).and_then(|row| {
            dims.iter()
                .skip(1)
                .try_fold(row, |acc, &d| acc.checked_mul(d))
        });
        let Some(n_bytes) = n_bytes else {
            return Err(GgufError::ByteSizeOverflow { name, ty, dims });
        };
        Ok(TensorInfo {
            name,
            ty,
            dims,
            offset,
            n_elements,
            n_bytes,
        })
    }

    /// Absolute file offset of the data, given the file's data-section offset.
    pub fn abs_offset(&self, data_offset: u64) -> u64 {
        data_offset.saturating_add(self.offset)
    }

    /// Dimension `i` (ne0, ne1, ...); 1 past the declared dims, as in ggml.
    pub fn ne(&self, i: usize) -> u64 {
        self.dims.get(i).copied().unwrap_or(1)
    }

    /// Number of dimensions declared.
    pub fn n_dims(&self) -> usize {
        self.dims.len()
    }

    /// Bytes of one row (ne0 elements). Fits usize for a tensor of a file that opened.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.ne(0)).unwrap_or(0) as usize
    }

    /// Number of rows (ne1 * ne2 * ne3); 0 for an empty tensor.
    pub fn n_rows(&self) -> usize {
        match self.ne(0) {
            0 => 0,
            ne0 => (self.n_elements / ne0) as usize,
        }
    }

    /// End of the data relative to the data section (checked at open).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.n_bytes)
    }
}

/// Checks offsets: each aligned, inside the file and no two overlapping. `file_len` is the total length.
pub(crate) fn check_layout(
    tensors: &[TensorInfo],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                name: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorPastEnd {
                    name: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    // Sort non-empty tensors by offset; each must start at or after the end of the one before.
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.offset < a.end() {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a.end(),
                second: b.name.clone(),
                second_start: b.offset,
                second_end: b.end(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let t = TensorInfo::new("w".into(), GgmlType::Q4_K, vec![512, 3, 2], 0).unwrap();
        assert_eq!(t.n_elements, 3072);
        assert_eq!(t.row_bytes(), 288);
        assert_eq!(t.n_rows(), 6);
        assert_eq!(t.n_bytes, 288 * 6);
        assert_eq!(t.ne(3), 1);
        let e = TensorInfo::new("e".into(), GgmlType::F32, vec![0, 7], 0).unwrap();
        assert_eq!((e.n_elements, e.n_bytes, e.n_rows()), (0, 0, 0));
        let s = TensorInfo::new("s".into(), GgmlType::F32, vec![], 0).unwrap();
        assert_eq!((s.n_elements, s.n_bytes), (1, 4));
    }
}
