//! `apps/v1` workloads as kube-apiserver validates them (`pkg/apis/apps/validation`): a
//! Deployment's, a ReplicaSet's and a StatefulSet's replicas, selector (required, not empty,
//! matching the pod template's labels; a Deployment's and a ReplicaSet's immutable), pod template
//! (their pod spec, `restartPolicy: Always`, no `activeDeadlineSeconds`) and counters. Messages
//! and their order are kube-apiserver v1.28.7's (the validation suite compares them with a real
//! server).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Errors, FieldError, Path, pod};

/// Go's `%#v` of a `map[string]string` (keys sorted, as Go prints maps).
fn go_map(map: Option<&Value>) -> String {
    match map.and_then(Value::as_object) {
        None => "map[string]string(nil)".into(),
        Some(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            let items: Vec<String> = sorted
                .iter()
                .map(|(k, v)| format!("{k:?}:{:?}", v.as_str().unwrap_or_default()))
                .collect();
            format!("map[string]string{{{}}}", items.join(", "))
        }
    }
}

/// Go's `%#v` of a `v1.LabelSelector` without expressions.
fn go_selector(selector: &Value) -> String {
    let expressions = match selector.get("matchExpressions").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => format!("[]v1.LabelSelectorRequirement{{/* {} */}}", list.len()),
        _ => "[]v1.LabelSelectorRequirement(nil)".into(),
    };
    format!(
        "v1.LabelSelector{{MatchLabels:{}, MatchExpressions:{expressions}}}",
        go_map(selector.get("matchLabels"))
    )
}

/// Whether `selector` (a present `LabelSelector`) selects `labels`.
fn matches(selector: &Value, labels: Option<&Value>) -> bool {
    slinky_api::selectors::matches_json(selector, labels)
}

fn nonnegative(spec: &Value, key: &str, field: &Path, errs: &mut Errors) {
    if let Some(n) = spec.get(key).and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid(
            &field.child(key),
            n,
            "must be greater than or equal to 0",
        ));
    }
}

/// The selector checks of both kinds: required, not empty (`kind` names the workload).
fn selector(spec: &Value, field: &Path, kind: &str, errs: &mut Errors) {
    match spec.get("selector") {
        None | Some(Value::Null) => errs.push(FieldError::required(&field.child("selector"), "")),
        Some(s) => {
            let count = s
                .get("matchLabels")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())
                + super::items(s, "matchExpressions").len();
            if count == 0 {
                errs.push(FieldError::invalid_rendered(
                    &field.child("selector"),
                    go_selector(s),
                    format!("empty selector is invalid for {kind}"),
                ));
            }
        }
    }
}

/// The pod template: labels the selector selects (a missing selector selects nothing, an empty
/// one everything), then (`with_pod_spec`: a Deployment's) the pod spec. kube-apiserver does not
/// validate a StatefulSet's pod spec: its mounts may name volume claim templates.
fn template(spec: &Value, field: &Path, with_pod_spec: bool, errs: &mut Errors) {
    let template = spec.get("template").unwrap_or(&Value::Null);
    let labels = template.pointer("/metadata/labels");
    let selects = match spec.get("selector") {
        None | Some(Value::Null) => false,
        Some(s) => {
            let empty = s
                .get("matchLabels")
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty())
                && super::items(s, "matchExpressions").is_empty();
            empty || matches(s, labels)
        }
    };
    let at = field.child("template");
    if !selects {
        errs.push(FieldError::invalid_rendered(
            &at.child("metadata").child("labels"),
            go_map(labels),
            "`selector` does not match template `labels`",
        ));
    }
    if with_pod_spec {
        let pod_spec = template.get("spec").unwrap_or(&Value::Null);
        errs.extend(pod::pod_spec(pod_spec, &at.child("spec")));
    }
}

