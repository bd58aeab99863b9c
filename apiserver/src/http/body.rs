//! Request and response bodies: reading (bounded), content types, decoding.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Request, body::Incoming, header};
use serde_json::Value;

use super::MAX_BODY;
use crate::ApiError;

pub(super) async fn read_body(req: Request<Incoming>) -> Result<(hyper::HeaderMap, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| {
            ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("cannot read the request body: {e}"),
            )
        })?
        .to_bytes();
    Ok((parts.headers, bytes))
}

/// Refuse bodies that aren't JSON (kubectl's typed clients try protobuf first).
pub(super) fn require_json(headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ctype.starts_with("application/json") || ctype.starts_with("application/yaml") || ctype.is_empty() {
        Ok(())
    } else {
        Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body content type {ctype:?} is not supported: send application/json"),
        ))
    }
}

pub(super) fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

pub(super) fn wants_table(headers: &hyper::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}
