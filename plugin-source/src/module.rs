//! A BuilderPlugin's module, where its spec says it is: pulled from an OCI registry by digest
//! (its cosign signature verified when keys are configured), or read from a ConfigMap (its
//! `<key>.sig` verified when keys are configured); decoded as the runtime loads it, and checked
//! against the digest the spec pins. Closed by default: a host without keys runs no registry
//! module unless its admin allows unsigned ones. Every refusal is a [`Failure`] of the
//! BuilderPlugin's `Loaded` condition, whose reason says which.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use slinky_api::{ConfigMapModule, PluginModule, conditions::LOADED, failure::Failure};

use crate::{DigestStore, Oci, OciError, PublicKey, Reference, cosign::check_blob_signature, sha256};

/// The store's record of a ConfigMap module's signature that verified (checked again, under
/// today's keys, before the kept module is trusted again).
const BLOB_SIGNATURE: &str = "blob-signature";

/// How fetched bytes become the component the runtime loads (a gzipped module is unpacked).
pub type Decode = fn(Vec<u8>) -> Result<Vec<u8>, String>;

/// A module as fetched.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The component.
    pub bytes: Vec<u8>,
    /// Where it came from, for messages (`registry/repo@sha256:…`, `ConfigMap ns/name key k`).
    pub label: String,
    /// The component's `sha256:<hex>`.
    pub digest: String,
}

/// Where modules come from, and whether to trust them.
pub struct ModuleSource {
    oci: Oci,
    kube: kube::Client,
    public_key: Option<PublicKey>,
    /// Without keys, registry modules pinned only by digest run (`--allow-unsigned-plugins`).
    allow_unsigned: bool,
    decode: Decode,
    /// The namespaces ConfigMap modules may be read from (`*`: any).
    config_map_namespaces: Vec<String>,
}

/// Every namespace, in [`ModuleSource::with_config_map_namespaces`].
pub const ANY_NAMESPACE: &str = "*";

impl std::fmt::Debug for ModuleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleSource")
            .field("verifies", &self.public_key.is_some())
            .field("allow_unsigned", &self.allow_unsigned)
            .finish_non_exhaustive()
    }
}

fn refused(reason: &'static str, message: impl Into<String>) -> Failure {
    Failure::new(LOADED, reason, message)
}

impl ModuleSource {
    /// Modules pulled with `oci` or read with `kube`, their signatures verified with
    /// `public_key` when given, decoded with `decode`; ConfigMap modules only from `kube`'s
    /// default namespace (the host's own, in a cluster).
    pub fn new(oci: Oci, kube: kube::Client, public_key: Option<PublicKey>, decode: Decode) -> ModuleSource {
        let own = kube.default_namespace().to_string();
        ModuleSource {
            oci,
            kube,
            public_key,
            allow_unsigned: false,
            decode,
            config_map_namespaces: vec![own],
        }
    }

    /// Without keys, run registry modules pinned only by digest (the admin's explicit choice:
    /// by default a host without keys refuses every registry module as `Unverified`). No effect
    /// with keys.
    #[must_use]
    pub fn allowing_unsigned(mut self, allow: bool) -> ModuleSource {
        self.allow_unsigned = allow;
        self
    }

    /// ConfigMap modules only from `namespaces` ([`ANY_NAMESPACE`]: from any, which lets whoever
    /// may write a ConfigMap anywhere replace the code a BuilderPlugin pins, when the pin is
    /// changed too). An empty list keeps the default.
    #[must_use]
    pub fn with_config_map_namespaces(mut self, namespaces: Vec<String>) -> ModuleSource {
        if !namespaces.is_empty() {
            self.config_map_namespaces = namespaces;
        }
        self
    }

    /// The namespaces ConfigMap modules are read from.
    pub fn config_map_namespaces(&self) -> &[String] {
        &self.config_map_namespaces
    }

    /// Where modules that served are kept.
    pub fn store(&self) -> &DigestStore {
        &self.oci.store
    }

    /// Whether signatures are verified.
    pub fn verifies(&self) -> bool {
        self.public_key.is_some()
    }

