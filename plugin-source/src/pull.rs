//! Pulling a plugin by digest: the manifest must hash to the pinned digest and name one
//! `application/wasm` layer, the layer's bytes must hash to its digest; both kept in the store
//! and re-verified on every read.

use crate::{
    DigestStore, MANIFEST_TYPE, MAX_BLOB, MAX_MANIFEST, Oci, OciError, Reference, WASM_LAYER_TYPE, sha256,
};
use serde_json::Value;

/// What a pull returns.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The manifest digest (`sha256:<hex>`), the one the reference pinned.
    pub manifest_digest: String,
    /// The component.
    pub wasm: Vec<u8>,
}

impl Oci {
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
        Oci::keep(&self.store, &manifest, &blob);
        Ok(Pulled {
            manifest_digest: digest,
            wasm: blob.to_vec(),
        })
    }

    /// The artifact `digest` from the store, when its manifest and layer are kept and intact.
    fn cached(&self, digest: &str) -> Option<Pulled> {
        let manifest = self.store.get(digest)?;
        let layer = wasm_layer(&manifest).ok()?;
        let wasm = self.store.get(&layer)?;
        Some(Pulled {
            manifest_digest: digest.to_string(),
            wasm,
        })
    }

    /// Keep a pulled artifact.
    fn keep(store: &DigestStore, manifest: &[u8], blob: &[u8]) {
        store.put(blob);
        store.put(manifest);
    }
}

/// The digest of the one `application/wasm` layer of a plugin manifest.
fn wasm_layer(manifest: &[u8]) -> Result<String, OciError> {
    let m: Value = serde_json::from_slice(manifest)
        .map_err(|e| OciError::NotAPlugin(format!("the manifest is not JSON: {e}")))?;
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
            .ok_or_else(|| OciError::NotAPlugin("the wasm layer has no sha256 digest".into())),
        _ => Err(OciError::NotAPlugin(format!(
            "not a plugin artifact: it has {} `{WASM_LAYER_TYPE}` layers, a plugin has one (push it with `slinky-host plugin push`)",
            layers.len()
        ))),
    }
}
