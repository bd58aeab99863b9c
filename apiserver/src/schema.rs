//! Structural-schema handling for custom resources: defaulting, pruning of unknown fields, and
//! validation of required fields, types and enums, and the CRD's validation rules
//! (`x-kubernetes-validations`, transition rules against the object before an update; the part of
//! CEL in [`crate::cel`]), as the real API server does for CRDs.

use serde_json::{Map, Value};

use super::{ApiError, resources::ResourceType};

/// Default, prune and validate `obj` against a CRD version's `openAPIV3Schema`; `old` is the
/// object an update replaces (its transition rules compare with it).
///
/// # Errors
/// 422 Invalid listing every violation with its field path.
pub fn default_and_validate(
    rt: &ResourceType,
    name: &str,
    schema: &Value,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if let Value::Object(m) = obj {
        // The schema covers the body; apiVersion, kind and metadata are the server's.
        let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| m.remove(*k).map(|v| (k.to_string(), v)))
            .collect();
        walk(schema, obj, old, "", &mut errors);
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

fn walk(schema: &Value, v: &mut Value, old: Option<&Value>, path: &str, errors: &mut Vec<(String, String)>) {
    if v.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
        return;
    }
    walk_value(schema, v, old, path, errors);
    // Rules see the value defaulted and pruned, as kube-apiserver evaluates them.
    rules(schema, v, old, path, errors);
}

/// The rules (`x-kubernetes-validations`) on this schema node, evaluated over `v`. A transition
/// rule (one that reads `oldSelf`) runs only where the old object has a value here.
fn rules(schema: &Value, v: &Value, old: Option<&Value>, path: &str, errors: &mut Vec<(String, String)>) {
    let Some(list) = schema.get("x-kubernetes-validations").and_then(Value::as_array) else {
        return;
    };
    for rule in list {
        let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
        let message = rule
            .get("message")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty());
        let shown = message.unwrap_or(text.trim());
        let at = match rule.get("fieldPath").and_then(Value::as_str) {
            Some(f) => format!("{path}{f}"),
            None => path.to_string(),
        };
        let expr = match crate::cel::parse(text) {
            Ok(e) => e,
            Err(e) => {
                errors.push((
                    path.to_string(),
                    format!("Invalid value: \"{}\": rule compile error: {e}", type_name(v)),
                ));
                continue;
            }
        };
        if expr.transition() && old.is_none() {
            continue;
        }
        match expr.holds(v, old) {
            Ok(true) => {}
            Ok(false) => {
                let detail = message.map_or_else(|| format!("failed rule: {shown}"), str::to_string);
                errors.push((at, format!("Invalid value: \"{}\": {detail}", type_name(v))));
            }
            Err(e) => errors.push((
                path.to_string(),
                format!(
                    "Invalid value: \"{}\": {e} evaluating rule: {shown}",
                    type_name(v)
                ),
            )),
        }
    }
}

fn walk_value(
    schema: &Value,
    v: &mut Value,
    old: Option<&Value>,
    path: &str,
    errors: &mut Vec<(String, String)>,
) {
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
    bounds(schema, v, path, errors);
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
                        let was = old.and_then(|o| o.get(key));
                        walk(sub, value, was, &child(path, key), errors);
                    }
                }
            }
            match schema.get("additionalProperties") {
                Some(Value::Object(_)) => {
                    let sub = &schema["additionalProperties"];
                    for (key, value) in m.iter_mut() {
                        if props.is_none_or(|p| !p.contains_key(key)) {
                            let was = old.and_then(|o| o.get(key));
                            walk(sub, value, was, &child(path, key), errors);
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
                // Items of a list are correlated with the old list's only by a map list's keys
                // (as kube-apiserver does); other items run no transition rules.
                let keys = map_keys(schema);
                for (i, item) in items.iter_mut().enumerate() {
                    let was = keys.as_deref().and_then(|k| same_keys(old, item, k));
                    walk(sub, item, was, &format!("{path}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
}

/// `minimum` and `maximum` (and their `exclusive*` flags), with kube-apiserver's messages.
fn bounds(schema: &Value, v: &Value, path: &str, errors: &mut Vec<(String, String)>) {
    let Some(n) = v.as_f64() else {
        return;
    };
    let flag = |k: &str| schema.get(k) == Some(&Value::Bool(true));
    for (key, exclusive, above, word) in [
        ("maximum", "exclusiveMaximum", true, "less"),
        ("minimum", "exclusiveMinimum", false, "greater"),
    ] {
        let Some(bound) = schema.get(key).and_then(Value::as_f64) else {
            continue;
        };
        let exclusive = flag(exclusive);
        let beyond = if above { n > bound } else { n < bound };
        if beyond || (exclusive && n == bound) {
            let or_equal = if exclusive { "" } else { "or equal to " };
            errors.push((
                path.to_string(),
                format!(
                    "Invalid value: {v}: {path} in body should be {word} than {or_equal}{}",
                    bound_text(bound)
                ),
            ));
        }
    }
}

/// A schema bound as kube-apiserver 1.28 prints it: an integral one without a fraction or an
/// exponent (`2147483647`), as measured; others as Rust prints them (`0.5`).
fn bound_text(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e18 {
        format!("{f:.0}")
    } else {
        f.to_string()
    }
}

/// A map list's keys (`x-kubernetes-list-type: map`).
fn map_keys(schema: &Value) -> Option<Vec<String>> {
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return None;
    }
    let keys = schema.get("x-kubernetes-list-map-keys")?.as_array()?;
    Some(
        keys.iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
    )
}

/// The item of the old list with the same keys as `item`.
fn same_keys<'a>(old: Option<&'a Value>, item: &Value, keys: &[String]) -> Option<&'a Value> {
    old?.as_array()?
        .iter()
        .find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
}

fn prune(m: &mut Map<String, Value>, props: Option<&Map<String, Value>>) {
    m.retain(|k, _| props.is_some_and(|p| p.contains_key(k)));
}
