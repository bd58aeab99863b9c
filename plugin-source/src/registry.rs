//! The registry client: HTTPS (plain HTTP only to loopback or `--insecure-registry`
//! registries), anonymous bearer tokens on a `401` challenge, redirects for reads, a deadline on
//! every whole request and a bound on every body.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;

use crate::{DigestStore, MAX_REDIRECTS, OciError, REQUEST_TIMEOUT, sha256};

/// A registry client whose pulls are kept in a [`DigestStore`].
#[derive(Clone)]
pub struct Oci {
    http:
        Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>>,
    pub(crate) store: DigestStore,
    insecure: Vec<String>,
}

impl Oci {
    /// A client keeping what it pulls in `store`; plain HTTP to the registries in `insecure`
    /// (and loopback).
    ///
    /// # Errors
    /// The system's root certificates cannot be read.
    pub fn new(store: DigestStore, insecure: Vec<String>) -> Result<Oci, OciError> {
        let provider = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| OciError::Content(format!("cannot read the system's root certificates: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Oci {
            http,
            store,
            insecure,
        })
    }

    pub(crate) fn base(&self, registry: &str) -> String {
        let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
        let plain = matches!(host, "localhost" | "127.0.0.1" | "[::1]")
            || self.insecure.iter().any(|r| r == registry);
        format!("{}://{registry}/v2", if plain { "http" } else { "https" })
    }

