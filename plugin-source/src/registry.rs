//! The registry client: HTTPS (plain HTTP only to loopback or `--insecure-registry`
//! registries), on a `401` challenge a bearer token (anonymous, or for the registry's
//! credentials) or the credentials themselves (`Basic`), redirects for reads, a deadline on
//! every whole request and a bound on every body.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;

use crate::{
    Credentials, DigestStore, MAX_REDIRECTS, OciError, Proxies, REQUEST_TIMEOUT, proxy::ProxyConnector,
    sha256,
};

/// A registry client whose pulls are kept in a [`DigestStore`].
#[derive(Clone)]
pub struct Oci {
    http: Client<hyper_rustls::HttpsConnector<ProxyConnector>, Full<Bytes>>,
    pub(crate) store: DigestStore,
    insecure: Vec<String>,
    credentials: Credentials,
}

impl Oci {
    /// A client keeping what it pulls in `store`; plain HTTP to the registries in `insecure`
    /// (and loopback); through the proxies the environment names.
    ///
    /// # Errors
    /// The system's root certificates cannot be read.
    pub fn new(store: DigestStore, insecure: Vec<String>) -> Result<Oci, OciError> {
        Oci::with_proxies(store, insecure, Proxies::from_env())
    }

    /// [`Oci::new`] through `proxies`.
    ///
    /// # Errors
    /// The system's root certificates cannot be read.
    pub fn with_proxies(
        store: DigestStore,
        insecure: Vec<String>,
        proxies: Proxies,
    ) -> Result<Oci, OciError> {
        let provider = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| OciError::Content(format!("cannot read the system's root certificates: {e}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(ProxyConnector::new(proxies));
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Oci {
            http,
            store,
            insecure,
            credentials: Credentials::none(),
        })
    }

    /// The same client, with `credentials` for the registries that ask for them.
    #[must_use]
    pub fn with_credentials(mut self, credentials: Credentials) -> Oci {
        self.credentials = credentials;
        self
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
        // What the registry asked for: `Bearer <token>` or `Basic <credentials>`.
        let mut auth: Option<String> = None;
        let mut url_next: Option<String> = None;
        let mut redirects = 0;
        loop {
            let url_now = url_next.take().unwrap_or_else(|| url.to_string());
            let url = url_now.as_str();
            let mut req = Request::builder().method(method.clone()).uri(url);
            for (k, v) in headers {
                req = req.header(k, *v);
            }
            if let Some(a) = &auth {
                req = req.header(header::AUTHORIZATION, a.as_str());
            }
            let req = req
                .body(Full::new(body.clone()))
                .map_err(|e| self.http_error(&method, url, e))?;
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| self.http_error(&method, url, crate::error::with_causes(&e)))?;
            let (parts, body) = resp.into_parts();
            if parts.status == StatusCode::UNAUTHORIZED
                && auth.is_none()
                && redirects == 0
                && let Some(challenge) = parts.headers.get(header::WWW_AUTHENTICATE)
            {
                auth = Some(self.authorization(url, challenge).await?);
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
                    may_follow(url, &next).map_err(|why| self.http_error(&method, url, why))?;
                    // The token and the credentials are the registry's, not the blob store's.
                    auth = None;
                    url_next = Some(next);
                    continue;
                }
            }
            // An answer that is no success is read only as far as its message needs.
            let body = if parts.status.is_success() {
                http_body_util::Limited::new(body, limit)
                    .collect()
                    .await
                    .map_err(|e| self.http_error(&method, url, e))?
                    .to_bytes()
            } else {
                prefix(body, ERROR_READ).await
            };
            if parts.status == StatusCode::UNAUTHORIZED && auth.is_some() {
                let registry = registry_of(url);
                let with = if self.credentials.basic(registry).is_some() {
                    format!("the credentials for {registry}")
                } else {
                    format!(
                        "an anonymous token (no credentials for {registry}: give them, as a Docker config, with \
                         --registry-credentials; Helm: builderPlugins.registrySecret)"
                    )
                };
                return Err(self.http_error(&method, url, format!("still unauthorized with {with}")));
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

    /// The `Authorization` a `WWW-Authenticate` challenge from `registry_url` asks for: `Basic`
    /// with the registry's credentials, or `Bearer` with a token from its realm.
    async fn authorization(&self, registry_url: &str, challenge: &HeaderValue) -> Result<String, OciError> {
        let text = challenge.to_str().unwrap_or_default();
        let registry = registry_of(registry_url);
        if text.get(..6).is_some_and(|s| s.eq_ignore_ascii_case("basic ")) {
            return self.credentials.basic(registry).ok_or_else(|| {
                OciError::Content(format!(
                    "{registry} asks for credentials ({text}) and this host has none for it: give them, as a \
                     Docker config, with --registry-credentials (Helm: builderPlugins.registrySecret, a \
                     kubernetes.io/dockerconfigjson Secret)"
                ))
            });
        }
        Ok(format!("Bearer {}", self.token(registry_url, challenge).await?))
    }

    /// A bearer token for a `WWW-Authenticate: Bearer realm=…,service=…,scope=…`: anonymous, or
    /// for the registry's credentials when there are some.
    pub(crate) async fn token(
        &self,
        registry_url: &str,
        challenge: &HeaderValue,
    ) -> Result<String, OciError> {
        let text = challenge.to_str().unwrap_or_default();
        let params = text.strip_prefix("Bearer ").ok_or_else(|| {
            OciError::Content(format!(
                "the registry asks for {text:?}: only bearer tokens and basic credentials are supported"
            ))
        })?;
        let mut realm = None;
        let mut query = Vec::new();
        for (k, v) in challenge_params(params) {
            match k.as_str() {
                "realm" => realm = Some(v),
                "service" | "scope" => query.push(format!("{k}={}", form_encode(&v))),
                _ => {}
            }
        }
        let realm = realm.ok_or_else(|| OciError::Content(format!("no realm in {text:?}")))?;
        may_follow(registry_url, &realm)
            .map_err(|why| OciError::Content(format!("the token realm: {why}")))?;
        let url = format!("{realm}?{}", query.join("&"));
        let mut req = Request::get(&url);
        if let Some(basic) = self.credentials.basic(registry_of(registry_url)) {
            req = req.header(header::AUTHORIZATION, basic);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| self.http_error(&Method::GET, &url, e))?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|e| self.http_error(&Method::GET, &url, e))?;
        let status = resp.status();
        if !status.is_success() {
            let body = prefix(resp.into_body(), ERROR_READ).await;
            return Err(self.http_error(&Method::GET, &url, format!("{status}: {}", excerpt(&body))));
        }
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
            return Err(self.http_error(&Method::GET, url, format!("{status}: {}", excerpt(&body))));
        }
        Ok(body)
    }
}

