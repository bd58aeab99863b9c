//! `slinky-host render`: read Controller/NodeSet manifests (and the Secrets and ConfigMaps they
//! reference) and print what the builders make of them, offline, through exactly the plugin path
//! the reconciler uses.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Pod, Secret, Service},
};
use kube::ResourceExt;
use serde_json::Value;
use slinky_api::{API_VERSION, Controller, NodeSet};

use crate::{
    plugins::{
        BuildContext, BuilderKind, ConfigMapFiles, ControllerInputs, Ownership, PluginError, PluginRegistry,
        PodIdentity,
    },
    revision::pod_revision,
};

/// Errors of reading manifests and rendering them; each names the file/object.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A document is not valid YAML/JSON.
    #[error("{at}: not valid YAML or JSON: {reason}")]
    Parse {
        /// `file` or `file (document N)`.
        at: String,
        /// The parser's message.
        reason: String,
    },
    /// A document is not a Controller or NodeSet, or is an invalid one.
    #[error("{at}: {reason}")]
    Invalid {
        /// Where.
        at: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A NodeSet's Controller is not among the inputs.
    #[error(
        "{at}: NodeSet {nodeset} references Controller {controller}, which is not in the input; add it (render needs the Controller to build pods)"
    )]
    MissingController {
        /// Where the NodeSet is.
        at: String,
        /// `namespace/name` of the NodeSet.
        nodeset: String,
        /// `namespace/name` of the missing Controller.
        controller: String,
    },
    /// A builder failed for an object.
    #[error("{at}: {object}: {source}")]
    Build {
        /// Where the parent is.
        at: String,
        /// `Kind namespace/name` of the parent.
        object: String,
        /// The plugin error.
        #[source]
        source: Box<PluginError>,
    },
}

/// A parent object read from a manifest.
#[derive(Debug, Clone)]
pub enum Parent {
    /// A Controller.
    Controller(Box<Controller>),
    /// A NodeSet.
    NodeSet(Box<NodeSet>),
}

/// A parent and where it was read from.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// `file` or `file (document N)`.
    pub at: String,
    /// The object.
    pub parent: Parent,
}

/// A built child object.
#[derive(Debug, Clone)]
pub enum Child {
    /// The Controller's Service.
    Service(Box<Service>),
    /// A NodeSet pod.
    Pod(Box<Pod>),
    /// Another child (a StatefulSet, ConfigMap, Service or PodDisruptionBudget) from a children
    /// builder.
    Object(Box<crate::plugins::Child>),
}

impl Child {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        let v = match self {
            Child::Service(s) => serde_json::to_value(s),
            Child::Pod(p) => serde_json::to_value(p),
            Child::Object(o) => Ok(o.object.clone()),
        };
        v.unwrap_or(Value::Null)
    }

    /// As a YAML document.
    ///
    /// # Errors
    /// A serializer failure (not expected for built objects).
    pub fn to_yaml(&self) -> Result<String, serde_saphyr::SerializeError> {
        match self {
            Child::Service(s) => serde_saphyr::to_string(s),
            Child::Pod(p) => serde_saphyr::to_string(p),
            Child::Object(o) => serde_saphyr::to_string(&o.object),
        }
    }

    /// `Kind name`.
    pub fn describe(&self) -> String {
        match self {
            Child::Service(s) => format!("Service {}", s.name_any()),
            Child::Pod(p) => format!("Pod {}", p.name_any()),
            Child::Object(o) => o.describe(),
        }
    }
}

/// The Secrets and ConfigMaps of the input files: what the Controllers reference (the host reads
/// them from the cluster; `render` from its input).
#[derive(Debug, Clone, Default)]
pub struct References {
    /// Secrets (for the key hashes; their data never reaches a builder).
    pub secrets: Vec<Secret>,
    /// ConfigMaps (for the files they provide).
    pub config_maps: Vec<ConfigMap>,
}

