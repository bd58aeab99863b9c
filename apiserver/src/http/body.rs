//! Request and response bodies: reading (bounded), content types, decoding.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
};
use serde_json::Value;

use super::{Body, MAX_BODY, full};
use crate::{ApiError, protobuf};

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

/// Decode a request body by its content type: JSON, YAML, or (built-in kinds) Kubernetes
/// protobuf, which kubectl's generators and client-go's typed clients send.
pub(super) fn decode_body(headers: &hyper::HeaderMap, bytes: &[u8], custom: bool) -> Result<Value, ApiError> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let media = ctype.split(';').next().unwrap_or_default().trim();
    match media {
        "" | "application/json" => parse_json(bytes),
        "application/yaml" => serde_saphyr::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid YAML: {e}"))),
        protobuf::MEDIA_TYPE if !custom => {
            protobuf::decode(bytes).map_err(|e| ApiError::new(e.code, e.reason, e.message))
        }
        _ => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of content type {ctype:?} is not supported: send application/json"),
        )),
    }
}

/// Whether the client prefers protobuf answers (its first `Accept` choice).
pub(super) fn wants_protobuf(headers: &hyper::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split(',').next())
        .is_some_and(|first| first.split(';').next().unwrap_or_default().trim() == protobuf::MEDIA_TYPE)
}

/// A response with `body` as JSON, or as protobuf when the client prefers it and the kind has a
/// protobuf form.
pub(super) fn respond(code: StatusCode, body: Value, protobuf_wanted: bool) -> Response<Body> {
    if protobuf_wanted && let Some(bytes) = protobuf::encode(&body) {
        let mut r = Response::new(Full::new(Bytes::from(bytes)).boxed());
        *r.status_mut() = code;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(protobuf::MEDIA_TYPE),
        );
        return r;
    }
    full(code, body)
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
