//! Loading from the layouts people have (a PEFT folder, either of its files, a GGUF LoRA
//! file; pickles refused) and keeping factors in the file's element type.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use tessera_core::DType;
use tessera_formats::gguf::writer::{write, TensorSpec};
use tessera_formats::gguf::MetaValue;
use tessera_formats::{Arch, ModelConfig, RopeScaling, RopeStyle};

use crate::{Factors, LoraAdapter, LoraModule, Target};

/// A tiny Llama: hidden 8, 2 heads of 4 (1 KV head), feed-forward 12, 2 layers.
fn base(rope_style: RopeStyle) -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 32,
        hidden_size: 8,
        intermediate_size: 12,
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope_dim: 4,
        rope_style,
        rope_scaling: RopeScaling::None,
        max_position: 64,
        tie_embeddings: true,
        block: Default::default(),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("tessera-lora-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const RANK: usize = 3;
const TARGETS: [Target; 3] = [Target::Q, Target::K, Target::Down];

/// Seeded values in (-1, 1), not representable in f16 or bf16.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.3 - 1.0)
        .collect()
}

/// `(name, shape [outer first], values)` of PEFT's A and B for every layer and target.
fn peft_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut v = Vec::new();
    for layer in 0..cfg.n_layers {
        for (i, t) in TARGETS.into_iter().enumerate() {
            let (inp, out) = t.shape(cfg);
            let part = if t == Target::Down {
                "mlp"
            } else {
                "self_attn"
            };
            let name = format!(
                "base_model.model.model.layers.{layer}.{part}.{}",
                t.hf_name()
            );
            let seed = 10 * layer + 2 * i;
            v.push((
                format!("{name}.lora_A.weight"),
                vec![RANK, inp],
                values(RANK * inp, seed),
            ));
            v.push((
                format!("{name}.lora_B.weight"),
                vec![out, RANK],
                values(out * RANK, seed + 1),
            ));
        }
    }
    v
}

/// Writes a PEFT folder whose tensors are `tensors` rounded to `dtype`.
fn write_peft(dir: &Path, cfg: &ModelConfig, dtype: DType) {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "peft_type": "LORA", "r": RANK, "lora_alpha": 6,
        "target_modules": TARGETS.map(|t| t.hf_name()),
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let st_dtype = match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        _ => Dtype::BF16,
    };
    let tensors = peft_tensors(cfg);
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| Factors::from_f32(&t.2, dtype).unwrap().to_le_bytes())
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                t.0.clone(),
                TensorView::new(st_dtype, t.1.clone(), b).unwrap(),
            )
        })
        .collect();
    let path = dir.join("adapter_model.safetensors");
    safetensors::tensor::serialize_to_file(views, None::<HashMap<String, String>>, &path).unwrap();
}

/// Every module of `a`, in order.
fn modules(a: &LoraAdapter) -> Vec<&LoraModule> {
    (0..2)
        .flat_map(|l| TARGETS.map(|t| a.module(l, t).unwrap()))
        .collect()
}

/// `m`'s factors rounded to `dtype` (exact when they hold values of `dtype` already).
fn rounded(m: &LoraModule, dtype: DType) -> LoraModule {
    let r = |f: &Factors| Factors::from_f32(&f.to_f32_vec(), dtype).unwrap();
    LoraModule {
        a: r(&m.a),
        b_t: r(&m.b_t),
        ..m.clone()
    }
}

/// F16 and BF16 folders are held in halves (half the bytes), exactly the f32 folder's values
/// rounded, permuted q/k rows included; an f32 folder stays f32.
#[test]
fn peft_halves_are_held_as_stored() {
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let cfg = base(style);
        let tmp = TempDir::new(&format!("halves-{style:?}"));
        let load = |d: DType| {
            let dir = tmp.0.join(format!("{d:?}"));
            write_peft(&dir, &cfg, d);
            LoraAdapter::load(&dir, &cfg).unwrap()
        };
        let f32s = load(DType::F32);
        for m in modules(&f32s) {
            assert_eq!((m.a.dtype(), m.b_t.dtype()), (DType::F32, DType::F32));
        }
        for d in [DType::F16, DType::BF16] {
            let halves = load(d);
            assert_eq!(2 * halves.bytes(), f32s.bytes(), "{d:?}");
            for (h, f) in modules(&halves).into_iter().zip(modules(&f32s)) {
                assert_eq!((h.a.dtype(), h.b_t.dtype()), (d, d));
                assert_eq!(h, &rounded(f, d), "{d:?} {style:?}");
            }
        }
    }
}

