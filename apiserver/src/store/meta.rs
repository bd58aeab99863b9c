//! Small helpers over objects' metadata: timestamps, uids, reading and writing `metadata`, and
//! the parts of an object a write compares.

use serde_json::{Map, Value, json};

pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(crate) fn new_uid() -> String {
    let h = crate::random_hex();
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The object without metadata and status: what `generation` tracks.
pub(crate) fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    v
}

/// Objects equal but for resourceVersion and managedFields timestamps: a no-op write (a change
/// of who manages which field is a write, as on kube-apiserver).
pub(crate) fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        let m = meta_mut(&mut v);
        m.remove("resourceVersion");
        if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
            for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                e.remove("time");
            }
        }
        v
    };
    strip(a) == strip(b)
}

/// The object without server-set metadata.
pub(crate) fn strip_server_fields(v: &Value) -> Value {
    let mut v = v.clone();
    let m = meta_mut(&mut v);
    for f in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "deletionTimestamp",
    ] {
        m.remove(f);
    }
    v
}
