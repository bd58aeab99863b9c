//! Builder plugins as OCI artifacts: pull by digest (cached on disk), push, and cosign-compatible
//! signatures (ECDSA P-256 keys).
//!
//! # The artifact
//! A plugin is an OCI image manifest (`application/vnd.oci.image.manifest.v1+json`) with the
//! Wasm OCI artifact layout (as `wkg oci push` and the CNCF TAG Runtime's wasm artifact guidance
//! make it): config `application/vnd.wasm.config.v0+json`, one layer `application/wasm` holding the
//! component.
//!
//! # Signatures
//! As cosign signs with a key (`cosign sign --key`): a manifest tagged `sha256-<hex>.sig` in the
//! same repository, one layer `application/vnd.dev.cosign.simplesigning.v1+json` whose blob is the
//! simple-signing payload naming the signed manifest digest, with the signature (ECDSA P-256,
//! SHA-256, ASN.1 DER, base64) in its `dev.cosignproject.cosign/signature` annotation. Verification
//! takes the public key as PEM (`cosign.pub`, `slinky-host plugin keygen`).
//!
//! # Guarantees
//! * Content addressed: a pull needs a reference pinned by digest, the manifest's bytes must hash
//!   to it and the component's bytes to the layer digest; nothing else is trusted.
//! * Cached: `<cache>/<manifest hex>.manifest` and `<cache>/<layer hex>.wasm` are re-verified on
//!   every read, so a host restarts with its plugins while the registry is down.
//! * Plain HTTP only to a loopback registry or one listed in `--insecure-registry`.

use std::{path::PathBuf, time::Duration};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use ring::signature::{self, KeyPair};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The manifest media type of plugin artifacts.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The config media type of Wasm artifacts.
pub const WASM_CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a Wasm component.
pub const WASM_LAYER_TYPE: &str = "application/wasm";
/// cosign's simple-signing payload media type.
pub const COSIGN_PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// cosign's signature annotation.
pub const COSIGN_SIGNATURE: &str = "dev.cosignproject.cosign/signature";
/// Largest manifest accepted (bytes).
const MAX_MANIFEST: usize = 4 << 20;
/// Largest component accepted (bytes).
const MAX_BLOB: usize = 64 << 20;
/// Largest signature payload accepted (bytes): cosign's are a few hundred.
const MAX_PAYLOAD: usize = 64 << 10;
/// At most this many signatures of one artifact are looked at.
const MAX_SIGNATURES: usize = 8;
/// One whole request (headers and body) to a registry.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed by one read.
const MAX_REDIRECTS: usize = 3;

