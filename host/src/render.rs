//! `slinky-host render`: read Controller/NodeSet manifests and print what the builders make of
//! them, offline, through exactly the plugin path the reconciler uses.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use serde_json::Value;
use slinky_api::{API_VERSION, Controller, NodeSet};

use crate::{
    plugins::{BuildContext, BuilderKind, PluginError, PluginRegistry, PodIdentity},
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
}

impl Child {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        let v = match self {
            Child::Service(s) => serde_json::to_value(s),
            Child::Pod(p) => serde_json::to_value(p),
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
        }
    }
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
            "unknown kind {kind:?} (apiVersion {api_version:?}): render reads {API_VERSION} Controller and NodeSet objects"
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

/// Build every child of the parents: each Controller's Service (none for an external
/// Controller), and for each NodeSet its pods for ordinals `0..replicas`.
///
/// # Errors
/// The first parent whose Controller is missing or whose builder fails.
pub fn render(
    manifests: &[Manifest],
    plugins: &PluginRegistry,
    ctx: &BuildContext,
) -> Result<Vec<Child>, RenderError> {
    let controllers = controllers(manifests);
    let mut children = Vec::new();
    for m in manifests {
        match &m.parent {
            Parent::Controller(c) => {
                if c.spec.external {
                    tracing::info!(controller = %c.name_any(), "external Controller: no Service to build");
                    continue;
                }
                if let Some(problem) = slinky_api::checks::summary(&c.name_problems()) {
                    return Err(RenderError::Invalid {
                        at: m.at.clone(),
                        reason: format!("Controller {}: {problem}", c.name_any()),
                    });
                }
                let plugin = plugins.active(BuilderKind::ControllerService);
                let svc = plugin
                    .build_service(ctx, c)
                    .map_err(|source| RenderError::Build {
                        at: m.at.clone(),
                        object: format!(
                            "Controller {}",
                            key(&c.namespace().unwrap_or_default(), &c.name_any())
                        ),
                        source: Box::new(source),
                    })?;
                children.push(Child::Service(Box::new(svc)));
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
                let plugin = plugins.active(BuilderKind::NodesetPod);
                let revision = pod_revision(n, controller, plugin.digest(), ctx);
                for ordinal in 0..u32::try_from(n.replicas()).unwrap_or(0) {
                    let identity = PodIdentity::for_ordinal(n, ordinal, &revision);
                    let pod = plugin
                        .build_pod(ctx, n, controller, &identity)
                        .map_err(|source| RenderError::Build {
                            at: m.at.clone(),
                            object: format!("NodeSet {}", key(&ns, &n.name_any())),
                            source: Box::new(source),
                        })?;
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
