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
    contains_at(actual, desired, false)
}

/// Whether the values of the field `key` are quantities: the API server stores them in canonical
/// form (`1024Mi` as `1Gi`), which is no change.
fn quantities_in(key: &str) -> bool {
    matches!(key, "requests" | "limits" | "overhead")
}

/// Two leaf values: equal, or (`quantity`) the same quantity in other words.
fn same_leaf(a: &Value, d: &Value, quantity: bool) -> bool {
    a == d
        || (quantity
            && matches!((a, d), (Value::String(x), Value::String(y)) if slinky_api::quantity::same(x, y)))
}

fn contains_at(actual: &Value, desired: &Value, quantity: bool) -> bool {
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => d.iter().all(|(k, dv)| match a.get(k) {
            Some(av) => contains_at(
                av,
                dv,
                quantities_in(k) || (quantity && !dv.is_object()) || k == "sizeLimit",
            ),
            // The API server omits empty values; wanting one is wanting nothing.
            None => is_empty(dv),
        }),
        // Each wanted element anywhere in the live list; the one at the same index first (lists
        // keep their order: a shared child's 100 owner references compared in order, not 100²).
        (Value::Array(a), Value::Array(d)) if d.iter().all(Value::is_object) => {
            d.iter().enumerate().all(|(i, dv)| {
                a.get(i).is_some_and(|av| contains_at(av, dv, false))
                    || a.iter().any(|av| contains_at(av, dv, false))
            })
        }
        (a, d) => same_leaf(a, d, quantity),
    }
}

/// The fields of `desired` that `actual` lacks or has with another value, as paths (`spec.
/// initContainers[name=logfile].restartPolicy`), at most `limit` of them.
pub fn differences(actual: &Value, desired: &Value, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    diff(actual, desired, String::new(), &mut out, limit, false);
    out
}

fn diff(actual: &Value, desired: &Value, path: String, out: &mut Vec<String>, limit: usize, quantity: bool) {
    if out.len() >= limit {
        return;
    }
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => {
            for (k, dv) in d {
                match a.get(k) {
                    Some(av) => diff(
                        av,
                        dv,
                        join(k),
                        out,
                        limit,
                        quantities_in(k) || (quantity && !dv.is_object()) || k == "sizeLimit",
                    ),
                    None if is_empty(dv) => {}
                    None => out.push(join(k)),
                }
            }
        }
        (Value::Array(a), Value::Array(d)) if d.iter().all(Value::is_object) => {
            for (i, dv) in d.iter().enumerate() {
                if a.iter().any(|av| contains(av, dv)) {
                    continue;
                }
                // Name the item by its `name` when it has one, and find its counterpart by it.
                let item_name = |v: &'_ Value| {
                    v.get("name")
                        .or_else(|| v.pointer("/metadata/name"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                let name = item_name(dv);
                let name = name.as_deref();
                let item = match name {
                    Some(n) => format!("{path}[name={n}]"),
                    None => format!("{path}[{i}]"),
                };
                match name.and_then(|n| a.iter().find(|av| item_name(av).as_deref() == Some(n))) {
                    Some(av) => diff(av, dv, item, out, limit, false),
                    None => out.push(item),
                }
            }
        }
        (a, d) if !same_leaf(a, d, quantity) => out.push(path),
        _ => {}
    }
}

/// What a builder's object lost on its way into the API server, for a Warning Event: the paths
/// of the fields the stored object lacks (a field of a feature the server does not enable, or of
/// a newer Kubernetes), with a hint for the fields known to be dropped.
pub fn dropped_note(what: &str, paths: &[String]) -> String {
    let mut note = format!(
        "the API server stored {what} without fields the builder set: {}",
        paths.join(", ")
    );
    if paths
        .iter()
        .any(|p| p.contains("spec.initContainers") && p.ends_with(".restartPolicy"))
    {
        note.push_str(
            "; native sidecar containers (initContainers with restartPolicy: Always) need \
             Kubernetes 1.29+, or the SidecarContainers feature gate on 1.28: without them the \
             sidecar runs as a plain init container and blocks the pod from starting; set no \
             image for it (spec.logfile.image) to leave it out",
        );
    }
    note
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

    /// The hint reaches a template's sidecar (a StatefulSet's) as well as a pod's.
    #[test]
    fn a_dropped_sidecar_gets_the_hint_in_a_pod_and_in_a_template() {
        for path in [
            "spec.initContainers[name=logfile].restartPolicy",
            "spec.template.spec.initContainers[name=logfile].restartPolicy",
        ] {
            let note = super::dropped_note("it", &[path.to_string()]);
            assert!(note.contains("Kubernetes 1.29+"), "{path}: {note}");
        }
        let note = super::dropped_note(
            "it",
            &["spec.template.spec.containers[name=a].restartPolicy".into()],
        );
        assert!(!note.contains("1.29"), "{note}");
    }

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
        // Lists of objects: in order, reordered, or one wanted item missing.
        let refs = json!({"r": [{"uid": "a"}, {"uid": "b"}, {"uid": "c"}]});
        assert!(contains(&refs, &json!({"r": [{"uid": "a"}, {"uid": "b"}]})));
        assert!(contains(&refs, &json!({"r": [{"uid": "c"}, {"uid": "a"}]})));
        assert!(!contains(
            &refs,
            &json!({"r": [{"uid": "a"}, {"uid": "d"}, {"uid": "c"}]})
        ));
    }

    #[test]
    fn quantities_are_compared_as_numbers_where_they_are_quantities() {
        let want = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1024Mi", "cpu": "1.5"}}}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "2048Mi"}}]}});
        let stored = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi", "cpu": "1500m"}}}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "2Gi"}}]}});
        assert!(
            contains(&stored, &want),
            "the API server's canonical form is no change"
        );
        assert!(differences(&stored, &want, 10).is_empty(), "and no dropped field");
        let more = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "2Gi", "cpu": "1500m"}}}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "2Gi"}}]}});
        assert!(!contains(&more, &want));
        assert_eq!(
            differences(&more, &want, 10),
            ["spec.containers[name=c].resources.requests.memory"]
        );
        // Elsewhere a text that reads as a quantity is only a text.
        assert!(!contains(
            &json!({"metadata": {"labels": {"size": "1k"}}}),
            &json!({"metadata": {"labels": {"size": "1000"}}})
        ));
    }

    #[test]
    fn differences_name_the_fields() {
        let desired = json!({"spec": {"initContainers": [{"name": "logfile", "image": "a", "restartPolicy": "Always"}],
            "hostname": "h", "dnsConfig": {}}});
        let actual =
            json!({"spec": {"initContainers": [{"name": "logfile", "image": "a"}], "hostname": "x"}});
        assert_eq!(
            differences(&actual, &desired, 10),
            ["spec.hostname", "spec.initContainers[name=logfile].restartPolicy"]
        );
        assert!(differences(&desired, &desired, 10).is_empty());
        assert_eq!(differences(&actual, &desired, 1).len(), 1);
    }
}
