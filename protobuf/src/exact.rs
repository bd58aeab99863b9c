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
        if let Some(mut path) = uncovered_field(value, spec) {
            path.push(Step::Key(key));
            return Err(path_text(path));
        }
    }
    encode(obj).ok_or_else(|| format!("no protobuf schema for {api_version} {kind}"))
}

/// One step of a path into an object: a field or an item of an array.
enum Step<'v> {
    Key(&'v str),
    Index(usize),
}

/// A path that cannot be carried, innermost step first: built only as a check fails, so the
/// fields that fit (nearly all of them) cost no allocation.
type Uncovered<'v> = Vec<Step<'v>>;

/// `spec.containers[0].image` from the steps of `path` (innermost first).
fn path_text(path: Uncovered<'_>) -> String {
    let mut text = String::new();
    for step in path.iter().rev() {
        match step {
            Step::Key(k) if text.is_empty() => text.push_str(k),
            Step::Key(k) => {
                text.push('.');
                text.push_str(k);
            }
            Step::Index(i) => text.push_str(&format!("[{i}]")),
        }
    }
    text
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

/// The first path under `v` (the value of field `spec`) that the field cannot carry.
fn uncovered_field<'v>(v: &'v Value, spec: &FieldSpec) -> Option<Uncovered<'v>> {
    match (spec.kind, v) {
        (Kind::Map, Value::Object(m)) => m.iter().find_map(|(k, item)| {
            let mut path = uncovered_scalar_or_message(
                item,
                spec.map_value.unwrap_or(Kind::String),
                spec.message.as_deref(),
            )?;
            path.push(Step::Key(k));
            Some(path)
        }),
        (Kind::Map, _) => Some(Vec::new()),
        (_, Value::Array(items)) if spec.repeated => items.iter().enumerate().find_map(|(i, item)| {
            let mut path = uncovered_scalar_or_message(item, spec.kind, spec.message.as_deref())?;
            path.push(Step::Index(i));
            Some(path)
        }),
        (_, _) if spec.repeated => Some(Vec::new()),
        _ => uncovered_scalar_or_message(v, spec.kind, spec.message.as_deref()),
    }
}

fn uncovered_scalar_or_message<'v>(v: &'v Value, kind: Kind, message: Option<&str>) -> Option<Uncovered<'v>> {
    let fits = match kind {
        Kind::String | Kind::Bytes => v.is_string(),
        Kind::Bool => v.is_boolean(),
        Kind::Int32 | Kind::Int64 => v.is_i64() || v.is_u64(),
        Kind::Double => v.is_number(),
        Kind::Message | Kind::Inline | Kind::Map => {
            return uncovered_message(v, message.unwrap_or_default());
        }
    };
    (!fits).then(Vec::new)
}

/// The first path under `v` that `message` cannot carry.
fn uncovered_message<'v>(v: &'v Value, message: &str) -> Option<Uncovered<'v>> {
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
                return Some(Vec::new());
            };
            return m
                .iter()
                .filter(|(_, item)| !item.is_null())
                .find_map(|(k, item)| {
                    let mut path = match find_spec(message, k) {
                        Some(spec) => uncovered_field(item, spec)?,
                        None => Vec::new(),
                    };
                    path.push(Step::Key(k));
                    Some(path)
                });
        }
    };
    (!fits).then(Vec::new)
}
