//! cosign signatures, as `cosign sign --key` makes them: a manifest tagged `sha256-<hex>.sig` in
//! the same repository, one `application/vnd.dev.cosign.simplesigning.v1+json` layer whose blob
//! is the simple-signing payload naming the signed manifest digest, the signature (ECDSA P-256,
//! SHA-256, ASN.1 DER, base64) in its `dev.cosignproject.cosign/signature` annotation (cosign 2,
//! and cosign 3 with `--new-bundle-format=false`).
//!
//! cosign 3's default, a Sigstore bundle attached as an OCI 1.1 referrer, is found through the
//! registry's referrers API, or the referrers tag `sha256-<hex>` where the registry has none (as
//! cosign itself writes and reads it), and checked in [`crate::bundle`].

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, StatusCode, header};
use ring::signature;
use serde_json::Value;

use crate::{
    COSIGN_PAYLOAD_TYPE, COSIGN_SIGNATURE, INDEX_TYPE, MANIFEST_TYPE, MAX_MANIFEST, MAX_PAYLOAD,
    MAX_SIGNATURES, Oci, OciError, PublicKey, Reference,
    bundle::{check_blob_bundle, check_manifest_bundle, is_bundle, is_bundle_type},
    sha256,
};

/// The store's record of the signatures of a manifest that verified.
const SIGNATURES: &str = "signatures.json";
/// The store's record of the Sigstore bundle of a manifest that verified.
const BUNDLE: &str = "sigstore.json";