/// The registry (`host[:port]`) of a URL.
fn registry_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// How much of an answer that is no success is read.
const ERROR_READ: usize = 4096;
/// How much of it an error, an Event or a status may quote.
const EXCERPT: usize = 300;

/// The first `n` bytes of `body` (all of it when shorter); the rest is never read.
async fn prefix(mut body: hyper::body::Incoming, n: usize) -> Bytes {
    let mut out = Vec::new();
    while out.len() < n {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    out.extend_from_slice(&data[..data.len().min(n - out.len())]);
                }
            }
            _ => break,
        }
    }
    Bytes::from(out)
}

/// A registry's answer as an error may quote it: at most [`EXCERPT`] characters of its text, one
/// line, controls replaced, and how much more there was.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .chars()
        .take(EXCERPT)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let shown = out.len();
    if body.len() > shown {
        out.push_str(&format!("… ({} bytes)", body.len()));
    }
    out
}

/// The `key=value` parameters of a `WWW-Authenticate` challenge, quoted values whole
/// (`scope="repository:x:pull,push"` keeps its comma).
pub(crate) fn challenge_params(params: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = params.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.find('"') {
                Some(end) => (quoted[..end].to_string(), &quoted[end + 1..]),
                None => (quoted.to_string(), ""),
            },
            None => match after.find(',') {
                Some(end) => (after[..end].trim().to_string(), &after[end..]),
                None => (after.trim().to_string(), ""),
            },
        };
        out.push((key, value));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// Whether the registry at `from` may send the client to `to` (a redirect, a token realm): to
/// `https`, or, from a registry reached over plain HTTP (loopback or `--insecure-registry`), to
/// plain HTTP on that same host. Never to another scheme.
pub(crate) fn may_follow(from: &str, to: &str) -> Result<(), String> {
    let host = |u: &str| -> String {
        let rest = u.split_once("://").map_or(u, |(_, r)| r);
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        authority.to_ascii_lowercase()
    };
    if to.starts_with("https://") {
        return Ok(());
    }
    if to.starts_with("http://") && from.starts_with("http://") && host(from) == host(to) {
        return Ok(());
    }
    Err(format!(
        "{to:?} is not https (plain HTTP only to the same host of a registry reached over HTTP): not followed"
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_keeps_its_quoted_commas() {
        let p = challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:x/y:pull,push""#,
        );
        assert_eq!(
            p,
            [
                ("realm".to_string(), "https://auth.example/token".to_string()),
                ("service".to_string(), "registry.example".to_string()),
                ("scope".to_string(), "repository:x/y:pull,push".to_string()),
            ]
        );
        let bare = challenge_params("realm=https://a/t, service=s");
        assert_eq!(bare[1], ("service".to_string(), "s".to_string()));
    }

    #[test]
    fn redirects_and_realms_go_to_https_or_the_same_plain_host() {
        let reg = "https://registry.example/v2/x/blobs/sha256:0";
        assert!(may_follow(reg, "https://cdn.example/blob").is_ok());
        assert!(may_follow(reg, "http://cdn.example/blob").is_err(), "a downgrade");
        assert!(may_follow(reg, "http://169.254.169.254/latest").is_err());
        assert!(may_follow(reg, "file:///etc/passwd").is_err());
        let local = "http://127.0.0.1:5000/v2/x/manifests/1";
        assert!(may_follow(local, "http://127.0.0.1:5000/token").is_ok());
        assert!(
            may_follow(local, "http://10.0.0.1/token").is_err(),
            "another plain host"
        );
        assert!(may_follow(local, "http://user@127.0.0.1:5000/t").is_ok());
    }

    #[test]
    fn an_error_quotes_a_short_excerpt() {
        let huge = vec![b'x'; 1 << 20];
        let e = excerpt(&huge);
        assert!(e.len() < 400, "{}", e.len());
        assert!(e.ends_with(&format!("({} bytes)", 1 << 20)), "{e}");
        assert_eq!(excerpt(b"not found\n"), "not found ");
    }
}
