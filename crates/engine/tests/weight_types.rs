//! Every weight format end to end, on tiny random Llamas written as GGUF by
//! `common/tiny.rs` with dimensions on whole 256-weight blocks (the K-quants' and IQ4_XS's
//! super-block): each of the 16 [`DType`]s as the format of every matrix (vectors F32), and a
//! file mixing formats the way llama.cpp's Q4_K_M does. For every format:
//! - it loads as stored (the engine holds the file's bytes), and on the exact path its logits
//!   are bitwise those of an F32 file holding the weights' decoded values; they are finite
//!   and within a bound derived from the format's precision of the original F32 model's, and
//!   not equal to them; the fast path stays within its 8-bit activations' bound of the
//!   decoded weights' logits;
//! - a sequence's logits are bitwise the same alone and batched, chunked and in one shot,
//!   and for every sub-batching, on both paths;
//! - two tensor-parallel ranks give one rank's logits within 1e-4, cut on whole blocks; and
//!   for the super-block formats, where a rank's row-parallel slice is not on whole blocks
//!   (decoded to f32 at load), 2 and 3 ranks do too;
//! - an f16 KV cache stays close to the f32 one;
//! - a prompt sharing a prefix with an earlier one is served from the prefix cache and gets
//!   the tokens it gets without it.
//!
//! A LoRA adapter on the Q4_K model gives the logits of an F32 model holding the Q4_K
//! weights' exact values plus the adapter's product, and a batch mixing the base and two
//! adapters gives each sequence its logits alone.
//!
//! `cargo test --release -p tessera-engine --test weight_types -- --nocapture` prints each
//! format's figures.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tessera_core::tensor::{dequantize_row, quantize_row};
use tessera_core::DType;
use tessera_engine::{Engine, KvDtype, KV_BLOCK_SIZE};
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};

mod common;

use common::tiny::*;

/// 256 wide, 2 layers of 4 heads of 128 in 2 KV groups, an MLP of 512: every matrix has
/// whole 256-weight blocks per row, and two ranks cut o (256 columns each) and down (256)
/// on whole blocks.
const DIMS: Dims = Dims {
    hidden: 256,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 128,
    ff: 512,
    ctx: 64,
    tied: true,
};

/// Heads of 64: a rank's o columns (128 on 2 ranks, 64 or 128 on 3) are not whole
/// 256-weight blocks; an MLP of 3 blocks is cut 2 + 1 on 2 ranks.
const OFF_BLOCK: Dims = Dims {
    hidden: 256,
    layers: 1,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    ff: 768,
    ctx: 64,
    tied: true,
};

const THREADS: usize = 2;

/// Bits of precision of a format's weights: rounding moves a weight by about 2^-bits of the
/// range of its block (8-bit codes for Q8_0/Q8_K and BF16's 8-bit significand, F16's 11,
/// 6, 5, 4, 3 and 2-bit codes for the others; IQ4's non-linear 4-bit grid counts as 4).
fn bits(dt: DType) -> i32 {
    match dt {
        DType::F32 => 24,
        DType::F16 => 11,
        DType::BF16 | DType::Q8_0 | DType::Q8_K => 8,
        DType::Q6_K => 6,
        DType::Q5_0 | DType::Q5_1 | DType::Q5_K => 5,
        DType::Q4_0 | DType::Q4_1 | DType::Q4_K | DType::IQ4_NL | DType::IQ4_XS => 4,
        DType::Q3_K => 3,
        DType::Q2_K => 2,
    }
}

/// The largest |Δlogit| from the F32 model allowed for weights of `bits` bits, relative to
/// the logit scale (max |logit|, at least 1): `K · 2^-bits`. K = 8 is model_files.rs's bound
/// for F16 and Q8_0 (4e-3 ≈ 8 · 2^-11, 3e-2 ≈ 8 · 2^-8) applied to every format. Measured
/// on this model: 2 to 4.8 times 2^-bits (F16 2.0, Q8_0 4.0, Q4_K 4.2, IQ4_XS 4.8, Q2_K 3.6),
/// so every format has at least 1.7x headroom, and a decoding error the size of a weight
/// would exceed it (for Q2_K and Q3_K the bound is about the logits' own size: there the
/// bitwise check against the decoded weights is what catches a decoding error).
const K: f32 = 8.0;

