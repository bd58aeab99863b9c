//! Pushing a plugin: the Wasm OCI artifact layout (config `application/vnd.wasm.config.v0+json`,
//! one `application/wasm` layer), tagged, optionally signed as cosign signs with a key.

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
