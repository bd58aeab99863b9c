//! Pushing a plugin: the Wasm OCI artifact layout of the CNCF TAG Runtime (config
//! `application/vnd.wasm.config.v0+json` with `created`, `architecture`, `os`, `layerDigests` and
//! `component`; one `application/wasm` layer titled), tagged, optionally signed as cosign signs
//! with a key: added to the signatures already there, never replacing them.

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};

use crate::{
    COSIGN_PAYLOAD_TYPE, COSIGN_SIGNATURE, MANIFEST_TYPE, Oci, OciError, Reference, SigningKey,
    WASM_CONFIG_TYPE, WASM_LAYER_TYPE, sha256,
};

impl Oci {
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
                format!("{status}: {}", crate::registry::excerpt(&body)),
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
                format!("{status}: {}", crate::registry::excerpt(&body)),
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
                format!("{status}: {}", crate::registry::excerpt(&body)),
            ));
        }
        Ok(sha256(manifest))
    }

    /// Push `wasm` as `reference` (a tag, default `latest`), signed with `key` when given; the
    /// reference pinned by the manifest digest, to put in a BuilderPlugin. `component` is the
    /// config's `component` (`{"imports": [...], "exports": [...]}`); `title` the layer's file
    /// name. `created` is `SOURCE_DATE_EPOCH`'s time, or the Unix epoch: the same plugin pushed
    /// twice is the same artifact, under the same digest.
    ///
    /// # Errors
    /// The registry refused an upload.
    pub async fn push(
        &self,
        reference: &Reference,
        wasm: &[u8],
        annotations: Value,
        component: Value,
        key: Option<&SigningKey>,
    ) -> Result<Reference, OciError> {
        let base = self.base(&reference.registry);
        let repo = &reference.repository;
        let layer = self.put_blob(&base, repo, wasm).await?;
        let title = annotations
            .get("org.opencontainers.image.title")
            .and_then(Value::as_str)
            .map_or_else(|| "plugin.wasm".to_string(), |t| format!("{t}.wasm"));
        let config = serde_json::to_vec(&json!({
            "created": created(),
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer],
            "component": component,
        }))
        .map_err(|e| OciError::Content(e.to_string()))?;
        let config_digest = self.put_blob(&base, repo, &config).await?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": WASM_CONFIG_TYPE,
            "config": {"mediaType": WASM_CONFIG_TYPE, "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": WASM_LAYER_TYPE, "digest": layer, "size": wasm.len(),
                        "annotations": {"org.opencontainers.image.title": title}}],
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

    /// Push a cosign signature of `digest` made with `key`, beside those the signature manifest
    /// has already (cosign appends too: another key's signature stays).
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
        let tag = format!("{}.sig", digest.replace(':', "-"));
        let ours = json!({
            "mediaType": COSIGN_PAYLOAD_TYPE,
            "digest": payload_digest,
            "size": payload.len(),
            "annotations": {COSIGN_SIGNATURE: base64::engine::general_purpose::STANDARD.encode(signature)},
        });
        let mut layers = self.signature_layers(&base, repo, &tag).await?;
        // Every key signs the same payload (one blob); each signature is its own layer. This
        // key's earlier signature goes (ECDSA signatures differ every time: a re-push would pile
        // them up and push other keys' out); at most the newest few are kept (a reader looks at
        // the first `MAX_SIGNATURES`).
        let public = key.public();
        layers.retain(|l| {
            let sig = l["annotations"][COSIGN_SIGNATURE].as_str().unwrap_or_default();
            l["digest"] != ours["digest"]
                || crate::cosign::check_blob_signature(&public, sig, &payload).is_err()
        });
        layers.push(ours);
        let excess = layers.len().saturating_sub(crate::MAX_SIGNATURES);
        layers.drain(..excess);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": layers,
        }))
        .map_err(|e| OciError::Content(e.to_string()))?;
        self.put_manifest(&base, repo, &tag, &manifest).await?;
        Ok(())
    }
}

/// The config's `created`: `SOURCE_DATE_EPOCH` (seconds) as RFC 3339, or the Unix epoch.
fn created() -> String {
    let secs: i64 = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn created_is_rfc_3339_of_the_epoch_or_source_date_epoch() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }
}