fn tolerance(bits: i32) -> f32 {
    K * (-bits as f32).exp2()
}

/// The fast path's 8-bit activations (symmetric codes, −127..127: 2^-7 of their block's
/// largest value) move the logits from those of the weights' exact values by at most
/// `tolerance(7)` (measured: at most 3.2e-2 of the scale, Q2_K; F32, F16, BF16 and Q8_K run
/// as on the exact path); from the F32 model's, by that plus the weights' own bound.
const ACT_BITS: i32 = 7;

fn fast_tolerance(bits: i32) -> f32 {
    tolerance(bits) + tolerance(ACT_BITS)
}

/// An f16 KV cache moves the exact path's logits by at most F16's bound (K and V rounded to
/// 11 bits; measured: at most 5.6e-4 of the scale against 3.9e-3) …
const KV_F16_BITS: i32 = 11;
/// … and the fast path's, whose 8-bit activations turn small changes into whole quantization
/// steps here and there, by at most that plus this many times the fast path's own distance
/// from the exact path (kv_dtype.rs's rule on the default model; measured: at most 1.06 times
/// that distance, Q3_K).
const KV_FAST_SCALE: f32 = 1.5;

/// Tensor-parallel ranks, and a LoRA product beside its merged weights, sum in another
/// order: f32 rounding only, |Δlogit| at most this.
const F32_ROUNDING: f32 = 1e-4;

fn write(dir: &TempDir, d: &Dims, dtype: DType) -> PathBuf {
    GgufParts::new(d, dtype, true).write_to(&dir.join(&format!("{dtype}.gguf")))
}

fn load_as(path: &Path, precision: Precision, tp: usize) -> Engine {
    Engine::load_tp(
        path,
        THREADS,
        precision,
        Planner::untuned(),
        tp,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("loading {} (tp {tp}, {precision}): {e}", path.display()))
}

/// Bytes of the matrices (and vectors) as the file stores them.
fn stored_bytes(p: &GgufParts) -> usize {
    p.tensors.iter().map(|t| t.data.len()).sum()
}

fn tokens() -> Vec<u32> {
    prompt(20)
}

/// Checks `got` against `reference`: finite, within `tol` times the logit scale (max
/// |reference|, at least 1), and when `lossy` not bitwise equal. Returns max |Δ| / scale.
fn check_close(what: &str, got: &[f32], reference: &[f32], tol: f32, lossy: bool) -> f32 {
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{what}: non-finite logits"
    );
    let scale = max_abs(reference).max(1.0);
    let d = max_abs_diff(got, reference);
    assert!(
        d <= tol * scale,
        "{what}: max |Δlogit| {d} > {tol} x logit scale {scale}"
    );
    if lossy {
        assert!(d > 0.0, "{what}: logits bitwise equal to the reference");
    }
    d / scale
}

// ---------------------------------------------------------------------------------------------
// Each format alone.

#[test]
fn every_format_loads_as_stored_and_stays_close_to_f32() {
    let dir = TempDir::new("wt-close");
    let t = tokens();
    let f32_path = write(&dir, &DIMS, DType::F32);
    let reference = logits_all(&load(&f32_path, THREADS), &t);
    let scale = max_abs(&reference);
    assert!(
        scale > 0.1,
        "the F32 model's logits are all near zero ({scale})"
    );
    eprintln!("logit scale {scale:.3}; max |Δlogit| / scale from the F32 model's (bound):");
    for dtype in DType::ALL {
        let parts = GgufParts::new(&DIMS, dtype, true);
        let path = parts.write_to(&dir.join(&format!("{dtype}.gguf")));
        let dec_path =
            decoded(&parts, &DIMS, &[]).write_to(&dir.join(&format!("{dtype}-decoded.gguf")));
        let dec = logits_all(&load(&dec_path, THREADS), &t);
        let b = bits(dtype);
        let lossy = dtype != DType::F32;
        // Exact path: the weights as stored, mapped.
        let e = load_as(&path, Precision::Exact, 1);
        assert_eq!(
            e.weight_bytes,
            stored_bytes(&parts),
            "{dtype}: weights not held as stored"
        );
        let exact = logits_all(&e, &t);
        let de = check_close(
            &format!("{dtype} exact"),
            &exact,
            &reference,
            tolerance(b),
            lossy,
        );
        if !lossy {
            assert!(exact == reference, "F32 exact: not bitwise the reference");
        }
        // Fast path.
        let f = load_as(&path, Precision::Fast, 1);
        let fast = logits_all(&f, &t);
        let df = check_close(
            &format!("{dtype} fast"),
            &fast,
            &reference,
            fast_tolerance(b),
            false,
        );
        // The exact path computes with the weights' exact values: bitwise the logits of an
        // F32 file holding them; the fast path within its activations' bound of those.
        assert!(
            exact == dec,
            "{dtype} exact: not bitwise the logits of its decoded weights (max |Δ| {})",
            max_abs_diff(&exact, &dec)
        );
        let dd = check_close(
            &format!("{dtype} fast vs its decoded weights"),
            &fast,
            &dec,
            tolerance(ACT_BITS),
            false,
        );
        eprintln!(
            "  {dtype:>6}: exact {de:.2e} ({:.2e}), fast {df:.2e} ({:.2e}), fast from the \
             decoded weights {dd:.2e} ({:.2e}); {} bytes",
            tolerance(b),
            fast_tolerance(b),
            tolerance(ACT_BITS),
            e.weight_bytes
        );
    }
}

