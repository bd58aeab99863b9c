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
    MAX_SIGNATURES, Oci, OciError, PublicKey, REQUEST_TIMEOUT, Reference,
    bundle::{SIGN_PREDICATE, check_blob_bundle, check_manifest_bundle, is_bundle, is_bundle_type},
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
        let mut why = Vec::new();
        // A registry that cannot be read is no bad signature: its error is returned (retried as a
        // failed pull) when nothing verified.
        let mut unreachable = None;
        match self.fetch_signatures(reference, manifest_digest).await {
            Ok(signatures) => {
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
            }
            Err(e) => unreachable = Some(e),
        }
        // cosign 3's bundles, looked for only when no cosign 2 signature verified, each checked as
        // it comes, the whole look bounded in time.
        let look = self.find_bundle(reference, manifest_digest, public_key, &mut why);
        match tokio::time::timeout(REQUEST_TIMEOUT, look).await {
            Ok(Ok(Some(bundle))) => {
                self.store.put_record(manifest_digest, BUNDLE, &bundle);
                return Ok(());
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => unreachable = unreachable.or(Some(e)),
            Err(_) => why.push(format!(
                "the referrers were not read within {} s",
                REQUEST_TIMEOUT.as_secs()
            )),
        }
        if let (Some(e), true) = (unreachable, why.is_empty()) {
            return Err(e);
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

    /// The first Sigstore bundle attached to `manifest_digest` as a referrer that verifies with
    /// `public_key` (why each other one did not goes to `why`). At most [`MAX_SIGNATURES`]
    /// referrers are read, attestations that say so in the index skipped first, each a small
    /// manifest that hashes to its digest, names `manifest_digest` as its subject and holds one
    /// bundle (cosign writes one per referrer); a referrer that cannot be read is skipped. The
    /// index's `artifactType` is not trusted to say which is a bundle: go-containerregistry, which
    /// cosign writes with, puts the config's media type there in the referrers tag.
    async fn find_bundle(
        &self,
        reference: &Reference,
        manifest_digest: &str,
        public_key: &PublicKey,
        why: &mut Vec<String>,
    ) -> Result<Option<Vec<u8>>, OciError> {
        let base = self.base(&reference.registry);
        let repo = &reference.repository;
        let index = self.referrers(&base, repo, manifest_digest).await?;
        let mut listed: Vec<(bool, &str)> = Vec::new();
        let entries = index["manifests"].as_array().into_iter().flatten();
        for m in entries.filter(|m| {
            m["artifactType"]
                .as_str()
                .is_none_or(|t| is_bundle_type(t) || t == EMPTY_CONFIG_TYPE)
        }) {
            let Some(digest) = m["digest"].as_str().filter(|d| is_sha256(d)) else {
                continue;
            };
            match m["annotations"][PREDICATE_ANNOTATION].as_str() {
                // An attestation that says so is no signature: not even read.
                Some(p) if p != SIGN_PREDICATE => {
                    if why.len() < MAX_SIGNATURES {
                        why.push(format!(
                            "the referrer {digest} is an attestation of {p:?}, not a signature ({SIGN_PREDICATE})"
                        ));
                    }
                }
                predicate => listed.push((predicate.is_none(), digest)),
            }
        }
        // The ones that say they are signatures first.
        listed.sort_by_key(|(unlabelled, _)| *unlabelled);
        for (_, digest) in listed.into_iter().take(MAX_SIGNATURES) {
            let url = format!("{base}/{repo}/manifests/{digest}");
            let body = match self.get(&url, MANIFEST_TYPE, MAX_PAYLOAD).await {
                Ok(b) => b,
                Err(e) => {
                    why.push(format!("the referrer {digest} cannot be read: {e}"));
                    continue;
                }
            };
            if sha256(&body) != digest {
                why.push(format!(
                    "the registry answered {url} with a manifest of another digest"
                ));
                continue;
            }
            let Ok(m) = serde_json::from_slice::<Value>(&body) else {
                why.push(format!("the referrer {digest} is not JSON"));
                continue;
            };
            if m["subject"]["digest"] != manifest_digest {
                continue;
            }
            let layer = m["layers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|l| l["mediaType"].as_str().is_some_and(is_bundle_type));
            let Some(blob) = layer.and_then(|l| l["digest"].as_str()).filter(|d| is_sha256(d)) else {
                continue;
            };
            let bundle = match self.blob(&base, repo, blob, MAX_PAYLOAD).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    why.push(e);
                    continue;
                }
                Err(e) => {
                    why.push(format!("the bundle {blob} cannot be read: {e}"));
                    continue;
                }
            };
            match check_manifest_bundle(public_key, &bundle, manifest_digest) {
                Ok(()) => return Ok(Some(bundle.to_vec())),
                Err(e) => why.push(e),
            }
        }
        Ok(None)
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
            // No referrers API: 404, or 400 where the route is not known (as go-containerregistry
            // reads it).
            if status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST {
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

/// The media type of an empty config (`{}`), cosign's referrers' config.
const EMPTY_CONFIG_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The annotation of a referrer naming the predicate type of its bundle.
const PREDICATE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";

/// Whether `digest` is a well-formed `sha256:<64 hex>` (it goes into URLs).
fn is_sha256(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
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