impl References {
    /// The inputs of `controller`'s children builder: its NodeSets among `manifests`, the key
    /// hashes of the Secrets it references (empty, with a warning, for one not in the input), the
    /// files of the ConfigMaps it references.
    pub fn inputs(&self, controller: &Controller, manifests: &[Manifest]) -> ControllerInputs {
        let ns = controller.namespace().unwrap_or_default();
        let mut nodesets: Vec<NodeSet> = manifests
            .iter()
            .filter_map(|m| match &m.parent {
                Parent::NodeSet(n) => Some(n.as_ref().clone()),
                Parent::Controller(_) => None,
            })
            .filter(|n| n.controller_namespace() == ns && n.spec.controller_ref.name == controller.name_any())
            .collect();
        nodesets.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let hash = |field: &str, r: &Option<k8s_openapi::api::core::v1::SecretKeySelector>| -> String {
            let Some(r) = r else { return String::new() };
            match self
                .secrets
                .iter()
                .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == r.name)
            {
                Some(s) => {
                    let mut data = s.data.clone().unwrap_or_default();
                    for (k, v) in s.string_data.iter().flatten() {
                        data.insert(k.clone(), ByteString(v.as_bytes().to_vec()));
                    }
                    slinky_api::hash::checksum_of_map(data.iter().map(|(k, ByteString(v))| (k, v.as_slice())))
                }
                None => {
                    tracing::warn!(
                        "Secret {ns}/{} ({field}) is not in the input: its key hash is left empty \
                         (add the Secret to the input to render the hash the host would)",
                        r.name
                    );
                    String::new()
                }
            }
        };
        let (slurm_key_hash, jwt_key_hash) = if controller.spec.external {
            (String::new(), String::new())
        } else {
            (
                hash("spec.slurmKeyRef", &controller.spec.slurm_key_ref),
                hash("spec.jwtKeyRef", &controller.spec.jwt_key_ref),
            )
        };
        let config_maps = controller
            .config_map_refs()
            .into_iter()
            .map(|name| {
                let found = self
                    .config_maps
                    .iter()
                    .find(|c| c.namespace().as_deref() == Some(ns.as_str()) && c.name_any() == name);
                if found.is_none() {
                    tracing::warn!(
                        "ConfigMap {ns}/{name} is not in the input: rendered as providing no files"
                    );
                }
                let mut files: Vec<String> = found
                    .iter()
                    .flat_map(|c| {
                        c.data
                            .iter()
                            .flat_map(|d| d.keys().cloned())
                            .chain(c.binary_data.iter().flat_map(|d| d.keys().cloned()))
                    })
                    .collect();
                files.sort();
                ConfigMapFiles { name, files }
            })
            .collect();
        ControllerInputs {
            nodesets,
            slurm_key_hash,
            jwt_key_hash,
            config_maps,
        }
    }
}

/// Read the Secrets and ConfigMaps of YAML (multi-document) or JSON files (what
/// [`read_manifests`] skips).
///
/// # Errors
/// A file that can't be read or parsed, or a Secret/ConfigMap that is not a valid one.
pub fn read_references(paths: &[PathBuf]) -> Result<References, RenderError> {
    let mut out = References::default();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| RenderError::Read {
            path: path.clone(),
            source,
        })?;
        for (i, doc) in yaml_documents(&text).iter().enumerate() {
            let at = format!("{} (document {})", path.display(), i + 1);
            let value: Value = parse_yaml(doc).map_err(|e| RenderError::Parse {
                at: at.clone(),
                reason: e.to_string(),
            })?;
            push_reference(&at, value, &mut out)?;
        }
    }
    Ok(out)
}

