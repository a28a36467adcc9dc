//! Each family's own keys read into the config, from transformers 5's and older
//! `config.json` layouts and from GGUF metadata, and bad values refused by name.

use serde_json::json;

use super::*;
use crate::config::{Activation, BlockSpec, RopeScaling};

/// A Llama-shaped config the families then adjust.
fn base(n_layers: usize) -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 100,
        hidden_size: 64,
        intermediate_size: 128,
        n_layers,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 32,
        rms_eps: 1e-6,
        rope_theta: 1e6,
        rope_dim: 32,
        rope_style: RopeStyle::Neox,
        rope_scaling: RopeScaling::None,
        max_position: 4096,
        tie_embeddings: true,
        block: BlockSpec::default(),
    }
}

fn hf(family: &str, v: serde_json::Value, n_layers: usize) -> Result<ModelConfig> {
    let fam = by_hf_type(family).unwrap();
    let mut c = base(n_layers);
    (fam.hf)(&HfMeta { json: &v }, &mut c)?;
    c.validate()?;
    Ok(c)
}

#[test]
fn gemma3_from_transformers_5_config() {
    let v = json!({
        "query_pre_attn_scalar": 256, "sliding_window": 512,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "hidden_activation": "gelu_pytorch_tanh"});
    let c = hf("gemma3_text", v, 3).unwrap();
    assert_eq!(c.block.windows, [Some(512), Some(512), None]);
    assert_eq!(c.block.activation, Activation::GeluTanh);
    assert!(c.block.qk_norm && c.block.post_norms);
    assert_eq!(c.block.embed_scale, 8.0);
    assert_eq!(c.block.attn_scale, Some(1.0 / 16.0));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(c.block.local_rope, Some((10000.0, RopeScaling::None)));
}

