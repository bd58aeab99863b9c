//! `rbac.authorization.k8s.io/v1` Roles, ClusterRoles and their bindings as kube-apiserver 1.28
//! validates them (`pkg/apis/rbac/validation`): rules need verbs and either API groups and
//! resources or non-resource URLs (never in a namespaced Role, never with resources), a
//! ClusterRole's aggregation rule needs selectors that are valid label selectors, a binding's
//! `roleRef` names the RBAC group, a `Role` or `ClusterRole` (a ClusterRoleBinding only a
//! ClusterRole) and a path-segment name, and may not change; each subject has a name and a known
//! kind (a ServiceAccount a subdomain name in the core group, with a namespace in a
//! ClusterRoleBinding; a User or Group the RBAC group). Names are path segments
//! ([`super::meta`]).
//!
//! An update is validated as kube-apiserver's strategies do it: the object's rules twice (the
//! strategy's `Validate…` and again inside `Validate…Update`), then the metadata update and the
//! `roleRef`, so an invalid update lists its causes twice, as the real server does. The defaults
//! (`roleRef.apiGroup`, a User's or Group's `apiGroup`) are set before ([`defaults`]).

use serde_json::Value;
use slinky_api::validation as rules;

use super::{Errors, FieldError, Path, budget, each_invalid, items, meta, str_of};
use crate::resources::ResourceType;

/// The RBAC API group.
pub(crate) const GROUP: &str = "rbac.authorization.k8s.io";

/// `SetDefaults_RoleBinding`, `SetDefaults_ClusterRoleBinding` and `SetDefaults_Subject`: an
/// empty `roleRef.apiGroup` is the RBAC group, an empty subject `apiGroup` the RBAC group for a
/// User or Group.
pub(crate) fn defaults(rt: &ResourceType, obj: &mut Value) {
    if !matches!(rt.plural.as_str(), "rolebindings" | "clusterrolebindings") {
        return;
    }
    if let Some(role_ref) = obj.get_mut("roleRef").and_then(Value::as_object_mut)
        && role_ref
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        role_ref.insert("apiGroup".into(), GROUP.into());
    }
    for subject in obj
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        let kind = subject.get("kind").and_then(Value::as_str).unwrap_or_default();
        let empty = subject
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if empty && matches!(kind, "User" | "Group") {
            subject.insert("apiGroup".into(), GROUP.into());
        }
    }
}

/// Validate a create (`old` is `None`) or an update of an RBAC object, metadata included.
pub(crate) fn validate(rt: &ResourceType, new: &Value, old: Option<&Value>) -> Errors {
    // `ValidateRole` and its siblings validate the metadata as a create does.
    let object = || {
        let mut errs = meta::object_meta(rt, new, None);
        match rt.plural.as_str() {
            "roles" => errs.extend(policy_rules(new, true)),
            "clusterroles" => {
                errs.extend(policy_rules(new, false));
                errs.extend(aggregation_rule(new));
            }
            "rolebindings" => errs.extend(binding(new, true)),
            "clusterrolebindings" => errs.extend(binding(new, false)),
            _ => {}
        }
        errs
    };
    let Some(old) = old else {
        return object();
    };
    let mut errs = object();
    errs.extend(object());
    errs.extend(meta::object_meta(rt, new, Some(old)));
    let is_binding = rt.plural.ends_with("bindings");
    if is_binding && role_ref_of(new) != role_ref_of(old) {
        let (group, kind, name) = role_ref_of(new);
        errs.push(FieldError::invalid_rendered(
            &Path::root("roleRef"),
            format!("rbac.RoleRef{{APIGroup:{group:?}, Kind:{kind:?}, Name:{name:?}}}"),
            "cannot change roleRef",
        ));
    }
    errs
}

