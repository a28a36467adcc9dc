//! SentencePiece-style GGUF vocabularies (`tokenizer.ggml.model = llama`), built the way
//! transformers builds them from the same file (`AutoTokenizer.from_pretrained(dir,
//! gguf_file=...)`) but for the pre-tokenization, which follows the models' own
//! tokenizers (checked by `tests/golden_tokenizers.rs`):
//!
//! - The vocabulary maps each string to its *last* id (a Python dict built in id order).
//! - Merges are rebuilt from the vocabulary as transformers' `generate_merges` does: every
//!   split of every token (of any type) into two vocabulary strings, ranked by the token's
//!   score (higher first), then the left piece's length, then the right piece's (longer
//!   first, in characters), then the token's place, then the pieces' ids.
//! - Three pipelines, by family ([`Flavor`]):
//!   - Llama (Llama 2, Mistral, and any SentencePiece file not below) and Phi-3:
//!     SentencePiece's dummy prefix as the models were trained (the sentencepiece library,
//!     their legacy tokenizer.json, llama.cpp): normalizers prepend `▁` to every piece
//!     between special tokens, then replace spaces, so `" Hello"` is `▁▁Hello` and a piece
//!     after `[INST]` starts with `▁`. transformers' GGUF loader builds a non-legacy
//!     pipeline instead (`▁Hello`, nothing after a special token); the goldens record both
//!     and follow the models' own. With `add_space_prefix = false` nothing is prepended
//!     (transformers drops that flag; sentencepiece and llama.cpp honour it, as this does).
//!     Phi-3's special tokens also swallow the whitespace after them (rstrip).
//!   - Gemma: no prefix; spaces become `▁`; the user-defined tokens of two or more spaces
//!     (stored with real spaces) are spelled with `▁` so that merges reach them, and are
//!     then ordinary tokens (llama.cpp matches them verbatim, longest first: 40 spaces are
//!     16 + 24 here, 31 + 9 there); merges are ranked by place, not score.
//!
//! All three use byte fallback (`<0x..>` tokens) and fuse unknown pieces. Tokens of type
//! CONTROL and UNKNOWN become special added tokens, USER_DEFINED ones plain added tokens,
//! all matched verbatim in the text before anything else.

use std::collections::HashSet;
use std::ops::Range;

use serde_json::{json, Value};

use tokenizers::models::bpe::Vocab;

use crate::gguf::{last_ids, Parts, TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED};

/// Which of transformers' SentencePiece pipelines a vocabulary gets (transformers picks it
/// by `general.architecture`: gemma, gemma2, gemma3 and phi3 have their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Llama,
    Gemma,
    Phi3,
}

impl Flavor {
    /// The flavor of a GGUF `general.architecture`.
    pub fn from_arch(arch: &str) -> Self {
        match arch {
            "gemma" | "gemma2" | "gemma3" | "gemma4" => Flavor::Gemma,
            "phi3" => Flavor::Phi3,
            _ => Flavor::Llama,
        }
    }

    /// The flavor guessed from the vocabulary, for sources that do not name their
    /// architecture: Gemma's has `<start_of_turn>`, Phi-3's `<|assistant|>` and `<|end|>`.
    pub fn guess(tokens: &[String]) -> Self {
        let has = |s: &str| tokens.iter().any(|t| t == s);
        if has("<start_of_turn>") && has("<end_of_turn>") {
            Flavor::Gemma
        } else if has("<|assistant|>") && has("<|end|>") {
            Flavor::Phi3
        } else {
            Flavor::Llama
        }
    }
}

/// Python's `str.isspace`: Unicode White_Space plus the separators U+001C..U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Gemma stores its tokens of spaces with real spaces; transformers spells them with `▁`.
fn gemma_spelling(t: &str) -> Option<String> {
    (t.contains(' ') && t.chars().all(py_space)).then(|| "▁".repeat(t.chars().count()))
}

