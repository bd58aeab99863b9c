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

/// `ValidateConfigMap`: keys, and no key in both `data` and `binaryData`.
pub(crate) fn config_map(cm: &Value) -> Errors {
    let mut errs = Errors::new();
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
    for k in keys(secret, "data") {
        let p = Path::root("data").key(&k);
        errs.extend(each_invalid(&p, &k, rules::config_map_key(&k)));
    }
    errs
}
