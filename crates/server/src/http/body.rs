//! Reading a request body, for the routes that take one: a declared `Content-Length` over
//! the limit is refused with 413 before a byte of the body is read; a body that grows past
//! the limit is refused with 413 as soon as it does; a body that has not fully arrived within
//! the body timeout is answered 408. Both close the connection. The JSON is then parsed into
//! the route's request type (400 naming `body` if it does not parse).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use super::AppState;
use crate::api::ApiError;

/// A JSON body, read under the server's limits.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Response> {
        let bytes = read_body(req, state.max_body_bytes, state.body_timeout).await?;
        parse(&bytes)
            .map(JsonBody)
            .map_err(IntoResponse::into_response)
    }
}

/// The body's declared length, if it declares one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// An error answer after which the connection is closed (the rest of the body is not read).
fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn too_large(limit: usize) -> Response {
    closing(ApiError::new(
        413,
        "invalid_request_error",
        format!("the request body is larger than this server's limit of {limit} bytes"),
    ))
}

/// The whole body, at most `limit` bytes, within `timeout`.
pub async fn read_body(req: Request, limit: usize, timeout: Duration) -> Result<Bytes, Response> {
    if declared_length(req.headers()).is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let body = Limited::new(req.into_body(), limit);
    match tokio::time::timeout(timeout, body.collect()).await {
        Err(_) => Err(closing(ApiError::new(
            408,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
        ))),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(limit)),
        Ok(Err(e)) => Err(closing(ApiError::new(
            400,
            "invalid_request_error",
            format!("reading the request body: {e}"),
        ))),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("invalid request body: {e}")))
}
