//! ControllerRevisions (`ValidateControllerRevision`, `ValidateControllerRevisionUpdate`): `data`
//! is required and may not change, `revision` may (a rollback renumbers one) but is never
//! negative. The name is a DNS subdomain (the metadata rules).
//!
//! kube-apiserver keeps `data` as the bytes it was sent and compares bytes on update, so a
//! client that re-sends the same document with other whitespace or key order is refused there;
//! this server keeps JSON values and compares them as values.

use serde_json::Value;

use super::{Errors, FieldError, Path};

/// `data` as Go's `%#v` prints the `runtime.Unknown` kube-apiserver decodes it into: its bytes
/// (compact JSON, keys in order) as a `[]uint8`.
fn go_unknown(data: &Value) -> String {
    let bytes: Vec<String> = data.to_string().bytes().map(|b| format!("{b:#x}")).collect();
    format!(
        "runtime.Unknown{{TypeMeta:runtime.TypeMeta{{APIVersion:\"\", Kind:\"\"}}, Raw:[]uint8{{{}}}, \
         ContentEncoding:\"\", ContentType:\"application/json\"}}",
        bytes.join(", ")
    )
}

/// A ControllerRevision created (`old` is `None`) or updated.
pub(crate) fn controller_revision(new: &Value, old: Option<&Value>) -> Errors {
    let mut errs = Errors::new();
    let field = |name: &str| Path::root(name);
    let data = new.get("data").filter(|d| !d.is_null());
    if data.is_none() {
        errs.push(FieldError::required(&field("data"), "data is mandatory"));
    }
    if let Some(n) = new.get("revision").and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid(
            &field("revision"),
            n,
            "must be greater than or equal to 0",
        ));
    }
    if let Some(old) = old
        && old.get("data").filter(|d| !d.is_null()) != data
    {
        let rendered = data.map_or_else(|| "\"null\"".to_string(), go_unknown);
        errs.push(FieldError::invalid_rendered(
            &field("data"),
            rendered,
            "field is immutable",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn data_prints_as_kube_apiserver_prints_its_bytes() {
        assert_eq!(
            go_unknown(&json!({"b": 2})),
            "runtime.Unknown{TypeMeta:runtime.TypeMeta{APIVersion:\"\", Kind:\"\"}, \
             Raw:[]uint8{0x7b, 0x22, 0x62, 0x22, 0x3a, 0x32, 0x7d}, ContentEncoding:\"\", \
             ContentType:\"application/json\"}"
        );
    }
}
