//! The API key: a layer in front of the protected routes that checks
//! `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) from the headers alone, before any handler reads the body, so
//! a client without the key cannot make the server read (or wait for) a body. The scheme is
//! matched in any case (`bearer`, `Bearer`, ...); the key is compared in constant time, as
//! SHA-256 digests, so neither its bytes nor its length leak through timing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::api::ApiError;

/// The server's key, kept as its digest.
pub struct ApiKey {
    digest: [u8; 32],
}

impl ApiKey {
    pub fn new(key: &str) -> Self {
        ApiKey {
            digest: Sha256::digest(key.as_bytes()).into(),
        }
    }

    /// Whether `given` is the key, in time independent of where they differ.
    pub fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        given.ct_eq(&self.digest).into()
    }
}

/// The token of an `Authorization: <scheme> <token>` header whose scheme is `Bearer` in any
/// case.
pub fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes().trim_ascii();
    let split = value.iter().position(|&b| b == b' ' || b == b'\t')?;
    let (scheme, token) = value.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    Some(token.trim_ascii()).filter(|t| !t.is_empty())
}

/// The key of an `x-api-key: KEY` header (Anthropic's clients send it).
pub fn x_api_key(headers: &HeaderMap) -> Option<&[u8]> {
    Some(headers.get("x-api-key")?.as_bytes().trim_ascii()).filter(|t| !t.is_empty())
}

/// Lets the request through only with the key (when the server has one).
pub async fn require_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let h = req.headers();
        let ok = bearer_token(h).is_some_and(|t| key.matches(t))
            || x_api_key(h).is_some_and(|t| key.matches(t));
        if !ok {
            let mut r = ApiError::new(
                401,
                "authentication_error",
                "missing or invalid API key (expected the header Authorization: Bearer KEY or \
                 x-api-key: KEY)",
            )
            .into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn bearer_scheme_in_any_case() {
        for v in ["Bearer k1", "bearer k1", "BEARER   k1 ", " BeArEr\tk1"] {
            assert_eq!(bearer_token(&headers(v)), Some(&b"k1"[..]), "{v:?}");
        }
        for v in ["Basic k1", "Bearer", "Bearer ", "Bearerk1", "k1"] {
            assert_eq!(bearer_token(&headers(v)), None, "{v:?}");
        }
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn x_api_key_header() {
        let mut h = HeaderMap::new();
        assert_eq!(x_api_key(&h), None);
        h.insert("x-api-key", HeaderValue::from_static(" k1 "));
        assert_eq!(x_api_key(&h), Some(&b"k1"[..]));
        h.insert("x-api-key", HeaderValue::from_static(""));
        assert_eq!(x_api_key(&h), None);
    }

    #[test]
    fn key_matches_only_itself() {
        let k = ApiKey::new("sekret");
        assert!(k.matches(b"sekret"));
        for bad in [&b"sekre"[..], b"sekret2", b"Sekret", b""] {
            assert!(!k.matches(bad));
        }
    }
}
