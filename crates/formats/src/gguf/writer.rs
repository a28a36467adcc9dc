//! GGUF writer: serialises metadata and tensors as a v3 file; used by tests to craft good
//! and bad inputs, and by tools.

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
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    let base = out.len();
    for (t, off) in tensors.iter().zip(offsets) {
        out.resize(base + off as usize, 0);
        out.extend(t.data);
    }
    out
}