/// The parts of the tokenizer of a SentencePiece-style vocabulary.
pub(crate) fn parts(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
    add_space_prefix: bool,
    flavor: Flavor,
) -> Parts {
    let respelled: Vec<String>;
    let spelled: &[String] = if flavor == Flavor::Gemma {
        respelled = tokens
            .iter()
            .map(|t| gemma_spelling(t).unwrap_or_else(|| t.clone()))
            .collect();
        &respelled
    } else {
        tokens
    };
    let vocab = last_ids(spelled);
    // CONTROL and UNKNOWN tokens are special; USER_DEFINED ones, as stored, plain where
    // that string is in the vocabulary (Gemma's tokens of spaces are not, once respelled).
    let added = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter_map(|(id, (t, &ty))| {
            let special = ty == TYPE_CONTROL || ty == TYPE_UNKNOWN;
            let plain = ty == TYPE_USER_DEFINED && vocab.contains_key(t.as_str());
            (special || plain).then(|| (id as u32, t.clone(), special))
        })
        .collect();
    let unk = types
        .iter()
        .position(|&t| t == TYPE_UNKNOWN)
        .map(|i| spelled[i].clone())
        .or_else(|| vocab.contains_key("<unk>").then(|| "<unk>".to_string()));
    let merges = merges(spelled, &vocab, |i| match flavor {
        Flavor::Gemma => -(i as f64),
        _ => scores[i] as f64,
    });
    let strip = json!({"type": "Strip", "content": " ", "start": 1, "stop": 0});
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let replace_spaces = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let (normalizer, pre_tokenizer) = match flavor {
        Flavor::Gemma => (
            replace_spaces,
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
        ),
        // SentencePiece's dummy prefix as the model was trained (the sentencepiece library,
        // the legacy tokenizer.json of Llama 2, Mistral and Phi-3, llama.cpp): a '▁' starts
        // the text and every piece after a special token; a leading space becomes '▁▁'.
        Flavor::Phi3 | Flavor::Llama if add_space_prefix => {
            decoders.push(strip);
            (
                json!({"type": "Sequence", "normalizers": [
                    {"type": "Prepend", "prepend": "▁"}, replace_spaces]}),
                Value::Null,
            )
        }
        Flavor::Phi3 | Flavor::Llama => (
            Value::Null,
            json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": false}),
        ),
    };
    Parts {
        normalizer,
        pre_tokenizer,
        decoder: json!({"type": "Sequence", "decoders": decoders}),
        vocab,
        merges,
        unk,
        fuse_unk: true,
        byte_fallback: true,
        ignore_merges: false,
        added,
        rstrip_specials: flavor == Flavor::Phi3,
    }
}

/// Merges implied by a vocabulary (transformers' `generate_merges`): each split of a token
/// into two vocabulary strings, best first by (score, left length, right length) with
/// lengths in characters, then by the token's first place, then by the pieces' ids. A
/// duplicated string is taken once, at its first place, with its last id's score.
fn merges(
    spelled: &[String],
    ids: &Vocab,
    score: impl Fn(usize) -> f64 + Sync,
) -> Vec<(String, String)> {
    struct Merge<'a> {
        score: f64,
        len_l: u32,
        len_r: u32,
        place: u32,
        l: u32,
        r: u32,
        text: (&'a str, &'a str),
    }
    let has_duplicates = ids.len() < spelled.len();
    let mut skip = vec![];
    if has_duplicates {
        let mut seen: HashSet<&str> = HashSet::new();
        skip = spelled.iter().map(|t| !seen.insert(t.as_str())).collect();
    }
    let splits = |range: Range<usize>| {
        let mut out = vec![];
        for place in range {
            if has_duplicates && skip[place] {
                continue;
            }
            let piece = spelled[place].as_str();
            let last = if has_duplicates {
                ids[piece] as usize
            } else {
                place
            };
            let n_chars = piece.chars().count() as u32;
            for (len_l, (split, _)) in piece.char_indices().enumerate().skip(1) {
                let (l, r) = piece.split_at(split);
                let Some(&li) = ids.get(l) else { continue };
                if let Some(&ri) = ids.get(r) {
                    out.push(Merge {
                        score: score(last),
                        len_l: len_l as u32,
                        len_r: n_chars - len_l as u32,
                        place: place as u32,
                        l: li,
                        r: ri,
                        text: (l, r),
                    });
                }
            }
        }
        out
    };
    let mut out: Vec<Merge> = in_parallel(spelled.len(), &splits);
    out.sort_unstable_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.len_l.cmp(&a.len_l))
            .then(b.len_r.cmp(&a.len_r))
            .then(a.place.cmp(&b.place))
            .then(a.l.cmp(&b.l))
            .then(a.r.cmp(&b.r))
    });
    let out = &out;
    in_parallel(out.len(), &|range: Range<usize>| {
        out[range]
            .iter()
            .map(|m| (m.text.0.to_string(), m.text.1.to_string()))
            .collect()
    })
}

/// `f` over `0..n` cut into one range per core (a large vocabulary takes a while), the
/// results concatenated in order.
fn in_parallel<T: Send>(n: usize, f: &(dyn Fn(Range<usize>) -> Vec<T> + Sync)) -> Vec<T> {
    const SERIAL_BELOW: usize = 50_000;
    let threads = std::thread::available_parallelism().map_or(1, |c| c.get().min(8));
    if n < SERIAL_BELOW || threads == 1 {
        return f(0..n);
    }
    let chunk = n.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|a| s.spawn(move || f(a..(a + chunk).min(n))))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("merge worker panicked"))
            .collect()
    })
}
