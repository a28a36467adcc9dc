//! `tessera bench make-adapters`: seeded random PEFT LoRA folders that fit a base model, for
//! load-testing a server that serves many adapters (`tessera serve --lora NAME=PATH`).
//!
//! Folder `DIR/a{i}` holds `adapter_config.json` (peft_type LORA, `r`, `lora_alpha = 2·r`,
//! the target modules, `use_rslora: false`, `bias: "none"`) and
//! `adapter_model.safetensors` with factors in `--dtype` (bf16 by default, what PEFT
//! training usually saves; f16 or f32; rounded to nearest from f32 draws) under PEFT's names
//! (`base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight` `[r, in]` and
//! `…lora_B.weight` `[out, r]`; `mlp.*` for gate/up/down), shaped from the base model's
//! configuration. Values are small so the adapted model stays sane: `A ~ U(-1,1)/√in`,
//! `B ~ U(-1,1)·0.01`. Adapter `i` draws from its own generator seeded from `--seed` and
//! `i`, so the same arguments always write the same bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use tessera_core::DType;
use tessera_formats::ModelConfig;
use tessera_lora::{Factors, Target};

/// The element type the factors are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FactorDtype {
    F32,
    F16,
    Bf16,
}

impl FactorDtype {
    pub fn dtype(self) -> DType {
        match self {
            FactorDtype::F32 => DType::F32,
            FactorDtype::F16 => DType::F16,
            FactorDtype::Bf16 => DType::BF16,
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            FactorDtype::F32 => Dtype::F32,
            FactorDtype::F16 => Dtype::F16,
            FactorDtype::Bf16 => Dtype::BF16,
        }
    }
}

#[derive(Debug, Clone)]
pub struct MakeAdaptersConfig {
    pub out: PathBuf,
    pub count: usize,
    pub rank: usize,
    pub targets: Vec<Target>,
    pub seed: u64,
    /// The base model (default: `$TESSERA_MODEL` or the default model).
    pub model: Option<PathBuf>,
    /// Element type of the factors in the files.
    pub dtype: FactorDtype,
}

/// Parses `--targets`: `all`, or modules by short (`q`, `k`, `v`, `o`, `gate`, `up`,
/// `down`) or PEFT name (`q_proj`, …). Sorted, each once.
pub fn parse_targets(list: &[String]) -> Result<Vec<Target>> {
    let mut v: Vec<Target> = Vec::new();
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if item == "all" {
            v.extend(Target::ALL);
            continue;
        }
        let t = Target::from_hf(item)
            .or_else(|| Target::from_hf(&format!("{item}_proj")))
            .ok_or_else(|| {
                anyhow!("--targets: unknown module {item:?} (q, k, v, o, gate, up, down or all)")
            })?;
        v.push(t);
    }
    v.sort();
    v.dedup();
    if v.is_empty() {
        bail!("--targets needs at least one module");
    }
    Ok(v)
}

/// PEFT's module path of `target` in layer `layer` (without `.lora_A.weight`).
pub fn module_name(layer: usize, target: Target) -> String {
    let part = match target {
        Target::Q | Target::K | Target::V | Target::O => "self_attn",
        Target::Gate | Target::Up | Target::Down => "mlp",
    };
    format!(
        "base_model.model.model.layers.{layer}.{part}.{}",
        target.hf_name()
    )
}

/// One tensor: name, shape, row-major values.
pub type Tensor = (String, Vec<usize>, Vec<f32>);

/// The generator of adapter `index`.
fn adapter_rng(seed: u64, index: usize) -> StdRng {
    StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The factors of one random adapter: per layer and target, `lora_A` `[rank, in]` then
/// `lora_B` `[out, rank]`.
pub fn adapter_tensors(
    cfg: &ModelConfig,
    rank: usize,
    targets: &[Target],
    seed: u64,
    index: usize,
) -> Vec<Tensor> {
    let mut rng = adapter_rng(seed, index);
    let mut out = Vec::with_capacity(cfg.n_layers * targets.len() * 2);
    for layer in 0..cfg.n_layers {
        for &t in targets {
            let (inp, outp) = t.shape(cfg);
            let name = module_name(layer, t);
            let sa = 1.0 / (inp as f32).sqrt();
            let a: Vec<f32> = (0..rank * inp)
                .map(|_| rng.gen_range(-1.0f32..1.0) * sa)
                .collect();
            let b: Vec<f32> = (0..outp * rank)
                .map(|_| rng.gen_range(-1.0f32..1.0) * 0.01)
                .collect();
            out.push((format!("{name}.lora_A.weight"), vec![rank, inp], a));
            out.push((format!("{name}.lora_B.weight"), vec![outp, rank], b));
        }
    }
    out
}

/// `adapter_config.json` of a rank-`rank` adapter of `targets` (`lora_alpha = 2·rank`).
pub fn adapter_config(rank: usize, targets: &[Target], base_name: &str) -> Value {
    let modules: Vec<&str> = targets.iter().map(|t| t.hf_name()).collect();
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": modules,
        "use_rslora": false,
        "use_dora": false,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "rank_pattern": {},
        "alpha_pattern": {},
        "modules_to_save": null,
        "layers_to_transform": null,
    })
}

