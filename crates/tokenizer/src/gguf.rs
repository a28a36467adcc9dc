//! GGUF vocabularies as `tokenizers` tokenizers (and as `tokenizer.json` documents), built as
//! Hugging Face transformers builds them from the same file.
//!
//! - `gpt2` (byte-level BPE): vocab and merges as stored; the pre-tokenizer is chosen by
//!   `tokenizer.ggml.pre`, matching the regexes llama.cpp uses for each. For `smollm` that
//!   means splitting digits one by one *before* the byte-level regex, as SmolLM2's original
//!   tokenizer does (transformers' GGUF conversion drops that split).
//! - `llama` (SentencePiece-style BPE): as transformers builds it from the same file; see
//!   [`crate::spm`].
//!
//! Tokens of type CONTROL (3) and USER_DEFINED (4) become added tokens, matched verbatim in
//! text; control tokens are special.

use serde_json::{json, Value};
use tessera_core::untrusted::quote;
use tessera_core::{Error, Result};
use tessera_formats::TokenizerSource;
use tokenizers::models::bpe::Vocab;

use crate::spm;

pub(crate) const TYPE_UNKNOWN: i32 = 2;
pub(crate) const TYPE_CONTROL: i32 = 3;
pub(crate) const TYPE_USER_DEFINED: i32 = 4;

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

/// A GGUF vocabulary taken apart into what a `tokenizers::Tokenizer` is made of. The big
/// parts (vocabulary, merges) are handed to `tokenizers` directly: going through a JSON
/// document costs seconds on a 262k vocabulary.
pub(crate) struct Parts {
    pub normalizer: Value,
    pub pre_tokenizer: Value,
    pub decoder: Value,
    /// Each string once, with its id.
    pub vocab: Vocab,
    /// Best first.
    pub merges: Vec<(String, String)>,
    pub unk: Option<String>,
    pub fuse_unk: bool,
    pub byte_fallback: bool,
    pub ignore_merges: bool,
    /// (id, text, special), matched verbatim in text before anything else.
    pub added: Vec<(u32, String, bool)>,
    /// Special tokens swallow the whitespace after them (Phi-3's chat markers, as its
    /// tokenizer.json and llama.cpp have it), but for [`NO_RSTRIP`].
    pub rstrip_specials: bool,
}

/// The special tokens that keep the whitespace after them where the others strip it.
const NO_RSTRIP: [&str; 3] = ["<unk>", "<s>", "<|endoftext|>"];

impl Parts {
    /// Whether added token `content` (special or not) strips the whitespace after it
    /// (`</s>` too, whatever its type, as llama.cpp has it).
    fn rstrip(&self, content: &str, special: bool) -> bool {
        self.rstrip_specials && (special || content == "</s>") && !NO_RSTRIP.contains(&content)
    }
}

