//! GGUF (v2 and v3) reader.
//!
//! Layout (ggml `docs/gguf.md`): magic `GGUF`, `u32` version, `u64` tensor count, `u64`
//! metadata count, the metadata key/values, the tensor infos, padding to `general.alignment`
//! (default 32), then tensor data. All integers are little-endian.
//!
//! The parser works on a byte slice and trusts nothing in it: every count and length is
//! checked against the bytes that remain before anything is allocated, tensor data must lie
//! inside the file, and dimensions must multiply without overflow. Errors name the offending
//! field or tensor, quoting keys and names read from the file with
//! [`tessera_core::untrusted::quote`] (escaped, cut short). Tensor bytes are never copied:
//! [`GgufFile::tensor`] returns a window into the memory map.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use tessera_core::untrusted::quote;
use tessera_core::{DType, Error, Result, TensorBytes, WeightTensor};

const MAGIC: &[u8; 4] = b"GGUF";
const FORMAT: &str = "GGUF";
/// More dimensions than any ggml tensor can have.
const MAX_DIMS: u32 = 4;
/// Nesting limit for arrays of arrays.
const MAX_DEPTH: usize = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) if v >= 0 => Some(v as u64),
            MetaValue::I16(v) if v >= 0 => Some(v as u64),
            MetaValue::I32(v) if v >= 0 => Some(v as u64),
            MetaValue::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value for a message: strings quoted and cut short, arrays by their length.
    pub fn describe(&self) -> String {
        match self {
            MetaValue::String(s) => format!("string {}", quote(s)),
            MetaValue::Array(a) => format!("array of {} items", a.len()),
            other => format!("{other:?}"),
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

/// A parsed GGUF file.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section.
    pub data_offset: usize,
    map: Option<Arc<Mmap>>,
    owned: Option<TensorBytes>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::malformed(FORMAT, msg)
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(bad(format!(
                "truncated: {what} needs {n} bytes at offset {}, file has {}",
                self.pos,
                self.buf.len()
            ))),
        }
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    /// A count of items each at least `min_item_bytes` long, checked against what remains.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = (n as u128) * (min_item_bytes.max(1) as u128) <= self.remaining() as u128;
        if !fits {
            return Err(bad(format!(
                "{what} is {n}, more than the {} bytes left can hold",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            bad(format!(
                "{what} at offset {} is not valid UTF-8",
                self.pos - n
            ))
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.u8(key)?),
            1 => MetaValue::I8(self.u8(key)? as i8),
            2 => MetaValue::U16(self.u16(key)?),
            3 => MetaValue::I16(self.u16(key)? as i16),
            4 => MetaValue::U32(self.u32(key)?),
            5 => MetaValue::I32(self.u32(key)? as i32),
            6 => MetaValue::F32(f32::from_bits(self.u32(key)?)),
            7 => match self.u8(key)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(bad(format!(
                        "metadata {key}: bool byte {b} is neither 0 nor 1"
                    )))
                }
            },
            8 => MetaValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(bad(format!("metadata {key}: arrays nested too deeply")));
                }
                let elem_ty = self.u32(key)?;
                let min = elem_min_bytes(elem_ty).ok_or_else(|| {
                    bad(format!(
                        "metadata {key}: unknown array element type {elem_ty}"
                    ))
                })?;
                let n = self.count(&format!("metadata {key} array length"), min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64(key)?),
            11 => MetaValue::I64(self.u64(key)? as i64),
            12 => MetaValue::F64(f64::from_bits(self.u64(key)?)),
            t => return Err(bad(format!("metadata {key}: unknown value type {t}"))),
        })
    }
}

