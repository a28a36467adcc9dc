//! `tessera cuda-check`: the GPU's parity with the CPU's exact path and its decode speed, on
//! one model file, as the device script runs it (`scripts/device-cuda.sh`).
//!
//! 1. Prefill parity: one prompt's logits at every position, GPU against CPU: the largest
//!    difference must stay within 1e-3 of the largest |logit|, and the argmax agree
//!    wherever the CPU's top-2 margin exceeds that tolerance.
//! 2. Greedy decode through the unchanged scheduler (a step engine on the GPU), checked
//!    teacher-forced against one CPU forward over prompt and output: every generated token
//!    is the CPU's argmax wherever its margin exceeds the tolerance.
//! 3. Continuous batching: four prompts decoded together on the GPU give each the tokens it
//!    gets alone.
//! 4. Speed: decode tokens/s of one sequence and of eight, against the bandwidth floor
//!    (the bytes a decode step reads over the GPU's memory bandwidth).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tessera_engine::generate::{generate, single_request_config};
use tessera_engine::{Engine, GenerateRequest, RequestEvent, SamplingParams, StepEngine};
use tessera_kernels::plan::Precision;

/// Relative tolerance: of the largest |logit|.
const TOL: f32 = 1e-3;

#[derive(clap::Args)]
pub(crate) struct CudaCheckArgs {
    /// The GGUF file (a real model, or one from `tessera synth model`).
    #[arg(long)]
    model: std::path::PathBuf,
    /// CPU threads for the reference forward (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value_t = 48)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Memory bandwidth in TB/s for the floor (default: 4.8 on an H200, 3.35 otherwise).
    #[arg(long)]
    bandwidth_tbs: Option<f64>,
    /// Seed of the prompts' token ids.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Past the first ids, where control tokens usually sit.
            (16 + x % (vocab as u64 - 16)) as u32
        })
        .collect()
}

fn greedy(p: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: p,
        max_tokens,
        params: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        ignore_eos: true,
        ..Default::default()
    }
}

/// (largest |diff| / largest |cpu|, argmax disagreements where the margin exceeds the
/// tolerance, rows compared).
fn compare(cpu: &[&[f32]], gpu: &[&[f32]]) -> (f32, usize) {
    let max = cpu
        .iter()
        .flat_map(|r| r.iter())
        .fold(0f32, |a, v| a.max(v.abs()));
    let mut diff = 0f32;
    let mut bad = 0;
    for (c, g) in cpu.iter().zip(gpu) {
        diff = c
            .iter()
            .zip(*g)
            .fold(diff, |a, (x, y)| a.max((x - y).abs()));
        let (top, margin) = top2(c);
        if margin > TOL * max && top != tessera_engine::sampling::argmax(g) as usize {
            bad += 1;
        }
    }
    (diff / max.max(f32::MIN_POSITIVE), bad)
}

/// The argmax of `row` and its margin over the runner-up.
fn top2(row: &[f32]) -> (usize, f32) {
    let (mut i1, mut v1, mut v2) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > v1 {
            (v2, v1, i1) = (v1, v, i);
        } else if v > v2 {
            v2 = v;
        }
    }
    (i1, v1 - v2)
}

/// Decodes every request of `reqs` together on `engine`'s device; returns each one's tokens
/// and the decode tokens/s (from the first step that only decodes).
fn run_batch(engine: &Engine, reqs: &[GenerateRequest]) -> Result<(Vec<Vec<u32>>, f64)> {
    let positions = reqs
        .iter()
        .map(|r| r.prompt_ids.len() + r.max_tokens + 1)
        .max()
        .unwrap_or(1);
    let mut cfg = single_request_config(engine, positions * reqs.len());
    cfg.max_num_seqs = reqs.len();
    cfg.max_waiting = reqs.len();
    cfg.max_num_batched_tokens = positions * reqs.len();
    let mut steps = StepEngine::new(engine, cfg)?;
    for (i, r) in reqs.iter().enumerate() {
        steps
            .submit(i as u64, r)
            .map_err(|e| anyhow::anyhow!("submitting: {e}"))?;
    }
    let mut out = vec![Vec::new(); reqs.len()];
    let (mut decode_tokens, mut decode_s) = (0usize, 0f64);
    while steps.has_work() {
        let t0 = Instant::now();
        let o = steps.step();
        let secs = t0.elapsed().as_secs_f64();
        if o.tokens == o.seqs && o.seqs > 0 {
            decode_tokens += o.tokens;
            decode_s += secs;
        }
        for (id, ev) in o.events {
            match ev {
                RequestEvent::Text { tokens, .. } => out[id as usize].extend(tokens),
                RequestEvent::Failed { message } => bail!("request {id} failed: {message}"),
                _ => {}
            }
        }
    }
    Ok((out, decode_tokens as f64 / decode_s.max(1e-9)))
}