/// What can go wrong talking to a registry or checking what it sent.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference does not parse.
    #[error("{0:?} is not an OCI reference like registry.example.com/site/plugin@sha256:<64 hex>: {1}")]
    Reference(String, &'static str),
    /// An HTTP request failed.
    #[error("{method} {url}: {reason}")]
    Http {
        /// The method.
        method: &'static str,
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The registry sent something that is not what was asked for.
    #[error("{0}")]
    Content(String),
    /// The signature is missing or does not verify.
    #[error("signature: {0}")]
    Signature(String),
    /// A key does not parse.
    #[error("key: {0}")]
    Key(String),
}

/// A parsed reference: `registry/repository[:tag][@sha256:hex]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `path/name`.
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// `sha256:<hex>`, if pinned.
    pub digest: Option<String>,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl Reference {
    /// Parse `registry/repository[:tag][@sha256:<hex>]` (the registry is required: there is no
    /// default registry).
    ///
    /// # Errors
    /// [`OciError::Reference`] saying what is wrong.
    pub fn parse(text: &str) -> Result<Reference, OciError> {
        let bad = |why| OciError::Reference(text.to_string(), why);
        let (rest, digest) = match text.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("the digest must be sha256:<hex>"))?;
                if hex.len() != 64
                    || !hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(bad("the digest must be sha256: and 64 lower-case hex digits"));
                }
                (r, Some(d.to_string()))
            }
            None => (text, None),
        };
        let (registry, path) = rest.split_once('/').ok_or_else(|| bad("no registry host"))?;
        if !(registry.contains('.') || registry.contains(':') || registry == "localhost") {
            return Err(bad(
                "the first part must be a registry host (with a dot or a port)",
            ));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (path, None),
        };
        if repository.is_empty()
            || !repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return Err(bad(
                "the repository must be lower-case letters, digits, '.', '_', '-' and '/'",
            ));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The same repository pinned at `digest`.
    pub fn pinned(&self, digest: &str) -> Reference {
        Reference {
            tag: None,
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// What a pull returns.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The manifest digest (`sha256:<hex>`), the one the reference pinned.
    pub manifest_digest: String,
    /// The component.
    pub wasm: Vec<u8>,
}

/// A registry client with a disk cache.
#[derive(Clone)]
pub struct Oci {
    http:
        Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>>,
    cache: Option<PathBuf>,
    insecure: Vec<String>,
}

impl Oci {
    /// A client caching in `cache`; plain HTTP to the registries in `insecure` (and loopback).
    ///
    /// # Errors
    /// The system's root certificates cannot be read.
    pub fn new(cache: Option<PathBuf>, insecure: Vec<String>) -> Result<Oci, OciError> {
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
            cache,
            insecure,
        })
    }

    fn base(&self, registry: &str) -> String {
        let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
        let plain = matches!(host, "localhost" | "127.0.0.1" | "[::1]")
            || self.insecure.iter().any(|r| r == registry);
        format!("{}://{registry}/v2", if plain { "http" } else { "https" })
    }

    /// One request, with a bearer token fetched on a `401` challenge (anonymous pulls from
    /// public registries need one).
    async fn request(
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

    fn http_error(&self, method: &Method, url: &str, e: impl std::fmt::Display) -> OciError {
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
    async fn token(&self, challenge: &HeaderValue) -> Result<String, OciError> {
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
    async fn blob(
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

    async fn get(&self, url: &str, accept: &str, limit: usize) -> Result<Bytes, OciError> {
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

    /// Pull the component `reference` (pinned by digest) names, from the cache when it is there.
    ///
    /// # Errors
    /// Not pinned, unreachable, not a plugin artifact, or bytes that do not hash to their digests.
    pub async fn pull(&self, reference: &Reference) -> Result<Pulled, OciError> {
        let digest = reference.digest.clone().ok_or(OciError::Reference(
            reference.to_string(),
            "pin it by digest (@sha256:…): `slinky-host plugin push` prints it",
        ))?;
        if let Some(p) = self.cached(&digest) {
            return Ok(p);
        }
        let base = self.base(&reference.registry);
        let url = format!("{base}/{}/manifests/{digest}", reference.repository);
        let manifest = self
            .get(&url, MANIFEST_TYPE, MAX_MANIFEST)
            .await
            .map_err(|e| match e {
                OciError::Http { reason, url, .. } if reason.starts_with("404") => {
                    OciError::Content(format!("unknown digest: {url} is not in the registry ({reason})"))
                }
                e => e,
            })?;
        if sha256(&manifest) != digest {
            return Err(OciError::Content(format!(
                "the registry answered {url} with a manifest whose digest is {}, not {digest}",
                sha256(&manifest)
            )));
        }
        let layer = wasm_layer(&manifest)?;
        let blob = self
            .blob(&base, &reference.repository, &layer, MAX_BLOB)
            .await?
            .map_err(OciError::Content)?;
        self.store(&digest, &manifest, &layer, &blob);
        Ok(Pulled {
            manifest_digest: digest,
            wasm: blob.to_vec(),
        })
    }

    fn cached(&self, digest: &str) -> Option<Pulled> {
        let dir = self.cache.as_ref()?;
        let hex = digest.strip_prefix("sha256:")?;
        let manifest = std::fs::read(dir.join(format!("{hex}.manifest"))).ok()?;
        if sha256(&manifest) != digest {
            return None;
        }
        let layer = wasm_layer(&manifest).ok()?;
        let wasm = std::fs::read(dir.join(format!("{}.wasm", layer.strip_prefix("sha256:")?))).ok()?;
        (sha256(&wasm) == layer).then(|| Pulled {
            manifest_digest: digest.to_string(),
            wasm,
        })
    }

    fn store(&self, digest: &str, manifest: &[u8], layer: &str, blob: &[u8]) {
        let Some(dir) = &self.cache else { return };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let hex = |d: &str| d.trim_start_matches("sha256:").to_string();
            for (name, bytes) in [
                (format!("{}.wasm", hex(layer)), blob),
                (format!("{}.manifest", hex(digest)), manifest),
            ] {
                let tmp = dir.join(format!(".{name}.tmp"));
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, dir.join(name))?;
            }
            Ok(())
        };
        if let Err(error) = write() {
            tracing::warn!(dir = %dir.display(), %error, "cannot cache a pulled plugin; it is pulled again next time");
        }
    }

    /// Verify the cosign signature of `reference`'s manifest digest with `public_key` (PEM). The
    /// signature manifest and payload are cached beside the artifact and re-verified from there.
    ///
    /// # Errors
    /// [`OciError::Signature`] when there is no signature or none verifies with the key.
    pub async fn verify(
        &self,
        reference: &Reference,
        manifest_digest: &str,
        public_key: &PublicKey,
    ) -> Result<(), OciError> {
        let hex = manifest_digest.trim_start_matches("sha256:");
        let cache = self.cache.as_ref().map(|d| d.join(format!("{hex}.sig.json")));
        // Only a signature that verified is cached (and checked again here, with today's key).
        let cached: Option<Vec<(String, Vec<u8>)>> = cache
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        for (sig, payload) in cached.iter().flatten() {
            if check_signature(public_key, sig, payload, manifest_digest).is_ok() {
                return Ok(());
            }
        }
        let signatures = self.fetch_signatures(reference, manifest_digest).await?;
        let mut why = Vec::new();
        for (sig, payload) in &signatures {
            match check_signature(public_key, sig, payload, manifest_digest) {
                Ok(()) => {
                    if let (Some(path), Ok(bytes)) = (&cache, serde_json::to_vec(&[(sig, payload)])) {
                        if let Some(dir) = path.parent() {
                            let _ = std::fs::create_dir_all(dir);
                        }
                        let _ = std::fs::write(path, bytes);
                    }
                    return Ok(());
                }
                Err(e) => why.push(e),
            }
        }
        Err(OciError::Signature(if why.is_empty() {
            format!(
                "{} has no cosign signature (tag sha256-{hex}.sig): sign it (`slinky-host plugin push --sign-key`, or `cosign sign --key`)",
                reference.pinned(manifest_digest)
            )
        } else {
            format!(
                "no signature of {} verifies with the configured public key: {}",
                reference.pinned(manifest_digest),
                why.join("; ")
            )
        }))
    }

    async fn fetch_signatures(
        &self,
        reference: &Reference,
        manifest_digest: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, OciError> {
        let base = self.base(&reference.registry);
        let tag = format!("{}.sig", manifest_digest.replace(':', "-"));
        let url = format!("{base}/{}/manifests/{tag}", reference.repository);
        let (status, _, body) = self
            .request(
                Method::GET,
                &url,
                &[(header::ACCEPT, MANIFEST_TYPE)],
                Bytes::new(),
                MAX_MANIFEST,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(Vec::new());
        }
        if !status.is_success() {
            return Err(self.http_error(&Method::GET, &url, status));
        }
        let manifest: Value =
            serde_json::from_slice(&body).map_err(|e| OciError::Signature(format!("{url}: {e}")))?;
        let mut out = Vec::new();
        let layers = manifest["layers"].as_array().into_iter().flatten();
        for layer in layers
            .filter(|l| l["mediaType"] == COSIGN_PAYLOAD_TYPE)
            .take(MAX_SIGNATURES)
        {
            let (Some(sig), Some(digest)) = (
                layer["annotations"][COSIGN_SIGNATURE].as_str(),
                layer["digest"].as_str(),
            ) else {
                continue;
            };
            let payload = self
                .blob(&base, &reference.repository, digest, MAX_PAYLOAD)
                .await?
                .map_err(OciError::Signature)?;
            out.push((sig.to_string(), payload.to_vec()));
        }
        Ok(out)
    }

    async fn put_blob(&self, base: &str, repository: &str, bytes: &[u8]) -> Result<String, OciError> {
        let digest = sha256(bytes);
        let head = format!("{base}/{repository}/blobs/{digest}");
        let (status, _, _) = self.request(Method::HEAD, &head, &[], Bytes::new(), 0).await?;
        if status.is_success() {
            return Ok(digest);
        }
        let start = format!("{base}/{repository}/blobs/uploads/");
        let (status, headers, body) = self
            .request(Method::POST, &start, &[], Bytes::new(), 1 << 16)
            .await?;
        if status != StatusCode::ACCEPTED {
            return Err(self.http_error(
                &Method::POST,
                &start,
                format!("{status}: {}", String::from_utf8_lossy(&body)),
            ));
        }
        let location = headers
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| OciError::Content("the upload answer has no Location".into()))?;
        let location = if location.starts_with('/') {
            format!("{}{location}", base.trim_end_matches("/v2"))
        } else {
            location.to_string()
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let url = format!("{location}{sep}digest={digest}");
        let (status, _, body) = self
            .request(
                Method::PUT,
                &url,
                &[(header::CONTENT_TYPE, "application/octet-stream")],
                Bytes::copy_from_slice(bytes),
                1 << 16,
            )
            .await?;
        if status != StatusCode::CREATED {
            return Err(self.http_error(
                &Method::PUT,
                &url,
                format!("{status}: {}", String::from_utf8_lossy(&body)),
            ));
        }
        Ok(digest)
    }

    async fn put_manifest(
        &self,
        base: &str,
        repository: &str,
        tag: &str,
        manifest: &[u8],
    ) -> Result<String, OciError> {
        let url = format!("{base}/{repository}/manifests/{tag}");
        let (status, _, body) = self
            .request(
                Method::PUT,
                &url,
                &[(header::CONTENT_TYPE, MANIFEST_TYPE)],
                Bytes::copy_from_slice(manifest),
                1 << 16,
            )
            .await?;
        if status != StatusCode::CREATED {
            return Err(self.http_error(
                &Method::PUT,
                &url,
                format!("{status}: {}", String::from_utf8_lossy(&body)),
            ));
        }
        Ok(sha256(manifest))
    }

    /// Push `wasm` as `reference` (a tag, default `latest`), signed with `key` when given; the
    /// reference pinned by the manifest digest, to put in a BuilderPlugin.
    ///
    /// # Errors
    /// The registry refused an upload.
    pub async fn push(
        &self,
        reference: &Reference,
        wasm: &[u8],
        annotations: Value,
        key: Option<&SigningKey>,
    ) -> Result<Reference, OciError> {
        let base = self.base(&reference.registry);
        let repo = &reference.repository;
        let layer = self.put_blob(&base, repo, wasm).await?;
        let config = serde_json::to_vec(&json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer],
        }))
        .map_err(|e| OciError::Content(e.to_string()))?;
        let config_digest = self.put_blob(&base, repo, &config).await?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": WASM_CONFIG_TYPE,
            "config": {"mediaType": WASM_CONFIG_TYPE, "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": WASM_LAYER_TYPE, "digest": layer, "size": wasm.len()}],
            "annotations": annotations,
        }))
        .map_err(|e| OciError::Content(e.to_string()))?;
        let tag = reference.tag.clone().unwrap_or_else(|| "latest".into());
        let digest = self.put_manifest(&base, repo, &tag, &manifest).await?;
        if let Some(key) = key {
            self.sign(reference, &digest, key).await?;
        }
        Ok(reference.pinned(&digest))
    }

    /// Push a cosign signature of `digest` made with `key`.
    async fn sign(&self, reference: &Reference, digest: &str, key: &SigningKey) -> Result<(), OciError> {
        let base = self.base(&reference.registry);
        let repo = &reference.repository;
        let payload = serde_json::to_vec(&json!({
            "critical": {
                "identity": {"docker-reference": format!("{}/{}", reference.registry, repo)},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": null,
        }))
        .map_err(|e| OciError::Content(e.to_string()))?;
        let signature = key.sign(&payload)?;
        let payload_digest = self.put_blob(&base, repo, &payload).await?;
        let config = b"{}".to_vec();
        let config_digest = self.put_blob(&base, repo, &config).await?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": [{
                "mediaType": COSIGN_PAYLOAD_TYPE,
                "digest": payload_digest,
                "size": payload.len(),
                "annotations": {COSIGN_SIGNATURE: base64::engine::general_purpose::STANDARD.encode(signature)},
            }],
        }))
        .map_err(|e| OciError::Content(e.to_string()))?;
        self.put_manifest(
            &base,
            repo,
            &format!("{}.sig", digest.replace(':', "-")),
            &manifest,
        )
        .await?;
        Ok(())
    }
}

