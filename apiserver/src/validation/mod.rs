//! Validation like kube-apiserver's, for the built-in kinds this server serves: object metadata
//! (names and `generateName` per kind, labels, annotations, owner references, finalizers),
//! Pods (create and the update immutability rules), Services, ConfigMaps and Secrets,
//! PersistentVolumeClaims (created), Events (their length limits), Deployments, ReplicaSets, StatefulSets,
//! ControllerRevisions, PodDisruptionBudgets, Leases, Namespaces and the RBAC kinds. The rules follow Kubernetes' `pkg/apis/core/validation` and apimachinery's
//! `objectmeta.go`; the messages and field paths are kube-apiserver's, so a client sees the same
//! `422 Invalid` `Status` (with `details.causes[].field`) from both. The name and value rules
//! themselves live in [`slinky_api::validation`], shared with the host.

mod budget;
mod claim;
mod data;
mod event;
mod meta;
mod pod;
mod rbac;
mod revision;
mod service;
mod workload;

pub(crate) use pod::bad_quantities;
pub(crate) use rbac::defaults as rbac_defaults;

use serde_json::{Value, json};

use crate::{ApiError, resources::ResourceType};

/// Why a field is wrong (Kubernetes' `field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    /// A value that was looked for is not there (`FieldValueNotFound`).
    NotFound,
    /// A value is missing (`FieldValueRequired`).
    Required,
    /// A value that must be unique is not (`FieldValueDuplicate`).
    Duplicate,
    /// A malformed value (`FieldValueInvalid`).
    Invalid,
    /// A value outside an enumeration (`FieldValueNotSupported`).
    NotSupported,
    /// A value that may not be set (`FieldValueForbidden`).
    Forbidden,
    /// A value over a size limit (`FieldValueTooLong`).
    TooLong,
}

impl ErrorType {
    /// The `reason` of a `StatusCause`.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
        }
    }

    fn text(self) -> &'static str {
        match self {
            ErrorType::NotFound => "Not found",
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
        }
    }

    /// Types whose message carries no value.
    fn omits_value(self) -> bool {
        matches!(
            self,
            ErrorType::Required | ErrorType::Forbidden | ErrorType::TooLong
        )
    }
}

/// One field-level error (Kubernetes' `field.Error`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldError {
    /// What is wrong.
    pub(crate) kind: ErrorType,
    /// The field path (`spec.containers[0].image`).
    pub(crate) field: String,
    /// The bad value (shown in the message for most types).
    pub(crate) value: Value,
    /// The explanation.
    pub(crate) detail: String,
    /// The value as kube-apiserver prints it, when [`render_value`] cannot (Go's `%#v` of a map
    /// or a struct).
    rendered: Option<String>,
}

impl FieldError {
    fn new(kind: ErrorType, field: &Path, value: Value, detail: impl Into<String>) -> Self {
        FieldError {
            kind,
            field: field.0.clone(),
            value,
            detail: detail.into(),
            rendered: None,
        }
    }