/// Little-endian bytes of f32 values rounded to nearest in `dtype`.
fn le_bytes(v: &[f32], dtype: FactorDtype) -> Vec<u8> {
    Factors::from_f32(v, dtype.dtype())
        .expect("a float type")
        .to_le_bytes()
}

/// Writes one adapter folder, factors in `dtype`; returns its size in bytes.
pub fn write_adapter(
    dir: &Path,
    config: &Value,
    tensors: &[Tensor],
    dtype: FactorDtype,
) -> Result<u64> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cfg_path = dir.join("adapter_config.json");
    let text = serde_json::to_string_pretty(config)? + "\n";
    std::fs::write(&cfg_path, &text).with_context(|| format!("writing {}", cfg_path.display()))?;
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| le_bytes(&t.2, dtype)).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            TensorView::new(dtype.safetensors(), shape.clone(), b)
                .map(|v| (name.clone(), v))
                .map_err(|e| anyhow!("tensor {name}: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let st_path = dir.join("adapter_model.safetensors");
    safetensors::tensor::serialize_to_file(views, Some(meta), &st_path)
        .map_err(|e| anyhow!("writing {}: {e}", st_path.display()))?;
    let st_len = std::fs::metadata(&st_path)
        .with_context(|| format!("reading {}", st_path.display()))?
        .len();
    Ok(st_len + text.len() as u64)
}

/// `1.8 MiB`, `512 KiB`, `300 B`.
pub fn human_bytes(n: u64) -> String {
    let x = n as f64;
    if x >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", x / (1u64 << 30) as f64)
    } else if x >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", x / (1u64 << 20) as f64)
    } else if x >= 1024.0 {
        format!("{:.0} KiB", x / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// The folder of adapter `i`.
pub fn adapter_dir(out: &Path, i: usize) -> PathBuf {
    out.join(format!("a{i}"))
}

/// `--lora a0=DIR/a0 --lora a1=DIR/a1 …` for `tessera serve`.
pub fn lora_flags(out: &Path, count: usize) -> String {
    (0..count)
        .map(|i| format!("--lora a{i}={}", adapter_dir(out, i).display()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes `count` adapters for the configuration `base` (named `base_name`).
pub fn make_adapters(
    cfg: &MakeAdaptersConfig,
    base: &ModelConfig,
    base_name: &str,
) -> Result<Vec<(PathBuf, u64)>> {
    if cfg.count == 0 {
        bail!("--count must be positive");
    }
    if cfg.rank == 0 {
        bail!("--rank must be positive");
    }
    let config = adapter_config(cfg.rank, &cfg.targets, base_name);
    (0..cfg.count)
        .map(|i| {
            let dir = adapter_dir(&cfg.out, i);
            let tensors = adapter_tensors(base, cfg.rank, &cfg.targets, cfg.seed, i);
            let size = write_adapter(&dir, &config, &tensors, cfg.dtype)?;
            Ok((dir, size))
        })
        .collect()
}

/// `tessera bench make-adapters`: reads the base model's configuration, writes the
/// folders, prints each with its size and then the `--lora` flags (last line).
pub fn run_make_adapters(cfg: &MakeAdaptersConfig) -> Result<()> {
    let path = tessera_engine::store::resolve_model(cfg.model.as_deref())?;
    let files = tessera_formats::load_model(&path)
        .with_context(|| format!("reading the base model {}", path.display()))?;
    let modules: Vec<&str> = cfg.targets.iter().map(|t| t.hf_name()).collect();
    eprintln!(
        "{} rank-{} {:?} adapters of {} for {} ({}, {} layers)",
        cfg.count,
        cfg.rank,
        cfg.dtype.dtype(),
        modules.join(","),
        files.name,
        path.display(),
        files.config.n_layers
    );
    let written = make_adapters(cfg, &files.config, &files.name)?;
    let mut total = 0;
    for (dir, size) in &written {
        println!("{}  {}", dir.display(), human_bytes(*size));
        total += size;
    }
    eprintln!("total {}", human_bytes(total));
    println!("{}", lora_flags(&cfg.out, cfg.count));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_formats::{Arch, RopeScaling, RopeStyle};

    /// SmolLM2-135M's shapes with 2 layers.
    fn smol(layers: usize) -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            n_layers: layers,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            rms_eps: 1e-5,
            rope_theta: 100000.0,
            rope_dim: 64,
            rope_style: RopeStyle::Neox,
            rope_scaling: RopeScaling::None,
            max_position: 8192,
            tie_embeddings: true,
            block: Default::default(),
        }
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            parse_targets(&strs(&["v", "q"])).unwrap(),
            [Target::Q, Target::V]
        );
        assert_eq!(parse_targets(&strs(&["all"])).unwrap(), Target::ALL);
        assert_eq!(
            parse_targets(&strs(&["gate_proj", "down", "q", "q"])).unwrap(),
            [Target::Q, Target::Gate, Target::Down]
        );
        assert!(parse_targets(&strs(&["lm_head"])).is_err());
        assert!(parse_targets(&strs(&[""])).is_err());
    }

    #[test]
    fn tensors_have_peft_names_shapes_and_small_seeded_values() {
        let cfg = smol(2);
        let t = adapter_tensors(&cfg, 8, &[Target::Q, Target::V, Target::Down], 7, 0);
        assert_eq!(t.len(), 2 * 3 * 2);
        let get = |n: &str| t.iter().find(|x| x.0 == n).unwrap();
        let a = get("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
        assert_eq!(a.1, [8, 576]);
        let b = get("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
        assert_eq!(b.1, [192, 8]);
        let d = get("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
        assert_eq!(d.1, [8, 1536]);
        for (name, shape, v) in &t {
            assert_eq!(v.len(), shape.iter().product::<usize>());
            let bound = if name.contains("lora_A") {
                1.0 / (shape[1] as f32).sqrt()
            } else {
                0.01
            };
            assert!(v.iter().all(|x| x.abs() <= bound), "{name}");
            assert!(v.iter().any(|x| *x != 0.0));
        }
        // Same seed and index: same values; another index or seed: different ones.
        assert_eq!(
            t,
            adapter_tensors(&cfg, 8, &[Target::Q, Target::V, Target::Down], 7, 0)
        );
        assert_ne!(
            t[0].2,
            adapter_tensors(&cfg, 8, &[Target::Q, Target::V, Target::Down], 7, 1)[0].2
        );
        assert_ne!(
            t[0].2,
            adapter_tensors(&cfg, 8, &[Target::Q, Target::V, Target::Down], 8, 0)[0].2
        );
    }

    #[test]
    fn folders_load_as_peft_adapters_of_the_base() {
        let dir =
            std::env::temp_dir().join(format!("tessera-make-adapters-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let base = smol(3);
        let mut f32_bytes = 0;
        for (targets, rank, dtype) in [
            (vec![Target::Q, Target::V], 8, FactorDtype::F32),
            (vec![Target::Q, Target::V], 8, FactorDtype::F16),
            (vec![Target::Q, Target::V], 8, FactorDtype::Bf16),
            (Target::ALL.to_vec(), 4, FactorDtype::Bf16),
        ] {
            let cfg = MakeAdaptersConfig {
                out: dir.clone(),
                count: 2,
                rank,
                targets: targets.clone(),
                seed: 1,
                model: None,
                dtype,
            };
            let written = make_adapters(&cfg, &base, "smol").unwrap();
            assert_eq!(written.len(), 2);
            assert_eq!(written[1].0, dir.join("a1"));
            for (path, size) in &written {
                let on_disk = std::fs::metadata(path.join("adapter_model.safetensors"))
                    .unwrap()
                    .len()
                    + std::fs::metadata(path.join("adapter_config.json"))
                        .unwrap()
                        .len();
                assert_eq!(*size, on_disk);
                let a = tessera_lora::LoraAdapter::load(path, &base).unwrap();
                assert_eq!(a.targets(), targets);
                assert_eq!(a.max_rank(), rank);
                let m = a.module(2, targets[0]).unwrap();
                assert_eq!(m.rank, rank);
                assert_eq!(m.scale, 2.0);
                // Held as written, the drawn values rounded to nearest.
                assert_eq!((m.a.dtype(), m.b_t.dtype()), (dtype.dtype(), dtype.dtype()));
                let drawn = adapter_tensors(&base, rank, &targets, 1, 0);
                let a0 = tessera_lora::LoraAdapter::load(&written[0].0, &base).unwrap();
                let want = Factors::from_f32(&drawn[2 * targets.len()].2, dtype.dtype()).unwrap();
                assert_eq!(a0.module(1, targets[0]).unwrap().a, want);
                match (dtype, rank) {
                    (FactorDtype::F32, 8) => f32_bytes = a.bytes(),
                    (_, 8) => assert_eq!(2 * a.bytes(), f32_bytes),
                    _ => {}
                }
                let v: Value = serde_json::from_str(
                    &std::fs::read_to_string(path.join("adapter_config.json")).unwrap(),
                )
                .unwrap();
                assert_eq!(v["peft_type"], "LORA");
                assert_eq!(v["lora_alpha"], 2 * rank);
                assert_eq!(v["use_rslora"], false);
                assert_eq!(v["bias"], "none");
            }
            // A base with other shapes refuses them.
            let mut other = base.clone();
            other.hidden_size = 512;
            assert!(tessera_lora::LoraAdapter::load(&written[0].0, &other).is_err());
        }
        assert_eq!(
            lora_flags(Path::new("/t"), 2),
            "--lora a0=/t/a0 --lora a1=/t/a1"
        );
        assert_eq!(human_bytes(300), "300 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        let _ = std::fs::remove_dir_all(&dir);
        let bad = MakeAdaptersConfig {
            out: dir.clone(),
            count: 0,
            rank: 8,
            targets: vec![Target::Q],
            seed: 1,
            model: None,
            dtype: FactorDtype::Bf16,
        };
        assert!(make_adapters(&bad, &base, "smol").is_err());
    }
}
