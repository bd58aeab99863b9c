//! managedFields: who owns which field, updated by PUT/PATCH (the changed fields move to the
//! writer) and by server-side apply (conflicts between managers, forced take-overs, removal of
//! fields a manager stopped applying).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{meta_mut, now, strip_server_fields};
use crate::{
    ApiError,
    patch::{self, FieldPath},
    resources::ResourceType,
};

/// The managedFields entries of an object, as (manager, operation, subresource, fields).
pub(super) fn managed(obj: &Value) -> Vec<(String, String, String, BTreeSet<FieldPath>)> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                    (
                        s("manager"),
                        s("operation"),
                        s("subresource"),
                        patch::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_managed(
    obj: &mut Value,
    entries: Vec<(String, String, String, BTreeSet<FieldPath>)>,
    rt: &ResourceType,
) {
    let time = now();
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|(_, _, _, set)| !set.is_empty())
        .map(|(manager, op, sub, set)| {
            let mut e = json!({"manager": manager, "operation": op, "apiVersion": rt.api_version(),
                "time": time, "fieldsType": "FieldsV1", "fieldsV1": patch::to_fields_v1(&set)});
            if !sub.is_empty() {
                e["subresource"] = sub.into();
            }
            e
        })
        .collect();
    let m = meta_mut(obj);
    if list.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(list));
    }
}

/// Give `set` to `manager` (operation `op`), taking the fields away from every other manager.
pub(super) fn set_managed(
    obj: &mut Value,
    manager: &str,
    op: &str,
    rt: &ResourceType,
    set: &BTreeSet<FieldPath>,
    status: bool,
) {
    let sub = if status { "status" } else { "" };
    let mut entries = managed(obj);
    for (m, o, s, fields) in entries.iter_mut() {
        if !(m == manager && o == op && s == sub) {
            fields.retain(|f| !set.contains(f));
        }
    }
    match entries
        .iter_mut()
        .find(|(m, o, s, _)| m == manager && o == op && s == sub)
    {
        Some(e) if op == "Apply" => e.3 = set.clone(),
        Some(e) => e.3.extend(set.iter().cloned()),
        None => entries.push((manager.to_string(), op.to_string(), sub.to_string(), set.clone())),
    }
    write_managed(obj, entries, rt);
}

/// Server-side apply of `config` by `manager` onto `current`.
pub(super) fn apply_to(
    current: &Value,
    config: &Value,
    rt: &ResourceType,
    manager: &str,
    force: bool,
    status: bool,
) -> Result<Value, ApiError> {
    let config = strip_server_fields(config);
    let new_set = patch::field_set(&config, &rt.plural, status);
    let sub = if status { "status" } else { "" };
    let entries = managed(current);
    let previous: BTreeSet<FieldPath> = entries
        .iter()
        .filter(|(m, o, s, _)| m == manager && o == "Apply" && s == sub)
        .flat_map(|(_, _, _, f)| f.iter().cloned())
        .collect();
    // Conflicts: fields another manager owns whose value this config changes.
    let mut conflicts: Vec<(String, String)> = Vec::new();
    for (m, _, _, fields) in &entries {
        if m == manager {
            continue;
        }
        for path in fields.intersection(&new_set) {
            if patch::get_path(current, path) != patch::get_path(&config, path) {
                conflicts.push((m.clone(), patch::display_path(path)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let detail: Vec<String> = conflicts
            .iter()
            .map(|(m, p)| format!("conflict with {m:?}: {p}"))
            .collect();
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} conflict{}: {}",
                conflicts.len(),
                if conflicts.len() == 1 { "" } else { "s" },
                detail.join(", ")
            ),
        ));
    }
    let mut obj = current.clone();
    // Fields this manager applied before and no longer applies are removed, unless another
    // entry also owns them: another manager's, or this manager's own Update entry (a create or
    // an update by the same name is another owner, as in structured-merge-diff).
    let others: BTreeSet<&FieldPath> = entries
        .iter()
        .filter(|(m, o, s, _)| !(m == manager && o == "Apply" && s == sub))
        .flat_map(|e| e.3.iter())
        .collect();
    for path in previous.difference(&new_set) {
        if !others.contains(path) {
            patch::remove_path(&mut obj, path);
        }
    }
    let mut body = config.clone();
    if let Value::Object(m) = &mut body {
        m.remove("apiVersion");
        m.remove("kind");
        if status {
            m.retain(|k, _| k == "status");
        }
    }
    patch::apply_merge(&mut obj, &body, &rt.plural, "");
    // Ownership: this manager owns exactly new_set; forced conflicts are taken from others.
    let mut entries = entries;
    let taken: BTreeSet<String> = if force {
        conflicts.iter().map(|(_, p)| p.clone()).collect()
    } else {
        BTreeSet::new()
    };
    for (m, _, _, fields) in entries.iter_mut() {
        if m != manager {
            fields.retain(|f| !(new_set.contains(f) && taken.contains(&patch::display_path(f))));
        }
    }
    match entries
        .iter_mut()
        .find(|(m, o, s, _)| m == manager && o == "Apply" && s == sub)
    {
        Some(e) => e.3 = new_set,
        None => entries.push((manager.to_string(), "Apply".into(), sub.to_string(), new_set)),
    }
    write_managed(&mut obj, entries, rt);
    Ok(obj)
}
