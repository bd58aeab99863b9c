//! A BuilderPlugin's module, where its spec says it is: pulled from an OCI registry by digest
//! (its cosign signature verified when keys are configured), or read from a ConfigMap; decoded
//! as the runtime loads it, and checked against the digest the spec pins. Every refusal is a
//! [`Failure`] of the BuilderPlugin's `Loaded` condition, whose reason says which.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use slinky_api::{ConfigMapModule, PluginModule, conditions::LOADED, failure::Failure};

use crate::{DigestStore, Oci, OciError, PublicKey, Reference, sha256};

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
            decode,
            config_map_namespaces: vec![own],
        }
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

    /// The module `spec` names, decoded and checked against `spec.digest`.
    ///
    /// # Errors
    /// A `Loaded` failure: `InvalidSpec`, `PullFailed`, `UnknownDigest`, `BadSignature`,
    /// `ModuleUnreadable` or `Refused` (bytes that do not decode).
    pub async fn fetch(&self, spec: &PluginModule) -> Result<Fetched, Failure> {
        let (raw, label) = match (&spec.image, &spec.config_map) {
            (Some(image), None) => self.pull(image).await?,
            (None, Some(cm)) => {
                // The schema requires it; one stored before the rule is refused here.
                if spec.digest.is_none() {
                    return Err(refused("InvalidSpec", slinky_api::CONFIG_MAP_PIN));
                }
                let allowed = &self.config_map_namespaces;
                if !allowed.iter().any(|n| n == ANY_NAMESPACE || *n == cm.namespace) {
                    return Err(refused(
                        "InvalidSpec",
                        format!(
                            "spec.module.configMap is in namespace {:?}, but this host reads ConfigMap modules \
                             only from {} (its --plugin-configmap-namespace): keep the module's ConfigMap \
                             there (whoever may edit a ConfigMap in {:?} would choose the code of every pod \
                             this step builds), or have the host's admin add the namespace",
                            cm.namespace,
                            allowed.join(", "),
                            cm.namespace
                        ),
                    ));
                }
                self.read_config_map(cm).await?
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
        Ok(Fetched { bytes, label, digest })
    }

    async fn pull(&self, image: &str) -> Result<(Vec<u8>, String), Failure> {
        let reference =
            Reference::parse(image).map_err(|e| refused("InvalidSpec", format!("spec.module.image: {e}")))?;
        let pulled = self.oci.pull(&reference).await.map_err(|e| {
            let reason = match &e {
                OciError::Content(m) if m.starts_with("unknown digest") => "UnknownDigest",
                OciError::Reference(..) => "InvalidSpec",
                _ => "PullFailed",
            };
            refused(reason, format!("cannot pull {image}: {e}"))
        })?;
        if let Some(key) = &self.public_key {
            self.oci
                .verify(&reference, &pulled.manifest_digest, key)
                .await
                .map_err(|e| refused("BadSignature", format!("{image}: {e}")))?;
        }
        Ok((pulled.wasm, image.to_string()))
    }

    async fn read_config_map(&self, cm: &ConfigMapModule) -> Result<(Vec<u8>, String), Failure> {
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
        bytes.map(|b| (b, label.clone())).ok_or_else(|| {
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
