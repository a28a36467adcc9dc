//! The chat page at `/`: plain HTML, JavaScript and CSS embedded in the binary
//! (`crates/server/assets/`), talking to `/v1/models` and `/v1/chat/completions` from the
//! browser. It fetches nothing from elsewhere, and the Content-Security-Policy it is served
//! with keeps it that way. The page itself needs no API key; the key it asks for is sent as
//! `Authorization: Bearer` on its API calls.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub const HTML: &str = include_str!("../assets/chat.html");
pub const JS: &str = include_str!("../assets/chat.js");
pub const CSS: &str = include_str!("../assets/chat.css");

/// Only this origin, for scripts, styles and API calls; `data:` for the (empty) icon.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`, `/chat.js`, `/chat.css`; stateless, so it merges into any router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", HTML) }),
        )
        .route(
            "/chat.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
        .route(
            "/chat.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_reference_nothing_external() {
        for (name, text) in [("chat.html", HTML), ("chat.js", JS), ("chat.css", CSS)] {
            for bad in ["http://", "https://", "=\"//", "@import", "url("] {
                assert!(
                    !text.contains(bad),
                    "{name} contains {bad:?}: the page must not load anything from elsewhere"
                );
            }
        }
        assert!(HTML.contains("src=\"/chat.js\""));
        assert!(HTML.contains("href=\"/chat.css\""));
    }
}
