//! Label selectors as Kubernetes matches and validates them, once for every caller: typed
//! ([`LabelSelector`], a BuilderPlugin's `spec.selector`) and as JSON (a workload's or a
//! PodDisruptionBudget's `spec.selector` in the embedded API server).
//!
//! # Rules (apimachinery's `metav1.LabelSelectorAsSelector` and `ValidateLabelSelector`)
//! * Every `matchLabels` pair and every `matchExpressions` requirement must hold; an empty
//!   selector matches everything.
//! * `In` needs the label with one of the values, `NotIn` the label absent or with none of them,
//!   `Exists` the label, `DoesNotExist` its absence.
//! * `In` and `NotIn` need values; `Exists` and `DoesNotExist` take none; any other operator is
//!   invalid (and, matched, matches nothing).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

/// A requirement's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// The label has one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl Operator {
    /// The operator named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Operator> {
        match name {
            "In" => Some(Operator::In),
            "NotIn" => Some(Operator::NotIn),
            "Exists" => Some(Operator::Exists),
            "DoesNotExist" => Some(Operator::DoesNotExist),
            _ => None,
        }
    }

    /// Whether the requirement holds for a label whose value is `value` (`None`: no such label).
    pub fn holds<S: AsRef<str>>(self, values: &[S], value: Option<&str>) -> bool {
        let listed = |v: &str| values.iter().any(|x| x.as_ref() == v);
        match self {
            Operator::In => value.is_some_and(listed),
            Operator::NotIn => value.is_none_or(|v| !listed(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// What is wrong with one requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequirementProblem {
    /// `In` or `NotIn` without values.
    NeedsValues(Operator),
    /// `Exists` or `DoesNotExist` with values.
    TakesNoValues(Operator),
    /// Not one of the four operators.
    UnknownOperator(String),
}

impl std::fmt::Display for RequirementProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequirementProblem::NeedsValues(op) => write!(f, "operator {op:?} needs values"),
            RequirementProblem::TakesNoValues(op) => write!(f, "operator {op:?} takes no values"),
            RequirementProblem::UnknownOperator(other) => {
                write!(
                    f,
                    "operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                )
            }
        }
    }
}

/// What is wrong with a requirement of `operator` with `values` values, if anything.
pub fn requirement_problem(operator: &str, values: usize) -> Option<RequirementProblem> {
    match Operator::parse(operator) {
        None => Some(RequirementProblem::UnknownOperator(operator.to_string())),
        Some(op @ (Operator::In | Operator::NotIn)) if values == 0 => {
            Some(RequirementProblem::NeedsValues(op))
        }
        Some(op @ (Operator::Exists | Operator::DoesNotExist)) if values > 0 => {
            Some(RequirementProblem::TakesNoValues(op))
        }
        Some(_) => None,
    }
}

/// The first problem of `selector`, naming its requirement.
///
/// # Errors
/// `matchExpressions[i] (key "k"): …`.
pub fn problem(selector: &LabelSelector) -> Result<(), String> {
    for (i, r) in selector.match_expressions.iter().flatten().enumerate() {
        let values = r.values.as_deref().unwrap_or_default().len();
        if let Some(p) = requirement_problem(&r.operator, values) {
            return Err(format!("matchExpressions[{i}] (key {:?}): {p}", r.key));
        }
    }
    Ok(())
}

/// Whether `selector` matches `labels`.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    pairs
        && selector.match_expressions.iter().flatten().all(|r| {
            Operator::parse(&r.operator).is_some_and(|op| {
                op.holds(
                    r.values.as_deref().unwrap_or_default(),
                    labels.get(&r.key).map(String::as_str),
                )
            })
        })
}

/// Whether `selector` (a `LabelSelector` as JSON) matches `labels` (a `metadata.labels` object,
/// `None` when the object has none).
pub fn matches_json(selector: &Value, labels: Option<&Value>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let pairs = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let list = |v: &Value, key: &str| v.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    pairs
        && list(selector, "matchExpressions").iter().all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values: Vec<String> = list(e, "values")
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            e.get("operator")
                .and_then(Value::as_str)
                .and_then(Operator::parse)
                .is_some_and(|op| op.holds(&values, get(key)))
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn only(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn selectors_match_as_kubernetes_does() {
        let canary = labels(&[("canary", "true"), ("site", "a")]);
        let plain = labels(&[("site", "a")]);
        assert!(matches(&LabelSelector::default(), &plain));
        let pairs = LabelSelector {
            match_labels: Some(labels(&[("canary", "true")])),
            ..Default::default()
        };
        assert!(matches(&pairs, &canary));
        assert!(!matches(&pairs, &plain));
        assert!(matches(&only("canary", "DoesNotExist", &[]), &plain));
        assert!(!matches(&only("canary", "DoesNotExist", &[]), &canary));
        assert!(matches(&only("canary", "Exists", &[]), &canary));
        assert!(matches(&only("site", "In", &["a", "b"]), &plain));
        assert!(!matches(&only("site", "NotIn", &["a"]), &plain));
        assert!(matches(&only("zone", "NotIn", &["a"]), &plain));
        assert!(
            !matches(&only("site", "Near", &["a"]), &plain),
            "unknown: nothing"
        );
    }

    #[test]
    fn typed_and_json_selectors_agree() -> Result<(), serde_json::Error> {
        let objects = [
            json!({"site": "a", "canary": "true"}),
            json!({"site": "b"}),
            json!({}),
        ];
        for selector in [
            only("site", "In", &["a"]),
            only("site", "NotIn", &["a"]),
            only("canary", "Exists", &[]),
            only("canary", "DoesNotExist", &[]),
            only("site", "Near", &["a"]),
            LabelSelector {
                match_labels: Some(labels(&[("site", "b")])),
                ..Default::default()
            },
        ] {
            let as_json = serde_json::to_value(&selector)?;
            for object in &objects {
                let typed: BTreeMap<String, String> = serde_json::from_value(object.clone())?;
                assert_eq!(
                    matches(&selector, &typed),
                    matches_json(&as_json, Some(object)),
                    "{as_json} on {object}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn selectors_are_validated_as_kubernetes_does() {
        assert!(problem(&only("a", "In", &["x"])).is_ok());
        assert!(problem(&only("a", "DoesNotExist", &[])).is_ok());
        assert!(problem(&only("a", "In", &[])).is_err_and(|e| e.contains("needs values")));
        assert!(problem(&only("a", "Exists", &["x"])).is_err_and(|e| e.contains("no values")));
        assert!(problem(&only("a", "Near", &["x"])).is_err_and(|e| e.contains("\"Near\"")));
    }
}
