//! Object metadata (`ValidateObjectMeta`, `ValidateObjectMetaUpdate`): names and `generateName`
//! by kind, labels, annotations, owner references, finalizers.

use std::collections::BTreeSet;

use serde_json::Value;
use slinky_api::validation as rules;

use super::{Errors, FieldError, Path, each_invalid, items, str_of};
use crate::resources::ResourceType;

/// How a kind's names are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameRule {
    /// DNS-1123 subdomain (most kinds).
    Subdomain,
    /// DNS-1123 label (Namespaces).
    Label,
    /// DNS-1035 label (Services).
    Dns1035,
    /// A URL path segment (RBAC kinds: `system:controller:x` is a valid Role name).
    PathSegment,
}

fn name_rule(rt: &ResourceType) -> NameRule {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "namespaces") => NameRule::Label,
        ("", "services") => NameRule::Dns1035,
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

/// `generateName` prefixes may end in a dash (the random suffix follows).
fn mask_trailing_dash(name: &str) -> String {
    match name.strip_suffix('-') {
        Some(rest) if !rest.is_empty() => format!("{rest}a"),
        _ => name.to_string(),
    }
}

/// `path.IsValidPathSegmentName` (what `ValidateRBACName` checks of a name and of a
/// `generateName` prefix alike).
pub(super) fn path_segment(name: &str) -> Vec<String> {
    if name == "." || name == ".." {
        return vec![format!("may not be '{name}'")];
    }
    let mut errs = Vec::new();
    for bad in ["/", "%"] {
        if name.contains(bad) {
            errs.push(format!("may not contain '{bad}'"));
        }
    }
    errs
}

fn check_name(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    let name = if prefix && rule != NameRule::PathSegment {
        mask_trailing_dash(name)
    } else {
        name.to_string()
    };
    match rule {
        NameRule::Subdomain => rules::dns1123_subdomain(&name),
        NameRule::Label => rules::dns1123_label(&name),
        NameRule::Dns1035 => rules::dns1035_label(&name),
        NameRule::PathSegment => path_segment(&name),
    }
}

/// `ValidateLabels`: keys qualified names, values label values; errors on the map's path.
pub(crate) fn labels(map: Option<&Value>, field: &Path) -> Errors {
    let mut errs = Errors::new();
    for (k, v) in map.and_then(Value::as_object).into_iter().flatten() {
        errs.extend(each_invalid(field, k, rules::qualified_name(k)));
        let v = v.as_str().unwrap_or_default();
        errs.extend(each_invalid(field, v, rules::label_value(v)));
    }
    errs
}

fn annotations(map: Option<&Value>, field: &Path) -> Errors {
    let mut errs = Errors::new();
    let mut total = 0;
    for (k, v) in map.and_then(Value::as_object).into_iter().flatten() {
        errs.extend(each_invalid(field, k, rules::qualified_name(&k.to_lowercase())));
        total += k.len() + v.as_str().map_or(0, str::len);
    }
    if total > rules::TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(field, rules::TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

fn owner_references(refs: &[Value], field: &Path) -> Errors {
    let mut errs = Errors::new();
    let mut controllers = Vec::new();
    for r in refs {
        let api_version = str_of(r, "apiVersion").unwrap_or_default();
        let version = api_version.rsplit('/').next().unwrap_or_default();
        if version.is_empty() {
            errs.push(FieldError::invalid(
                &field.child("apiVersion"),
                api_version,
                "version must not be empty",
            ));
        }
        for (key, what) in [("kind", "kind"), ("name", "name"), ("uid", "uid")] {
            let v = str_of(r, key).unwrap_or_default();
            if v.is_empty() {
                errs.push(FieldError::invalid(
                    &field.child(key),
                    v,
                    format!("{what} must not be empty"),
                ));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers.push(format!(
                "{}/{}",
                str_of(r, "kind").unwrap_or_default(),
                str_of(r, "name").unwrap_or_default()
            ));
        }
    }
    if controllers.len() > 1 {
        errs.push(FieldError::invalid(
            field,
            Value::Array(refs.to_vec()),
            format!(
                "Only one reference can have Controller set to true. Found \"true\" in references for {}",
                controllers.join(" and ")
            ),
        ));
    }
    errs
}

const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

fn finalizers(list: &[Value], field: &Path) -> Errors {
    let mut errs = Errors::new();
    let names: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
    for (i, f) in names.iter().enumerate() {
        errs.extend(each_invalid(field, f, rules::qualified_name(f)));
        if !f.contains('/') && !STANDARD_FINALIZERS.contains(f) {
            errs.push(FieldError::invalid(
                &field.index(i),
                *f,
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    if names.contains(&"orphan") && names.contains(&"foregroundDeletion") {
        errs.push(FieldError::invalid(
            field,
            Value::Array(list.to_vec()),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

/// Metadata of a create (`old` is `None`) or an update.
pub(crate) fn object_meta(rt: &ResourceType, new: &Value, old: Option<&Value>) -> Errors {
    let field = Path::root("metadata");
    let empty = Value::Null;
    let meta = new.get("metadata").unwrap_or(&empty);
    let mut errs = Errors::new();
    let rule = name_rule(rt);
    if old.is_none()
        && let Some(prefix) = str_of(meta, "generateName").filter(|g| !g.is_empty())
    {
        errs.extend(each_invalid(
            &field.child("generateName"),
            prefix,
            check_name(rule, prefix, true),
        ));
    }
    match str_of(meta, "name").filter(|n| !n.is_empty()) {
        None => errs.push(FieldError::required(
            &field.child("name"),
            "name or generateName is required",
        )),
        Some(name) if old.is_none() => {
            errs.extend(each_invalid(
                &field.child("name"),
                name,
                check_name(rule, name, false),
            ));
        }
        Some(_) => {}
    }
    errs.extend(labels(meta.get("labels"), &field.child("labels")));
    errs.extend(annotations(meta.get("annotations"), &field.child("annotations")));
    errs.extend(owner_references(
        items(meta, "ownerReferences"),
        &field.child("ownerReferences"),
    ));
    let new_finalizers = items(meta, "finalizers");
    if old.is_none() {
        errs.extend(finalizers(new_finalizers, &field.child("finalizers")));
    }
    if let Some(old) = old
        && old.pointer("/metadata/deletionTimestamp").is_some()
    {
        // Finalizers cannot be added once the object is being deleted.
        let before: BTreeSet<&str> = items(&old["metadata"], "finalizers")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let extra: Vec<String> = new_finalizers
            .iter()
            .filter_map(Value::as_str)
            .filter(|f| !before.contains(f))
            .map(|f| format!("{f:?}"))
            .collect();
        if !extra.is_empty() {
            errs.push(FieldError::forbidden(
                &field.child("finalizers"),
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    extra.join(", ")
                ),
            ));
        }
    }
    errs
}
