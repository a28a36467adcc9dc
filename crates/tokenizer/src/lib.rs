//! Text to token ids and back, and chat templates.
//!
//! Every tokenizer is a `tokenizers::Tokenizer`: a `tokenizer.json` is loaded as is; a GGUF
//! vocabulary is first written out as the equivalent `tokenizer.json` document ([`gguf`]), so
//! both paths share one implementation. Special tokens written in raw text (`<|im_start|>`)
//! are matched as special tokens, as Hugging Face tokenizers do; in chat messages they are
//! not ([`Tokenizer::encode_chat`], [`chat_ids`]).
//!
//! A [`Tokenizer`] is `Send + Sync` and every method takes `&self`: one is shared by all
//! request handlers, and chat rendering is bounded ([`chat`]) so it may run on a blocking
//! pool.

pub mod chat;
mod chat_ids;
pub mod gguf;
pub mod spm;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use tessera_core::{Error, Result, TemplateError};
use tessera_formats::TokenizerSpec;

pub use chat::{ChatExtras, ChatMessage, ChatTemplate, TemplateLimits};
pub use stream::StreamDecoder;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special tokens read as plain text (made on first need).
    plain: OnceLock<tokenizers::Tokenizer>,
    specials: OnceLock<chat_ids::Specials>,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    /// The compiled template, or why there is none (kept, and reported when chat is used,
    /// so a broken template does not stop what never renders it).
    chat: std::result::Result<ChatTemplate, TemplateError>,
    chat_source: String,
    allow_special_in_content: AtomicBool,
    /// Cached: `tokenizers` rebuilds its whole vocabulary map to count it.
    vocab_size: usize,
}

