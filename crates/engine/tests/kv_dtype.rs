//! The f16 KV cache on the default model: half the bytes per block; logits within a stated
//! bound of the f32 cache's over the golden prompts and a 1,500-token prose prompt (on the
//! exact path an absolute bound; on the fast path one relative to that path's own distance
//! from the exact path), the same top-1 token at nearly every position; bitwise batch
//! invariance of its own; tensor-parallel ranks all on f16.
//!
//! `cargo test --release -p tessera-engine --test kv_dtype -- --nocapture` prints the
//! per-prompt figures behind what docs/serving.md says of `--kv-dtype f16`.

use std::path::PathBuf;

use serde_json::Value;
use tessera_engine::generate::generate;
use tessera_engine::sampling::argmax;
use tessera_engine::{Engine, GenerateRequest, KvDtype, SamplingParams, KV_BLOCK_SIZE};
use tessera_kernels::plan::Precision;
use tessera_model::Logits;

mod common;

/// Largest |Δlogit| allowed between f16 and f32 KV at any position of any prompt, on the
/// exact path (measured: about 0.05).
const MAX_ABS_DIFF: f64 = 0.25;
/// On the fast path, whose 8-bit activations turn small changes into whole quantization
/// steps here and there, f16 KV may move the logits at most this many times as far as the
/// fast path's own distance from the exact path (measured: about 0.7 times) …
const FAST_SCALE: f64 = 1.5;
/// … and lose at most this share of top-1 agreement beyond the fast path's own.
const FAST_TOP1_SLACK: f64 = 0.02;
/// Least share of positions whose top-1 token must agree.
const MIN_TOP1_AGREEMENT: f64 = 0.99;
/// Tokens of the long prompt.
const LONG: usize = 1500;

fn engine(precision: Precision, tp: usize) -> Engine {
    common::tp_engine(tp, precision)
}

/// The golden prompts, and the first [`LONG`] tokens of docs/design.md.
fn prompts(e: &Engine) -> Vec<(String, Vec<u32>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tests/golden/smollm2-135m-q4_1.json")).unwrap(),
    )
    .unwrap();
    let mut out: Vec<(String, Vec<u32>)> = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids = p["ids"].as_array().unwrap();
            let ids = ids.iter().map(|x| x.as_u64().unwrap() as u32).collect();
            (p["name"].as_str().unwrap().to_string(), ids)
        })
        .collect();
    let text = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let mut long = e.tokenizer.encode(&text).unwrap();
    assert!(
        long.len() >= LONG,
        "docs/design.md has {} tokens",
        long.len()
    );
    long.truncate(LONG);
    out.push((format!("design_md_{LONG}"), long));
    out
}

fn greedy(e: &Engine, prompt: &[u32]) -> Vec<u32> {
    let req = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_tokens: 32,
        params: SamplingParams::greedy(),
        ignore_eos: true,
        ..Default::default()
    };
    generate(e, &req, &mut |_| {}).unwrap().tokens
}

/// Max |Δ| between two logits tables, and at how many positions their top-1 agrees.
fn compare(a: &Logits, b: &Logits, positions: usize) -> (f64, usize) {
    let d = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let same = (0..positions)
        .filter(|&i| argmax(a.row(i)) == argmax(b.row(i)))
        .count();
    (d, same)
}

