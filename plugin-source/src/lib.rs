//! # slinky-plugin-source
//!
//! Where builder plugin modules come from and whether to trust them: OCI references, the
//! registry client and its auth, one digest store for everything kept on disk, cosign
//! signatures, and BuilderPlugin modules from registries or ConfigMaps. It never runs a module:
//! the runtime does (`slinky-runtime`), on the bytes this crate vouches for.
//!
//! # The artifact
//! A plugin is an OCI image manifest (`application/vnd.oci.image.manifest.v1+json`) with the
//! Wasm OCI artifact layout (as `wkg oci push` and the CNCF TAG Runtime's wasm artifact guidance
//! make it): config `application/vnd.wasm.config.v0+json`, one layer `application/wasm` holding the
//! component.
//!
//! # Guarantees
//! * Content addressed: a pull needs a reference pinned by digest, the manifest's bytes must hash
//!   to it and the component's bytes to the layer digest; nothing else is trusted.
//! * Kept: what was pulled (and the modules that served) is kept in a [`DigestStore`] and
//!   re-verified on every read, so a host restarts with its plugins while the registry is down.
//! * Signatures (`cosign sign --key`'s layouts: cosign 2's `.sig` tag, cosign 3's Sigstore bundle
//!   referrer) are verified against the configured ECDSA P-256
//!   key; only verified ones are kept, and they are checked again with today's key when read.
//! * Plain HTTP only to a loopback registry or one listed in `--insecure-registry`.
//! * Through the HTTP proxy the environment names (`HTTPS_PROXY`, `NO_PROXY`, …), by `CONNECT`
//!   tunnels ([`Proxies`]).
//! * Credentials (a Docker config, [`Credentials`]) only to the registry they are for and the
//!   token realm it names.

mod bundle;
mod cosign;
mod credentials;
mod error;
mod keys;
mod module;
mod proxy;
mod pull;
mod push;
mod reference;
mod registry;
mod store;

use std::time::Duration;

use sha2::{Digest, Sha256};

pub use credentials::Credentials;
pub use error::OciError;
pub use keys::{PublicKey, SigningKey};
pub use module::{ANY_NAMESPACE, Decode, Fetched, ModuleSource};
pub use proxy::{Proxies, shown as proxy_without_credentials};
pub use pull::Pulled;
pub use reference::Reference;
pub use registry::Oci;
pub use store::DigestStore;

/// The manifest media type of plugin artifacts.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of an OCI image index (a referrers list is one).
const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
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

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use serde_json::json;

    use super::*;
    use crate::{cosign::check_signature, registry::absolute};

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
        let at = |r: &str| Reference::parse(&format!("{r}@{digest}")).unwrap_or_else(|e| panic!("{e}"));
        let here = at("r.io:5000/site/gpu");
        let payload = serde_json::to_vec(&json!({"critical": {
            "identity": {"docker-reference": "r.io:5000/site/gpu"},
            "image": {"docker-manifest-digest": digest}}}))
        .map_err(|e| OciError::Content(e.to_string()))?;
        let sig = base64::engine::general_purpose::STANDARD.encode(key.sign(&payload)?);
        assert_eq!(check_signature(&public, &sig, &payload, &digest, &here), Ok(()));
        let other = format!("sha256:{}", "c".repeat(64));
        assert!(check_signature(&public, &sig, &payload, &other, &here).is_err_and(|e| e.contains("copied")));
        assert!(
            check_signature(&public, &sig, &payload, &digest, &at("r.io:5000/tenant/gpu"))
                .is_err_and(|e| e.contains("made for the repository")),
            "the same artifact copied to another repository"
        );
        let (_, stranger) = SigningKey::generate()?;
        let stranger = PublicKey::from_pem(&stranger)?;
        assert!(
            check_signature(&stranger, &sig, &payload, &digest, &here)
                .is_err_and(|e| e.contains("does not verify"))
        );
        // A rotation: the old and the new key in one file; either verifies.
        let both = PublicKey::from_pem(&format!("{}{}", stranger.to_pem(), public.to_pem()))?;
        assert_eq!(both.len(), 2);
        assert_eq!(check_signature(&both, &sig, &payload, &digest, &here), Ok(()));
        assert!(
            PublicKey::from_pem(&format!(
                "{}-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                public.to_pem()
            ))
            .is_err_and(|e| e.to_string().contains("block 2"))
        );
        let hub = Reference::parse(&format!("docker.io/site/gpu@{digest}")).unwrap_or_else(|e| panic!("{e}"));
        let hub_payload = serde_json::to_vec(&json!({"critical": {
            "identity": {"docker-reference": "index.docker.io/site/gpu"},
            "image": {"docker-manifest-digest": digest}}}))
        .map_err(|e| OciError::Content(e.to_string()))?;
        let hub_sig = base64::engine::general_purpose::STANDARD.encode(key.sign(&hub_payload)?);
        assert_eq!(
            check_signature(&public, &hub_sig, &hub_payload, &digest, &hub),
            Ok(()),
            "Docker Hub's spellings"
        );
        Ok(())
    }
}