/// `get_vocab_size(true)` (the model's strings and the added ones), without building the
/// whole vocabulary map as `tokenizers` does for it.
fn vocab_size(t: &tokenizers::Tokenizer) -> usize {
    let model = t.get_model();
    let extra = t
        .get_added_tokens_decoder()
        .values()
        .filter(|a| tokenizers::Model::token_to_id(model, &a.content).is_none())
        .count();
    t.get_vocab_size(false) + extra
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self> {
        let inner = gguf::build(&spec.source)?;
        let vocab_size = vocab_size(&inner);
        let mut t = Tokenizer {
            inner,
            plain: OnceLock::new(),
            specials: OnceLock::new(),
            bos_id: spec.bos_id,
            eos_ids: spec.eos_ids.clone(),
            add_bos: spec.add_bos,
            chat: Err(TemplateError::Missing),
            chat_source: String::new(),
            allow_special_in_content: AtomicBool::new(false),
            vocab_size,
        };
        if let Some(src) = &spec.chat_template {
            let bos = t
                .bos_id
                .and_then(|i| t.inner.id_to_token(i))
                .unwrap_or_default();
            let eos = t
                .eos_ids
                .first()
                .and_then(|&i| t.inner.id_to_token(i))
                .unwrap_or_default();
            t.chat = match ChatTemplate::new(src, &bos, &eos) {
                Ok(c) => Ok(c),
                Err(Error::ChatTemplate(e)) => {
                    tracing::warn!("{e}; chat requests will fail, the rest works");
                    Err(e)
                }
                Err(e) => return Err(e),
            };
            t.chat_source = src.clone();
        }
        Ok(t)
    }

    /// Token ids of `text`; special tokens in the text are recognised; BOS is prepended when
    /// the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(tok_err)?;
        Ok(self.with_bos(enc))
    }

    /// Ids of a rendered chat template: its special tokens are the template's own (as
    /// transformers' `apply_chat_template`, no post-processor adding a second BOS); BOS is
    /// prepended only when the model asks for it and the template did not write it.
    fn encode_rendered(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tok_err)?;
        Ok(self.with_bos(enc))
    }

    /// The ids of a post-processed encoding, BOS first when the model asks for it and the
    /// post-processor did not add it.
    fn with_bos(&self, enc: tokenizers::Encoding) -> Vec<u32> {
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            if let Some(b) = self.bos_id {
                if enc.get_ids().first() != Some(&b) {
                    ids.push(b);
                }
            }
        }
        ids.extend_from_slice(enc.get_ids());
        ids
    }

    /// Token ids of `messages` rendered by the model's chat template: the template's own
    /// text parses special tokens, the messages' roles and contents do not (unless
    /// [`Tokenizer::set_allow_special_in_content`] says so); see [`chat_ids`].
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, add_generation_prompt, &ChatExtras::default())
    }

    /// [`Tokenizer::encode_chat`] with `extras` (tools, template kwargs) given to the
    /// template; their strings are text too.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extras: &ChatExtras,
    ) -> Result<Vec<u32>> {
        let chat = self.chat.as_ref().map_err(|e| e.clone())?;
        if self.allow_special_in_content() {
            return self.encode_rendered(&chat.render_with(
                messages,
                add_generation_prompt,
                extras,
            )?);
        }
        let specials = self.specials.get_or_init(|| {
            chat_ids::Specials::new(
                self.inner
                    .get_added_tokens_decoder()
                    .into_values()
                    .filter(|t| t.special)
                    .map(|t| t.content),
            )
        });
        let (safe, safe_extras, sentinels) = chat_ids::neutralise_messages(
            messages,
            extras,
            specials,
            &[&self.chat_source, chat.bos_token(), chat.eos_token()],
        )?;
        let text = chat.render_with(&safe, add_generation_prompt, &safe_extras)?;
        if sentinels.is_empty() {
            return self.encode_rendered(&text);
        }
        let plain = self.plain.get_or_init(|| {
            let mut p = self.inner.clone();
            p.set_encode_special_tokens(true);
            p
        });
        let mut parts = vec![];
        for piece in chat_ids::pieces(&text, &sentinels) {
            let enc = match piece {
                chat_ids::Piece::Markup(s) => self.inner.encode(s.as_str(), false),
                chat_ids::Piece::Plain(s) => plain.encode(s.as_str(), false),
            };
            parts.push(enc.map_err(tok_err)?);
        }
        let merged = tokenizers::Encoding::merge(parts, true);
        let enc = self
            .inner
            .post_process(merged, None, false)
            .map_err(tok_err)?;
        Ok(self.with_bos(enc))
    }

    /// Whether chat message contents may carry special tokens (off by default: a user's
    /// `<|im_end|>` is text). Raw-text [`Tokenizer::encode`] always parses them.
    pub fn set_allow_special_in_content(&self, allow: bool) {
        self.allow_special_in_content
            .store(allow, Ordering::Relaxed);
    }

    pub fn allow_special_in_content(&self) -> bool {
        self.allow_special_in_content.load(Ordering::Relaxed)
    }

    /// Text of `ids`, special tokens included verbatim.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_err)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The compiled chat template; `None` when the model has none or it does not parse
    /// ([`Tokenizer::chat_template_error`] says which).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref().ok()
    }

    pub fn chat_template_error(&self) -> Option<&TemplateError> {
        self.chat.as_ref().err()
    }

    /// Renders `messages` with the model's chat template, as text (message contents
    /// verbatim: encoding this text parses special tokens anywhere in it; to tokenize a
    /// conversation use [`Tokenizer::encode_chat`]).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(messages, add_generation_prompt, &ChatExtras::default())
    }

    /// [`Tokenizer::apply_chat_template`] with `extras` (tools, template kwargs).
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extras: &ChatExtras,
    ) -> Result<String> {
        let chat = self.chat.as_ref().map_err(|e| e.clone())?;
        chat.render_with(messages, add_generation_prompt, extras)
    }

    /// The id of the added token (special or not) written `text`, if the vocabulary has one.
    pub fn added_token_id(&self, text: &str) -> Option<u32> {
        self.inner
            .get_added_tokens_decoder()
            .into_iter()
            .find(|(_, t)| t.content == text)
            .map(|(id, _)| id)
    }

    /// The chat template's source ("" when the model has none).
    pub fn chat_template_source(&self) -> &str {
        &self.chat_source
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
