//! The on-disk format of one cached KV block (version 1), all integers little-endian:
//!
//! | offset      | bytes | field                                                    |
//! |-------------|-------|----------------------------------------------------------|
//! | 0           | 8     | magic `HEARTHKV`                                         |
//! | 8           | 4     | version, `1`                                             |
//! | 12          | 4     | reserved, `0`                                            |
//! | 16          | 16    | namespace (u128: model identity, KV type, block layout)  |
//! | 32          | 16    | block hash (u128, the hash chain up to this block)       |
//! | 48          | 4     | `n` = number of tokens (u32)                             |
//! | 52          | 4     | reserved, `0`                                            |
//! | 56          | 8     | `p` = payload length in bytes (u64)                      |
//! | 64          | 4·n   | the block's token ids (u32 each)                         |
//! | 64+4n       | p     | payload (the block's K and V, opaque here)               |
//! | 64+4n+p     | 16    | checksum: xxh3_128 of every byte before it               |
//!
//! The payload length sits in the fixed header, so a file's expected size is known from its first
//! 64 bytes: the scan at open reads only those, and a length that disagrees with the file's real
//! size is rejected before anything is allocated for it.

use std::io::{self, Read, Write};

use xxhash_rust::xxh3::Xxh3;

/// First bytes of every cache file.
pub(crate) const MAGIC: [u8; 8] = *b"HEARTHKV";
/// Format version; a file of any other version is dropped (the cache is disposable).
pub(crate) const VERSION: u32 = 1;
/// Bytes of the fixed header.
pub(crate) const HEADER_LEN: usize = 64;
/// Bytes of the trailing checksum.
pub(crate) const CHECKSUM_LEN: usize = 16;
/// Most tokens in one block (the pool uses 64; anything far larger is not a block).
pub(crate) const MAX_TOKENS: usize = 1 << 16;
/// Largest payload accepted (a block of a 100-layer model with wide KV is tens of MB).
pub(crate) const MAX_PAYLOAD: u64 = 1 << 30;

/// The fixed header of a cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub namespace: u128,
    pub hash: u128,
    pub n_tokens: u32,
    pub payload_len: u64,
}

/// Why a file is not the block asked for. Any of these means the file is dropped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Invalid {
    #[error("shorter than its header")]
    Short,
    #[error("bad magic")]
    Magic,
    #[error("format version {0}, expected {VERSION}")]
    Version(u32),
    #[error("nonzero reserved fields")]
    Reserved,
    #[error("namespace {0:032x} is not this cache's")]
    Namespace(u128),
    #[error("holds block {0:032x}, not the one its name says")]
    Hash(u128),
    #[error("{0} tokens is more than a block holds")]
    TooManyTokens(u32),
    #[error("payload of {0} bytes is more than a block holds")]
    TooLarge(u64),
    #[error("{actual} bytes long, its header says {expected}")]
    Length { expected: u64, actual: u64 },
    #[error("its tokens differ from the block's")]
    Tokens,
    #[error("checksum mismatch")]
    Checksum,
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
}

/// Total bytes of a file holding `n_tokens` tokens and `payload_len` bytes of payload, or None if
/// that overflows.
pub(crate) fn file_len(n_tokens: u64, payload_len: u64) -> Option<u64> {
    n_tokens
        .checked_mul(4)?
        .checked_add(payload_len)?
        .checked_add((HEADER_LEN + CHECKSUM_LEN) as u64)
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.namespace.to_le_bytes());
        b[32..48].copy_from_slice(&self.hash.to_le_bytes());
        b[48..52].copy_from_slice(&self.n_tokens.to_le_bytes());
        b[56..64].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Parses and checks the fields that need nothing else: magic, version, reserved words, and
    /// the caps on token count and payload length.
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, Invalid> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut w8 = [0u8; 8];
        let mut w16 = [0u8; 16];
        if b[0..8] != MAGIC {
            return Err(Invalid::Magic);
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(Invalid::Version(version));
        }
        if u32_at(12) != 0 || u32_at(52) != 0 {
            return Err(Invalid::Reserved);
        }
        w16.copy_from_slice(&b[16..32]);
        let namespace = u128::from_le_bytes(w16);
        w16.copy_from_slice(&b[32..48]);
        let hash = u128::from_le_bytes(w16);
        let n_tokens = u32_at(48);
        if n_tokens as usize > MAX_TOKENS {
            return Err(Invalid::TooManyTokens(n_tokens));
        }
        w8.copy_from_slice(&b[56..64]);
        let payload_len = u64::from_le_bytes(w8);
        if payload_len > MAX_PAYLOAD {
            return Err(Invalid::TooLarge(payload_len));
        }
        Ok(Header {
            namespace,
            hash,
            n_tokens,
            payload_len,
        })
    }

    /// The size the whole file must have. The caps of [`Header::decode`] keep this far from
    /// overflowing.
    pub(crate) fn file_len(&self) -> u64 {
        file_len(u64::from(self.n_tokens), self.payload_len).unwrap_or(u64::MAX)
    }

    /// Checks that the header is the one of block `hash` in `namespace` and agrees with the file's
    /// real size.
    pub(crate) fn check(&self, namespace: u128, hash: u128, actual: u64) -> Result<(), Invalid> {
        if self.namespace != namespace {
            return Err(Invalid::Namespace(self.namespace));
        }
        if self.hash != hash {
            return Err(Invalid::Hash(self.hash));
        }
        let expected = self.file_len();
        if expected != actual {
            return Err(Invalid::Length { expected, actual });
        }
        Ok(())
    }
}

