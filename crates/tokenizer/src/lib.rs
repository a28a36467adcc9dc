//! Text to token ids and back, and chat templates.
//!
//! Every tokenizer is a `tokenizers::Tokenizer`: a `tokenizer.json` is loaded as is; a GGUF
//! vocabulary is first written out as the equivalent `tokenizer.json` document ([`gguf`]), so
//! both paths share one implementation. Special tokens written in the text (`<|im_start|>`)
//! are matched as special tokens, as Hugging Face tokenizers do.

pub mod chat;
pub mod gguf;
mod stream;

use tessera_core::{Error, Result};
use tessera_formats::{TokenizerSource, TokenizerSpec};

pub use chat::{ChatMessage, ChatTemplate};
pub use stream::StreamDecoder;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    chat: Option<ChatTemplate>,
    /// Cached: `tokenizers` rebuilds its whole vocabulary map to count it.
    vocab_size: usize,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self> {
        let json = match &spec.source {
            TokenizerSource::HfJson(s) => s.clone(),
            other => gguf::tokenizer_json(other)?.to_string(),
        };
        let inner: tokenizers::Tokenizer = json.parse().map_err(tok_err)?;
        let vocab_size = inner.get_vocab_size(true);
        let mut t = Tokenizer {
            inner,
            bos_id: spec.bos_id,
            eos_ids: spec.eos_ids.clone(),
            add_bos: spec.add_bos,
            chat: None,
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
            t.chat = Some(ChatTemplate::new(src, &bos, &eos)?);
        }
        Ok(t)
    }

    /// Token ids of `text`; special tokens in the text are recognised; BOS is prepended when
    /// the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            if let Some(b) = self.bos_id {
                if enc.get_ids().first() != Some(&b) {
                    ids.push(b);
                }
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
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

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }

    /// Renders `messages` with the model's chat template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let chat = self
            .chat
            .as_ref()
            .ok_or_else(|| Error::Tokenizer("this model has no chat template".into()))?;
        chat.render(messages, add_generation_prompt)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