    /// One request, with a bearer token fetched on a `401` challenge (anonymous pulls from
    /// public registries need one).
    pub(crate) async fn request(
        &self,
        method: Method,
        url: &str,
        headers: &[(header::HeaderName, &str)],
        body: Bytes,
        limit: usize,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), OciError> {
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.exchange(method.clone(), url, headers, body, limit),
        )
        .await
        .map_err(|_| {
            self.http_error(
                &method,
                url,
                format!("no complete answer within {} s", REQUEST_TIMEOUT.as_secs()),
            )
        })?
    }

    /// One request: a bearer token fetched on a `401` challenge, redirects (blobs are often served
    /// from elsewhere) followed for reads, at most [`MAX_REDIRECTS`], without the token.
    async fn exchange(
        &self,
        method: Method,
        url: &str,
        headers: &[(header::HeaderName, &str)],
        body: Bytes,
        limit: usize,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), OciError> {
        let mut token: Option<String> = None;
        let mut url_next: Option<String> = None;
        let mut redirects = 0;
        loop {
            let url_now = url_next.take().unwrap_or_else(|| url.to_string());
            let url = url_now.as_str();
            let mut req = Request::builder().method(method.clone()).uri(url);
            for (k, v) in headers {
                req = req.header(k, *v);
            }
            if let Some(t) = &token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let req = req
                .body(Full::new(body.clone()))
                .map_err(|e| self.http_error(&method, url, e))?;
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| self.http_error(&method, url, e))?;
            let (parts, body) = resp.into_parts();
            if parts.status == StatusCode::UNAUTHORIZED
                && token.is_none()
                && redirects == 0
                && let Some(challenge) = parts.headers.get(header::WWW_AUTHENTICATE)
            {
                token = Some(self.token(challenge).await?);
                continue;
            }
            if parts.status.is_redirection() && (method == Method::GET || method == Method::HEAD) {
                let location = parts.headers.get(header::LOCATION).and_then(|l| l.to_str().ok());
                if let Some(location) = location
                    && redirects < MAX_REDIRECTS
                {
                    redirects += 1;
                    let next = absolute(url, location);
                    drop(body);
                    // The token is the registry's, not the blob store's.
                    token = None;
                    url_next = Some(next);
                    continue;
                }
            }
            let body = http_body_util::Limited::new(body, limit)
                .collect()
                .await
                .map_err(|e| self.http_error(&method, url, e))?
                .to_bytes();
            if parts.status == StatusCode::UNAUTHORIZED && token.is_some() {
                return Err(self.http_error(&method, url, "still unauthorized with an anonymous token"));
            }
            return Ok((parts.status, parts.headers, body));
        }
    }

    pub(crate) fn http_error(&self, method: &Method, url: &str, e: impl std::fmt::Display) -> OciError {
        OciError::Http {
            method: if *method == Method::GET {
                "GET"
            } else if *method == Method::PUT {
                "PUT"
            } else if *method == Method::POST {
                "POST"
            } else {
                "HEAD"
            },
            url: url.to_string(),
            reason: e.to_string(),
        }
    }

    /// An anonymous bearer token for a `WWW-Authenticate: Bearer realm=…,service=…,scope=…`.
    pub(crate) async fn token(&self, challenge: &HeaderValue) -> Result<String, OciError> {
        let text = challenge.to_str().unwrap_or_default();
        let params = text.strip_prefix("Bearer ").ok_or_else(|| {
            OciError::Content(format!(
                "the registry asks for {text:?}: only anonymous bearer tokens are supported"
            ))
        })?;
        let mut realm = None;
        let mut query = Vec::new();
        for part in params.split(',') {
            let Some((k, v)) = part.trim().split_once('=') else {
                continue;
            };
            let v = v.trim_matches('"');
            match k {
                "realm" => realm = Some(v.to_string()),
                "service" | "scope" => query.push(format!("{k}={}", form_encode(v))),
                _ => {}
            }
        }
        let realm = realm.ok_or_else(|| OciError::Content(format!("no realm in {text:?}")))?;
        let url = format!("{realm}?{}", query.join("&"));
        let req = Request::get(&url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| self.http_error(&Method::GET, &url, e))?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|e| self.http_error(&Method::GET, &url, e))?;
        let body = http_body_util::Limited::new(resp.into_body(), 1 << 16)
            .collect()
            .await
            .map_err(|e| self.http_error(&Method::GET, &url, e))?
            .to_bytes();
        let v: Value = serde_json::from_slice(&body).map_err(|e| OciError::Content(format!("token: {e}")))?;
        v.get("token")
            .or_else(|| v.get("access_token"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| OciError::Content("the token answer has no token".into()))
    }

    /// The blob `digest` of `repository`, at most `limit` bytes; `Ok(Err(why))` when its bytes do
    /// not hash to `digest`.
    pub(crate) async fn blob(
        &self,
        base: &str,
        repository: &str,
        digest: &str,
        limit: usize,
    ) -> Result<Result<Bytes, String>, OciError> {
        let bytes = self
            .get(&format!("{base}/{repository}/blobs/{digest}"), "*/*", limit)
            .await?;
        let got = sha256(&bytes);
        if got != digest {
            return Ok(Err(format!("the blob {digest} has the digest {got}")));
        }
        Ok(Ok(bytes))
    }

    pub(crate) async fn get(&self, url: &str, accept: &str, limit: usize) -> Result<Bytes, OciError> {
        let (status, _, body) = self
            .request(Method::GET, url, &[(header::ACCEPT, accept)], Bytes::new(), limit)
            .await?;
        if !status.is_success() {
            return Err(self.http_error(
                &Method::GET,
                url,
                format!("{status}: {}", String::from_utf8_lossy(&body)),
            ));
        }
        Ok(body)
    }
}

/// `location` (a redirect's) made absolute against `url`.
pub(crate) fn absolute(url: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.to_string();
    }
    let origin_end = url
        .find("://")
        .and_then(|i| url[i + 3..].find('/').map(|j| i + 3 + j))
        .unwrap_or(url.len());
    if location.starts_with('/') {
        format!("{}{location}", &url[..origin_end])
    } else {
        let dir = url
            .rfind('/')
            .filter(|&i| i >= origin_end)
            .map_or(url, |i| &url[..=i]);
        format!("{dir}{location}")
    }
}

fn form_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
