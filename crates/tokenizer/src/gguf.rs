//! GGUF vocabularies as `tokenizer.json` documents.
//!
//! - `gpt2` (byte-level BPE): vocab and merges as stored; the pre-tokenizer is chosen by
//!   `tokenizer.ggml.pre`, matching the regexes llama.cpp uses for each. For `smollm` that
//!   means splitting digits one by one *before* the byte-level regex, as SmolLM2's original
//!   tokenizer does (transformers' GGUF conversion drops that split).
//! - `llama` (SentencePiece BPE): merges are rebuilt from the scores (a merge's rank is its
//!   result's score, as transformers' `SentencePieceExtractor` does), with byte fallback and
//!   `▁` for spaces.
//!
//! Tokens of type CONTROL (3) and USER_DEFINED (4) become added tokens, matched verbatim in
//! text; control tokens are special.

use std::collections::HashMap;

use serde_json::{json, Value};
use tessera_core::untrusted::quote;
use tessera_core::{Error, Result};
use tessera_formats::TokenizerSource;

const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

/// The pre-tokenizer for a GGUF `tokenizer.ggml.pre` value, and whether merges are skipped
/// for whole-vocabulary words (`ignore_merges`, as Llama 3's tokenizer.json sets).
fn pre_tokenizer(pre: &str) -> (Value, bool) {
    match pre {
        "smollm" => (
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            false,
        ),
        "llama-bpe" | "llama3" | "smaug-bpe" => (
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
            true,
        ),
        "qwen2" | "deepseek-r1-qwen" => (
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
            false,
        ),
        "default" | "gpt2" | "gpt-2" => (byte_level(true), false),
        other => {
            tracing::warn!("unknown GGUF pre-tokenizer {}; using GPT-2's", quote(other));
            (
                json!({"type": "Sequence", "pretokenizers": [split(GPT2_REGEX), byte_level(false)]}),
                false,
            )
        }
    }
}

fn added_tokens(tokens: &[String], types: &[i32]) -> Vec<Value> {
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, &t))| t == TYPE_CONTROL || t == TYPE_USER_DEFINED)
        .map(|(id, (content, &t))| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": t == TYPE_CONTROL})
        })
        .collect()
}

fn vocab_map(tokens: &[String]) -> serde_json::Map<String, Value> {
    let mut vocab = serde_json::Map::new();
    for (id, t) in tokens.iter().enumerate() {
        // Keep the first id of a duplicated string; later duplicates stay reachable as ids.
        vocab.entry(t.clone()).or_insert(json!(id));
    }
    vocab
}

/// The `tokenizer.json` document equivalent to a GGUF vocabulary.
pub fn tokenizer_json(source: &TokenizerSource) -> Result<Value> {
    match source {
        TokenizerSource::GgufBpe {
            tokens,
            token_types,
            merges,
            pre,
        } => {
            let (pre_tok, ignore_merges) = pre_tokenizer(pre);
            for m in merges {
                if m.split(' ').count() != 2 {
                    return Err(Error::Tokenizer(format!(
                        "malformed merge {} (expected \"left right\")",
                        quote(m)
                    )));
                }
            }
            Ok(json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added_tokens(tokens, token_types),
                "normalizer": null,
                "pre_tokenizer": pre_tok,
                "post_processor": null,
                "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                          "ignore_merges": ignore_merges, "vocab": vocab_map(tokens), "merges": merges}
            }))
        }
        TokenizerSource::GgufSpm {
            tokens,
            token_types,
            scores,
            add_space_prefix,
        } => {
            let unk = token_types
                .iter()
                .position(|&t| t == TYPE_UNKNOWN)
                .map(|i| tokens[i].clone());
            let mut normalizers = vec![];
            if *add_space_prefix {
                normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
            }
            normalizers
                .push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
            Ok(json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added_tokens(tokens, token_types),
                "normalizer": {"type": "Sequence", "normalizers": normalizers},
                "pre_tokenizer": null,
                "post_processor": null,
                "decoder": {"type": "Sequence", "decoders": [
                    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                    {"type": "ByteFallback"}, {"type": "Fuse"},
                    {"type": "Strip", "content": " ", "start": if *add_space_prefix { 1 } else { 0 }, "stop": 0}]},
                "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                          "ignore_merges": false, "vocab": vocab_map(tokens),
                          "merges": spm_merges(tokens, token_types, scores)}
            }))
        }
        TokenizerSource::HfJson(s) => {
            serde_json::from_str(s).map_err(|e| Error::Tokenizer(format!("tokenizer.json: {e}")))
        }
    }
}