/// Bitwise: two sequences batched as each alone, chunked prefills as one shot, every
/// sub-batching as one pass; on the exact path (the contract) and on the fast one (which
/// keeps it too).
#[test]
fn every_format_is_batch_and_chunk_invariant() {
    let dir = TempDir::new("wt-invariant");
    let (a, b) = (prompt(13), prompt(29)[20..].to_vec());
    let chunked = prompt(23);
    for dtype in DType::ALL {
        let path = write(&dir, &DIMS, dtype);
        for precision in [Precision::Exact, Precision::Fast] {
            let mut e = load_as(&path, precision, 1);
            assert_batched_matches_alone(&e, &a, &b, 7, 100);
            assert_chunked_prefill_matches_one_shot(
                &e,
                &chunked,
                &[4, 1, 6, 0, 3, 5, 2],
                &[&[3, 4, 16], &[3, 4, 5, 6, 5], &[1; 23], &[22, 1]],
            );
            // Fewer prompts on the fast path, whose kernels for these tiny products are slower.
            let prompts = match precision {
                Precision::Exact => vec![prompt(5), prompt(19)[7..].to_vec(), vec![3], prompt(23)],
                _ => vec![prompt(19)[7..].to_vec(), prompt(23)],
            };
            common::assert_sub_batch_invariant(&mut e, &prompts);
        }
    }
}

#[test]
fn every_format_on_two_ranks_matches_one_rank() {
    let dir = TempDir::new("wt-tp");
    let t = tokens();
    for dtype in DType::ALL {
        let path = write(&dir, &DIMS, dtype);
        // Cut on whole blocks: no slice is decoded.
        let files = tessera_formats::load_model(&path).unwrap();
        let layout = tessera_model::TpLayout::for_files(&files, 2).unwrap();
        for r in 0..2 {
            let (_, notes) = tessera_model::shard_files_noted(&files, &layout, r).unwrap();
            assert_eq!(notes.decoded, vec![], "{dtype}, rank {r}");
        }
        let one = load_as(&path, Precision::Exact, 1)
            .logits_all(&t, None)
            .unwrap()
            .data;
        let e = load_as(&path, Precision::Exact, 2);
        let got = e.logits_all(&t, None).unwrap().data;
        let d = max_abs_diff(&got, &one);
        eprintln!("{dtype:>6}: tp 2 vs 1: max |Δlogit| {d:.2e}");
        assert!(
            d < F32_ROUNDING,
            "{dtype}: tp 2 differs from one rank by {d}"
        );
        assert!(
            e.logits_all(&t, None).unwrap().data == got,
            "{dtype}: tp 2 not reproducible"
        );
    }
}