/// `location` (a redirect's) made absolute against `url`.
fn absolute(url: &str, location: &str) -> String {
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

/// The digest of the one `application/wasm` layer of a plugin manifest.
fn wasm_layer(manifest: &[u8]) -> Result<String, OciError> {
    let m: Value = serde_json::from_slice(manifest)
        .map_err(|e| OciError::Content(format!("the manifest is not JSON: {e}")))?;
    let layers: Vec<&Value> = m["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["mediaType"] == WASM_LAYER_TYPE)
        .collect();
    match layers.as_slice() {
        [one] => one["digest"]
            .as_str()
            .filter(|d| d.starts_with("sha256:"))
            .map(str::to_string)
            .ok_or_else(|| OciError::Content("the wasm layer has no sha256 digest".into())),
        _ => Err(OciError::Content(format!(
            "not a plugin artifact: it has {} `{WASM_LAYER_TYPE}` layers, a plugin has one (push it with `slinky-host plugin push`)",
            layers.len()
        ))),
    }
}

/// Check one cosign signature: it verifies over `payload` with `key`, and the payload names
/// `manifest_digest`.
fn check_signature(
    key: &PublicKey,
    sig_b64: &str,
    payload: &[u8],
    manifest_digest: &str,
) -> Result<(), String> {
    let sig = base64::engine::general_purpose::STANDARD
        .decode(sig_b64.trim())
        .map_err(|e| format!("the signature is not base64: {e}"))?;
    signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, &key.point)
        .verify(payload, &sig)
        .map_err(|_| {
            "a signature does not verify with the key (signed with another key, or altered)".to_string()
        })?;
    let p: Value = serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
    let named = p["critical"]["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap_or_default();
    if named != manifest_digest {
        return Err(format!(
            "a valid signature names {named}, not {manifest_digest} (a signature copied from another artifact)"
        ));
    }
    Ok(())
}

/// The fixed DER prefix of a P-256 SubjectPublicKeyInfo (id-ecPublicKey, prime256v1), before the
/// 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
    0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn pem_body(pem: &str, label: &str) -> Result<Vec<u8>, OciError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem
        .find(&begin)
        .ok_or_else(|| OciError::Key(format!("no {begin} block")))?
        + begin.len();
    let stop = pem[start..]
        .find(&end)
        .ok_or_else(|| OciError::Key(format!("no {end}")))?
        + start;
    let b64: String = pem[start..stop].split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| OciError::Key(format!("the {label} block is not base64: {e}")))
}