/// `ValidatePolicyRule` of each rule (`namespaced` for a Role).
fn policy_rules(obj: &Value, namespaced: bool) -> Errors {
    let mut errs = Errors::new();
    for (i, rule) in items(obj, "rules").iter().enumerate() {
        let at = Path::root("rules").index(i);
        let non_empty = |key: &str| !items(rule, key).is_empty();
        if !non_empty("verbs") {
            errs.push(FieldError::required(
                &at.child("verbs"),
                "verbs must contain at least one value",
            ));
        }
        if non_empty("nonResourceURLs") {
            let urls = rule.get("nonResourceURLs").cloned().unwrap_or(Value::Null);
            if namespaced {
                errs.push(FieldError::invalid(
                    &at.child("nonResourceURLs"),
                    urls.clone(),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if non_empty("apiGroups") || non_empty("resources") || non_empty("resourceNames") {
                errs.push(FieldError::invalid(
                    &at.child("nonResourceURLs"),
                    urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if !non_empty("apiGroups") {
            errs.push(FieldError::required(
                &at.child("apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if !non_empty("resources") {
            errs.push(FieldError::required(
                &at.child("resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
    errs
}

/// A ClusterRole's `aggregationRule`: at least one selector, each a valid label selector (an
/// invalid one is also `invalid label selector.`, with the nil selector Go could not build).
fn aggregation_rule(obj: &Value) -> Errors {
    let mut errs = Errors::new();
    let Some(rule) = obj.get("aggregationRule").filter(|r| !r.is_null()) else {
        return errs;
    };
    let field = Path::root("aggregationRule").child("clusterRoleSelectors");
    let selectors = items(rule, "clusterRoleSelectors");
    if selectors.is_empty() {
        errs.push(FieldError::required(
            &field,
            "at least one clusterRoleSelector required if aggregationRule is non-nil",
        ));
    }
    for (i, selector) in selectors.iter().enumerate() {
        let at = field.index(i);
        let mut found = Errors::new();
        budget::selector(selector, &at, &mut found);
        let invalid = !found.is_empty();
        errs.extend(found);
        if invalid {
            errs.push(FieldError::invalid(&at, Value::Null, "invalid label selector."));
        }
    }
    errs
}

/// `roleRef`'s (apiGroup, kind, name), empty strings for what is missing (as Go decodes them).
fn role_ref_of(obj: &Value) -> (&str, &str, &str) {
    let r = obj.get("roleRef").unwrap_or(&Value::Null);
    (
        str_of(r, "apiGroup").unwrap_or_default(),
        str_of(r, "kind").unwrap_or_default(),
        str_of(r, "name").unwrap_or_default(),
    )
}

/// `ValidateRoleBinding` (`namespaced`) or `ValidateClusterRoleBinding` without the metadata.
fn binding(obj: &Value, namespaced: bool) -> Errors {
    let mut errs = Errors::new();
    let at = Path::root("roleRef");
    let (group, kind, name) = role_ref_of(obj);
    if group != GROUP {
        errs.push(FieldError::not_supported(&at.child("apiGroup"), group, &[GROUP]));
    }
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&kind) {
        errs.push(FieldError::not_supported(&at.child("kind"), kind, kinds));
    }
    if name.is_empty() {
        errs.push(FieldError::required(&at.child("name"), ""));
    } else {
        errs.extend(each_invalid(&at.child("name"), name, meta::path_segment(name)));
    }
    for (i, subject) in items(obj, "subjects").iter().enumerate() {
        errs.extend(subject_errors(
            subject,
            namespaced,
            &Path::root("subjects").index(i),
        ));
    }
    errs
}

/// `ValidateRoleBindingSubject`.
fn subject_errors(subject: &Value, namespaced: bool, at: &Path) -> Errors {
    let mut errs = Errors::new();
    let name = str_of(subject, "name").unwrap_or_default();
    let group = str_of(subject, "apiGroup").unwrap_or_default();
    if name.is_empty() {
        errs.push(FieldError::required(&at.child("name"), ""));
    }
    match str_of(subject, "kind").unwrap_or_default() {
        "ServiceAccount" => {
            if !name.is_empty() {
                errs.extend(each_invalid(
                    &at.child("name"),
                    name,
                    rules::dns1123_subdomain(name),
                ));
            }
            if !group.is_empty() {
                errs.push(FieldError::not_supported(&at.child("apiGroup"), group, &[""]));
            }
            if !namespaced && str_of(subject, "namespace").is_none_or(str::is_empty) {
                errs.push(FieldError::required(&at.child("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                errs.push(FieldError::not_supported(&at.child("apiGroup"), group, &[GROUP]));
            }
        }
        other => errs.push(FieldError::not_supported(
            &at.child("kind"),
            other,
            &["ServiceAccount", "User", "Group"],
        )),
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rt(plural: &str) -> ResourceType {
        crate::resources::builtins()
            .into_iter()
            .find(|t| t.group == GROUP && t.plural == plural)
            .unwrap_or_else(|| panic!("no built-in {plural}"))
    }

    fn bodies(errs: &Errors) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn bindings_are_defaulted_then_checked() {
        let crb = rt("clusterrolebindings");
        let mut obj = json!({"metadata": {"name": "b"}, "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "sa"}]});
        defaults(&crb, &mut obj);
        assert_eq!(obj["roleRef"]["apiGroup"], GROUP);
        assert_eq!(obj["subjects"][0]["apiGroup"], GROUP);
        assert!(obj["subjects"][1].get("apiGroup").is_none());
        assert_eq!(
            bodies(&validate(&crb, &obj, None)),
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[1].namespace: Required value",
            ]
        );
    }

    #[test]
    fn an_update_lists_the_objects_causes_twice_and_a_changed_role_ref() {
        let rb = rt("rolebindings");
        let old = json!({"metadata": {"name": "b"},
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "r"}});
        let new = json!({"metadata": {"name": "b"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "r"},
            "subjects": [{"kind": "Robot", "name": "x"}]});
        assert_eq!(
            bodies(&validate(&rb, &new, Some(&old))),
            [
                "subjects[0].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                "subjects[0].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                "roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"r\"}: cannot change roleRef",
            ]
        );
    }

    #[test]
    fn rules_need_verbs_and_resources_or_urls() {
        let role = rt("roles");
        let obj = json!({"metadata": {"name": "r"}, "rules": [
            {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
            {"nonResourceURLs": ["/healthz"], "resources": ["pods"]},
            {"verbs": ["get"]}]});
        assert_eq!(
            bodies(&validate(&role, &obj, None)),
            [
                "rules[1].verbs: Required value: verbs must contain at least one value",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: rules cannot apply to both regular resources and non-resource URLs",
                "rules[2].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[2].resources: Required value: resource rules must supply at least one resource",
            ]
        );
    }
}