fn push_reference(at: &str, value: Value, out: &mut References) -> Result<(), RenderError> {
    let field = |f: &str| {
        value
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let invalid = |reason: String| RenderError::Invalid {
        at: at.to_string(),
        reason,
    };
    match (field("apiVersion").as_str(), field("kind").as_str()) {
        ("v1", "List") => {
            for item in value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                push_reference(at, item, out)?;
            }
        }
        ("v1", "Secret") => {
            let mut s: Secret =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid Secret: {e}")))?;
            default_namespace(&mut s.metadata);
            out.secrets.push(s);
        }
        ("v1", "ConfigMap") => {
            let mut c: ConfigMap =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid ConfigMap: {e}")))?;
            default_namespace(&mut c.metadata);
            out.config_maps.push(c);
        }
        _ => {}
    }
    Ok(())
}

/// Parse one YAML document (or JSON) with YAML 1.2 Core booleans: only `true`/`false`
/// (any case) are booleans, so `name: n` or `value: on` stay strings, as a user writing a
/// manifest means them.
///
/// # Errors
/// The parser's error, with the line and column.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    serde_saphyr::from_str_with_options(text, options)
}

/// The documents of a YAML stream: the text between document markers (`---` at the start of a
/// line, alone or followed by a space), so each can be parsed, and reported, on its own.
pub fn yaml_documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare == "---" || bare.starts_with("--- ") {
            docs.push(&text[start..offset]);
            // Content after the marker on the same line belongs to the next document.
            start = offset + 3;
        }
        offset += line.len();
    }
    docs.push(&text[start..]);
    // Empty documents (a leading `---`, a trailing one) are no documents.
    docs.retain(|d| !d.trim().is_empty());
    docs
}

/// Read every Controller and NodeSet from YAML (multi-document) or JSON files. A `v1` `List`'s
/// items are read too.
///
/// # Errors
/// The first file or document that can't be read, parsed or is not a Controller/NodeSet.
pub fn read_manifests(paths: &[PathBuf]) -> Result<Vec<Manifest>, RenderError> {
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| RenderError::Read {
            path: path.clone(),
            source,
        })?;
        out.extend(parse_manifests(path, &text)?);
    }
    Ok(out)
}

/// Parse manifests from text (see [`read_manifests`]).
///
/// # Errors
/// As [`read_manifests`].
pub fn parse_manifests(path: &Path, text: &str) -> Result<Vec<Manifest>, RenderError> {
    let mut out = Vec::new();
    // Name documents by number when the file has separators.
    let docs = yaml_documents(text);
    let many = docs.len() > 1;
    for (i, doc) in docs.iter().enumerate() {
        let at = if many {
            format!("{} (document {})", path.display(), i + 1)
        } else {
            path.display().to_string()
        };
        let value: Value = parse_yaml(doc).map_err(|e| RenderError::Parse {
            at: at.clone(),
            reason: e.to_string(),
        })?;
        if value.is_null() {
            continue;
        }
        push_object(&at, value, &mut out)?;
    }
    Ok(out)
}

fn push_object(at: &str, value: Value, out: &mut Vec<Manifest>) -> Result<(), RenderError> {
    let invalid = |reason: String| RenderError::Invalid {
        at: at.to_string(),
        reason,
    };
    let field = |f: &str| {
        value
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    match (api_version.as_str(), kind.as_str()) {
        // What the Controllers reference: read by `read_references`.
        ("v1", "Secret" | "ConfigMap") => Ok(()),
        ("v1", "List") => {
            let items = value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (i, item) in items.into_iter().enumerate() {
                push_object(&format!("{at} item {i}"), item, out)?;
            }
            Ok(())
        }
        (API_VERSION, "Controller") => {
            let mut c: Controller =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid Controller: {e}")))?;
            default_namespace(&mut c.metadata);
            require_name(&c.metadata).map_err(invalid)?;
            out.push(Manifest {
                at: at.to_string(),
                parent: Parent::Controller(Box::new(c)),
            });
            Ok(())
        }
        (API_VERSION, "NodeSet") => {
            let mut n: NodeSet =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid NodeSet: {e}")))?;
            default_namespace(&mut n.metadata);
            require_name(&n.metadata).map_err(invalid)?;
            if n.replicas() < 0 {
                return Err(invalid(format!(
                    "NodeSet {}: spec.replicas is {}, it must be 0 or more",
                    n.name_any(),
                    n.replicas()
                )));
            }
            out.push(Manifest {
                at: at.to_string(),
                parent: Parent::NodeSet(Box::new(n)),
            });
            Ok(())
        }
        _ => Err(invalid(format!(
            "unknown kind {kind:?} (apiVersion {api_version:?}): render reads {API_VERSION} Controller and NodeSet objects, and the v1 Secrets and ConfigMaps they reference"
        ))),
    }
}

fn default_namespace(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".into());
    }
}

