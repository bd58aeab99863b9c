//! Reading manifests: the Controllers and NodeSets to render, and the Secrets and ConfigMaps
//! they reference, from YAML (multi-document) or JSON files.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use serde_json::Value;
use slinky_api::{API_VERSION, Controller, NodeSet};

use super::{Manifest, Parent, References, RenderError};

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
        (API_VERSION, "RestApi") => {
            let mut r: slinky_api::RestApi =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid RestApi: {e}")))?;
            default_namespace(&mut r.metadata);
            require_name(&r.metadata).map_err(invalid)?;
            out.push(Manifest {
                at: at.to_string(),
                parent: Parent::RestApi(Box::new(r)),
            });
            Ok(())
        }
        (API_VERSION, "LoginSet") => {
            let mut l: slinky_api::LoginSet =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid LoginSet: {e}")))?;
            default_namespace(&mut l.metadata);
            require_name(&l.metadata).map_err(invalid)?;
            out.push(Manifest {
                at: at.to_string(),
                parent: Parent::LoginSet(Box::new(l)),
            });
            Ok(())
        }
        (API_VERSION, "Accounting") => {
            let mut a: slinky_api::Accounting =
                serde_json::from_value(value).map_err(|e| invalid(format!("invalid Accounting: {e}")))?;
            default_namespace(&mut a.metadata);
            require_name(&a.metadata).map_err(invalid)?;
            out.push(Manifest {
                at: at.to_string(),
                parent: Parent::Accounting(Box::new(a)),
            });
            Ok(())
        }
        _ => Err(invalid(format!(
            "unknown kind {kind:?} (apiVersion {api_version:?}): render reads {API_VERSION} Controller, NodeSet, RestApi, LoginSet and Accounting objects, and the v1 Secrets and ConfigMaps they reference"
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