/// A folder, its safetensors file and its config file all load the folder.
#[test]
fn a_folder_or_either_of_its_files() {
    let cfg = base(RopeStyle::Neox);
    let tmp = TempDir::new("paths");
    let dir = tmp.0.join("a");
    write_peft(&dir, &cfg, DType::BF16);
    let want = LoraAdapter::load(&dir, &cfg).unwrap();
    for file in ["adapter_model.safetensors", "adapter_config.json"] {
        let got = LoraAdapter::load(&dir.join(file), &cfg).unwrap();
        assert_eq!(modules(&got), modules(&want), "{file}");
        assert_eq!(got.path, dir, "{file}");
    }
    // Another safetensors file is not a PEFT adapter.
    std::fs::copy(
        dir.join("adapter_model.safetensors"),
        tmp.0.join("x.safetensors"),
    )
    .unwrap();
    let e = LoraAdapter::load(&tmp.0.join("x.safetensors"), &cfg)
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
}

/// Pickles are refused with a one-line conversion, whether given as a file or found alone
/// in a folder (with or without its config).
#[test]
fn pickle_files_are_refused_with_a_conversion() {
    let cfg = base(RopeStyle::Neox);
    let tmp = TempDir::new("pickle");
    let check = |p: &Path| {
        let e = LoraAdapter::load(p, &cfg).unwrap_err().to_string();
        for want in [
            "pickle",
            "torch.load(",
            "save_file(",
            "adapter_model.safetensors",
        ] {
            assert!(e.contains(want), "{}: {e}", p.display());
        }
    };
    let only_bin = tmp.0.join("only-bin");
    std::fs::create_dir_all(&only_bin).unwrap();
    std::fs::write(only_bin.join("adapter_model.bin"), b"\x80\x02pickle").unwrap();
    check(&only_bin);
    std::fs::write(only_bin.join("adapter_config.json"), r#"{"r": 3}"#).unwrap();
    check(&only_bin);
    for name in ["adapter_model.bin", "weights.pt", "lora.pth"] {
        let p = tmp.0.join(name);
        std::fs::write(&p, b"\x80\x02pickle").unwrap();
        check(&p);
    }
    // A folder with both loads the safetensors.
    let both = tmp.0.join("both");
    write_peft(&both, &cfg, DType::F16);
    std::fs::write(both.join("adapter_model.bin"), b"\x80\x02pickle").unwrap();
    LoraAdapter::load(&both, &cfg).unwrap();
}

/// Writes a GGUF LoRA file of the PEFT tensors (Neox base: no permutation) in ggml type
/// `ggml_type` (0 F32, 1 F16, 30 BF16).
fn write_gguf(path: &Path, cfg: &ModelConfig, dtype: DType, ggml_type: u32) {
    let names = |peft: &str| {
        let layer: usize = peft.split('.').nth(4).unwrap().parse().unwrap();
        let t = TARGETS
            .into_iter()
            .find(|t| peft.contains(t.hf_name()))
            .unwrap();
        let ab = if peft.contains("lora_A") { "a" } else { "b" };
        format!("blk.{layer}.{}.weight.lora_{ab}", t.gguf_name())
    };
    let tensors = peft_tensors(cfg);
    let data: Vec<(String, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, shape, v)| {
            let dims = shape.iter().rev().map(|&d| d as u64).collect();
            (
                names(n),
                dims,
                Factors::from_f32(v, dtype).unwrap().to_le_bytes(),
            )
        })
        .collect();
    let specs: Vec<TensorSpec> = data
        .iter()
        .map(|(name, dims, bytes)| TensorSpec {
            name,
            dims,
            ggml_type,
            data: bytes,
        })
        .collect();
    let meta = [
        ("general.architecture", MetaValue::String("llama".into())),
        ("general.type", MetaValue::String("adapter".into())),
        ("adapter.type", MetaValue::String("lora".into())),
        ("adapter.lora.alpha", MetaValue::F32(6.0)),
    ];
    std::fs::write(path, write(&meta, &specs)).unwrap();
}