fn require_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Result<(), String> {
    match meta.name.as_deref() {
        Some(n) if !n.is_empty() => Ok(()),
        _ => Err("metadata.name is missing".into()),
    }
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Build every child of the parents, as [`render_with`] does, without any Secret or ConfigMap
/// in the input (key hashes are empty).
///
/// # Errors
/// The first parent whose Controller is missing or whose builder fails.
pub fn render(
    manifests: &[Manifest],
    plugins: &PluginRegistry,
    ctx: &BuildContext,
) -> Result<Vec<Child>, RenderError> {
    render_with(manifests, &References::default(), plugins, ctx)
}

/// Build every child of the parents, in a stable order: for each Controller (in input order) its
/// children by kind (ConfigMaps, Services, StatefulSet) and name; for each NodeSet its children
/// other than pods (the workers' Service and PodDisruptionBudget once per Controller and
/// namespace, owned by every NodeSet of the input sharing them), then its pods for ordinals
/// `0..replicas`. An external Controller has only its minimal ConfigMap.
///
/// # Errors
/// The first parent whose Controller is missing or whose builder fails.
pub fn render_with(
    manifests: &[Manifest],
    references: &References,
    plugins: &PluginRegistry,
    ctx: &BuildContext,
) -> Result<Vec<Child>, RenderError> {
    let controllers = controllers(manifests);
    let mut children = Vec::new();
    let mut shared_done = BTreeSet::new();
    let build_error = |at: &str, object: String| {
        let at = at.to_string();
        move |source| RenderError::Build {
            at,
            object,
            source: Box::new(source),
        }
    };
    for m in manifests {
        match &m.parent {
            Parent::Controller(c) => {
                let object = format!(
                    "Controller {}",
                    key(&c.namespace().unwrap_or_default(), &c.name_any())
                );
                if let Some(problem) = slinky_api::checks::summary(&c.spec_problems()) {
                    return Err(RenderError::Invalid {
                        at: m.at.clone(),
                        reason: format!("Controller {}: {problem}", c.name_any()),
                    });
                }
                let mut built = Vec::new();
                if c.spec.external {
                    tracing::info!(controller = %c.name_any(), "external Controller: no Service, StatefulSet or internal Service to build");
                } else {
                    let plugin = plugins.active(BuilderKind::ControllerService);
                    let svc = plugin
                        .build_service(ctx, c)
                        .map_err(build_error(&m.at, object.clone()))?;
                    built.push(crate::plugins::Child {
                        kind: crate::plugins::ChildKind::Service,
                        ownership: Ownership::Controlled,
                        object: serde_json::to_value(&svc).unwrap_or_default(),
                    });
                }
                let inputs = references.inputs(c, manifests);
                let plugin = plugins.active(BuilderKind::ControllerChildren);
                built.extend(
                    plugin
                        .build_controller_children(ctx, c, &inputs)
                        .map_err(build_error(&m.at, object))?,
                );
                built.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
                children.extend(built.into_iter().map(|o| Child::Object(Box::new(o))));
            }
            Parent::NodeSet(n) => {
                let ns = n.namespace().unwrap_or_default();
                let (ctl_ns, ctl_name) = (n.controller_namespace(), n.spec.controller_ref.name.as_str());
                let controller = controllers
                    .iter()
                    .find(|c| c.namespace().as_deref() == Some(ctl_ns) && c.name_any() == ctl_name)
                    .ok_or_else(|| RenderError::MissingController {
                        at: m.at.clone(),
                        nodeset: key(&ns, &n.name_any()),
                        controller: key(ctl_ns, ctl_name),
                    })?;
                // What the host would refuse with an InvalidSpec condition, render refuses too.
                if let Some(problem) = slinky_api::checks::summary(&n.spec_problems()) {
                    return Err(RenderError::Invalid {
                        at: m.at.clone(),
                        reason: format!("NodeSet {}: {problem}", n.name_any()),
                    });
                }
                let object = format!("NodeSet {}", key(&ns, &n.name_any()));
                let plugin = plugins.active(BuilderKind::NodesetChildren);
                let mut built = plugin
                    .build_nodeset_children(ctx, n, controller)
                    .map_err(build_error(&m.at, object.clone()))?;
                let sharing: Vec<&NodeSet> = manifests
                    .iter()
                    .filter_map(|m| match &m.parent {
                        Parent::NodeSet(o) => Some(o.as_ref()),
                        Parent::Controller(_) => None,
                    })
                    .filter(|o| {
                        o.namespace().as_deref() == Some(ns.as_str())
                            && o.spec.controller_ref.name == ctl_name
                    })
                    .collect();
                let owners = slinky_api::owners::shared_refs(sharing);
                built.retain(|c| {
                    c.ownership == Ownership::Controlled
                        || shared_done.insert((c.kind, ns.clone(), c.name().to_string()))
                });
                for c in built.iter_mut().filter(|c| c.ownership == Ownership::Shared) {
                    c.set_owners(owners.clone());
                }
                built.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
                children.extend(built.into_iter().map(|o| Child::Object(Box::new(o))));
                let plugin = plugins.active(BuilderKind::NodesetPod);
                let revision = pod_revision(n, controller, plugin.digest(), ctx);
                for ordinal in 0..u32::try_from(n.replicas()).unwrap_or(0) {
                    let identity = PodIdentity::for_ordinal(n, ordinal, &revision);
                    let pod = plugin
                        .build_pod(ctx, n, controller, &identity)
                        .map_err(build_error(&m.at, object.clone()))?;
                    children.push(Child::Pod(Box::new(pod)));
                }
            }
        }
    }
    Ok(children)
}

/// The Controllers among `manifests`.
pub fn controllers(manifests: &[Manifest]) -> Vec<&Controller> {
    manifests
        .iter()
        .filter_map(|m| match &m.parent {
            Parent::Controller(c) => Some(c.as_ref()),
            Parent::NodeSet(_) => None,
        })
        .collect()
}

/// Kubernetes YAML: one document per object, separated by `---`.
///
/// # Errors
/// A serializer failure.
pub fn to_yaml(children: &[Child]) -> Result<String, serde_saphyr::SerializeError> {
    let docs = children
        .iter()
        .map(Child::to_yaml)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

/// A `v1` `List` of the objects.
pub fn to_json_list(children: &[Child]) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": children.iter().map(Child::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod document_tests {
    use super::yaml_documents;

    #[test]
    fn documents_are_split_at_their_markers() {
        assert_eq!(yaml_documents("a: 1\n"), ["a: 1\n"]);
        assert_eq!(yaml_documents("---\na: 1\n---\nb: 2\n"), ["\na: 1\n", "\nb: 2\n"]);
        assert_eq!(
            yaml_documents("a: |\n  ---x\n--- \nb: 2"),
            ["a: |\n  ---x\n", " \nb: 2"]
        );
        assert!(yaml_documents("").is_empty());
        assert_eq!(yaml_documents("a: 1\n---\n"), ["a: 1\n"]);
    }
}