/// `restartPolicy: Always` and no `activeDeadlineSeconds` (`kind` for the message).
fn long_running(spec: &Value, field: &Path, kind: &str, errs: &mut Errors) {
    let pod_spec = field.child("template").child("spec");
    let policy = spec
        .pointer("/template/spec/restartPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Always");
    if policy != "Always" {
        errs.push(FieldError::not_supported(
            &pod_spec.child("restartPolicy"),
            policy,
            &["Always"],
        ));
    }
    if spec
        .pointer("/template/spec/activeDeadlineSeconds")
        .is_some_and(|v| !v.is_null())
    {
        errs.push(FieldError::forbidden(
            &pod_spec.child("activeDeadlineSeconds"),
            format!("activeDeadlineSeconds in {kind} is not Supported"),
        ));
    }
}

/// Go's `%#v` of an `intstr.IntOrString` (the type kube-apiserver prints a bound with).
fn go_int_or_string(v: &Value) -> String {
    match v {
        Value::String(s) => format!("intstr.IntOrString{{Type:1, IntVal:0, StrVal:{s:?}}}"),
        other => format!(
            "intstr.IntOrString{{Type:0, IntVal:{}, StrVal:\"\"}}",
            other.as_i64().unwrap_or(0)
        ),
    }
}

/// A `RollingUpdate` bound's value (`getIntOrPercentValue`: a percentage's number), `None` when
/// it is a string that is not a percentage.
fn bound_value(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.strip_suffix('%').and_then(|d| {
            (!d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .then(|| d.parse().ok())
                .flatten()
        }),
        other => other.as_i64(),
    }
}

