//! `policy/v1` PodDisruptionBudgets as kube-apiserver 1.28 validates them
//! (`ValidatePodDisruptionBudgetSpec`): `minAvailable` and `maxUnavailable` not both set, each a
//! non-negative number or a percentage of at most 100%, the selector's labels and expressions,
//! and `unhealthyPodEvictionPolicy`. Messages are kube-apiserver v1.28.7's.

use serde_json::Value;
use slinky_api::selectors::{RequirementProblem, requirement_problem};

use slinky_api::validation as rules;

use super::{Errors, FieldError, Path, items, meta, str_of};

/// Go's `%#v` of an `intstr.IntOrString` holding a string.
fn go_int_or_string(s: &str) -> String {
    format!("intstr.IntOrString{{Type:1, IntVal:0, StrVal:{s:?}}}")
}

/// Go's `%#v` of a pointer field: `(*type)(nil)`, or an address (kube-apiserver prints the
/// pointer; any address stands for it).
fn go_pointer(spec: &Value, key: &str, ty: &str, address: usize) -> String {
    match spec.get(key) {
        None | Some(Value::Null) => format!("(*{ty})(nil)"),
        Some(_) => format!("(*{ty})(0xc000{address:06x})"),
    }
}

/// `ValidatePositiveIntOrPercent` and `IsNotMoreThan100Percent` of one bound.
fn bound(spec: &Value, key: &str, field: &Path, errs: &mut Errors) {
    let at = field.child(key);
    match spec.get(key) {
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64()
                && i < 0
            {
                errs.push(FieldError::invalid(&at, i, "must be greater than or equal to 0"));
            }
        }
        Some(Value::String(s)) => {
            let percent = s
                .strip_suffix('%')
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
            match percent {
                None => errs.push(FieldError::invalid_rendered(
                    &at,
                    go_int_or_string(s),
                    "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  \
                     or '93%', regex used for validation is '[0-9]+%')",
                )),
                Some(digits) if digits.parse::<u64>().map_or(true, |p| p > 100) => {
                    errs.push(FieldError::invalid_rendered(
                        &at,
                        go_int_or_string(s),
                        "must not be greater than 100%",
                    ));
                }
                Some(_) => {}
            }
        }
        _ => {}
    }
}

/// `ValidateLabelSelector`: the labels, and each expression's key, operator and values.
pub(super) fn selector(selector: &Value, field: &Path, errs: &mut Errors) {
    errs.extend(meta::labels(
        selector.get("matchLabels"),
        &field.child("matchLabels"),
    ));
    for (i, e) in items(selector, "matchExpressions").iter().enumerate() {
        let at = field.child("matchExpressions").index(i);
        let values = items(e, "values");
        let operator = str_of(e, "operator").unwrap_or_default();
        match requirement_problem(operator, values.len()) {
            Some(RequirementProblem::NeedsValues(_)) => errs.push(FieldError::required(
                &at.child("values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            Some(RequirementProblem::TakesNoValues(_)) => errs.push(FieldError::forbidden(
                &at.child("values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            Some(RequirementProblem::UnknownOperator(_)) => errs.push(FieldError::invalid(
                &at.child("operator"),
                operator,
                "not a valid selector operator",
            )),
            None => {}
        }
        let key = str_of(e, "key").unwrap_or_default();
        errs.extend(super::each_invalid(
            &at.child("key"),
            key,
            rules::qualified_name(key),
        ));
        // Values must be label values (a PodDisruptionBudget is created without
        // `AllowInvalidLabelValueInSelector`).
        for (j, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or_default();
            errs.extend(super::each_invalid(
                &at.child("values").index(j),
                v,
                rules::label_value(v),
            ));
        }
    }
}

/// A PodDisruptionBudget's spec.
pub(crate) fn budget(new: &Value) -> Errors {
    let mut errs = Errors::new();
    let field = Path::root("spec");
    let spec = new.get("spec").unwrap_or(&Value::Null);
    let set = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
    if set("minAvailable") && set("maxUnavailable") {
        let rendered = format!(
            "policy.PodDisruptionBudgetSpec{{MinAvailable:{}, Selector:{}, MaxUnavailable:{}, \
             UnhealthyPodEvictionPolicy:{}}}",
            go_pointer(spec, "minAvailable", "intstr.IntOrString", 0x3e0),
            go_pointer(spec, "selector", "v1.LabelSelector", 0x400),
            go_pointer(spec, "maxUnavailable", "intstr.IntOrString", 0x3c0),
            go_pointer(
                spec,
                "unhealthyPodEvictionPolicy",
                "policy.UnhealthyPodEvictionPolicyType",
                0x420
            ),
        );
        errs.push(FieldError::invalid_rendered(
            &field,
            rendered,
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    bound(spec, "minAvailable", &field, &mut errs);
    bound(spec, "maxUnavailable", &field, &mut errs);
    if let Some(s) = spec.get("selector").filter(|s| !s.is_null()) {
        selector(s, &field.child("selector"), &mut errs);
    }
    if let Some(policy) = str_of(spec, "unhealthyPodEvictionPolicy")
        && !matches!(policy, "AlwaysAllow" | "IfHealthyBudget")
    {
        errs.push(FieldError::not_supported(
            &field.child("unhealthyPodEvictionPolicy"),
            policy,
            &["AlwaysAllow", "IfHealthyBudget"],
        ));
    }
    errs
}