impl Oci {
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
        // Only a signature that verified is kept (and checked again here, with today's key).
        let cached: Option<Vec<(String, Vec<u8>)>> = self
            .store
            .get_record(manifest_digest, SIGNATURES)
            .and_then(|b| serde_json::from_slice(&b).ok());
        for (sig, payload) in cached.iter().flatten() {
            if check_signature(public_key, sig, payload, manifest_digest, reference).is_ok() {
                return Ok(());
            }
        }
        let kept_bundle = self.store.get_record(manifest_digest, BUNDLE);
        if kept_bundle.is_some_and(|b| check_manifest_bundle(public_key, &b, manifest_digest).is_ok()) {
            return Ok(());
        }
        let signatures = self.fetch_signatures(reference, manifest_digest).await?;
        let mut why = Vec::new();
        for (sig, payload) in &signatures {
            match check_signature(public_key, sig, payload, manifest_digest, reference) {
                Ok(()) => {
                    if let Ok(bytes) = serde_json::to_vec(&[(sig, payload)]) {
                        self.store.put_record(manifest_digest, SIGNATURES, &bytes);
                    }
                    return Ok(());
                }
                Err(e) => why.push(e),
            }
        }
        // cosign 3's bundles, looked for only when no cosign 2 signature verified.
        for bundle in self.fetch_bundles(reference, manifest_digest).await? {
            match check_manifest_bundle(public_key, &bundle, manifest_digest) {
                Ok(()) => {
                    self.store.put_record(manifest_digest, BUNDLE, &bundle);
                    return Ok(());
                }
                Err(e) => why.push(e),
            }
        }
        Err(OciError::Signature(if why.is_empty() {
            format!(
                "{} has no cosign signature (no tag sha256-{hex}.sig, no Sigstore bundle among its referrers): \
                 sign it (`slinky-host plugin push --sign-key`, or `cosign sign --key`)",
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
        let layers = self.signature_layers(&base, &reference.repository, &tag).await?;
        let mut out = Vec::new();
        for layer in layers.iter().take(MAX_SIGNATURES) {
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

    /// The Sigstore bundles attached to `manifest_digest` as referrers (at most
    /// [`MAX_SIGNATURES`]), each from a referrer manifest that hashes to its digest and names
    /// `manifest_digest` as its subject.
    async fn fetch_bundles(
        &self,
        reference: &Reference,
        manifest_digest: &str,
    ) -> Result<Vec<Vec<u8>>, OciError> {
        let base = self.base(&reference.registry);
        let repo = &reference.repository;
        let index = self.referrers(&base, repo, manifest_digest).await?;
        let mut out = Vec::new();
        let listed = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["artifactType"].as_str().is_some_and(is_bundle_type))
            .filter_map(|m| m["digest"].as_str())
            .take(MAX_SIGNATURES);
        for digest in listed {
            let url = format!("{base}/{repo}/manifests/{digest}");
            let body = self.get(&url, MANIFEST_TYPE, MAX_MANIFEST).await?;
            if sha256(&body) != digest {
                return Err(OciError::Signature(format!(
                    "{url}: the registry answered a manifest whose digest is {}",
                    sha256(&body)
                )));
            }
            let m: Value =
                serde_json::from_slice(&body).map_err(|e| OciError::Signature(format!("{url}: {e}")))?;
            if m["subject"]["digest"] != manifest_digest {
                continue;
            }
            let layers = m["layers"].as_array().into_iter().flatten();
            for layer in layers.filter(|l| l["mediaType"].as_str().is_some_and(is_bundle_type)) {
                let Some(blob) = layer["digest"].as_str() else {
                    continue;
                };
                let bundle = self
                    .blob(&base, repo, blob, MAX_PAYLOAD)
                    .await?
                    .map_err(OciError::Signature)?;
                out.push(bundle.to_vec());
            }
        }
        Ok(out)
    }

    /// The OCI 1.1 referrers index of `digest`: the registry's referrers API, or where it has
    /// none (a `404`), the referrers tag `sha256-<hex>`; an empty index when neither exists.
    async fn referrers(&self, base: &str, repo: &str, digest: &str) -> Result<Value, OciError> {
        let tag = digest.replace(':', "-");
        for url in [
            format!("{base}/{repo}/referrers/{digest}"),
            format!("{base}/{repo}/manifests/{tag}"),
        ] {
            let (status, _, body) = self
                .request(
                    Method::GET,
                    &url,
                    &[(header::ACCEPT, INDEX_TYPE)],
                    Bytes::new(),
                    MAX_MANIFEST,
                )
                .await?;
            if status == StatusCode::NOT_FOUND {
                continue;
            }
            if !status.is_success() {
                return Err(self.http_error(
                    &Method::GET,
                    &url,
                    format!("{status}: {}", crate::registry::excerpt(&body)),
                ));
            }
            let index: Value =
                serde_json::from_slice(&body).map_err(|e| OciError::Signature(format!("{url}: {e}")))?;
            if index["mediaType"] == INDEX_TYPE || index["manifests"].is_array() {
                return Ok(index);
            }
        }
        Ok(Value::Null)
    }

    /// The cosign layers of the signature manifest `tag` of `repo` (none when there is none):
    /// what a verify reads, and what a push adds its signature to.
    pub(crate) async fn signature_layers(
        &self,
        base: &str,
        repo: &str,
        tag: &str,
    ) -> Result<Vec<Value>, OciError> {
        let url = format!("{base}/{repo}/manifests/{tag}");
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
            return Err(self.http_error(
                &Method::GET,
                &url,
                format!("{status}: {}", crate::registry::excerpt(&body)),
            ));
        }
        let manifest: Value =
            serde_json::from_slice(&body).map_err(|e| OciError::Signature(format!("{url}: {e}")))?;
        Ok(manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["mediaType"] == COSIGN_PAYLOAD_TYPE)
            .cloned()
            .collect())
    }
}

/// A repository as cosign names it in `docker-reference`, Docker Hub's spellings made one.
fn repository_name(name: &str) -> String {
    for hub in ["index.docker.io/", "registry-1.docker.io/", "docker.io/"] {
        if let Some(rest) = name.strip_prefix(hub) {
            return format!("docker.io/{rest}");
        }
    }
    name.to_string()
}

/// Check a signature of a blob (`cosign sign-blob --key --output-signature`'s, or `slinky-host
/// plugin sign`'s: ECDSA P-256 over SHA-256 of the bytes, ASN.1 DER, base64) with one of `key`'s
/// keys.
///
/// A Sigstore bundle in its place (`cosign sign-blob --key --bundle`, cosign 3's default) is
/// checked as one.
pub(crate) fn check_blob_signature(key: &PublicKey, sig_b64: &str, bytes: &[u8]) -> Result<(), String> {
    if is_bundle(sig_b64) {
        return check_blob_bundle(key, sig_b64.as_bytes(), bytes);
    }
    let sig = base64::engine::general_purpose::STANDARD
        .decode(sig_b64.trim())
        .map_err(|e| {
            format!(
                "the signature is neither base64 (cosign sign-blob --output-signature's format) nor a \
                 Sigstore bundle (cosign sign-blob --bundle's): {e}"
            )
        })?;
    let verifies = key.points.iter().any(|point| {
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
            .verify(bytes, &sig)
            .is_ok()
    });
    if verifies {
        Ok(())
    } else {
        Err(format!(
            "the signature does not verify with the configured key{} (signed with another key, or made for \
             other bytes: sign the uncompressed component)",
            if key.points.len() > 1 { "s" } else { "" }
        ))
    }
}

/// Check one cosign signature: it verifies over `payload` with one of `key`'s keys, and the
/// payload names `manifest_digest` and `reference`'s repository (`docker-reference`: a signature
/// made for another repository's copy of the same artifact is not this one's).
pub(crate) fn check_signature(
    key: &PublicKey,
    sig_b64: &str,
    payload: &[u8],
    manifest_digest: &str,
    reference: &Reference,
) -> Result<(), String> {
    let sig = base64::engine::general_purpose::STANDARD
        .decode(sig_b64.trim())
        .map_err(|e| format!("the signature is not base64: {e}"))?;
    let verifies = key.points.iter().any(|point| {
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
            .verify(payload, &sig)
            .is_ok()
    });
    if !verifies {
        return Err(format!(
            "a signature does not verify with the configured key{} (signed with another key, or altered)",
            if key.points.len() > 1 { "s" } else { "" }
        ));
    }
    let p: Value = serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
    let named = p["critical"]["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap_or_default();
    if named != manifest_digest {
        return Err(format!(
            "a valid signature names {named}, not {manifest_digest} (a signature copied from another artifact)"
        ));
    }
    let want = format!("{}/{}", reference.registry, reference.repository);
    let signed_for = p["critical"]["identity"]["docker-reference"]
        .as_str()
        .unwrap_or_default();
    if repository_name(signed_for) != repository_name(&want) {
        return Err(format!(
            "a valid signature of {manifest_digest} was made for the repository {signed_for:?}, not {want} \
             (sign the artifact where it is pulled from)"
        ));
    }
    Ok(())
}