#[test]
fn every_format_runs_on_an_f16_kv_cache() {
    let dir = TempDir::new("wt-kv");
    let t = tokens();
    for dtype in DType::ALL {
        let path = write(&dir, &DIMS, dtype);
        let (mut ex, mut fa) = (
            load_as(&path, Precision::Exact, 1),
            load_as(&path, Precision::Fast, 1),
        );
        let (ex32, fa32) = (
            ex.logits_all(&t, None).unwrap().data,
            fa.logits_all(&t, None).unwrap().data,
        );
        ex.kv_dtype = KvDtype::F16;
        fa.kv_dtype = KvDtype::F16;
        let kv = ex.new_kv(16, 1).unwrap();
        assert_eq!(kv[0].dtype(), KvDtype::F16);
        drop(kv);
        let (ex16, fa16) = (
            ex.logits_all(&t, None).unwrap().data,
            fa.logits_all(&t, None).unwrap().data,
        );
        let scale = max_abs(&ex32).max(1.0);
        let de = check_close(
            &format!("{dtype} exact, f16 KV"),
            &ex16,
            &ex32,
            tolerance(KV_F16_BITS),
            true,
        );
        let fast_from_exact = max_abs_diff(&fa32, &ex32) / scale;
        let df = check_close(
            &format!("{dtype} fast, f16 KV"),
            &fa16,
            &fa32,
            tolerance(KV_F16_BITS) + KV_FAST_SCALE * fast_from_exact,
            false,
        );
        eprintln!(
            "{dtype:>6}: f16 vs f32 KV, max |Δlogit| / scale: exact {de:.2e}, fast {df:.2e} \
             (the fast path from the exact one: {fast_from_exact:.2e})"
        );
        // Bitwise batch invariance of its own.
        common::assert_sub_batch_invariant(&mut ex, &[prompt(5), prompt(19)[7..].to_vec()]);
    }
}

/// Where a rank's o columns are not whole 256-weight blocks, the loader decodes that slice to
/// its exact f32 values: the ranks still give one rank's logits.
#[test]
fn super_block_slices_off_block_boundaries_match_one_rank() {
    let dir = TempDir::new("wt-tp-off");
    let t = tokens();
    for dtype in DType::ALL.into_iter().filter(|d| d.is_super_block()) {
        let path = write(&dir, &OFF_BLOCK, dtype);
        let files = tessera_formats::load_model(&path).unwrap();
        let layout = tessera_model::TpLayout::for_files(&files, 2).unwrap();
        // The MLP on whole blocks, unevenly (3 blocks: 2 + 1); o decoded on both ranks.
        let ff: Vec<_> = layout.ranks.iter().map(|r| r.ff.clone()).collect();
        assert_eq!(ff, vec![0..512, 512..768], "{dtype}");
        for r in 0..2 {
            let (_, notes) = tessera_model::shard_files_noted(&files, &layout, r).unwrap();
            let names: Vec<_> = notes.decoded.iter().map(|d| d.0.as_str()).collect();
            assert_eq!(names, vec!["blk.0.attn_output.weight"], "{dtype}, rank {r}");
            assert_eq!(notes.decoded[0].1, dtype);
        }
        let one = load_as(&path, Precision::Exact, 1)
            .logits_all(&t, None)
            .unwrap()
            .data;
        for tp in [2, 3] {
            let got = load_as(&path, Precision::Exact, tp)
                .logits_all(&t, None)
                .unwrap()
                .data;
            let d = max_abs_diff(&got, &one);
            eprintln!("{dtype:>6}: off-block tp {tp} vs 1: max |Δlogit| {d:.2e}");
            assert!(
                d < F32_ROUNDING,
                "{dtype}: off-block tp {tp} differs by {d}"
            );
        }
    }
}

