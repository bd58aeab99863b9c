//! PersistentVolumeClaims: `ValidatePersistentVolumeClaimSpec`'s access modes and storage request
//! (what a StatefulSet's volume claim template must have for its claims to be created).

use serde_json::Value;

use super::{Errors, FieldError, Path, items};

/// The access modes kube-apiserver accepts, in its order.
const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];

/// A claim's spec: at least one supported access mode and a `storage` request.
pub(crate) fn claim(pvc: &Value) -> Errors {
    let mut errs = Errors::new();
    let null = Value::Null;
    let spec = pvc.get("spec").unwrap_or(&null);
    let path = Path::root("spec");
    let modes = items(spec, "accessModes");
    if modes.is_empty() {
        errs.push(FieldError::required(
            &path.child("accessModes"),
            "at least 1 access mode is required",
        ));
    }
    for mode in modes {
        if !mode.as_str().is_some_and(|m| ACCESS_MODES.contains(&m)) {
            errs.push(FieldError::not_supported(
                &path.child("accessModes"),
                mode.clone(),
                &ACCESS_MODES,
            ));
        }
    }
    if spec.pointer("/resources/requests/storage").is_none() {
        errs.push(FieldError::required(&path.child("resources").key("storage"), ""));
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(pvc: &Value) -> Vec<String> {
        claim(pvc)
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    /// Recorded from kube-apiserver v1.28.7.
    #[test]
    fn an_empty_claim_spec_is_refused_as_kube_apiserver_does() {
        assert_eq!(
            messages(&json!({"spec": {}})),
            [
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value",
            ]
        );
        assert_eq!(
            messages(
                &json!({"spec": {"accessModes": ["Bogus"], "resources": {"requests": {"storage": "1Gi"}}}})
            ),
            [
                r#"spec.accessModes: Unsupported value: "Bogus": supported values: "ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod""#
            ]
        );
        assert!(
            messages(&json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
                .is_empty()
        );
    }
}
