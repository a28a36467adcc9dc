//! Tests of the GGUF reader: every value type, corrupt and crafted files.

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
    let data = vec![0u8; 66]; // one IQ2_XXS block (a type Tessera does not load)
    let b = write(
        &[],
        &[TensorSpec {
            name: "blk.0.q",
            dims: &[256, 1],
            ggml_type: 16,
            data: &data,
        }],
    );
    let f = GgufFile::from_bytes(&b).unwrap();
    let e = f.tensor(&f.tensors[0]).unwrap_err().to_string();
    assert_eq!(e, "unsupported tensor type IQ2_XXS for tensor blk.0.q");
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
    let data = vec![0u8; 66]; // one IQ2_XXS block (a type Tessera does not load)
    let b = write(
        &[("general.alignment", MetaValue::String(long.clone()))],
        &[TensorSpec {
            name: evil,
            dims: &[256, 1],
            ggml_type: 16,
            data: &data,
        }],
    );
    safe(&err_of(&b));
    let b = write(
        &[],
        &[TensorSpec {
            name: &long,
            dims: &[256, 1],
            ggml_type: 16,
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