    /// Whether a registry module may run at all: with keys (its signature is then checked), or
    /// without them where the admin allowed unsigned modules.
    fn admits_registry(&self, image: &str) -> Result<(), Failure> {
        if self.public_key.is_some() || self.allow_unsigned {
            return Ok(());
        }
        Err(refused(
            "Unverified",
            format!(
                "{image}: this host has no public key to verify registry modules with, and runs none \
                 unverified: give it the key the module is signed with (`run --plugin-public-key`; Helm: \
                 builderPlugins.publicKeySecret), or, to run modules pinned only by digest, have its admin \
                 start it with --allow-unsigned-plugins (Helm: builderPlugins.allowUnsigned)"
            ),
        ))
    }

    /// Whether a ConfigMap in `namespace` may hold modules.
    fn admits_namespace(&self, namespace: &str) -> Result<(), Failure> {
        let allowed = &self.config_map_namespaces;
        if allowed.iter().any(|n| n == ANY_NAMESPACE || n == namespace) {
            return Ok(());
        }
        Err(refused(
            "InvalidSpec",
            format!(
                "spec.module.configMap is in namespace {namespace:?}, but this host reads ConfigMap modules \
                 only from {} (its --plugin-configmap-namespace): keep the module's ConfigMap there \
                 (whoever may edit a ConfigMap in {namespace:?} would choose the code of every pod this \
                 step builds), or have the host's admin add the namespace",
                allowed.join(", "),
            ),
        ))
    }

    /// Whether this host may run again a module it kept (`bytes`, whose digest is `digest`) for
    /// `spec`, on nothing but its own records: a registry module only where registry modules run
    /// at all (with keys the caller fetches it again instead, its signature checked); a
    /// ConfigMap module only from a namespace allowed today and, with keys, only if the
    /// signature it loaded with verifies under **today's** keys.
    ///
    /// # Errors
    /// A `Loaded` failure: `Unverified`, `InvalidSpec` or `BadSignature`.
    pub fn vouch_kept(&self, spec: &PluginModule, digest: &str, bytes: &[u8]) -> Result<(), Failure> {
        if let Some(image) = &spec.image {
            self.admits_registry(image)?;
        }
        let Some(cm) = &spec.config_map else {
            return Ok(());
        };
        self.admits_namespace(&cm.namespace)?;
        let Some(key) = &self.public_key else {
            return Ok(());
        };
        let sig = self
            .store()
            .get_record(digest, BLOB_SIGNATURE)
            .unwrap_or_default();
        check_blob_signature(key, &String::from_utf8_lossy(&sig), bytes).map_err(|e| {
            refused(
                "BadSignature",
                format!(
                    "the kept ConfigMap module {digest} has no signature verifying under today's keys: {e}"
                ),
            )
        })
    }

    /// The module `spec` names, decoded and checked against `spec.digest`.
    ///
    /// # Errors
    /// A `Loaded` failure: `InvalidSpec`, `Unverified`, `PullFailed`, `UnknownDigest`,
    /// `BadSignature`, `ModuleUnreadable` or `Refused` (bytes that do not decode).
    pub async fn fetch(&self, spec: &PluginModule) -> Result<Fetched, Failure> {
        let mut signature = None;
        let (raw, label) = match (&spec.image, &spec.config_map) {
            (Some(image), None) => {
                self.admits_registry(image)?;
                self.pull(image).await?
            }
            (None, Some(cm)) => {
                // The schema requires it; one stored before the rule is refused here.
                if spec.digest.is_none() {
                    return Err(refused("InvalidSpec", slinky_api::CONFIG_MAP_PIN));
                }
                self.admits_namespace(&cm.namespace)?;
                let (raw, label, sig) = self.read_config_map(cm).await?;
                signature = sig;
                (raw, label)
            }
            _ => {
                return Err(refused(
                    "InvalidSpec",
                    "spec.module: set exactly one of image (an OCI reference pinned by digest) and configMap",
                ));
            }
        };
        let bytes = (self.decode)(raw).map_err(|e| refused("Refused", format!("{label}: {e}")))?;
        let digest = sha256(&bytes);
        if let Some(want) = &spec.digest
            && *want != digest
        {
            return Err(refused(
                "UnknownDigest",
                format!(
                    "spec.module.digest is {want}, but the module {label} has {digest}: pin the digest the \
                     module has, or give the module that digest"
                ),
            ));
        }
        if let (Some(key), Some(cm)) = (&self.public_key, &spec.config_map) {
            let sig_key = signature_key(cm);
            let sig = signature.ok_or_else(|| {
                refused(
                    "BadSignature",
                    format!(
                        "the {label} has no signature (key {sig_key:?}), and this host runs only signed modules: \
                         `slinky-host plugin sign plugin.wasm --key signing.key` (or `cosign sign-blob --key \
                         cosign.key --tlog-upload=false --bundle {sig_key} plugin.wasm`), then add \
                         it: `--from-file={sig_key}`"
                    ),
                )
            })?;
            check_blob_signature(key, &sig, &bytes)
                .map_err(|e| refused("BadSignature", format!("the {label}: {e}")))?;
            self.store()
                .put_record(&digest, BLOB_SIGNATURE, sig.trim().as_bytes());
        }
        Ok(Fetched { bytes, label, digest })
    }

