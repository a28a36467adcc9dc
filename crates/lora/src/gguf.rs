//! llama.cpp GGUF LoRA files (`general.type = adapter`, `adapter.type = lora`): tensors
//! `blk.{i}.{attn_q,...,ffn_down}.weight.lora_a` (ggml `[in, r]`, i.e. `A` as `[r, in]`) and
//! `.lora_b` (ggml `[r, out]`, `B` as `[out, r]`), with q/k rows of `B` already permuted as
//! the base's are. Scale `adapter.lora.alpha / r`, or 1 when alpha is absent or 0, as
//! llama.cpp applies it. F32, F16 and BF16 factors are held as stored; block-quantized ones
//! (convert_lora_to_gguf's q8_0) are dequantized to f32.

use std::collections::HashMap;
use std::path::Path;

use tessera_core::untrusted::quote;
use tessera_core::{DType, Error, Result, WeightTensor};
use tessera_formats::gguf::{GgufFile, MetaValue};
use tessera_formats::{Arch, ModelConfig};

use crate::{AdapterFormat, Factors, LoraAdapter, LoraModule, Target};

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::Config(format!("adapter {}: {}", path.display(), msg.into()))
}

/// A tensor's values: as stored for F32, F16 and BF16, dequantized to f32 for the
/// block-quantized types.
fn factors(t: &WeightTensor) -> Factors {
    match t.dtype {
        DType::F32 | DType::F16 | DType::BF16 => Factors::from_le_bytes(t.data(), t.dtype),
        _ => None,
    }
    .unwrap_or_else(|| Factors::F32(t.to_f32_vec()))
}

pub fn load(path: &Path, base: &ModelConfig) -> Result<LoraAdapter> {
    let f = GgufFile::open(path)?;
    let meta = |k: &str| f.get(k).and_then(MetaValue::as_str);
    if meta("general.type") != Some("adapter") || meta("adapter.type") != Some("lora") {
        return Err(bad(
            path,
            format!(
                "not a GGUF LoRA adapter (general.type {}, adapter.type {})",
                meta("general.type").map_or("none".into(), quote),
                meta("adapter.type").map_or("none".into(), quote)
            ),
        ));
    }
    let arch = meta("general.architecture").unwrap_or("");
    // Llama and Mistral files name each other's architecture.
    let fits = match base.arch {
        Arch::Llama | Arch::Mistral => matches!(arch, "llama" | "mistral"),
        a => tessera_formats::family::of(a).gguf_archs.contains(&arch),
    };
    if !fits {
        return Err(bad(
            path,
            format!(
                "made for architecture {}, the base model is {:?}",
                quote(arch),
                base.arch
            ),
        ));
    }
    let alpha = f
        .get("adapter.lora.alpha")
        .and_then(MetaValue::as_f64)
        .unwrap_or(0.0);
    let mut pairs: HashMap<(usize, Target), [Option<WeightTensor>; 2]> = HashMap::new();
    for info in &f.tensors {
        let parsed = info.name.strip_prefix("blk.").and_then(|rest| {
            let (layer, rest) = rest.split_once('.')?;
            let (stem, ab) = rest.split_once(".weight.lora_")?;
            let is_b = match ab {
                "a" => false,
                "b" => true,
                _ => return None,
            };
            Some((layer.parse::<usize>().ok()?, Target::from_gguf(stem)?, is_b))
        });
        let Some((layer, target, is_b)) = parsed else {
            return Err(bad(
                path,
                format!(
                    "tensor {} is not a LoRA factor of a projection",
                    quote(&info.name)
                ),
            ));
        };
        pairs.entry((layer, target)).or_default()[is_b as usize] = Some(f.tensor(info)?);
    }
    let mut modules = Vec::with_capacity(pairs.len());
    for ((layer, target), [a, b]) in pairs {
        let name = format!("blk.{layer}.{}", target.gguf_name());
        let (Some(a), Some(b)) = (a, b) else {
            return Err(bad(
                path,
                format!("{name} has only one of lora_a and lora_b"),
            ));
        };
        let (inp, out) = target.shape(base);
        let rank = a.shape.first().copied().unwrap_or(0);
        if a.shape != [rank, inp] || b.shape != [out, rank] {
            return Err(bad(
                path,
                format!(
                    "{name}: lora_a {:?} and lora_b {:?} (outermost first) do not fit the base \
                     projection {inp} -> {out}",
                    a.shape, b.shape
                ),
            ));
        }
        let scale = if alpha == 0.0 {
            1.0
        } else {
            (alpha / rank as f64) as f32
        };
        modules.push((
            layer,
            target,
            LoraModule {
                rank,
                scale,
                a: factors(&a),
                b_t: factors(&b).transposed(out, rank),
            },
        ));
    }
    modules.sort_by_key(|m| (m.0, m.1));
    LoraAdapter::from_modules(path, AdapterFormat::Gguf, base, modules)
}