/// Greedy tokens of `prompts`, each run to its end before the next is submitted, through one
/// step engine (prefix cache on or off); and the prompt tokens its cache served.
/// A prompt sharing two full KV blocks with an earlier one reuses them from the prefix cache
/// and gets the tokens it gets with the cache off.
#[test]
fn every_format_serves_from_the_prefix_cache() {
    let dir = TempDir::new("wt-prefix");
    let first = prompt(40);
    let mut second = first[..2 * KV_BLOCK_SIZE].to_vec();
    second.extend((0..7).map(|i| i * 11 + 3));
    for dtype in DType::ALL {
        let path = write(&dir, &DIMS, dtype);
        for precision in [Precision::Exact, Precision::Fast] {
            let e = load_as(&path, precision, 1);
            let prompts = [first.clone(), second.clone()];
            let (cached, hits) = common::one_after_another(&e, &prompts, true, DIMS.ctx);
            assert!(
                hits >= 2 * KV_BLOCK_SIZE as u64,
                "{dtype} {precision}: {hits} prompt tokens from the cache"
            );
            let (fresh, none) = common::one_after_another(&e, &prompts[1..], false, DIMS.ctx);
            assert_eq!(none, 0);
            assert_eq!(
                cached[1], fresh[0],
                "{dtype} {precision}: the cached prefix changed the tokens"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Formats mixed in one file.

/// llama.cpp's Q4_K_M mix (as in the Qwen2.5-Coder files): q and k Q5_0, v Q8_0 (Q6_K in
/// some layers), o, gate and up Q4_K, down Q6_K (Q4_K in some layers), an output head of its
/// own in Q6_K, the embedding Q4_K. The fused q/k/v stack mixes formats (two runs).
fn q4_k_m(name: &str) -> DType {
    let layer1 = name.starts_with("blk.1.");
    match name.rsplit('.').nth(1).unwrap() {
        "attn_q" | "attn_k" => DType::Q5_0,
        "attn_v" if layer1 => DType::Q6_K,
        "attn_v" => DType::Q8_0,
        "ffn_down" if layer1 => DType::Q4_K,
        "ffn_down" | "output" => DType::Q6_K,
        _ => DType::Q4_K,
    }
}

#[test]
fn a_q4_k_m_mix_matches_its_formats() {
    let dir = TempDir::new("wt-mixed");
    let d = Dims {
        tied: false,
        ..DIMS
    };
    let t = tokens();
    let reference = logits_all(&load(&write(&dir, &d, DType::F32), THREADS), &t);
    let parts = GgufParts::new_with(&d, true, q4_k_m);
    let types: Vec<(String, u32)> = parts
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.ty))
        .collect();
    assert!(types.contains(&("output.weight".into(), DType::Q6_K.ggml_type())));
    assert!(types.contains(&("blk.1.attn_v.weight".into(), DType::Q6_K.ggml_type())));
    let path = parts.write_to(&dir.join("q4_k_m.gguf"));
    let e = load_as(&path, Precision::Exact, 1);
    assert!(!e.model.config.tie_embeddings);
    assert_eq!(e.weight_bytes, stored_bytes(&parts));
    // Bitwise the logits of its decoded weights; bounded by its coarsest format, Q4_K.
    let exact = logits_all(&e, &t);
    let dec_path = decoded(&parts, &d, &[]).write_to(&dir.join("q4_k_m-decoded.gguf"));
    let dec = logits_all(&load(&dec_path, THREADS), &t);
    assert!(
        exact == dec,
        "Q4_K_M mix: not bitwise the logits of its decoded weights"
    );
    let de = check_close("Q4_K_M exact", &exact, &reference, tolerance(4), true);
    let fast = logits_all(&load_as(&path, Precision::Fast, 1), &t);
    let df = check_close("Q4_K_M fast", &fast, &reference, fast_tolerance(4), false);
    let dd = check_close(
        "Q4_K_M fast vs decoded",
        &fast,
        &dec,
        tolerance(ACT_BITS),
        false,
    );
    eprintln!(
        "Q4_K_M mix: max |Δlogit| / scale from F32: exact {de:.2e}, fast {df:.2e}; fast from \
         the decoded weights {dd:.2e}"
    );

    let mut e = e;
    assert_batched_matches_alone(&e, &prompt(13), &prompt(29)[20..], 7, 100);
    assert_chunked_prefill_matches_one_shot(
        &e,
        &prompt(23),
        &[4, 1, 6, 0, 3, 5, 2],
        &[&[3, 4, 16], &[3, 4, 5, 6, 5], &[22, 1]],
    );
    let prompts = vec![prompt(5), prompt(19)[7..].to_vec(), vec![3], prompt(23)];
    common::assert_sub_batch_invariant(&mut e, &prompts);

    let one = e.logits_all(&t, None).unwrap().data;
    for tp in [2, 3] {
        let got = load_as(&path, Precision::Exact, tp)
            .logits_all(&t, None)
            .unwrap()
            .data;
        let dd = max_abs_diff(&got, &one);
        assert!(dd < F32_ROUNDING, "Q4_K_M mix: tp {tp} differs by {dd}");
    }
}

// ---------------------------------------------------------------------------------------------
// LoRA on a K-quant base.

const LORA_RANK: usize = 4;
const LORA_ALPHA: f32 = 8.0;

/// One adapted module: `(layer, module, A [r, in], B [out, r])`.
type Factor = (usize, &'static str, Vec<f32>, Vec<f32>);

/// A PEFT folder adapting all seven projections of every layer (rank 4, alpha 8), in
/// Hugging Face layout; returns its factors too.
fn write_peft(dir: &Path, d: &Dims, seed: u64) -> Vec<Factor> {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng(seed);
    let (h, q, kv, ff) = (d.hidden, d.q_dim(), d.kv_dim(), d.ff);
    let mut factors = vec![];
    for l in 0..d.layers {
        for (module, inp, out) in [
            ("self_attn.q_proj", h, q),
            ("self_attn.k_proj", h, kv),
            ("self_attn.v_proj", h, kv),
            ("self_attn.o_proj", q, h),
            ("mlp.gate_proj", h, ff),
            ("mlp.up_proj", h, ff),
            ("mlp.down_proj", ff, h),
        ] {
            let a = rng.vec(LORA_RANK * inp, 0.1, 0.0);
            let b = rng.vec(out * LORA_RANK, 0.05, 0.0);
            factors.push((l, module, a, b));
        }
    }
    let weights: Vec<Weight> = factors
        .iter()
        .flat_map(|(l, module, a, b)| {
            let name =
                |f: &str| format!("base_model.model.model.layers.{l}.{module}.lora_{f}.weight");
            let (inp, out) = (a.len() / LORA_RANK, b.len() / LORA_RANK);
            [
                Weight {
                    hf: name("A"),
                    gguf: String::new(),
                    shape: vec![LORA_RANK, inp],
                    values: a.clone(),
                    permute_heads: None,
                },
                Weight {
                    hf: name("B"),
                    gguf: String::new(),
                    shape: vec![out, LORA_RANK],
                    values: b.clone(),
                    permute_heads: None,
                },
            ]
        })
        .collect();
    std::fs::write(
        dir.join("adapter_model.safetensors"),
        safetensors_bytes(&weights),
    )
    .unwrap();
    let cfg = json!({
        "peft_type": "LORA",
        "r": LORA_RANK,
        "lora_alpha": LORA_ALPHA,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "bias": "none",
    });
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
    factors
}

/// `parts` with every tensor stored as F32: its exact decoded values, plus `alpha / r · B A`
/// of each adapter factor given (q/k rows permuted as the GGUF file's).
fn decoded(parts: &GgufParts, d: &Dims, factors: &[Factor]) -> GgufParts {
    let mut out = GgufParts {
        meta: parts.meta.clone(),
        tensors: vec![],
    };
    for t in &parts.tensors {
        let dtype = DType::from_ggml_type(t.ty).unwrap();
        let cols = t.dims[0] as usize;
        let rows: usize = t.dims[1..].iter().product::<u64>() as usize;
        let row_bytes = dtype.row_bytes(cols).unwrap();
        let mut w = vec![0f32; rows * cols];
        for (r, o) in w.chunks_mut(cols).enumerate() {
            dequantize_row(dtype, &t.data[r * row_bytes..(r + 1) * row_bytes], o);
        }
        for (l, module, a, b) in factors {
            let stem = match *module {
                "self_attn.q_proj" => "attn_q",
                "self_attn.k_proj" => "attn_k",
                "self_attn.v_proj" => "attn_v",
                "self_attn.o_proj" => "attn_output",
                "mlp.gate_proj" => "ffn_gate",
                "mlp.up_proj" => "ffn_up",
                _ => "ffn_down",
            };
            if t.name != format!("blk.{l}.{stem}.weight") {
                continue;
            }
            // delta[o][i] = scale · Σ_k B[o][k] A[k][i], in Hugging Face row order.
            let scale = LORA_ALPHA / LORA_RANK as f32;
            let mut delta = vec![0f32; rows * cols];
            for (o, row) in delta.chunks_mut(cols).enumerate() {
                for k in 0..LORA_RANK {
                    let bk = scale * b[o * LORA_RANK + k];
                    for (x, ai) in row.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                        *x += bk * ai;
                    }
                }
            }
            let delta = match stem {
                "attn_q" => permute_rows(&delta, d.heads, cols),
                "attn_k" => permute_rows(&delta, d.kv_heads, cols),
                _ => delta,
            };
            for (x, dx) in w.iter_mut().zip(&delta) {
                *x += dx;
            }
        }
        out.tensors.push(GTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: DType::F32.ggml_type(),
            data: quantize_row(DType::F32, &w),
        });
    }
    out
}

/// A PEFT adapter on the Q4_K model: its logits are those of the F32 model holding the Q4_K
/// weights' exact values plus the adapter's product (within f32 rounding), unlike the base's;
/// in a batch mixing the base and two adapters every sequence gets its logits alone, bitwise,
/// on both paths.
#[test]
fn lora_on_a_q4_k_base_matches_the_merged_weights() {
    let dir = TempDir::new("wt-lora");
    let base_parts = GgufParts::new(&DIMS, DType::Q4_K, true);
    let path = base_parts.write_to(&dir.join("q4_k.gguf"));
    let factors = write_peft(&dir.join("adapter"), &DIMS, 0xADA9);
    write_peft(&dir.join("adapter2"), &DIMS, 0xBEEF);
    let merged_path = decoded(&base_parts, &DIMS, &factors).write_to(&dir.join("merged.gguf"));
    let t = tokens();

    let e = load_as(&path, Precision::Exact, 1);
    let lora = e.load_adapter(&dir.join("adapter")).unwrap();
    let base = e.logits_all(&t, None).unwrap().data;
    let adapted = e.logits_all(&t, Some(&lora)).unwrap().data;
    let want = load_as(&merged_path, Precision::Exact, 1)
        .logits_all(&t, None)
        .unwrap()
        .data;
    assert!(adapted.iter().all(|x| x.is_finite()));
    let moved = max_abs_diff(&adapted, &base);
    let d = max_abs_diff(&adapted, &want);
    let scale = max_abs(&want).max(1.0);
    eprintln!(
        "LoRA on Q4_K: moves the logits by {moved:.3}, vs merged F32 weights {d:.2e} \
         (scale {scale:.2})"
    );
    assert!(moved > 0.05 * scale, "the adapter changed little ({moved})");
    assert!(
        d <= F32_ROUNDING,
        "LoRA on Q4_K vs merged weights: max |Δlogit| {d}"
    );

    // Base, adapter and a second adapter in one batch: each as alone.
    for precision in [Precision::Exact, Precision::Fast] {
        let e = load_as(&path, precision, 1);
        let table: Vec<Arc<_>> = ["adapter", "adapter2"]
            .iter()
            .map(|n| e.load_adapter(&dir.join(n)).unwrap())
            .collect();
        let prompts = [prompt(11), prompt(11), prompt(17)[3..].to_vec()];
        let slots = [None, Some(0), Some(1)];
        let seq = |i: usize, blocks: Vec<u32>| {
            let mut s = SeqChunk::new(prompts[i].clone(), 0, blocks, LogitsFor::All);
            s.adapter = slots[i];
            s
        };
        let alone: Vec<Vec<f32>> = (0..3)
            .map(|i| {
                let mut kv = e.model.new_kv_storage(BLOCK, 4).unwrap();
                e.forward_with(
                    &BatchMeta {
                        seqs: vec![seq(i, vec![0, 1, 2, 3])],
                    },
                    &mut kv,
                    &table,
                )
                .unwrap()
                .data
            })
            .collect();
        assert!(
            alone[0] != alone[1],
            "{precision}: the adapter changed nothing"
        );
        let mut kv = e.model.new_kv_storage(BLOCK, 12).unwrap();
        let batch = BatchMeta {
            seqs: (0..3)
                .map(|i| seq(i, (0..4).map(|b| (b * 3 + i) as u32).collect()))
                .collect(),
        };
        let l = e.forward_with(&batch, &mut kv, &table).unwrap();
        let v = e.model.config.vocab_size;
        let mut start = 0;
        for (i, want) in alone.iter().enumerate() {
            let n = prompts[i].len() * v;
            assert!(
                l.data[start..start + n] == want[..],
                "{precision}: sequence {i} (adapter {:?}) changed in a mixed batch",
                slots[i]
            );
            start += n;
        }
    }
}