impl Parts {
    fn shell(&self, added: Value, model: Value) -> Value {
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added,
            "normalizer": self.normalizer,
            "pre_tokenizer": self.pre_tokenizer,
            "post_processor": null,
            "decoder": self.decoder,
            "model": model,
        })
    }

    fn model_json(&self, vocab: Value, merges: Value) -> Value {
        json!({"type": "BPE", "dropout": null, "unk_token": self.unk, "continuing_subword_prefix": null,
               "end_of_word_suffix": null, "fuse_unk": self.fuse_unk, "byte_fallback": self.byte_fallback,
               "ignore_merges": self.ignore_merges, "vocab": vocab, "merges": merges})
    }

    /// The whole `tokenizer.json` document.
    fn json(&self) -> Value {
        let added: Vec<Value> = self
            .added
            .iter()
            .map(|(id, content, special)| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                       "rstrip": self.rstrip(content, *special), "normalized": false,
                       "special": special})
            })
            .collect();
        let vocab: serde_json::Map<String, Value> = self
            .vocab
            .iter()
            .map(|(t, i)| (t.clone(), json!(i)))
            .collect();
        let merges: Vec<Value> = self.merges.iter().map(|(l, r)| json!([l, r])).collect();
        self.shell(
            Value::Array(added),
            self.model_json(Value::Object(vocab), Value::Array(merges)),
        )
    }

    fn build(self) -> Result<tokenizers::Tokenizer> {
        let added: Vec<tokenizers::AddedToken> = self
            .added
            .iter()
            .map(|(_, content, special)| {
                tokenizers::AddedToken::from(content.clone(), *special)
                    .normalized(false)
                    .rstrip(self.rstrip(content, *special))
            })
            .collect();
        let empty = self.model_json(json!({}), json!([]));
        let mut tok: tokenizers::Tokenizer = self
            .shell(json!([]), empty)
            .to_string()
            .parse()
            .map_err(|e| Error::Tokenizer(format!("{e}")))?;
        let mut bpe = tokenizers::models::bpe::BPE::builder()
            .vocab_and_merges(self.vocab, self.merges)
            .fuse_unk(self.fuse_unk)
            .byte_fallback(self.byte_fallback)
            .ignore_merges(self.ignore_merges);
        if let Some(unk) = self.unk {
            bpe = bpe.unk_token(unk);
        }
        let bpe = bpe.build().map_err(|e| Error::Tokenizer(format!("{e}")))?;
        tok.with_model(bpe);
        tok.add_tokens(&added);
        Ok(tok)
    }
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`).
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    table
}

/// A byte-level vocabulary as transformers reads it from a GGUF: a token that is not
/// written in the byte alphabet is spelled in it (its UTF-8 bytes); a CONTROL token is
/// special unless it is not written in the alphabet (a mislabel, skipped), a USER_DEFINED
/// one is a plain added token when its text is in the vocabulary.
fn bpe_parts(tokens: &[String], types: &[i32], merges: &[String], pre: &str) -> Result<Parts> {
    let table = byte_chars();
    let alphabet: std::collections::HashSet<char> = table.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let spelled: Vec<String> = tokens
        .iter()
        .map(|t| {
            if in_alphabet(t) {
                t.clone()
            } else {
                t.bytes().map(|b| table[b as usize]).collect()
            }
        })
        .collect();
    let vocab = last_ids(&spelled);
    let added = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|&(_, (t, &ty))| {
            (ty == TYPE_CONTROL && in_alphabet(t))
                || (ty == TYPE_USER_DEFINED && vocab.contains_key(t.as_str()))
        })
        .map(|(id, (t, &ty))| (id as u32, t.clone(), ty == TYPE_CONTROL))
        .collect();
    let merges = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((l, r)) if !r.contains(' ') => Ok((l.to_string(), r.to_string())),
            _ => Err(Error::Tokenizer(format!(
                "malformed merge {} (expected \"left right\")",
                quote(m)
            ))),
        })
        .collect::<Result<_>>()?;
    let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre);
    Ok(Parts {
        normalizer: Value::Null,
        pre_tokenizer,
        decoder: json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
        vocab,
        merges,
        unk: None,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges,
        rstrip_specials: false,
        added,
    })
}

/// The vocabulary with each string at its *last* id (transformers builds a Python dict in
/// id order).
pub(crate) fn last_ids(spelled: &[String]) -> Vocab {
    let mut vocab = Vocab::with_capacity(spelled.len());
    for (i, t) in spelled.iter().enumerate() {
        vocab.insert(t.clone(), i as u32);
    }
    vocab
}

fn parts(source: &TokenizerSource) -> Result<Parts> {
    match source {
        TokenizerSource::GgufBpe {
            tokens,
            token_types,
            merges,
            pre,
        } => bpe_parts(tokens, token_types, merges, pre),
        TokenizerSource::GgufSpm {
            tokens,
            token_types,
            scores,
            add_space_prefix,
            arch,
        } => Ok(spm::parts(
            tokens,
            token_types,
            scores,
            *add_space_prefix,
            match arch {
                Some(a) => spm::Flavor::from_arch(a),
                None => spm::Flavor::guess(tokens),
            },
        )),
        TokenizerSource::HfJson(_) => unreachable!("not a GGUF vocabulary"),
    }
}

/// The `tokenizer.json` document equivalent to a GGUF vocabulary.
pub fn tokenizer_json(source: &TokenizerSource) -> Result<Value> {
    match source {
        TokenizerSource::HfJson(s) => {
            serde_json::from_str(s).map_err(|e| Error::Tokenizer(format!("tokenizer.json: {e}")))
        }
        other => Ok(parts(other)?.json()),
    }
}

/// The tokenizer of a source: [`tokenizer_json`] loaded into `tokenizers`, faster.
pub fn build(source: &TokenizerSource) -> Result<tokenizers::Tokenizer> {
    match source {
        TokenizerSource::HfJson(s) => s.parse().map_err(|e| Error::Tokenizer(format!("{e}"))),
        other => parts(other)?.build(),
    }
}

/// The 256 symbols of GPT-2's byte-to-unicode table, in byte order: the base vocabulary of
/// byte-level BPE (printable bytes stand for themselves, the others for code points from 256).
pub fn byte_level_symbols() -> Vec<String> {
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
    pairs
        .iter()
        .map(|&(_, c)| char::from_u32(c).unwrap_or('?').to_string())
        .collect()
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
        tokens.extend(byte_level_symbols());
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
                arch: None,
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