/// `ValidateDeploymentStrategy` of the defaulted strategy (a missing type is `RollingUpdate`,
/// missing bounds 25%): `Recreate` without `rollingUpdate`; each bound a non-negative number
/// or a percentage, not both 0, `maxUnavailable` at most 100%.
fn strategy(spec: &Value, field: &Path, errs: &mut Errors) {
    let at = field.child("strategy");
    let strategy = spec.get("strategy").unwrap_or(&Value::Null);
    let rolling = strategy.get("rollingUpdate").filter(|r| !r.is_null());
    match strategy
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("RollingUpdate")
    {
        "Recreate" => {
            if rolling.is_some() {
                errs.push(FieldError::forbidden(
                    &at.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => {
            let at = at.child("rollingUpdate");
            let default = Value::String("25%".into());
            let get = |k: &str| {
                rolling
                    .and_then(|r| r.get(k))
                    .filter(|v| !v.is_null())
                    .unwrap_or(&default)
            };
            let (unavailable, surge) = (get("maxUnavailable"), get("maxSurge"));
            for (key, v) in [("maxUnavailable", unavailable), ("maxSurge", surge)] {
                let path = at.child(key);
                match v {
                    Value::String(_) if bound_value(v).is_none() => errs.push(FieldError::invalid_rendered(
                        &path,
                        go_int_or_string(v),
                        "a valid percent string must be a numeric string followed by an ending '%' \
                         (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                    )),
                    Value::Number(n) if n.as_i64().is_some_and(|n| n < 0) => errs.push(FieldError::invalid(
                        &path,
                        n.as_i64().unwrap_or(0),
                        "must be greater than or equal to 0",
                    )),
                    _ => {}
                }
            }
            let value = |v: &Value| bound_value(v).unwrap_or(0);
            if value(unavailable) == 0 && value(surge) == 0 {
                errs.push(FieldError::invalid_rendered(
                    &at.child("maxUnavailable"),
                    go_int_or_string(unavailable),
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
            if unavailable.is_string() && bound_value(unavailable).is_some_and(|p| p > 100) {
                errs.push(FieldError::invalid_rendered(
                    &at.child("maxUnavailable"),
                    go_int_or_string(unavailable),
                    "must not be greater than 100%",
                ));
            }
        }
        other => {
            let rolling_update = if rolling.is_some() {
                "(*apps.RollingUpdateDeployment)(0xc000a1b2c0)"
            } else {
                "(*apps.RollingUpdateDeployment)(nil)"
            };
            errs.push(FieldError::not_supported_rendered(
                &at,
                format!("apps.DeploymentStrategy{{Type:{other:?}, RollingUpdate:{rolling_update}}}"),
                &["Recreate", "RollingUpdate"],
            ));
        }
    }
}

/// `ValidateDeployment` (and, for an update, `ValidateDeploymentUpdate` with apps/v1's immutable
/// selector).
pub(crate) fn deployment(new: &Value, old: Option<&Value>) -> Errors {
    let mut errs = Errors::new();
    let spec = new.get("spec").unwrap_or(&Value::Null);
    let field = Path::root("spec");
    nonnegative(spec, "replicas", &field, &mut errs);
    selector(spec, &field, "deployment", &mut errs);
    template(spec, &field, true, &mut errs);
    long_running(spec, &field, "ReplicaSet", &mut errs);
    strategy(spec, &field, &mut errs);
    nonnegative(spec, "minReadySeconds", &field, &mut errs);
    nonnegative(spec, "revisionHistoryLimit", &field, &mut errs);
    if let Some(deadline) = spec.get("progressDeadlineSeconds").and_then(Value::as_i64) {
        nonnegative(spec, "progressDeadlineSeconds", &field, &mut errs);
        let min_ready = spec.get("minReadySeconds").and_then(Value::as_i64).unwrap_or(0);
        if deadline <= min_ready {
            errs.push(FieldError::invalid(
                &field.child("progressDeadlineSeconds"),
                deadline,
                "must be greater than minReadySeconds",
            ));
        }
    }
    if let Some(old) = old {
        immutable_selector(spec, old, &field, &mut errs);
    }
    errs
}

/// `ValidateReplicaSet` (and, for an update, apps/v1's immutable selector): replicas and
/// `minReadySeconds`, the selector, the pod template as a Deployment's.
pub(crate) fn replicaset(new: &Value, old: Option<&Value>) -> Errors {
    let mut errs = Errors::new();
    let spec = new.get("spec").unwrap_or(&Value::Null);
    let field = Path::root("spec");
    nonnegative(spec, "replicas", &field, &mut errs);
    nonnegative(spec, "minReadySeconds", &field, &mut errs);
    // kube-apiserver names Deployments in a ReplicaSet's message too.
    selector(spec, &field, "deployment", &mut errs);
    template(spec, &field, true, &mut errs);
    long_running(spec, &field, "ReplicaSet", &mut errs);
    if let Some(old) = old {
        immutable_selector(spec, old, &field, &mut errs);
    }
    errs
}

/// apps/v1's immutable selector of an update.
fn immutable_selector(spec: &Value, old: &Value, field: &Path, errs: &mut Errors) {
    let (now, was) = (spec.get("selector"), old.pointer("/spec/selector"));
    if now != was {
        errs.push(FieldError::invalid_rendered(
            &field.child("selector"),
            now.map_or_else(|| "nil".into(), go_selector),
            "field is immutable",
        ));
    }
}

/// `ValidateStatefulSetSpec` (the counters, selector and template; the policies are defaulted).
pub(crate) fn statefulset(new: &Value) -> Errors {
    let mut errs = Errors::new();
    let spec = new.get("spec").unwrap_or(&Value::Null);
    let field = Path::root("spec");
    nonnegative(spec, "replicas", &field, &mut errs);
    nonnegative(spec, "minReadySeconds", &field, &mut errs);
    selector(spec, &field, "statefulset", &mut errs);
    template(spec, &field, false, &mut errs);
    long_running(spec, &field, "StatefulSet", &mut errs);
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn go_prints_maps_and_selectors_so() {
        assert_eq!(
            go_map(Some(&json!({"c": "d", "a": "b"}))),
            r#"map[string]string{"a":"b", "c":"d"}"#
        );
        assert_eq!(go_map(None), "map[string]string(nil)");
        assert_eq!(
            go_selector(&json!({})),
            "v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement(nil)}"
        );
        assert!(matches(
            &json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}),
            Some(&json!({"a": "b"}))
        ));
        assert!(!matches(
            &json!({"matchLabels": {"a": "x"}}),
            Some(&json!({"a": "b"}))
        ));
    }
}
