//! Patches and server-side apply.
//!
//! * JSON merge patch (RFC 7386) and JSON patch (RFC 6902), through the `json-patch` crate.
//! * Strategic merge patch for the built-in types: lists merged by their patch merge keys
//!   (containers/volumes/env by `name`, container ports by `containerPort`, service ports by
//!   `port`, mounts by `mountPath`, …), `null` deletes, and the `$patch: delete|replace`,
//!   `$retainKeys`, `$setElementOrder/…` and `$deleteFromPrimitiveList/…` directives.
//! * Server-side apply: field sets per manager (`metadata.managedFields`, `FieldsV1`), conflicts
//!   when another manager owns a field with a different value (unless forced), and removal of
//!   fields a manager stopped applying.

use std::collections::BTreeSet;

use serde_json::{Map, Value};
use slinky_api::merge_keys::{ListContext, patch_merge_key};

/// The merge key of a list field in a resource, if it is a keyed (associative) list.
pub fn list_key(plural: &str, field: &str) -> Option<&'static str> {
    let ctx = if plural == "services" {
        ListContext::Service
    } else {
        ListContext::Pod
    };
    patch_merge_key(field, ctx).or(match field {
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "managedFields" => None,
        _ => None,
    })
}

/// Apply a strategic merge patch to `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value, plural: &str) {
    let (Value::Object(t), Value::Object(p)) = (&mut *target, patch) else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = p.clone();
        replaced.remove("$patch");
        *t = replaced;
        return;
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: BTreeSet<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(k.as_str()));
    }
    for (key, pv) in p {
        // Before the other directives are skipped: this one changes the target.
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(del)) = (t.get_mut(field), pv) {
                items.retain(|i| !del.contains(i));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            t.remove(key);
            continue;
        }
        match (t.get_mut(key), pv) {
            (Some(tv @ Value::Object(_)), Value::Object(_)) => strategic_merge(tv, pv, plural),
            (Some(Value::Array(tl)), Value::Array(pl)) => match list_key(plural, key) {
                Some(mk) => merge_keyed(tl, pl, mk, plural),
                // `metadata.finalizers` is a primitive list with the merge strategy: the
                // patch's values, then the object's others, as kube-apiserver merges them
                // (`$deleteFromPrimitiveList` removes).
                None if key == "finalizers" => {
                    let mut merged: Vec<Value> = Vec::new();
                    for v in pl.iter().chain(tl.iter()) {
                        if !merged.contains(v) {
                            merged.push(v.clone());
                        }
                    }
                    *tl = merged;
                }
                None => *tl = pl.clone(),
            },
            _ => {
                let mut v = pv.clone();
                strip_directives(&mut v);
                t.insert(key.clone(), v);
            }
        }
    }
    let orders: Vec<(String, Value)> = p
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("$setElementOrder/")
                .map(|f| (f.to_string(), v.clone()))
        })
        .collect();
    for (field, order) in orders {
        reorder(t, &field, &order, plural);
    }
}

fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.starts_with('$'));
            m.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

fn merge_keyed(target: &mut Vec<Value>, patch: &[Value], key: &str, plural: &str) {
    for item in patch {
        let k = item.get(key);
        let pos = k.and_then(|k| target.iter().position(|t| t.get(key) == Some(k)));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                target.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut target[i], item, plural),
            (None, false) => {
                let mut v = item.clone();
                strip_directives(&mut v);
                target.push(v);
            }
        }
    }
}

fn reorder(t: &mut Map<String, Value>, field: &str, order: &Value, plural: &str) {
    let (Some(Value::Array(items)), Some(order), Some(key)) =
        (t.get_mut(field), order.as_array(), list_key(plural, field))
    else {
        return;
    };
    let rank = |v: &Value| {
        order
            .iter()
            .position(|o| o.get(key) == v.get(key))
            .unwrap_or(usize::MAX)
    };
    items.sort_by_key(rank);
}

/// A path to a field, as FieldsV1 keys (`f:spec`, `k:{"name":"c"}`, `v:"x"`).
pub type FieldPath = Vec<String>;

/// The leaf field paths of an object (what a manager owns when it sets this object).
/// `metadata.{name,namespace,uid,resourceVersion,generation,creationTimestamp,managedFields}`
/// and `apiVersion`/`kind` are not owned.
pub fn field_set(obj: &Value, plural: &str, status_only: bool) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    if let Value::Object(m) = obj {
        for (k, v) in m {
            if matches!(k.as_str(), "apiVersion" | "kind") || (status_only && k != "status") {
                continue;
            }
            if k == "metadata" {
                if let Value::Object(meta) = v {
                    for (mk, mv) in meta {
                        if matches!(
                            mk.as_str(),
                            "labels" | "annotations" | "finalizers" | "ownerReferences"
                        ) {
                            collect(
                                mv,
                                &mut vec![format!("f:{k}"), format!("f:{mk}")],
                                mk,
                                plural,
                                &mut out,
                            );
                        }
                    }
                }
                continue;
            }
            collect(v, &mut vec![format!("f:{k}")], k, plural, &mut out);
        }
    }
    out
}

