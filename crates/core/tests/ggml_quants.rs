//! `tessera_core::ggml_quants` against `tests/golden/ggml_quants.json`, written by
//! `tools/reference/make_ggml_quant_golden.py` from gguf-py's numpy dequantization (and
//! cross-checked there against ggml's C reference): bitwise equality for every row of every
//! type, NaN equal to NaN.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tessera_core::ggml_quants::{
    dequantize_row, quantize_row_q8_k, quantize_row_q8_k_into, GgmlQuant,
};

// ---- a small JSON reader (the golden is plain objects, arrays, strings and numbers) ----

#[derive(Debug)]
#[allow(dead_code)] // `Bool` and `Null` are parsed, not read
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn get(&self, k: &str) -> &Json {
        match self {
            Json::Obj(m) => m.get(k).unwrap_or_else(|| panic!("missing key {k}")),
            _ => panic!("not an object"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }
    fn num(&self) -> f64 {
        match self {
            Json::Num(n) => *n,
            other => panic!("not a number: {other:?}"),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            other => panic!("not an array: {other:?}"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.s[self.i], c, "expected '{}' at {}", c as char, self.i);
        self.i += 1;
    }
    fn value(&mut self) -> Json {
        self.ws();
        match self.s[self.i] {
            b'{' => {
                self.i += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.s[self.i] == b'}' {
                    self.i += 1;
                    return Json::Obj(m);
                }
                loop {
                    self.ws();
                    let k = self.string();
                    self.eat(b':');
                    m.insert(k, self.value());
                    self.ws();
                    self.i += 1;
                    match self.s[self.i - 1] {
                        b',' => continue,
                        b'}' => return Json::Obj(m),
                        c => panic!("unexpected '{}' in object", c as char),
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut a = Vec::new();
                self.ws();
                if self.s[self.i] == b']' {
                    self.i += 1;
                    return Json::Arr(a);
                }
                loop {
                    a.push(self.value());
                    self.ws();
                    self.i += 1;
                    match self.s[self.i - 1] {
                        b',' => continue,
                        b']' => return Json::Arr(a),
                        c => panic!("unexpected '{}' in array", c as char),
                    }
                }
            }
            b'"' => Json::Str(self.string()),
            b't' => {
                self.i += 4;
                Json::Bool(true)
            }
            b'f' => {
                self.i += 5;
                Json::Bool(false)
            }
            b'n' => {
                self.i += 4;
                Json::Null
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len() && b"+-.eE0123456789".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                Json::Num(t.parse().unwrap_or_else(|_| panic!("bad number {t:?}")))
            }
        }
    }
    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut out = String::new();
        loop {
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => return out,
                b'\\' => {
                    let e = self.s[self.i];
                    self.i += 1;
                    match e {
                        b'u' => {
                            let h = std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
                            self.i += 4;
                            let cp = u32::from_str_radix(h, 16).unwrap();
                            out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                        }
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        other => out.push(other as char),
                    }
                }
                _ => {
                    // Multi-byte UTF-8 passes through byte by byte into a valid String at the end.
                    let start = self.i - 1;
                    let len = match c {
                        0..=0x7f => 1,
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        _ => 4,
                    };
                    out.push_str(std::str::from_utf8(&self.s[start..start + len]).unwrap());
                    self.i = start + len;
                }
            }
        }
    }
}

fn b64(s: &str) -> Vec<u8> {
    fn v(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 byte {c}"),
        }
    }
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            acc |= v(c) << (18 - 6 * k);
        }
        let n = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    out
}

fn golden() -> Json {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/golden/ggml_quants.json"
    );
    let text = std::fs::read(path).expect("tests/golden/ggml_quants.json");
    Parser { s: &text, i: 0 }.value()
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

// ---- golden ----

#[test]
fn dequantize_matches_golden_bitwise() {
    let g = golden();
    let mut rows_per_type: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for row in g.get("dequantize").arr() {
        let name = row.get("type").str();
        let q = GgmlQuant::from_ggml_type(row.get("ggml_type").num() as u32)
            .unwrap_or_else(|| panic!("unknown ggml type in golden row of {name}"));
        assert_eq!(q.name(), name);
        let bytes = b64(row.get("bytes").str());
        let blocks = row.get("blocks").num() as usize;
        assert_eq!(bytes.len(), blocks * q.block_bytes(), "{name}");
        let want: Vec<f32> = b64(row.get("expected_f32_bits").str())
            .chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        assert_eq!(want.len(), blocks * q.block_len(), "{name}");
        let mut got = vec![0f32; want.len()];
        dequantize_row(q, &bytes, &mut got).unwrap();
        let bad: Vec<usize> = (0..want.len())
            .filter(|&i| !same_bits(got[i], want[i]))
            .collect();
        let n = rows_per_type.entry(name).or_default();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{name} row {} ({}): {} of {} values differ; first at {i}: got {:?} ({:#010x}), want {:?} ({:#010x})",
                *n,
                row.get("note").str(),
                bad.len(),
                want.len(),
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            ));
        }
        *n += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for q in GgmlQuant::ALL {
        assert!(
            rows_per_type.get(q.name()).copied().unwrap_or(0) >= 5,
            "the golden lacks rows for {q}"
        );
    }
}