/// Reads the fixed header (the scan at open reads nothing more).
pub(crate) fn read_header(r: &mut impl Read) -> Result<Header, Invalid> {
    let mut b = [0u8; HEADER_LEN];
    r.read_exact(&mut b).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => Invalid::Short,
        _ => Invalid::Io(e),
    })?;
    Header::decode(&b)
}

/// Token ids as the file stores them.
fn token_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Writes a whole file: header, tokens, payload, checksum. The caller checked the caps.
pub(crate) fn write_block(
    w: &mut impl Write,
    namespace: u128,
    hash: u128,
    tokens: &[u32],
    payload: &[u8],
) -> io::Result<()> {
    let header = Header {
        namespace,
        hash,
        n_tokens: u32::try_from(tokens.len()).map_err(io::Error::other)?,
        payload_len: payload.len() as u64,
    };
    // Header and tokens go out in one write, the payload in another, the checksum last.
    let mut head = header.encode().to_vec();
    head.extend_from_slice(&token_bytes(tokens));
    let mut sum = Xxh3::new();
    sum.update(&head);
    sum.update(payload);
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.write_all(&sum.digest128().to_le_bytes())
}

/// Reads and verifies the block `hash` of `namespace` holding `tokens` from a file of `actual`
/// bytes, returning its payload. The payload is read in one `read_to_end` into a buffer whose size
/// the header gave and the file's size confirmed.
pub(crate) fn read_block(
    r: &mut impl Read,
    actual: u64,
    namespace: u128,
    hash: u128,
    tokens: &[u32],
) -> Result<Vec<u8>, Invalid> {
    let header = read_header(r)?;
    header.check(namespace, hash, actual)?;
    if header.n_tokens as usize != tokens.len() {
        return Err(Invalid::Tokens);
    }
    let mut sum = Xxh3::new();
    sum.update(&header.encode());
    // The header was checked against the real size: these lengths are what the file holds.
    let mut stored = vec![0u8; 4 * tokens.len()];
    r.read_exact(&mut stored)?;
    if stored != token_bytes(tokens) {
        return Err(Invalid::Tokens);
    }
    sum.update(&stored);
    let len = header.payload_len as usize;
    let mut payload = Vec::with_capacity(len);
    r.by_ref()
        .take(header.payload_len)
        .read_to_end(&mut payload)?;
    if payload.len() != len {
        return Err(Invalid::Length {
            expected: header.file_len(),
            actual,
        });
    }
    sum.update(&payload);
    let mut check = [0u8; CHECKSUM_LEN];
    r.read_exact(&mut check).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => Invalid::Length {
            expected: header.file_len(),
            actual,
        },
        _ => Invalid::Io(e),
    })?;
    if u128::from_le_bytes(check) != sum.digest128() {
        return Err(Invalid::Checksum);
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> Vec<u8> {
        let mut v = Vec::new();
        write_block(&mut v, 7, 9, &[1, 2, 3], b"payload!").unwrap();
        v
    }

    #[test]
    fn layout_is_as_documented() {
        let v = block();
        assert_eq!(v.len() as u64, file_len(3, 8).unwrap());
        assert_eq!(&v[0..8], b"HEARTHKV");
        assert_eq!(&v[8..12], &1u32.to_le_bytes());
        assert_eq!(&v[16..32], &7u128.to_le_bytes());
        assert_eq!(&v[32..48], &9u128.to_le_bytes());
        assert_eq!(&v[48..52], &3u32.to_le_bytes());
        assert_eq!(&v[56..64], &8u64.to_le_bytes());
        assert_eq!(&v[64..68], &1u32.to_le_bytes());
        assert_eq!(&v[76..84], b"payload!");
        let sum = xxhash_rust::xxh3::xxh3_128(&v[..84]);
        assert_eq!(&v[84..], &sum.to_le_bytes());
        let got = read_block(&mut &v[..], v.len() as u64, 7, 9, &[1, 2, 3]).unwrap();
        assert_eq!(got, b"payload!");
    }

    #[test]
    fn a_huge_length_is_refused_before_allocating() {
        let mut v = block();
        v[56..64].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let n = v.len() as u64;
        assert!(matches!(
            read_block(&mut &v[..], n, 7, 9, &[1, 2, 3]),
            Err(Invalid::TooLarge(_))
        ));
        // Within the cap but beyond the file: refused by the size check, nothing allocated.
        v[56..64].copy_from_slice(&(1u64 << 29).to_le_bytes());
        assert!(matches!(
            read_block(&mut &v[..], n, 7, 9, &[1, 2, 3]),
            Err(Invalid::Length { .. })
        ));
    }
}