#[test]
fn gemma3_from_older_config() {
    // rope_theta + rope_scaling + rope_local_base_freq, a pattern instead of layer_types.
    let v = json!({"query_pre_attn_scalar": 168, "sliding_window": 1024,
        "sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}});
    let c = hf("gemma3_text", v, 12).unwrap();
    let globals: Vec<usize> = (0..12).filter(|&i| c.window(i).is_none()).collect();
    assert_eq!(globals, [5, 11]);
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(c.block.local_rope, Some((10000.0, RopeScaling::None)));
}

#[test]
fn gemma2_soft_caps_and_alternating_windows() {
    let v = json!({"query_pre_attn_scalar": 256, "sliding_window": 4096,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0});
    let c = hf("gemma2", v, 4).unwrap();
    assert_eq!(c.block.windows, [Some(4096), None, Some(4096), None]);
    assert_eq!(
        (c.block.attn_softcap, c.block.final_softcap),
        (Some(50.0), Some(30.0))
    );
    assert!(!c.block.qk_norm);
}

#[test]
fn phi3_longrope_gets_its_original_context_and_attention_factor() {
    let v = json!({"original_max_position_embeddings": 4096, "sliding_window": 262144});
    let fam = by_hf_type("phi3").unwrap();
    let mut c = base(2);
    c.max_position = 131072;
    c.rope_scaling = rope_scaling(Some(&json!({"type": "longrope",
        "short_factor": vec![1.0; 16], "long_factor": vec![2.0; 16]})))
    .unwrap();
    (fam.hf)(&HfMeta { json: &v }, &mut c).unwrap();
    c.validate().unwrap();
    let RopeScaling::LongRope {
        original_max_position,
        attn_factor,
        ..
    } = c.rope_scaling
    else {
        panic!("not LongRoPE");
    };
    assert_eq!(original_max_position, 4096);
    let want = (1.0 + (32.0f64).ln() / (4096.0f64).ln()).sqrt() as f32;
    assert!((attn_factor - want).abs() < 1e-6, "{attn_factor} vs {want}");
    assert_eq!(c.block.windows, vec![Some(262144); 2]);
}

#[test]
fn mistral_window_and_qwen_window_switch() {
    let c = hf("mistral", json!({"sliding_window": 4096}), 3).unwrap();
    assert_eq!(c.block.windows, vec![Some(4096); 3]);
    let c = hf("mistral", json!({"sliding_window": null}), 3).unwrap();
    assert!(c.block.windows.is_empty());
    // Qwen2's window is off unless use_sliding_window, then from max_window_layers on.
    let c = hf(
        "qwen2",
        json!({"sliding_window": 4096, "use_sliding_window": false}),
        3,
    )
    .unwrap();
    assert!(c.block.windows.is_empty());
    let v = json!({"sliding_window": 64, "use_sliding_window": true, "max_window_layers": 2});
    assert_eq!(
        hf("qwen2", v, 3).unwrap().block.windows,
        [None, None, Some(64)]
    );
    assert!(hf("qwen3", json!({}), 2).unwrap().block.qk_norm);
}

#[test]
fn bad_family_values_are_refused_by_name() {
    let err = |fam: &str, v: serde_json::Value, n: usize| hf(fam, v, n).unwrap_err().to_string();
    let e = err(
        "gemma3_text",
        json!({"sliding_window": 8, "layer_types": ["full_attention"]}),
        3,
    );
    assert!(e.contains("layer_types lists 1 layers"), "{e}");
    let e = err(
        "gemma3_text",
        json!({"sliding_window": 8, "layer_types": ["chunked", "a", "b"]}),
        3,
    );
    assert!(e.contains("unsupported layer type"), "{e}");
    let e = err("gemma2", json!({"hidden_activation": "relu"}), 2);
    assert!(e.contains("relu"), "{e}");
    let e = err("gemma2", json!({"sliding_window": 0}), 2);
    assert!(e.contains("window of 0"), "{e}");
    let e = err("gemma2", json!({"attn_logit_softcapping": -1.0}), 2);
    assert!(e.contains("soft-cap"), "{e}");
    let e = rope_scaling(Some(&json!({"type": "longrope", "short_factor": [1.0]}))).unwrap_err();
    assert!(e.to_string().contains("long_factor"), "{e}");
}

#[test]
fn fused_tensors_split_into_their_parts() {
    let c = base(1);
    let (q, kv, ff, h) = (c.q_dim(), c.kv_dim(), c.intermediate_size, c.hidden_size);
    let rows =
        |n: usize, tag: f32| -> Vec<f32> { (0..n * h).map(|i| tag + (i / h) as f32).collect() };
    let mut t = HashMap::new();
    let qkv = WeightTensor::from_f32(
        "blk.0.attn_qkv.weight",
        vec![q + 2 * kv, h],
        &rows(q + 2 * kv, 0.0),
    );
    t.insert(qkv.name.clone(), qkv);
    let up = WeightTensor::from_f32(
        "blk.0.ffn_up.weight",
        vec![2 * ff, h],
        &rows(2 * ff, 1000.0),
    );
    t.insert(up.name.clone(), up);
    split_fused(&mut t, &c).unwrap();
    let first = |n: &str| t[n].to_f32_vec()[0];
    assert_eq!(t["blk.0.attn_k.weight"].shape, [kv, h]);
    assert_eq!(first("blk.0.attn_k.weight"), q as f32);
    assert_eq!(first("blk.0.attn_v.weight"), (q + kv) as f32);
    assert_eq!(first("blk.0.ffn_gate.weight"), 1000.0);
    assert_eq!(first("blk.0.ffn_up.weight"), 1000.0 + ff as f32);
    assert!(!t.contains_key("blk.0.attn_qkv.weight"));
    // A fused tensor of the wrong height is an error naming it.
    let mut bad = HashMap::new();
    let w = WeightTensor::from_f32("blk.0.attn_qkv.weight", vec![3, h], &rows(3, 0.0));
    bad.insert(w.name.clone(), w);
    assert!(split_fused(&mut bad, &c)
        .unwrap_err()
        .to_string()
        .contains("attn_qkv"));
}