fn collect(v: &Value, path: &mut FieldPath, field: &str, plural: &str, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(format!("f:{k}"));
                collect(child, path, k, plural, out);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match list_key(plural, field) {
            Some(key) if items.iter().all(|i| i.get(key).is_some()) => {
                for item in items {
                    let k = serde_json::json!({ key: item.get(key) });
                    path.push(format!("k:{k}"));
                    out.insert(path.clone()); // the item itself (".")
                    collect(item, path, "", plural, out);
                    path.pop();
                }
            }
            _ if field == "finalizers" => {
                for item in items {
                    path.push(format!("v:{item}"));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Look up the value at a field path.
pub fn get_path<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        cur = step(cur, seg)?;
    }
    Some(cur)
}

fn step<'a>(cur: &'a Value, seg: &str) -> Option<&'a Value> {
    if let Some(f) = seg.strip_prefix("f:") {
        return cur.get(f);
    }
    let items = cur.as_array()?;
    if let Some(k) = seg.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(k).ok()?;
        return items
            .iter()
            .find(|i| key.iter().all(|(kk, kv)| i.get(kk) == Some(kv)));
    }
    let v: Value = serde_json::from_str(seg.strip_prefix("v:")?).ok()?;
    items.iter().find(|i| **i == v)
}

/// Remove the value at a field path (a keyed list item, a set value, or a map entry).
pub fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parent_path {
        let next = if let Some(f) = seg.strip_prefix("f:") {
            cur.get_mut(f)
        } else {
            let idx = cur.as_array().and_then(|_| position(cur, seg));
            match idx {
                Some(i) => cur.get_mut(i),
                None => None,
            }
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(i) = position(cur, last)
        && let Some(a) = cur.as_array_mut()
    {
        a.remove(i);
    }
}

fn position(list: &Value, seg: &str) -> Option<usize> {
    let found = step(list, seg)?;
    list.as_array()?.iter().position(|i| std::ptr::eq(i, found))
}

/// Merge an applied configuration into an object: maps recursively, keyed lists by key, other
/// lists and scalars replaced.
pub fn apply_merge(target: &mut Value, config: &Value, plural: &str, field: &str) {
    match (&mut *target, config) {
        (Value::Object(t), Value::Object(c)) => {
            for (k, cv) in c {
                match t.get_mut(k) {
                    Some(tv) => apply_merge(tv, cv, plural, k),
                    None => {
                        t.insert(k.clone(), cv.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(c)) if list_key(plural, field).is_some() => {
            let key = list_key(plural, field).unwrap_or("name");
            *t = apply_keyed(std::mem::take(t), c, key, plural);
        }
        (t, c) => *t = c.clone(),
    }
}

/// A keyed list merged as structured-merge-diff merges an applied associative list: items of
/// both in the applied order, the live object's other items kept where they were.
fn apply_keyed(live: Vec<Value>, applied: &[Value], key: &str, plural: &str) -> Vec<Value> {
    let k = |v: &Value| v.get(key).cloned().filter(|k| !k.is_null());
    let same = |a: &Value, b: &Value| k(a).is_some() && k(a) == k(b);
    let in_applied = |v: &Value| applied.iter().any(|a| same(a, v));
    let counterpart = |v: &Value| live.iter().find(|l| same(l, v)).cloned();
    let mut shared: std::collections::VecDeque<Value> = applied
        .iter()
        .filter(|a| live.iter().any(|l| same(l, a)))
        .filter_map(k)
        .collect();
    let mut next_shared = shared.pop_front();
    let mut out = Vec::with_capacity(live.len().max(applied.len()));
    let (mut li, mut ai) = (0, 0);
    while li < live.len() || ai < applied.len() {
        if li < live.len() && ai < applied.len() {
            if same(&live[li], &applied[ai]) {
                let mut merged = live[li].clone();
                apply_merge(&mut merged, &applied[ai], plural, "");
                out.push(merged);
                li += 1;
                ai += 1;
                next_shared = shared.pop_front();
                continue;
            }
            // A shared item, but not the next one in the applied order: it comes later.
            if in_applied(&live[li]) && next_shared.is_some() && next_shared != k(&live[li]) {
                li += 1;
                continue;
            }
        }
        if li < live.len() && !in_applied(&live[li]) {
            out.push(live[li].clone());
            li += 1;
            continue;
        }
        if ai < applied.len() {
            let item = &applied[ai];
            let merged = match counterpart(item) {
                Some(mut l) => {
                    apply_merge(&mut l, item, plural, "");
                    l
                }
                None => item.clone(),
            };
            if next_shared.is_some() && next_shared == k(item) {
                next_shared = shared.pop_front();
            }
            out.push(merged);
            ai += 1;
            continue;
        }
        // A live item also applied, already placed in the applied order.
        li += 1;
    }
    out
}

/// FieldsV1 JSON of a field set.
pub fn to_fields_v1(set: &BTreeSet<FieldPath>) -> Value {
    fn insert(map: &mut Map<String, Value>, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let entry = map
            .entry(first.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(child) = entry {
            if rest.is_empty() {
                if first.starts_with("k:") {
                    child
                        .entry(".".to_string())
                        .or_insert_with(|| Value::Object(Map::new()));
                }
            } else {
                insert(child, rest);
            }
        }
    }
    let mut root = Map::new();
    for path in set {
        insert(&mut root, path);
    }
    Value::Object(root)
}

/// The field set in a FieldsV1 JSON.
pub fn from_fields_v1(v: &Value) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        let Some(m) = v.as_object() else { return };
        let children: Vec<_> = m.iter().filter(|(k, _)| k.as_str() != ".").collect();
        if (m.contains_key(".") || children.is_empty()) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, child) in children {
            path.push(k.clone());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// Render a field path for a conflict message: `.spec.replicas`, `.spec.containers[name="c"].image`.
pub fn display_path(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let inner: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", inner.join(",")));
        } else if let Some(v) = seg.strip_prefix("v:") {
            s.push_str(&format!("[{v}]"));
        }
    }
    s
}

/// The leaf paths whose values differ between two objects (present in either).
pub fn changed_fields(old: &Value, new: &Value, plural: &str, status_only: bool) -> BTreeSet<FieldPath> {
    let old_set = field_set(old, plural, status_only);
    let new_set = field_set(new, plural, status_only);
    old_set
        .union(&new_set)
        .filter(|p| get_path(old, p) != get_path(new, p))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn applied_keyed_lists_take_the_applied_order_as_structured_merge_diff_does() {
        let refs = |uids: &[&str]| Value::Array(uids.iter().map(|u| json!({"uid": u})).collect());
        let mut obj = json!({"metadata": {"ownerReferences": refs(&["b", "x", "a"])}});
        apply_merge(
            &mut obj,
            &json!({"metadata": {"ownerReferences": refs(&["a", "b", "c"])}}),
            "services",
            "",
        );
        assert_eq!(
            obj["metadata"]["ownerReferences"],
            refs(&["x", "a", "b", "c"]),
            "shared items in the applied order, a live-only item where it was, new ones after"
        );
        let mut obj = json!({"metadata": {"ownerReferences": refs(&["a"])}});
        apply_merge(
            &mut obj,
            &json!({"metadata": {"ownerReferences": refs(&["a", "b"])}}),
            "services",
            "",
        );
        assert_eq!(obj["metadata"]["ownerReferences"], refs(&["a", "b"]));
    }

    #[test]
    fn strategic_merge_keys_and_directives() {
        let mut pod = json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
                             "tolerations": [{"key": "x"}]}, "metadata": {"labels": {"k": "v", "gone": "x"}}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "a", "$patch": "delete"}, {"name": "c"}],
                                     "tolerations": [{"key": "y"}]},
                           "metadata": {"labels": {"gone": null}}});
        strategic_merge(&mut pod, &patch, "pods");
        assert_eq!(
            pod,
            json!({"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c"}],
                                         "tolerations": [{"key": "y"}]}, "metadata": {"labels": {"k": "v"}}})
        );
    }

    #[test]
    fn field_sets_round_trip_through_fields_v1() {
        let obj = json!({"metadata": {"labels": {"a": "b"}, "name": "x"},
                         "spec": {"ports": [{"port": 80, "name": "http"}], "selector": {"app": "x"}}});
        let set = field_set(&obj, "services", false);
        let v1 = to_fields_v1(&set);
        assert_eq!(from_fields_v1(&v1), set);
        assert!(set.contains(&vec![
            "f:spec".to_string(),
            "f:ports".into(),
            "k:{\"port\":80}".into(),
            "f:name".into()
        ]));
        let path: Vec<String> = vec![
            "f:spec".into(),
            "f:ports".into(),
            "k:{\"port\":80}".into(),
            "f:name".into(),
        ];
        assert_eq!(get_path(&obj, &path), Some(&json!("http")));
        let mut o = obj.clone();
        remove_path(&mut o, &path[..3]);
        assert_eq!(o["spec"]["ports"], json!([]));
    }
}
