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
    let rows = (numel as usize).checked_div(inner).unwrap_or(0);
    rows.checked_mul(row)
        .ok_or_else(|| bad(format!("tensor {}: size overflows", quote(&t.name))))
}

pub mod synthetic;
pub mod writer;

#[cfg(test)]
mod tests;
