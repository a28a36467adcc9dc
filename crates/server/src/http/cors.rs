//! CORS (`--cors-origins`), off by default: with origins listed, every route answers
//! browsers' preflights itself, before any key check, and adds the CORS headers for an
//! allowed origin; a disallowed origin gets no `Access-Control-Allow-Origin`.

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Request headers a browser may send: the API key's two headers, JSON, Anthropic's
/// version and beta headers, and the official SDKs' own.
pub const ALLOWED_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "openai-organization",
    "openai-project",
    "x-stainless-arch",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-timeout",
    "x-stainless-helper-method",
];

/// The layer for `origins` (`None` when the list is empty); an origin that is not `*`
/// or `scheme://host[:port]` is an error naming it.
pub fn layer(origins: &[String]) -> Result<Option<CorsLayer>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        if origins.len() > 1 {
            return Err("--cors-origins: `*` allows every origin; give it alone".into());
        }
        AllowOrigin::any()
    } else {
        let mut list = Vec::with_capacity(origins.len());
        for o in origins {
            let o = o.trim_end_matches('/');
            let ok = (o.starts_with("http://") || o.starts_with("https://"))
                && !o
                    .split_once("://")
                    .is_some_and(|(_, rest)| rest.is_empty() || rest.contains('/'));
            let v = HeaderValue::from_str(o)
                .ok()
                .filter(|_| ok)
                .ok_or_else(|| {
                    format!(
                        "--cors-origins: {} is not an origin (scheme://host[:port], or *)",
                        crate::text::quote(o)
                    )
                })?;
            list.push(v);
        }
        AllowOrigin::list(list)
    };
    let headers: Vec<HeaderName> = ALLOWED_HEADERS
        .iter()
        .map(|h| HeaderName::from_static(h))
        .collect();
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            .allow_headers(headers)
            .expose_headers([header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600)),
    ))
}
