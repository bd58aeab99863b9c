//! ConfigMaps and Secrets: keys of `data`, `binaryData` and `stringData`, no key in two maps.

use serde_json::Value;
use slinky_api::validation as rules;

use super::{Errors, FieldError, Path, each_invalid};

fn keys(obj: &Value, field: &str) -> Vec<String> {
    obj.get(field)
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Kubernetes' `MaxSecretSize`: the most bytes of values a ConfigMap or a Secret holds.
pub(crate) const MAX_DATA_SIZE: usize = 1 << 20;

/// The bytes of the values of `obj.field`: text as it is, base64 (`binaryData`, Secret `data`)
/// decoded.
fn values_size(obj: &Value, field: &str, base64_encoded: bool) -> usize {
    use base64::Engine as _;
    obj.get(field)
        .and_then(Value::as_object)
        .map(|m| {
            m.values()
                .filter_map(Value::as_str)
                .map(|v| {
                    if base64_encoded {
                        base64::engine::general_purpose::STANDARD
                            .decode(v)
                            .map_or(v.len() * 3 / 4, |b| b.len())
                    } else {
                        v.len()
                    }
                })
                .sum()
        })
        .unwrap_or_default()
}

/// `ValidateConfigMap`: keys, no key in both `data` and `binaryData`, and at most 1 MiB of
/// values (reported at the path `[]`, as kube-apiserver 1.28 renders it).
pub(crate) fn config_map(cm: &Value) -> Errors {
    let mut errs = Errors::new();
    if values_size(cm, "data", false) + values_size(cm, "binaryData", true) > MAX_DATA_SIZE {
        errs.push(FieldError::too_long(&Path::root("[]"), MAX_DATA_SIZE));
    }
    let data = keys(cm, "data");
    let binary = keys(cm, "binaryData");
    for k in &data {
        let p = Path::root("data").key(k);
        errs.extend(each_invalid(&p, k, rules::config_map_key(k)));
    }
    for k in &binary {
        let p = Path::root("binaryData").key(k);
        errs.extend(each_invalid(&p, k, rules::config_map_key(k)));
        if data.contains(k) {
            errs.push(FieldError::invalid(
                &Path::root("data").key(k),
                k.as_str(),
                "duplicate of key present in binaryData",
            ));
        }
    }
    errs
}

/// `ValidateSecret`: keys of `data` (after `stringData` merged into it, as the server does).
pub(crate) fn secret(secret: &Value) -> Errors {
    let mut errs = Errors::new();
    if values_size(secret, "data", true) > MAX_DATA_SIZE {
        errs.push(FieldError::too_long(&Path::root("data"), MAX_DATA_SIZE));
    }
    for k in keys(secret, "data") {
        let p = Path::root("data").key(&k);
        errs.extend(each_invalid(&p, &k, rules::config_map_key(&k)));
    }
    errs
}