/// BPE merges implied by a SentencePiece vocabulary: every split of a normal token into two
/// vocabulary pieces, ranked by the merged token's score (higher first), then by the pieces'
/// ids, as transformers' `SentencePieceExtractor` orders them.
fn spm_merges(tokens: &[String], types: &[i32], scores: &[f32]) -> Vec<String> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f32, usize, usize, String)> = vec![];
    for (id, piece) in tokens.iter().enumerate() {
        if types[id] != 1 {
            continue;
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[id], li, ri, format!("{l} {r}")));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges.into_iter().map(|m| m.3).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Tokenizer;
    use tessera_formats::TokenizerSpec;

    fn spec(source: TokenizerSource, add_bos: bool) -> TokenizerSpec {
        TokenizerSpec {
            source,
            bos_id: Some(1),
            eos_ids: vec![2],
            add_bos,
            chat_template: None,
        }
    }

    /// A byte-level vocabulary: all 256 byte symbols plus a few merges.
    pub(crate) fn tiny_bpe(pre: &str) -> Tokenizer {
        tiny_bpe_with(pre, None)
    }

    /// [`tiny_bpe`] with a chat template.
    pub(crate) fn tiny_bpe_with(pre: &str, chat_template: Option<&str>) -> Tokenizer {
        let mut tokens: Vec<String> = vec![
            "<|endoftext|>".into(),
            "<|im_start|>".into(),
            "<|im_end|>".into(),
        ];
        // GPT-2 byte-to-unicode table.
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
        tokens.extend(
            pairs
                .iter()
                .map(|&(_, c)| char::from_u32(c).unwrap().to_string()),
        );
        tokens.extend(["he", "ll", "hell", "hello", "Ġw", "12"].map(String::from));
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "1 2"]
            .map(String::from)
            .to_vec();
        let mut types = vec![1; tokens.len()];
        types[..3].fill(TYPE_CONTROL);
        let mut spec = spec(
            TokenizerSource::GgufBpe {
                tokens,
                token_types: types,
                merges,
                pre: pre.into(),
            },
            false,
        );
        spec.chat_template = chat_template.map(String::from);
        Tokenizer::from_spec(&spec).unwrap()
    }

    #[test]
    fn bpe_merges_and_special_tokens_in_text() {
        let t = tiny_bpe("gpt2");
        let ids = t.encode("<|im_start|>hello w<|im_end|>").unwrap();
        let text: Vec<String> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
        assert_eq!(text, ["<|im_start|>", "hello", "Ġw", "<|im_end|>"]);
        assert_eq!(t.decode(&ids).unwrap(), "<|im_start|>hello w<|im_end|>");
    }

    #[test]
    fn smollm_splits_digits_before_merging() {
        let gpt2 = tiny_bpe("gpt2");
        let smol = tiny_bpe("smollm");
        let tok = |t: &Tokenizer, s: &str| -> Vec<String> {
            t.encode(s)
                .unwrap()
                .iter()
                .map(|&i| t.token_text(i).unwrap())
                .collect()
        };
        assert_eq!(tok(&gpt2, "12"), ["12"]);
        assert_eq!(tok(&smol, "12"), ["1", "2"]);
    }

    #[test]
    fn spm_vocab_encodes_with_scores_and_byte_fallback() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        tokens.extend(
            [
                "▁", "h", "e", "l", "o", "he", "ll", "▁he", "▁hell", "▁hello", "hel",
            ]
            .map(String::from),
        );
        let mut types = vec![1; tokens.len()];
        types[0] = TYPE_UNKNOWN;
        types[1] = TYPE_CONTROL;
        types[2] = TYPE_CONTROL;
        for t in &mut types[3..259] {
            *t = 6;
        }
        let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
        let t = Tokenizer::from_spec(&spec(
            TokenizerSource::GgufSpm {
                tokens,
                token_types: types,
                scores,
                add_space_prefix: true,
            },
            true,
        ))
        .unwrap();
        let ids = t.encode("hello").unwrap();
        assert_eq!(ids[0], 1, "BOS first");
        let text: Vec<String> = ids[1..].iter().map(|&i| t.token_text(i).unwrap()).collect();
        assert_eq!(text, ["▁hello"]);
        // 'z' is not in the vocabulary: byte fallback.
        let ids = t.encode("z").unwrap();
        let text: Vec<String> = ids[1..].iter().map(|&i| t.token_text(i).unwrap()).collect();
        assert_eq!(text, ["▁", "<0x7A>"]);
        assert_eq!(t.decode(&ids[1..]).unwrap(), "z");
    }
}
