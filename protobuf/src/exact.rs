//! [`encode_exact`]: the encoding only when the schema carries every field of the object.

use serde_json::Value;

use crate::{
    CRD_JSON, CRD_OR_ARRAY, CRD_OR_BOOL, CRD_OR_STRINGS, DURATION, FIELDS_V1, FieldSpec, INT_OR_STRING, Kind,
    MICRO_TIME, QUANTITY, RAW_EXTENSION, TIME, encode, message_of, schema,
};

/// Encode a JSON object as [`encode`] does, only when the schema holds every field it sets with
/// the JSON type it has: else the path of the first field it would drop or misread (a field
/// newer than the schema, a number where a string belongs), and the caller sends JSON. The
/// host's creates go through this, so protobuf never loses what a builder built.
///
/// # Errors
/// The path of the first field the schema cannot carry, or the kind has no schema.
pub fn encode_exact(obj: &Value) -> Result<Vec<u8>, String> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let message = message_of(api_version, kind)
        .ok_or_else(|| format!("no protobuf schema for {api_version} {kind}"))?;
    let Value::Object(top) = obj else {
        return Err("not an object".into());
    };
    for (key, value) in top {
        if key == "apiVersion" || key == "kind" || value.is_null() {
            continue;
        }
        let spec = find_spec(&message, key).ok_or_else(|| key.clone())?;
        uncovered_field(value, spec, key).map_or(Ok(()), Err)?;
    }
    encode(obj).ok_or_else(|| format!("no protobuf schema for {api_version} {kind}"))
}

/// The field `json` of `message`, or of a message inlined into it (a Go embedded struct).
fn find_spec<'s>(message: &str, json: &str) -> Option<&'s FieldSpec> {
    let specs = schema().messages.get(message)?;
    specs
        .iter()
        .find(|s| s.kind != Kind::Inline && s.json == json)
        .or_else(|| {
            specs
                .iter()
                .filter(|s| s.kind == Kind::Inline)
                .find_map(|s| find_spec(s.message.as_deref().unwrap_or_default(), json))
        })
}

/// The first path under `path` that field `spec` cannot carry from `v`.
fn uncovered_field(v: &Value, spec: &FieldSpec, path: &str) -> Option<String> {
    match (spec.kind, v) {
        (Kind::Map, Value::Object(m)) => m.iter().find_map(|(k, item)| {
            let at = format!("{path}.{k}");
            uncovered_scalar_or_message(
                item,
                spec.map_value.unwrap_or(Kind::String),
                spec.message.as_deref(),
                &at,
            )
        }),
        (Kind::Map, _) => Some(path.into()),
        (_, Value::Array(items)) if spec.repeated => items.iter().enumerate().find_map(|(i, item)| {
            uncovered_scalar_or_message(item, spec.kind, spec.message.as_deref(), &format!("{path}[{i}]"))
        }),
        (_, _) if spec.repeated => Some(path.into()),
        _ => uncovered_scalar_or_message(v, spec.kind, spec.message.as_deref(), path),
    }
}

fn uncovered_scalar_or_message(v: &Value, kind: Kind, message: Option<&str>, path: &str) -> Option<String> {
    let fits = match kind {
        Kind::String | Kind::Bytes => v.is_string(),
        Kind::Bool => v.is_boolean(),
        Kind::Int32 | Kind::Int64 => v.is_i64() || v.is_u64(),
        Kind::Double => v.is_number(),
        Kind::Message | Kind::Inline | Kind::Map => {
            return uncovered_message(v, message.unwrap_or_default(), path);
        }
    };
    (!fits).then(|| path.to_string())
}

/// The first path under `path` that `message` cannot carry from `v`.
fn uncovered_message(v: &Value, message: &str, path: &str) -> Option<String> {
    let fits = match message {
        TIME | MICRO_TIME => v
            .as_str()
            .is_some_and(|s| s.parse::<k8s_openapi::jiff::Timestamp>().is_ok()),
        DURATION => v.is_string(),
        INT_OR_STRING => v.is_string() || v.is_i64(),
        QUANTITY => v.is_string(),
        RAW_EXTENSION | FIELDS_V1 | CRD_JSON => true,
        CRD_OR_BOOL | CRD_OR_ARRAY | CRD_OR_STRINGS => false,
        _ => {
            let Value::Object(m) = v else {
                return Some(path.into());
            };
            return m
                .iter()
                .filter(|(_, item)| !item.is_null())
                .find_map(|(k, item)| {
                    let at = format!("{path}.{k}");
                    match find_spec(message, k) {
                        Some(spec) => uncovered_field(item, spec, &at),
                        None => Some(at),
                    }
                });
        }
    };
    (!fits).then(|| path.to_string())
}
