//! The GPU forward against the CPU's exact path on small synthetic Llamas, one per weight
//! format the kernels read: logits within 1e-3 of the largest |logit|, through a batch of a
//! prefill and decode steps over the paged cache. Skipped, with a message, where no CUDA
//! driver can be loaded (CI, and every machine without an NVIDIA GPU).
//!
//! Not yet run on a device: written against the CPU path, compiled here, first to be run by
//! `cargo test --release -p tessera-cuda --test gpu` on a GPU machine with a Rust toolchain
//! (the device machines have none; `tessera cuda-check` covers the same ground there).

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_core::DType;
use tessera_engine::Engine;
use tessera_formats::gguf::synthetic::{synthetic_gguf, Shape};
use tessera_formats::gguf::MetaValue;
use tessera_kernels::plan::Precision;

/// A byte-level BPE vocabulary of the 256 byte symbols (GPT-2's table) and no merges.
fn tokenizer() -> BTreeMap<String, MetaValue> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
    pairs.sort();
    let mut tokens = vec![MetaValue::String("<|endoftext|>".into())];
    tokens.extend(
        pairs
            .iter()
            .map(|&(_, c)| MetaValue::String(char::from_u32(c).unwrap().to_string())),
    );
    let mut types = vec![MetaValue::I32(3)];
    types.extend((0..256).map(|_| MetaValue::I32(1)));
    let mut m = BTreeMap::new();
    m.insert(
        "tokenizer.ggml.model".into(),
        MetaValue::String("gpt2".into()),
    );
    m.insert(
        "tokenizer.ggml.pre".into(),
        MetaValue::String("gpt2".into()),
    );
    m.insert("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens));
    m.insert("tokenizer.ggml.token_type".into(), MetaValue::Array(types));
    m.insert("tokenizer.ggml.merges".into(), MetaValue::Array(vec![]));
    m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(0));
    m
}

const SHAPE: Shape = Shape {
    name: "tiny",
    arch: "llama",
    hidden: 256,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    ff: 512,
    ctx: 256,
    rope_theta: 10000.0,
};

#[test]
fn every_format_matches_the_cpu_exact_path() {
    let present = tessera_cuda::driver_present();
    let dir = std::env::temp_dir().join(format!("tessera-cuda-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in tessera_cuda::formats::FORMATS {
        for shape in [
            SHAPE,
            Shape {
                arch: "qwen2",
                ..SHAPE
            },
        ] {
            let path = dir.join(format!("{}-{}.gguf", shape.arch, f.dtype));
            let bytes = synthetic_gguf(&shape, f.dtype, 3, &tokenizer()).unwrap();
            std::fs::write(&path, bytes).unwrap();
            let load = || tessera_formats::load_model(&path).unwrap();
            let planner = tessera_engine::tuning::load_planner;
            let cpu = Engine::from_files(load(), 2, Precision::Exact, planner()).unwrap();
            let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 250 + 1) as u32).collect();
            let c = cpu.logits_all(&tokens, None).unwrap();
            if !present {
                // The model and the CPU reference work here; the GPU half needs a driver.
                continue;
            }
            let mut gpu = Engine::from_files(load(), 2, Precision::Exact, planner()).unwrap();
            let dev = tessera_cuda::CudaDevice::new(&load()).unwrap();
            gpu.set_device(Arc::new(dev)).unwrap();
            let g = gpu.logits_all(&tokens, None).unwrap();
            let max = c.data.iter().fold(0f32, |a, v| a.max(v.abs()));
            let diff = c
                .data
                .iter()
                .zip(&g.data)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(
                diff <= 1e-3 * max,
                "{} {}: max |diff| {diff} of max |logit| {max}",
                shape.arch,
                f.dtype
            );
            assert_eq!(f.dtype, DType::parse(&f.dtype.to_string()).unwrap());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if !present {
        eprintln!("skipped the GPU half: no CUDA driver (libcuda.so.1) on this machine");
    }
}