    /// `Invalid value: <rendered>: detail`, the value already printed as Go prints it.
    pub(crate) fn invalid_rendered(field: &Path, rendered: String, detail: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorType::Invalid, field, Value::Null, detail);
        e.rendered = Some(rendered);
        e
    }

    /// `Required value[: detail]`.
    pub(crate) fn required(field: &Path, detail: &str) -> Self {
        Self::new(ErrorType::Required, field, Value::Null, detail)
    }

    /// `Invalid value: <value>: detail`.
    pub(crate) fn invalid(field: &Path, value: impl Into<Value>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, field, value.into(), detail)
    }

    /// `Duplicate value: <value>`.
    pub(crate) fn duplicate(field: &Path, value: impl Into<Value>) -> Self {
        Self::new(ErrorType::Duplicate, field, value.into(), "")
    }

    /// `Not found: <value>`.
    pub(crate) fn not_found(field: &Path, value: impl Into<Value>) -> Self {
        Self::new(ErrorType::NotFound, field, value.into(), "")
    }

    /// `Unsupported value: <value>: supported values: "a", "b"`.
    pub(crate) fn not_supported(field: &Path, value: impl Into<Value>, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self::new(
            ErrorType::NotSupported,
            field,
            value.into(),
            format!("supported values: {}", list.join(", ")),
        )
    }

    /// `Unsupported value: <rendered>: supported values: …`, the value already printed as Go
    /// prints it.
    pub(crate) fn not_supported_rendered(field: &Path, rendered: String, supported: &[&str]) -> Self {
        let mut e = Self::not_supported(field, Value::Null, supported);
        e.rendered = Some(rendered);
        e
    }

    /// `Forbidden: detail`.
    pub(crate) fn forbidden(field: &Path, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, field, Value::Null, detail)
    }

    /// `Too long: must have at most N bytes`.
    pub(crate) fn too_long(field: &Path, max: usize) -> Self {
        Self::new(
            ErrorType::TooLong,
            field,
            Value::Null,
            format!("must have at most {max} bytes"),
        )
    }

    /// The message without the field (Kubernetes' `ErrorBody`).
    pub(crate) fn body(&self) -> String {
        let mut s = self.kind.text().to_string();
        if !self.kind.omits_value() {
            s.push_str(": ");
            match &self.rendered {
                Some(r) => s.push_str(r),
                None => s.push_str(&render_value(&self.value)),
            }
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

/// A bad value as kube-apiserver prints it: strings quoted, numbers and booleans bare, lists of
/// strings as Go prints a `[]string`, and a nil value as the string `"null"` (Go's `ErrorBody`
/// replaces nil with "null", then quotes it as any string).
fn render_value(v: &Value) -> String {
    match v {
        Value::Null => "\"null\"".into(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            let inner: Vec<String> = items.iter().map(render_value).collect();
            format!("[]string{{{}}}", inner.join(", "))
        }
        other => other.to_string(),
    }
}

/// A list of field errors.
pub(crate) type Errors = Vec<FieldError>;

/// A field path under construction (`spec`, `.containers`, `[0]`, `[key]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Path(String);

impl Path {
    /// A top-level field.
    pub(crate) fn root(name: &str) -> Self {
        Path(name.to_string())
    }

    /// A child field.
    pub(crate) fn child(&self, name: &str) -> Self {
        Path(format!("{}.{name}", self.0))
    }

    /// A list item.
    pub(crate) fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }

    /// A map entry.
    pub(crate) fn key(&self, k: &str) -> Self {
        Path(format!("{}[{k}]", self.0))
    }
}

/// Each message of a rule as an `Invalid` error of `field` with `value`.
pub(crate) fn each_invalid(field: &Path, value: &str, messages: Vec<String>) -> Errors {
    messages
        .into_iter()
        .map(|m| FieldError::invalid(field, value, m))
        .collect()
}

/// A string field of an object.
pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// The items of a list field (none when absent or not a list).
pub(crate) fn items<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// Validate a write of a built-in or custom object: `old` is the stored object for an update,
/// `None` for a create. Status-only writes are not validated here.
pub(crate) fn validate(rt: &ResourceType, new: &Value, old: Option<&Value>) -> Errors {
    if rt.group == rbac::GROUP {
        return rbac::validate(rt, new, old);
    }
    let mut errs = meta::object_meta(rt, new, old);
    let spec = Path::root("spec");
    match (rt.group.as_str(), rt.plural.as_str(), old) {
        ("", "pods", None) => errs.extend(pod::pod(new)),
        ("", "pods", Some(old)) => errs.extend(pod::pod_update(new, old)),
        ("", "services", _) => errs.extend(service::service(new, old)),
        ("", "configmaps", _) => errs.extend(data::config_map(new)),
        ("", "secrets", _) => errs.extend(data::secret(new)),
        ("", "persistentvolumeclaims", None) => errs.extend(claim::claim(new)),
        ("", "events", _) => errs.extend(event::event(new)),
        ("apps", "deployments", old) => errs.extend(workload::deployment(new, old)),
        ("apps", "replicasets", old) => errs.extend(workload::replicaset(new, old)),
        ("apps", "statefulsets", None) => errs.extend(workload::statefulset(new)),
        ("apps", "controllerrevisions", old) => errs.extend(revision::controller_revision(new, old)),
        ("policy", "poddisruptionbudgets", _) => errs.extend(budget::budget(new)),
        ("coordination.k8s.io", "leases", _) => {
            let s = new.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(d) = s.get("leaseDurationSeconds").and_then(Value::as_i64)
                && d <= 0
            {
                errs.push(FieldError::invalid(
                    &spec.child("leaseDurationSeconds"),
                    d,
                    "must be greater than 0",
                ));
            }
            if let Some(t) = s.get("leaseTransitions").and_then(Value::as_i64)
                && t < 0
            {
                errs.push(FieldError::invalid(
                    &spec.child("leaseTransitions"),
                    t,
                    "must be greater than or equal to 0",
                ));
            }
        }
        _ => {}
    }
    errs
}

/// The `422 Invalid` error of `errs`, like kube-apiserver's (`Kind "name" is invalid: …`, causes
/// with `reason`, `message` and `field`). Every error is a cause; the message names each
/// distinct one once (Go's `ErrorList.ToAggregate` drops repeats).
pub(crate) fn invalid(rt: &ResourceType, name: &str, errs: &[FieldError]) -> ApiError {
    let mut parts: Vec<String> = Vec::new();
    for e in errs {
        let part = format!("{}: {}", e.field, e.body());
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    let text = match parts.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let kind = if rt.group.is_empty() {
        rt.kind.clone()
    } else {
        format!("{}.{}", rt.kind, rt.group)
    };
    let mut e = ApiError::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {text}"));
    e.details = Some(json!({
        "name": name, "group": rt.group, "kind": rt.kind,
        "causes": errs.iter().map(|e| json!({"reason": e.kind.reason(), "message": e.body(), "field": e.field})).collect::<Vec<_>>(),
    }));
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_like_kube_apiservers() {
        let p = Path::root("spec").child("containers").index(0);
        assert_eq!(
            FieldError::required(&p.child("image"), "").body(),
            "Required value"
        );
        assert_eq!(
            FieldError::duplicate(&p.child("name"), "c").body(),
            "Duplicate value: \"c\""
        );
        assert_eq!(
            FieldError::invalid(&p.child("port"), 70000, "must be between 1 and 65535, inclusive").body(),
            "Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            FieldError::not_supported(&p, "Sometimes", &["Always", "OnFailure", "Never"]).body(),
            "Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
        );
        assert_eq!(
            FieldError::invalid(&p, json!(["10.96.0.1"]), "may not change once set").body(),
            "Invalid value: []string{\"10.96.0.1\"}: may not change once set"
        );
        assert_eq!(Path::root("data").key("bad key!").0, "data[bad key!]");
    }
}