pub(crate) fn run(args: CudaCheckArgs) -> Result<()> {
    let load = || {
        tessera_formats::load_model(&args.model)
            .with_context(|| format!("loading {}", args.model.display()))
    };
    let files = load()?;
    let threads = args
        .threads
        .unwrap_or_else(tessera_engine::engine::default_threads);
    let device = Arc::new(tessera_cuda::CudaDevice::new(&files).context("--device cuda")?);
    eprintln!("{}", device.summary());
    let planner = tessera_engine::tuning::load_planner;
    // Two engines on the same file: the CPU reference, and the one whose step engines run on
    // the GPU.
    let cpu = Engine::from_files(load()?, threads, Precision::Exact, planner())?;
    let mut gpu = Engine::from_files(files, threads, Precision::Exact, planner())?;
    gpu.set_device(device.clone())?;
    let vocab = cpu.config.vocab_size;
    let name = tessera_engine::Device::name(&*device);
    println!(
        "model {} | {name} | CPU reference on {threads} threads",
        cpu.name
    );
    let mut ok = true;

    // 1. Prefill parity, every position.
    let p = prompt(args.prompt_tokens, vocab, args.seed);
    let c = cpu.logits_all(&p, None)?;
    let g = gpu.logits_all(&p, None)?;
    let (cr, gr): (Vec<&[f32]>, Vec<&[f32]>) = (0..p.len()).map(|i| (c.row(i), g.row(i))).unzip();
    let (rel, bad) = compare(&cr, &gr);
    let pass = rel <= TOL && bad == 0;
    ok &= pass;
    println!(
        "prefill parity: {} positions, max |diff| = {rel:.2e} of max |logit| (tolerance {TOL:.0e}), \
         {bad} argmax disagreements beyond the margin: {}",
        p.len(),
        if pass { "PASS" } else { "FAIL" }
    );

    // 2. Greedy decode on the GPU through the scheduler, teacher-forced on the CPU.
    let t0 = Instant::now();
    let stats = generate(&gpu, &greedy(p.clone(), args.decode_tokens), &mut |_| {})?;
    let gpu_s = t0.elapsed().as_secs_f64();
    let mut all = p.clone();
    all.extend(&stats.tokens);
    let c = cpu.logits_all(&all[..all.len() - 1], None)?;
    let max = (0..all.len() - 1)
        .flat_map(|i| c.row(i).iter())
        .fold(0f32, |a, v| a.max(v.abs()));
    let (mut agree, mut close, mut bad) = (0, 0, 0);
    for (i, &t) in stats.tokens.iter().enumerate() {
        let (top, margin) = top2(c.row(p.len() - 1 + i));
        match (top == t as usize, margin > TOL * max) {
            (true, _) => agree += 1,
            (false, false) => close += 1,
            (false, true) => bad += 1,
        }
    }
    let pass = bad == 0;
    ok &= pass;
    println!(
        "greedy decode: {} tokens in {gpu_s:.2}s, {agree} the CPU's argmax, {close} within the \
         tolerance of a tie, {bad} wrong: {}",
        stats.tokens.len(),
        if pass { "PASS" } else { "FAIL" }
    );

    // 3. Continuous batching: four prompts together, each as alone.
    let reqs: Vec<GenerateRequest> = (0..4)
        .map(|i| greedy(prompt(8 + 11 * i, vocab, args.seed + 1 + i as u64), 24))
        .collect();
    let (together, _) = run_batch(&gpu, &reqs)?;
    let mut same = 0;
    for (r, t) in reqs.iter().zip(&together) {
        let alone = generate(&gpu, r, &mut |_| {})?;
        same += (alone.tokens == *t) as usize;
    }
    let pass = same == reqs.len();
    ok &= pass;
    println!(
        "continuous batching: {same} of {} sequences decoded together equal their decode alone: {}",
        reqs.len(),
        if pass { "PASS" } else { "FAIL" }
    );

    // 4. Speed against the bandwidth floor.
    let bw = args
        .bandwidth_tbs
        .unwrap_or(if name.contains("H200") { 4.8 } else { 3.35 })
        * 1e12;
    let bytes = gpu.step_weight_bytes as f64;
    let floor = bw / bytes;
    let one = generate(&gpu, &greedy(prompt(32, vocab, 99), 128), &mut |_| {})?;
    let eight: Vec<GenerateRequest> = (0..8)
        .map(|i| greedy(prompt(32, vocab, 100 + i), 64))
        .collect();
    let (_, eight_tps) = run_batch(&gpu, &eight)?;
    println!(
        "decode speed: 1 sequence {:.1} tok/s ({:.0}% of the bandwidth floor {floor:.0} tok/s = \
         {:.1} MB a step at {:.2} TB/s); 8 sequences {eight_tps:.1} tok/s",
        one.decode_tok_s(),
        100.0 * one.decode_tok_s() / floor,
        bytes / 1e6,
        bw / 1e12
    );
    println!(
        "{}",
        serde_json::json!({
            "model": cpu.name, "device": name, "prefill_rel_diff": rel,
            "decode_tok_s": one.decode_tok_s(), "decode8_tok_s": eight_tps,
            "floor_tok_s": floor, "pass": ok,
        })
    );
    if !ok {
        bail!("the GPU does not match the CPU's exact path");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins_and_tolerances() {
        assert_eq!(top2(&[0.0, 3.0, 2.5]), (1, 0.5));
        let c: &[f32] = &[1.0, 100.0, 99.99];
        // Within the tolerance of a tie: a swapped argmax is not counted.
        let (_, bad) = compare(&[c], &[&[1.0, 99.99, 100.0]]);
        assert_eq!(bad, 0);
        let (rel, bad) = compare(&[&[1.0, 100.0, 90.0]], &[&[1.0, 90.0, 100.0]]);
        assert_eq!(bad, 1);
        assert!((rel - 0.1).abs() < 1e-6);
        let p = prompt(100, 1000, 3);
        assert!(p.iter().all(|&t| (16..1000).contains(&t)));
        assert_eq!(p, prompt(100, 1000, 3));
    }
}