/// Smallest encoding of one value of a type, used to bound array lengths before allocating.
fn elem_min_bytes(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

impl GgufFile {
    /// Memory-maps and parses a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only; like every mmap-based loader we assume the model file
        // is not truncated or rewritten while it is in use.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let map = Arc::new(map);
        let mut f = Self::parse(&map)?;
        f.map = Some(map);
        Ok(f)
    }

    /// Parses GGUF bytes held in memory (tests, small files).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut f = Self::parse(bytes)?;
        f.owned = Some(TensorBytes::owned(bytes));
        Ok(f)
    }

    fn parse(buf: &[u8]) -> Result<Self> {
        let mut r = Reader { buf, pos: 0 };
        let magic = r
            .take(4, "magic")
            .map_err(|_| bad("file is shorter than the 4-byte magic"))?;
        if magic != MAGIC {
            return Err(bad(format!("wrong magic {magic:02x?} (expected \"GGUF\")")));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!(
                "unsupported version {version} (supported: 2, 3)"
            )));
        }
        // A tensor info is at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
        // a key/value at least 8 + 4 + 1.
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        if n_kv as u128 * 13 > r.remaining() as u128 {
            return Err(bad(format!(
                "metadata count {n_kv} cannot fit in a {}-byte file",
                buf.len()
            )));
        }
        if n_tensors as u128 * 24 > r.remaining() as u128 {
            return Err(bad(format!(
                "tensor count {n_tensors} cannot fit in a {}-byte file",
                buf.len()
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let label = quote(&key);
            let ty = r.u32(&label)?;
            let v = r.value(ty, &label, 0)?;
            if metadata.insert(key, v).is_some() {
                return Err(bad(format!("duplicate metadata key {label}")));
            }
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = std::collections::HashSet::new();
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor {i} name"))?;
            let label = format!("tensor {}", quote(&name));
            let n_dims = r.u32(&label)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(bad(format!(
                    "{label}: {n_dims} dimensions (expected 1..={MAX_DIMS})"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&label)?);
            }
            let ggml_type = r.u32(&label)?;
            let offset = r.u64(&label)?;
            if !names.insert(name.clone()) {
                return Err(bad(format!("duplicate {label}")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => {
                    return Err(bad(format!(
                        "general.alignment {} is not a power of two",
                        v.describe()
                    )))
                }
            },
        };
        let data_offset = r.pos.div_ceil(alignment) * alignment;
        let data_len = buf.len().saturating_sub(data_offset);
        for t in &tensors {
            if t.offset % alignment as u64 != 0 {
                return Err(bad(format!(
                    "tensor {}: offset {} is not a multiple of the alignment {alignment}",
                    quote(&t.name),
                    t.offset
                )));
            }
            // Unsupported types are reported when the tensor is used, so a file with an odd
            // unused tensor still opens; their extent cannot be checked without the type.
            if let Some(dtype) = DType::from_ggml_type(t.ggml_type) {
                let size = tensor_size(t, dtype)?;
                let end = t.offset.checked_add(size as u64);
                if end.is_none_or(|e| e > data_len as u64) {
                    return Err(bad(format!(
                        "tensor {}: data [{}, +{size}) lies outside the file's {data_len}-byte data section",
                        quote(&t.name), t.offset
                    )));
                }
            }
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            data_offset,
            map: None,
            owned: None,
        })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The named tensor, as a window into the file, with shape outermost-first.
    pub fn tensor(&self, info: &TensorInfo) -> Result<WeightTensor> {
        let dtype =
            DType::from_ggml_type(info.ggml_type).ok_or_else(|| Error::UnsupportedTensorType {
                ty: DType::ggml_type_name(info.ggml_type),
                name: info.name.clone(),
            })?;
        let size = tensor_size(info, dtype)?;
        let offset = self.data_offset + info.offset as usize;
        let bytes = match (&self.map, &self.owned) {
            (Some(map), _) => TensorBytes::Mapped {
                map: map.clone(),
                offset,
                len: size,
            },
            (None, Some(owned)) => TensorBytes::owned(&owned.as_slice()[offset..offset + size]),
            (None, None) => unreachable!("GgufFile is always built with its bytes"),
        };
        let shape = info.dims.iter().rev().map(|&d| d as usize).collect();
        WeightTensor::new(info.name.clone(), dtype, shape, bytes)
    }
}

/// Bytes a tensor occupies, with overflow and block-shape checks.
fn tensor_size(t: &TensorInfo, dtype: DType) -> Result<usize> {
    let mut numel: u64 = 1;
    for &d in &t.dims {
        numel = numel
            .checked_mul(d)
            .filter(|&n| n <= 1 << 40)
            .ok_or_else(|| {
                bad(format!(
                    "tensor {}: absurd dimensions {:?}",
                    quote(&t.name),
                    t.dims
                ))
            })?;
    }
    let inner = t.dims[0] as usize;
    let row = dtype.row_bytes(inner).ok_or_else(|| {
        bad(format!(
            "tensor {}: row length {inner} is not a multiple of the {dtype} block size",
            quote(&t.name)
        ))
    })?;
    let rows = if inner == 0 {
        0
    } else {
        numel as usize / inner
    };
    rows.checked_mul(row)
        .ok_or_else(|| bad(format!("tensor {}: size overflows", quote(&t.name))))
}

/// Writes GGUF files; used by tests to craft good and bad inputs, and by tools.
pub mod writer {
    use super::MetaValue;

    pub struct TensorSpec<'a> {
        pub name: &'a str,
        /// ggml order (innermost first).
        pub dims: &'a [u64],
        pub ggml_type: u32,
        pub data: &'a [u8],
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn type_id(v: &MetaValue) -> u32 {
        match v {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::String(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
        match v {
            MetaValue::U8(x) => out.push(*x),
            MetaValue::I8(x) => out.push(*x as u8),
            MetaValue::U16(x) => out.extend(x.to_le_bytes()),
            MetaValue::I16(x) => out.extend(x.to_le_bytes()),
            MetaValue::U32(x) => out.extend(x.to_le_bytes()),
            MetaValue::I32(x) => out.extend(x.to_le_bytes()),
            MetaValue::F32(x) => out.extend(x.to_le_bytes()),
            MetaValue::Bool(x) => out.push(*x as u8),
            MetaValue::String(s) => put_str(out, s),
            MetaValue::Array(items) => {
                let et = items.first().map(type_id).unwrap_or(4);
                out.extend(et.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for it in items {
                    put_value(out, it);
                }
            }
            MetaValue::U64(x) => out.extend(x.to_le_bytes()),
            MetaValue::I64(x) => out.extend(x.to_le_bytes()),
            MetaValue::F64(x) => out.extend(x.to_le_bytes()),
        }
    }

    /// Serialises a v3 GGUF file with 32-byte alignment.
    pub fn write(meta: &[(&str, MetaValue)], tensors: &[TensorSpec]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((meta.len() as u64).to_le_bytes());
        for (k, v) in meta {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = vec![];
        for t in tensors {
            put_str(&mut out, t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset += (t.data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        let base = out.len();
        for (t, off) in tensors.iter().zip(offsets) {
            out.resize(base + off as usize, 0);
            out.extend(t.data);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::writer::{write, TensorSpec};
    use super::*;

    fn sample() -> Vec<u8> {
        let data: Vec<u8> = (0..2 * 64 * 4).map(|i| i as u8).collect();
        write(
            &[
                ("general.architecture", MetaValue::String("llama".into())),
                ("x.u8", MetaValue::U8(7)),
                ("x.i8", MetaValue::I8(-7)),
                ("x.u16", MetaValue::U16(700)),
                ("x.i16", MetaValue::I16(-700)),
                ("x.u32", MetaValue::U32(70000)),
                ("x.i32", MetaValue::I32(-70000)),
                ("x.f32", MetaValue::F32(1.5)),
                ("x.bool", MetaValue::Bool(true)),
                ("x.u64", MetaValue::U64(1 << 40)),
                ("x.i64", MetaValue::I64(-(1 << 40))),
                ("x.f64", MetaValue::F64(-2.25)),
                (
                    "x.arr",
                    MetaValue::Array(vec![
                        MetaValue::String("a".into()),
                        MetaValue::String("bc".into()),
                    ]),
                ),
                (
                    "x.nested",
                    MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I32(1)])]),
                ),
            ],
            &[TensorSpec {
                name: "w",
                dims: &[64, 2],
                ggml_type: 0,
                data: &data,
            }],
        )
    }

    #[test]
    fn reads_every_value_type_and_tensor() {
        let f = GgufFile::from_bytes(&sample()).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.get("x.i16"), Some(&MetaValue::I16(-700)));
        assert_eq!(f.get("x.u64").unwrap().as_u64(), Some(1 << 40));
        assert_eq!(f.get("x.f64").unwrap().as_f64(), Some(-2.25));
        assert_eq!(
            f.get("x.arr").unwrap().as_array().unwrap()[1].as_str(),
            Some("bc")
        );
        let t = f.tensor(&f.tensors[0]).unwrap();
        assert_eq!(t.shape, vec![2, 64]);
        assert_eq!(t.data()[5], 5);
    }

    fn err_of(bytes: &[u8]) -> String {
        GgufFile::from_bytes(bytes).unwrap_err().to_string()
    }

    #[test]
    fn rejects_corrupt_files_with_clear_errors() {
        let good = sample();
        assert!(err_of(b"GG").contains("shorter than"));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(err_of(&b).contains("wrong magic"));
        let mut b = good.clone();
        b[4] = 1;
        assert!(err_of(&b).contains("unsupported version 1"));
        let mut b = good.clone();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err_of(&b).contains("tensor count"));
        let mut b = good.clone();
        b[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
        assert!(err_of(&b).contains("metadata count"));
        // Truncated anywhere: a clear error, never a panic.
        for cut in [30, 100, 300, good.len() - 1] {
            let e = err_of(&good[..cut]);
            assert!(
                e.contains("truncated")
                    || e.contains("outside")
                    || e.contains("cannot fit")
                    || e.contains("more than"),
                "{cut}: {e}"
            );
        }
    }

    #[test]
    fn rejects_tensor_data_outside_file_and_absurd_dims() {
        let data = vec![0u8; 64 * 4];
        let b = write(
            &[],
            &[TensorSpec {
                name: "w",
                dims: &[64, 1],
                ggml_type: 0,
                data: &data,
            }],
        );
        // Claim twice the rows.
        let mut big = b.clone();
        let pos = big
            .windows(8)
            .position(|w| w == 64u64.to_le_bytes())
            .unwrap();
        big[pos + 8..pos + 16].copy_from_slice(&2u64.to_le_bytes());
        assert!(err_of(&big).contains("outside"));
        let mut absurd = b.clone();
        absurd[pos + 8..pos + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err_of(&absurd).contains("absurd dimensions"));
        let mut misaligned = b.clone();
        let end = misaligned.len() - 256 - 32 + 24; // offset field: before padding
        let _ = end;
        let off_pos = pos + 16 + 4; // dims(2x8) then type(4) then offset
        misaligned[off_pos..off_pos + 8].copy_from_slice(&3u64.to_le_bytes());
        assert!(err_of(&misaligned).contains("alignment"));
    }

    #[test]
    fn unsupported_type_is_named_on_use() {
        let data = vec![0u8; 144];
        let b = write(
            &[],
            &[TensorSpec {
                name: "blk.0.q",
                dims: &[256, 1],
                ggml_type: 12,
                data: &data,
            }],
        );
        let f = GgufFile::from_bytes(&b).unwrap();
        let e = f.tensor(&f.tensors[0]).unwrap_err().to_string();
        assert_eq!(e, "unsupported tensor type Q4_K for tensor blk.0.q");
    }

    /// No byte of a crafted key, name or value reaches a message unescaped, or at length.
    #[test]
    fn errors_quote_file_strings_escaped_and_short() {
        let evil = "evil\x1b[31m\u{202e}red\x07";
        let safe = |e: &str| {
            assert!(
                !e.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{e:?}"
            );
            assert!(e.len() < 400, "{} bytes: {e}", e.len());
        };
        // Duplicate key, quoted with the escape visible.
        let b = write(&[(evil, MetaValue::U8(1)), (evil, MetaValue::U8(2))], &[]);
        let e = err_of(&b);
        safe(&e);
        assert!(e.contains(r#""evil\u{1b}[31m\u{202e}red\u{7}""#), "{e}");
        // A key of 100 kB, its value truncated.
        let long = format!("{evil}{}", "k".repeat(100_000));
        let b = write(&[(long.as_str(), MetaValue::U32(1))], &[]);
        // Cut inside the value: header 24, key length 8, key, type 4, then 2 of 4 bytes.
        let e = err_of(&b[..24 + 8 + long.len() + 4 + 2]);
        safe(&e);
        assert!(e.contains("bytes)"), "{e}");
        // A tensor name, through the error type's own display.
        let data = vec![0u8; 144];
        let b = write(
            &[("general.alignment", MetaValue::String(long.clone()))],
            &[TensorSpec {
                name: evil,
                dims: &[256, 1],
                ggml_type: 12,
                data: &data,
            }],
        );
        safe(&err_of(&b));
        let b = write(
            &[],
            &[TensorSpec {
                name: &long,
                dims: &[256, 1],
                ggml_type: 12,
                data: &data,
            }],
        );
        let f = GgufFile::from_bytes(&b).unwrap();
        safe(&f.tensor(&f.tensors[0]).unwrap_err().to_string());
        // A value reaching the loader's messages.
        let b = write(
            &[("general.architecture", MetaValue::String(long.clone()))],
            &[],
        );
        let f = GgufFile::from_bytes(&b).unwrap();
        let e = crate::load::from_gguf(&f, Path::new("m.gguf"))
            .err()
            .unwrap()
            .to_string();
        safe(&e);
        assert!(
            e.starts_with(r#"unsupported architecture "evil\u{1b}[31m"#),
            "{e}"
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_corruption_never_panics(pos in 0usize..400, byte in 0u8..=255) {
            let mut b = sample();
            let p = pos % b.len();
            b[p] = byte;
            let _ = GgufFile::from_bytes(&b);
        }
    }
}