#[test]
fn quantize_q8_k_matches_golden_bitwise() {
    let g = golden();
    let rows = g.get("quantize_q8_k").arr();
    assert!(rows.len() >= 5);
    for row in rows {
        let note = row.get("note").str();
        let x: Vec<f32> = b64(row.get("input_f32_bits").str())
            .chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let want = b64(row.get("expected_bytes").str());
        let got = quantize_row_q8_k(&x);
        assert_eq!(got.len(), want.len(), "{note}");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "q8_K quantize '{note}': byte {i} (block {}, offset {}) got {} want {}",
                i / 292,
                i % 292,
                got[i],
                want[i]
            );
        }
        // And dequantizing what was quantized reads back d * q.
        let mut y = vec![0f32; x.len()];
        dequantize_row(GgmlQuant::Q8_K, &got, &mut y).unwrap();
    }
}

// ---- lengths ----

#[test]
fn length_mismatches_are_errors() {
    for q in GgmlQuant::ALL {
        let (bb, bl) = (q.block_bytes(), q.block_len());
        let bytes = vec![0x55u8; 2 * bb];
        let mut out = vec![7f32; 2 * bl];
        assert!(dequantize_row(q, &bytes, &mut out).is_ok());
        assert!(dequantize_row(q, &[], &mut []).is_ok());
        for (nbytes, nout) in [
            (2 * bb - 1, 2 * bl),
            (2 * bb + 1, 2 * bl),
            (1, 0),
            (2 * bb, 2 * bl - 1),
            (2 * bb, 2 * bl + 1),
            (2 * bb, bl),
            (bb, 2 * bl),
            (0, bl),
        ] {
            let bytes = vec![0x55u8; nbytes];
            let mut out = vec![7f32; nout];
            let e = dequantize_row(q, &bytes, &mut out).unwrap_err();
            assert!(e.starts_with(q.name()), "{e}");
            assert!(
                out.iter().all(|&v| v == 7.0),
                "{q}: output touched on error"
            );
        }
        assert_eq!(q.row_bytes(3 * bl), Some(3 * bb));
        assert_eq!(q.row_bytes(bl + 1), None);
    }
    let mut out = vec![0u8; 292];
    assert!(quantize_row_q8_k_into(&[0.0; 255], &mut out).is_err());
    assert!(quantize_row_q8_k_into(&[0.0; 256], &mut out[..291]).is_err());
    assert!(quantize_row_q8_k_into(&[0.0; 256], &mut out).is_ok());
}

#[test]
#[should_panic(expected = "q8_K")]
fn quantize_q8_k_panics_on_partial_block() {
    quantize_row_q8_k(&[1.0; 300]);
}

// ---- properties ----

/// Offsets of the f16 scale fields in a block (None: Q8_K, whose `d` is an f32 at 0).
fn f16_fields(q: GgmlQuant) -> Option<&'static [usize]> {
    Some(match q {
        GgmlQuant::Q5_0 | GgmlQuant::IQ4_NL | GgmlQuant::IQ4_XS => &[0],
        GgmlQuant::Q5_1 | GgmlQuant::Q4_K | GgmlQuant::Q5_K => &[0, 2],
        GgmlQuant::Q2_K => &[80, 82],
        GgmlQuant::Q3_K => &[108],
        GgmlQuant::Q6_K => &[208],
        GgmlQuant::Q8_K => return None,
    })
}

fn any_case() -> impl Strategy<Value = (GgmlQuant, Vec<u8>, bool)> {
    (0..GgmlQuant::ALL.len(), 0usize..4, any::<bool>()).prop_flat_map(|(t, nb, finite)| {
        let q = GgmlQuant::ALL[t];
        (
            Just(q),
            prop::collection::vec(any::<u8>(), nb * q.block_bytes()),
            Just(finite),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes of a whole number of blocks dequantize without panicking, every output is
    /// written (the same result over two different prefills), and with finite scales every
    /// value is finite.
    #[test]
    fn dequantize_any_bytes((q, mut bytes, finite) in any_case()) {
        if finite {
            for blk in bytes.chunks_exact_mut(q.block_bytes()) {
                match f16_fields(q) {
                    // Clearing the top exponent bit makes every f16 finite.
                    Some(offs) => offs.iter().for_each(|&o| blk[o + 1] &= !0x40),
                    // Q8_K: the same bit of an f32 d keeps |d| < 2.
                    None => blk[3] &= !0x40,
                }
            }
        }
        let n = bytes.len() / q.block_bytes() * q.block_len();
        let mut a = vec![0f32; n];
        let mut b = vec![f32::NAN; n];
        dequantize_row(q, &bytes, &mut a).unwrap();
        dequantize_row(q, &bytes, &mut b).unwrap();
        for i in 0..n {
            prop_assert!(same_bits(a[i], b[i]), "{} value {} not written", q, i);
            if finite {
                prop_assert!(a[i].is_finite(), "{} value {} = {}", q, i, a[i]);
            }
        }
    }

    /// Q8_K round trip: |x - d * q| <= |d| / 2 (plus rounding) for finite inputs.
    #[test]
    fn q8_k_round_trip(x in prop::collection::vec(-1e6f32..1e6, 256)) {
        let bytes = quantize_row_q8_k(&x);
        let mut y = vec![0f32; 256];
        dequantize_row(GgmlQuant::Q8_K, &bytes, &mut y).unwrap();
        let d = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]).abs();
        for (a, b) in x.iter().zip(&y) {
            prop_assert!((a - b).abs() <= d * 0.5 + a.abs() * 1e-6 + 1e-30, "{} vs {} (d {})", a, b, d);
        }
        for g in 0..16 {
            let sum: i32 = bytes[4 + 16 * g..4 + 16 * g + 16].iter().map(|&q| q as i8 as i32).sum();
            let bsum = i16::from_le_bytes([bytes[260 + 2 * g], bytes[261 + 2 * g]]);
            prop_assert_eq!(sum, bsum as i32);
        }
    }
}
