//! A structural check of a GGUF file before MLX's reader (gguflib, which
//! trusts the file) sees it: magic and version, every metadata entry, the
//! tensor table, and that each tensor's data lies inside the file. It reads
//! and allocates nothing beyond the header, whatever the bytes claim.

use std::fmt;

/// What is wrong with the file, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufCheckError {
    /// Byte offset in the file where the problem was found.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for GgufCheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn fail<T>(&self, message: impl Into<String>) -> Result<T, GgufCheckError> {
        Err(GgufCheckError {
            offset: self.pos,
            message: message.into(),
        })
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufCheckError> {
        match self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
        {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => self.fail(format!("file ends inside {what}")),
        }
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufCheckError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufCheckError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length that must fit in the rest of the file at `unit` bytes per item.
    fn count(&mut self, unit: usize, what: &str) -> Result<usize, GgufCheckError> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(unit as u64) > left {
            return self.fail(format!("{what} claims {n} items, more than the file holds"));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<&'a str, GgufCheckError> {
        let n = self.count(1, what)?;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).or_else(|_| self.fail(format!("{what} is not UTF-8")))
    }
}

/// Bytes of a scalar metadata value type, None for strings and arrays.
fn scalar_size(value_type: u32) -> Option<usize> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn skip_value(c: &mut Cursor<'_>, value_type: u32, depth: u32) -> Result<(), GgufCheckError> {
    if let Some(n) = scalar_size(value_type) {
        c.take(n, "a metadata value")?;
        return Ok(());
    }
    match value_type {
        8 => c.string("a metadata string").map(|_| ()),
        9 if depth == 0 => {
            let item_type = c.u32("an array's item type")?;
            let unit = scalar_size(item_type).unwrap_or(8);
            let n = c.count(unit, "a metadata array")?;
            if let Some(size) = scalar_size(item_type) {
                c.take(n * size, "a metadata array")?;
            } else {
                for _ in 0..n {
                    skip_value(c, item_type, depth + 1)?;
                }
            }
            Ok(())
        }
        _ => c.fail(format!("unknown metadata value type {value_type}")),
    }
}

/// (elements per block, bytes per block) of a ggml tensor type.
fn block_layout(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        9 => (32, 36),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292),
        24 => (1, 1), // I8
        25 => (1, 2), // I16
        26 => (1, 4), // I32
        27 => (1, 8), // I64
        28 => (1, 8), // F64
        30 => (1, 2), // BF16
        _ => return None,
    })
}

/// Check the structure of a whole GGUF file held in `bytes`.
pub fn check(bytes: &[u8]) -> Result<(), GgufCheckError> {
    let mut c = Cursor { bytes, pos: 0 };
    if c.take(4, "the magic")? != b"GGUF" {
        c.pos = 0;
        return c.fail("wrong magic: not a GGUF file");
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return c.fail(format!("unsupported GGUF version {version}"));
    }
    let n_tensors = c.count(24, "the tensor count")?;
    let n_kv = c.count(12, "the metadata count")?;
    let mut alignment = 32u64;
    for _ in 0..n_kv {
        let key = c.string("a metadata key")?;
        let value_type = c.u32("a metadata type")?;
        if key == "general.alignment" && value_type == 4 {
            let start = c.pos;
            alignment = c.u32("general.alignment")? as u64;
            if alignment == 0 || !alignment.is_power_of_two() {
                c.pos = start;
                return c.fail(format!("alignment {alignment} is not a power of two"));
            }
        } else {
            skip_value(&mut c, value_type, 0)?;
        }
    }
    let mut extents = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = c.string("a tensor name")?.to_string();
        let n_dims = c.u32("a tensor's rank")?;
        if n_dims == 0 || n_dims > 4 {
            return c.fail(format!("tensor '{name}' has rank {n_dims}"));
        }
        let mut elements = 1u64;
        for _ in 0..n_dims {
            let d = c.u64("a tensor dimension")?;
            elements = elements
                .checked_mul(d)
                .filter(|&e| e <= bytes.len() as u64 * 8)
                .ok_or_else(|| GgufCheckError {
                    offset: c.pos,
                    message: format!("tensor '{name}' claims more elements than the file holds"),
                })?;
        }
        let ggml_type = c.u32("a tensor type")?;
        let (block, block_bytes) = match block_layout(ggml_type) {
            Some(l) => l,
            None => return c.fail(format!("tensor '{name}' has unknown ggml type {ggml_type}")),
        };
        if !elements.is_multiple_of(block) {
            return c.fail(format!(
                "tensor '{name}' has {elements} elements, not a whole number of blocks of {block}"
            ));
        }
        let offset = c.u64("a tensor offset")?;
        if offset % alignment != 0 {
            return c.fail(format!(
                "tensor '{name}' data offset {offset} is not aligned"
            ));
        }
        extents.push((name, offset, elements / block * block_bytes));
    }
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let data_len = (bytes.len() as u64).saturating_sub(data_start);
    for (name, offset, size) in extents {
        if offset.checked_add(size).is_none_or(|end| end > data_len) {
            return Err(GgufCheckError {
                offset: bytes.len(),
                message: format!(
                    "tensor '{name}' data ({size} bytes at {offset}) runs past the end of the file"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small valid GGUF: one string key, one u32 alignment, one f32 tensor [4].
    fn tiny() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes()); // tensors
        b.extend_from_slice(&2u64.to_le_bytes()); // kv
        let (key, value) = ("general.name", "tiny");
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&(value.len() as u64).to_le_bytes());
        b.extend_from_slice(value.as_bytes());
        let key = "general.alignment";
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&32u32.to_le_bytes());
        let name = "w";
        b.extend_from_slice(&(name.len() as u64).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&0u64.to_le_bytes()); // offset
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for v in [1.0f32, 2.0, 3.0, 4.0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn accepts_a_valid_file() {
        assert_eq!(check(&tiny()), Ok(()));
    }

    #[test]
    fn rejects_every_truncation() {
        let b = tiny();
        for len in 0..b.len() {
            assert!(check(&b[..len]).is_err(), "truncated at {len} passed");
        }
    }

    #[test]
    fn rejects_wrong_magic_and_huge_counts() {
        let mut b = tiny();
        b[0] = b'X';
        assert!(check(&b).unwrap_err().message.contains("magic"));
        let mut b = tiny();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check(&b).is_err());
    }
}