    async fn pull(&self, image: &str) -> Result<(Vec<u8>, String), Failure> {
        let reference =
            Reference::parse(image).map_err(|e| refused("InvalidSpec", format!("spec.module.image: {e}")))?;
        let pulled = self.oci.pull(&reference).await.map_err(|e| {
            let reason = match &e {
                OciError::Content(m) if m.starts_with("unknown digest") => "UnknownDigest",
                OciError::Reference(..) => "InvalidSpec",
                // What a digest pins never changes: not fetched again until the spec does.
                OciError::NotAPlugin(..) => "Refused",
                _ => "PullFailed",
            };
            refused(reason, format!("cannot pull {image}: {e}"))
        })?;
        if let Some(key) = &self.public_key {
            self.oci
                .verify(&reference, &pulled.manifest_digest, key)
                .await
                .map_err(|e| match e {
                    // The registry did not answer: a failed pull, retried.
                    OciError::Http { .. } => refused("PullFailed", format!("{image}: {e}")),
                    e => refused("BadSignature", format!("{image}: {e}")),
                })?;
        }
        Ok((pulled.wasm, image.to_string()))
    }

    /// The module's bytes, its label, and its signature if the ConfigMap has one.
    async fn read_config_map(
        &self,
        cm: &ConfigMapModule,
    ) -> Result<(Vec<u8>, String, Option<String>), Failure> {
        let key = cm.key.clone().unwrap_or_else(|| "plugin.wasm".into());
        let label = format!("ConfigMap {}/{} key {key}", cm.namespace, cm.name);
        let unreadable = |m: String| refused("ModuleUnreadable", m);
        let api = Api::<ConfigMap>::namespaced(self.kube.clone(), &cm.namespace);
        let map = api
            .get_opt(&cm.name)
            .await
            .map_err(|e| unreadable(format!("cannot read the {label}: {e}")))?
            .ok_or_else(|| unreadable(format!("the {label} does not exist (yet)")))?;
        let bytes = map
            .binary_data
            .as_ref()
            .and_then(|d| d.get(&key))
            .map(|b| b.0.clone());
        let sig_key = signature_key(cm);
        let signature = map
            .data
            .as_ref()
            .and_then(|d| d.get(&sig_key).cloned())
            .or_else(|| {
                let b = map.binary_data.as_ref()?.get(&sig_key)?;
                String::from_utf8(b.0.clone()).ok()
            });
        bytes.map(|b| (b, label.clone(), signature)).ok_or_else(|| {
            unreadable(format!(
                "the {label} has no binaryData key {key:?} (it has [{}]): `kubectl create configmap {} \
                 --from-file={key}=plugin.wasm`",
                map.binary_data
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                cm.name
            ))
        })
    }
}

/// The ConfigMap key of a module's signature: the module's key and `.sig` (`plugin.wasm.sig`;
/// `plugin.wasm.sig` for a gzipped `plugin.wasm.gz` too: the signature is of the component).
fn signature_key(cm: &ConfigMapModule) -> String {
    let key = cm.key.as_deref().unwrap_or("plugin.wasm");
    format!("{}.sig", key.strip_suffix(".gz").unwrap_or(key))
}