/// GGUF LoRA files in F16 and BF16 are held as stored, the F32 file's values rounded, and
/// equal to the PEFT folder of the same values.
#[test]
fn gguf_halves_are_held_as_stored() {
    let cfg = base(RopeStyle::Neox);
    let tmp = TempDir::new("gguf");
    let load = |d: DType, ty: u32| {
        let p = tmp.0.join(format!("{d:?}.gguf"));
        write_gguf(&p, &cfg, d, ty);
        LoraAdapter::load(&p, &cfg).unwrap()
    };
    let f32s = load(DType::F32, 0);
    for (d, ty) in [(DType::F16, 1), (DType::BF16, 30)] {
        let halves = load(d, ty);
        assert_eq!(2 * halves.bytes(), f32s.bytes());
        let dir = tmp.0.join(format!("peft-{d:?}"));
        write_peft(&dir, &cfg, d);
        let peft = LoraAdapter::load(&dir, &cfg).unwrap();
        for ((h, f), p) in modules(&halves)
            .into_iter()
            .zip(modules(&f32s))
            .zip(modules(&peft))
        {
            assert_eq!((h.a.dtype(), h.b_t.dtype()), (d, d));
            assert_eq!(h, &rounded(f, d));
            assert_eq!(h, p);
        }
    }
}

/// Tensor-parallel slices keep the element type and take the same values as on f32.
#[test]
fn slices_keep_halves() {
    let cfg = base(RopeStyle::Neox);
    let tmp = TempDir::new("slices");
    for d in [DType::F32, DType::F16, DType::BF16] {
        let dir = tmp.0.join(format!("{d:?}"));
        write_peft(&dir, &cfg, d);
        let a = LoraAdapter::load(&dir, &cfg).unwrap();
        let mut half_cfg = cfg.clone();
        half_cfg.intermediate_size = 6;
        let part = a
            .map_modules(&half_cfg, |_, t, m| match t {
                Target::Down => m.slice_in(6..12),
                _ => m.clone(),
            })
            .unwrap();
        assert_eq!(part.id, a.id);
        let (m, p) = (
            a.module(1, Target::Down).unwrap(),
            part.module(1, Target::Down).unwrap(),
        );
        assert_eq!(p.a.dtype(), d);
        let f = m.a.to_f32_vec();
        let want: Vec<f32> = f.chunks(12).flat_map(|r| r[6..].to_vec()).collect();
        assert_eq!(p.a.to_f32_vec(), want);
        assert_eq!(p.b_t, m.b_t);
        let q = a.module(0, Target::Q).unwrap().slice_out(2..6);
        assert_eq!((q.b_t.dtype(), q.b_t.len()), (d, RANK * 4));
    }
}

/// Non-finite halves are refused like non-finite f32 values.
#[test]
fn non_finite_halves_are_refused() {
    let cfg = base(RopeStyle::Neox);
    let (inp, out) = Target::V.shape(&cfg);
    let mut a = vec![0.5f32; RANK * inp];
    a[3] = f32::INFINITY;
    for d in [DType::F16, DType::BF16] {
        let m = LoraModule {
            rank: RANK,
            scale: 1.0,
            a: Factors::from_f32(&a, d).unwrap(),
            b_t: Factors::from_f32(&vec![0.5; RANK * out], d).unwrap(),
        };
        let e = LoraAdapter::from_modules(
            Path::new("x"),
            crate::AdapterFormat::Peft,
            &cfg,
            vec![(0, Target::V, m)],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("non-finite"), "{e}");
    }
}
