//! Structural-schema handling for custom resources: defaulting, pruning of unknown fields, and
//! validation of required fields, types and enums, as the real API server does for CRDs.

use serde_json::{Map, Value};

use super::{ApiError, resources::ResourceType};

/// Default, prune and validate `obj` against a CRD version's `openAPIV3Schema`.
///
/// # Errors
/// 422 Invalid listing every violation with its field path.
pub fn default_and_validate(
    rt: &ResourceType,
    name: &str,
    schema: &Value,
    obj: &mut Value,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if let Value::Object(m) = obj {
        // The schema covers the body; apiVersion, kind and metadata are the server's.
        let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| m.remove(*k).map(|v| (k.to_string(), v)))
            .collect();
        walk(schema, obj, "", &mut errors);
        if let Value::Object(m) = obj {
            m.extend(kept);
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let causes: Vec<(&str, String)> = errors.iter().map(|(p, m)| (p.as_str(), m.clone())).collect();
    Err(ApiError::invalid(rt, name, causes))
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn walk(schema: &Value, v: &mut Value, path: &str, errors: &mut Vec<(String, String)>) {
    if v.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if int_or_string {
        if !matches!(type_name(v), "integer" | "string") {
            errors.push((
                path.to_string(),
                format!("Invalid value: {}: must be an integer or a string", type_name(v)),
            ));
        }
        return;
    }
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let have = type_name(v);
        let ok = have == want || (want == "number" && have == "integer");
        if !ok {
            errors.push((
                path.to_string(),
                format!("Invalid value: \"{have}\": {path} in body must be of type {want}: \"{have}\""),
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        errors.push((
            path.to_string(),
            format!("Unsupported value: {v}: supported values: {}", list.join(", ")),
        ));
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            if let Some(props) = props {
                for (key, sub) in props {
                    if !m.contains_key(key)
                        && let Some(d) = sub.get("default")
                    {
                        m.insert(key.clone(), d.clone());
                    }
                    if let Some(value) = m.get_mut(key) {
                        walk(sub, value, &child(path, key), errors);
                    }
                }
            }
            match schema.get("additionalProperties") {
                Some(Value::Object(_)) => {
                    let sub = &schema["additionalProperties"];
                    for (key, value) in m.iter_mut() {
                        if props.is_none_or(|p| !p.contains_key(key)) {
                            walk(sub, value, &child(path, key), errors);
                        }
                    }
                }
                Some(Value::Bool(true)) => {}
                _ if preserve => {}
                _ => prune(m, props),
            }
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !m.contains_key(req) {
                    errors.push((child(path, req), "Required value".to_string()));
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(sub, item, &format!("{path}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
}

fn prune(m: &mut Map<String, Value>, props: Option<&Map<String, Value>>) {
    m.retain(|k, _| props.is_some_and(|p| p.contains_key(k)));
}
