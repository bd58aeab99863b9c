//! Whether a live object already has what a builder wants, so a steady state makes no writes.
//!
//! The live object carries more than the builder's output: server defaults, fields of other
//! managers (a port another controller added, tolerations an admission plugin added). So the
//! comparison is a *subset*: every field the builder sets must be there with its value; lists of
//! objects (ports, containers, volumes, …) match item by item in any order, each wanted item
//! contained in some live item; lists of plain values (`args`, `command`) must be equal.

use serde_json::Value;

/// Whether `actual` contains everything in `desired`.
pub fn contains(actual: &Value, desired: &Value) -> bool {
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => d.iter().all(|(k, dv)| match a.get(k) {
            Some(av) => contains(av, dv),
            // The API server omits empty values; wanting one is wanting nothing.
            None => is_empty(dv),
        }),
        (Value::Array(a), Value::Array(d)) if d.iter().all(Value::is_object) => {
            d.iter().all(|dv| a.iter().any(|av| contains(av, dv)))
        }
        (a, d) => a == d,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn another_managers_additions_are_no_difference() {
        let desired =
            json!({"spec": {"ports": [{"name": "slurmctld", "port": 6817}], "selector": {"a": "b"}}});
        let with_extra_port = json!({"spec": {"ports": [{"name": "metrics", "port": 9000}, {"name": "slurmctld", "port": 6817, "protocol": "TCP"}],
            "selector": {"a": "b"}, "clusterIP": "10.0.0.1"}});
        assert!(contains(&with_extra_port, &desired));
        let changed =
            json!({"spec": {"ports": [{"name": "slurmctld", "port": 6818}], "selector": {"a": "b"}}});
        assert!(!contains(&changed, &desired));
        let missing_selector = json!({"spec": {"ports": [{"name": "slurmctld", "port": 6817}]}});
        assert!(!contains(&missing_selector, &desired));
        assert!(contains(
            &json!({"a": 1}),
            &json!({"a": 1, "b": null, "c": [], "d": {}})
        ));
        assert!(
            !contains(&json!({"args": ["-Z", "x"]}), &json!({"args": ["-Z"]})),
            "plain lists must be equal"
        );
    }
}