/// Tokens from the start on which two continuations agree.
fn agree(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Running figures of one comparison over the prompts.
#[derive(Default)]
struct Tally {
    worst: f64,
    same: usize,
    positions: usize,
}

impl Tally {
    fn add(&mut self, (d, same): (f64, usize), positions: usize) {
        self.worst = self.worst.max(d);
        self.same += same;
        self.positions += positions;
    }
    fn share(&self) -> f64 {
        self.same as f64 / self.positions as f64
    }
}

#[test]
fn f16_kv_stays_close_to_f32_kv() {
    let mut ex = engine(Precision::Exact, 1);
    let mut fa = engine(Precision::Fast, 1);
    let f32_block = ex.kv_bytes_per_block(KV_BLOCK_SIZE);
    ex.kv_dtype = KvDtype::F16;
    assert_eq!(2 * ex.kv_bytes_per_block(KV_BLOCK_SIZE), f32_block);
    let kv = ex.new_kv(KV_BLOCK_SIZE, 3).unwrap();
    assert_eq!(kv[0].bytes(), 3 * ex.kv_bytes_per_block(KV_BLOCK_SIZE));
    assert_eq!(kv[0].dtype(), KvDtype::F16);
    drop(kv);
    // f16 vs f32 KV on each path, and (for scale) the fast path vs the exact one, f32 KV.
    let (mut exact, mut fast, mut fast_vs_exact) =
        (Tally::default(), Tally::default(), Tally::default());
    for (name, ids) in prompts(&ex) {
        let n = ids.len();
        let run = |e: &mut Engine, dtype| {
            e.kv_dtype = dtype;
            (e.logits_all(&ids, None).unwrap(), greedy(e, &ids))
        };
        let (a32, ga32) = run(&mut ex, KvDtype::F32);
        let (a16, ga16) = run(&mut ex, KvDtype::F16);
        let e = compare(&a16, &a32, n);
        drop(a16);
        let (b32, gb32) = run(&mut fa, KvDtype::F32);
        let r = compare(&b32, &a32, n);
        drop(a32);
        let (b16, gb16) = run(&mut fa, KvDtype::F16);
        let f = compare(&b16, &b32, n);
        eprintln!(
            "{name} ({n} positions): exact: max |Δlogit| {:.2e}, top-1 agrees at {}/{n}, \
             greedy agrees for {}/32 tokens; fast: {:.2e}, {}/{n}, {}/32 \
             (fast vs exact, f32 KV: {:.2e}, {}/{n})",
            e.0,
            e.1,
            agree(&ga16, &ga32),
            f.0,
            f.1,
            agree(&gb16, &gb32),
            r.0,
            r.1
        );
        assert!(e.0 <= MAX_ABS_DIFF, "exact {name}: |Δlogit| {}", e.0);
        exact.add(e, n);
        fast.add(f, n);
        fast_vs_exact.add(r, n);
    }
    eprintln!(
        "exact: max |Δlogit| {:.2e}, top-1 agreement {:.4}; fast: {:.2e}, {:.4}; \
         fast vs exact: {:.2e}, {:.4} ({} positions)",
        exact.worst,
        exact.share(),
        fast.worst,
        fast.share(),
        fast_vs_exact.worst,
        fast_vs_exact.share(),
        exact.positions
    );
    assert!(
        exact.share() >= MIN_TOP1_AGREEMENT,
        "exact top-1 agreement {}",
        exact.share()
    );
    assert!(
        fast.worst <= FAST_SCALE * fast_vs_exact.worst,
        "fast: f16 KV moves logits by {}, the fast path itself by {}",
        fast.worst,
        fast_vs_exact.worst
    );
    assert!(
        fast.share() >= fast_vs_exact.share() - FAST_TOP1_SLACK,
        "fast: top-1 agreement {} with f16 KV, {} fast vs exact",
        fast.share(),
        fast_vs_exact.share()
    );
}

#[test]
fn f16_kv_is_batch_invariant() {
    for precision in [Precision::Exact, Precision::Fast] {
        let mut e = engine(precision, 1);
        e.kv_dtype = KvDtype::F16;
        let p = prompts(&e);
        let some: Vec<Vec<u32>> = p.iter().take(4).map(|(_, ids)| ids.clone()).collect();
        common::assert_sub_batch_invariant(&mut e, &some);
        // A prefill in 512-token chunks (the step engine) ends with the same logits as one
        // forward over the whole prompt.
        let (_, long) = p.last().unwrap();
        let one = e.logits_all(long, None).unwrap();
        let req = GenerateRequest {
            prompt_ids: long.clone(),
            max_tokens: 1,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            ..Default::default()
        };
        let first = generate(&e, &req, &mut |_| {}).unwrap().tokens;
        assert_eq!(first, vec![argmax(one.row(long.len() - 1)) as u32]);
    }
}

#[test]
fn tensor_parallel_ranks_share_the_f16_kv() {
    let mut one = engine(Precision::Exact, 1);
    one.kv_dtype = KvDtype::F16;
    let ids: Vec<u32> = prompts(&one)[3].1.clone();
    let want = one.logits_all(&ids, None).unwrap();
    drop(one);
    let mut e = engine(Precision::Exact, 2);
    e.kv_dtype = KvDtype::F16;
    let kv = e.new_kv(KV_BLOCK_SIZE, 2).unwrap();
    assert_eq!(kv.len(), 2);
    assert!(kv.iter().all(|k| k.dtype() == KvDtype::F16));
    drop(kv);
    let got = e.logits_all(&ids, None).unwrap();
    // The ranks' sums round differently, so a K or V value near an f16 rounding boundary
    // may round the other way: the f16-vs-f32 bound, not f32 TP's 1e-4.
    let same = (0..ids.len())
        .filter(|&i| argmax(got.row(i)) == argmax(want.row(i)))
        .count();
    assert!(
        same as f64 >= MIN_TOP1_AGREEMENT * ids.len() as f64,
        "{same}/{}",
        ids.len()
    );
    let d = got
        .data
        .iter()
        .zip(&want.data)
        .map(|(a, b)| (a - b).abs() as f64)
        .fold(0.0, f64::max);
    eprintln!(
        "tp 2 vs 1 on f16 KV: max |Δlogit| {d:.2e}, top-1 agrees at {same}/{}",
        ids.len()
    );
    assert!(d <= MAX_ABS_DIFF, "tp 2 vs 1 on f16 KV: {d}");
}