/// An ECDSA P-256 public key (cosign's `cosign.pub`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    point: Vec<u8>,
}

impl PublicKey {
    /// Parse a PEM `PUBLIC KEY` (P-256 SubjectPublicKeyInfo).
    ///
    /// # Errors
    /// [`OciError::Key`] when it is not one.
    pub fn from_pem(pem: &str) -> Result<PublicKey, OciError> {
        let der = pem_body(pem, "PUBLIC KEY")?;
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(PublicKey {
                point: point.to_vec(),
            }),
            _ => Err(OciError::Key(
                "not an ECDSA P-256 public key (cosign's keys are; `slinky-host plugin keygen` makes one)"
                    .into(),
            )),
        }
    }

    /// As PEM.
    pub fn to_pem(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        pem_wrap("PUBLIC KEY", &der)
    }
}

fn pem_wrap(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// An ECDSA P-256 signing key (PKCS#8, PEM `PRIVATE KEY`, as `slinky-host plugin keygen` or
/// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes it).
pub struct SigningKey {
    pair: signature::EcdsaKeyPair,
    rng: ring::rand::SystemRandom,
}

impl SigningKey {
    /// Parse a PEM `PRIVATE KEY`.
    ///
    /// # Errors
    /// [`OciError::Key`] when it is not a P-256 PKCS#8 key.
    pub fn from_pem(pem: &str) -> Result<SigningKey, OciError> {
        let der = pem_body(pem, "PRIVATE KEY")?;
        let rng = ring::rand::SystemRandom::new();
        let pair =
            signature::EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &der, &rng)
                .map_err(|e| OciError::Key(format!("not an ECDSA P-256 PKCS#8 private key: {e}")))?;
        Ok(SigningKey { pair, rng })
    }

    /// A new key pair: (private key PEM, public key PEM).
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn generate() -> Result<(String, String), OciError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|e| OciError::Key(format!("cannot generate a key: {e}")))?;
        let key = SigningKey::from_pem(&pem_wrap("PRIVATE KEY", pkcs8.as_ref()))?;
        Ok((pem_wrap("PRIVATE KEY", pkcs8.as_ref()), key.public().to_pem()))
    }

    /// Its public key.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            point: self.pair.public_key().as_ref().to_vec(),
        }
    }

    fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, OciError> {
        self.pair
            .sign(&self.rng, payload)
            .map(|s| s.as_ref().to_vec())
            .map_err(|e| OciError::Key(format!("cannot sign: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_refuse_what_is_not_one() {
        let hex = "a".repeat(64);
        let r = Reference::parse(&format!("127.0.0.1:5000/site/gpu@sha256:{hex}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "site/gpu", None)
        );
        assert_eq!(r.digest, Some(format!("sha256:{hex}")));
        let t = Reference::parse("registry.example.com/gpu:1.2").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.tag.as_deref(), Some("1.2"));
        for bad in [
            "gpu",
            "gpu/plugin",
            "r.io/GPU",
            "r.io/gpu@sha256:abc",
            "r.io/gpu@md5:aa",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redirects_resolve_against_the_request() {
        let url = "http://r.io:5000/v2/site/gpu/blobs/sha256:aa";
        assert_eq!(
            absolute(url, "https://s3.example/x?sig=1"),
            "https://s3.example/x?sig=1"
        );
        assert_eq!(absolute(url, "/other/y"), "http://r.io:5000/other/y");
        assert_eq!(absolute(url, "z"), "http://r.io:5000/v2/site/gpu/blobs/z");
    }

    #[test]
    fn signatures_verify_with_their_key_only_and_name_the_digest() -> Result<(), OciError> {
        let (private, public) = SigningKey::generate()?;
        let key = SigningKey::from_pem(&private)?;
        let public = PublicKey::from_pem(&public)?;
        assert_eq!(key.public(), public);
        let digest = format!("sha256:{}", "b".repeat(64));
        let payload = serde_json::to_vec(&json!({"critical": {"image": {"docker-manifest-digest": digest}}}))
            .map_err(|e| OciError::Content(e.to_string()))?;
        let sig = base64::engine::general_purpose::STANDARD.encode(key.sign(&payload)?);
        assert_eq!(check_signature(&public, &sig, &payload, &digest), Ok(()));
        let other = format!("sha256:{}", "c".repeat(64));
        assert!(check_signature(&public, &sig, &payload, &other).is_err_and(|e| e.contains("copied")));
        let (_, stranger) = SigningKey::generate()?;
        let stranger = PublicKey::from_pem(&stranger)?;
        assert!(
            check_signature(&stranger, &sig, &payload, &digest).is_err_and(|e| e.contains("does not verify"))
        );
        Ok(())
    }
}
