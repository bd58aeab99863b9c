//! Lists: selectors, pagination (`limit`/`continue`), resourceVersion semantics, and tables for
//! kubectl.

use std::{collections::HashMap, sync::Arc};

use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::{Body, body::respond, full, scale::json_path_get};
use crate::{
    ApiError, Shared,
    resources::ResourceType,
    selectors::{FieldSelector, LabelSelector},
};

fn age(created: Option<&str>) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (k8s_openapi::jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A computed cell of a built-in kind's table.
type Cell = fn(&Value) -> Value;
/// A column's cell, computed from the object.
type CellFn = Box<dyn Fn(&Value) -> Value>;

fn int(o: &Value, pointer: &str) -> i64 {
    o.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// `ready/desired` of a workload, as kubectl prints a StatefulSet's or a Deployment's `READY`
/// (a missing `spec.replicas` is 1, its default).
fn ready_of_desired(o: &Value) -> Value {
    let desired = o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    format!("{}/{desired}", int(o, "/status/readyReplicas")).into()
}

/// The names or images of a workload's pod template's containers, comma-separated (`-o wide`'s
/// `CONTAINERS` and `IMAGES`).
fn template_containers(o: &Value, field: &str) -> Value {
    let names: Vec<&str> = o
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get(field).and_then(Value::as_str))
        .collect();
    names.join(",").into()
}

/// A label selector as `metav1.FormatLabelSelector` prints it (requirements sorted by key:
/// `k=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`), `<none>` when empty.
fn format_selector(o: &Value) -> Value {
    let selector = o.pointer("/spec/selector").unwrap_or(&Value::Null);
    let mut parts: Vec<(String, String)> = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), format!("{k}={}", v.as_str().unwrap_or_default())))
        .collect();
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
        let mut values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let text = match e.get("operator").and_then(Value::as_str) {
            Some("In") => format!("{key} in ({})", values.join(",")),
            Some("NotIn") => format!("{key} notin ({})", values.join(",")),
            Some("Exists") => key.to_string(),
            Some("DoesNotExist") => format!("!{key}"),
            _ => return "<error>".into(),
        };
        parts.push((key.to_string(), text));
    }
    parts.sort();
    if parts.is_empty() {
        return "<none>".into();
    }
    parts
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
        .into()
}

/// A PodDisruptionBudget's `minAvailable` or `maxUnavailable` as printed: the number or
/// percentage, or `N/A`.
fn int_or_na(o: &Value, pointer: &str) -> Value {
    match o.pointer(pointer) {
        Some(Value::Number(n)) => n.to_string().into(),
        Some(Value::String(s)) => s.clone().into(),
        _ => "N/A".into(),
    }
}

/// A pod's `READY` (ready containers / containers), `STATUS` (the reason, a waiting or terminated
/// container's reason, `Terminating`, or the phase) and `RESTARTS`, as kubectl prints them.
fn pod_ready(o: &Value) -> Value {
    let total = o
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = container_statuses(o).filter(|c| c["ready"] == true).count();
    format!("{ready}/{total}").into()
}

fn container_statuses(o: &Value) -> impl Iterator<Item = &Value> {
    o.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// kubectl's pod `STATUS`: the phase, replaced by `status.reason`, then by a container's waiting
/// or terminated reason (the last container's first), then `Terminating` while being deleted.
fn non_empty(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|r| !r.is_empty())
}

fn pod_status(o: &Value) -> Value {
    let mut reason = non_empty(o.pointer("/status/phase")).unwrap_or_default();
    if let Some(r) = non_empty(o.pointer("/status/reason")) {
        reason = r;
    }
    let statuses: Vec<&Value> = container_statuses(o).collect();
    if let Some(r) = statuses.iter().rev().find_map(|c| {
        non_empty(c.pointer("/state/waiting/reason"))
            .or_else(|| non_empty(c.pointer("/state/terminated/reason")))
    }) {
        reason = r;
    }
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        return "Terminating".into();
    }
    reason.into()
}

/// A wide pod column: the value, or `<none>`.
fn or_none(pointer: &'static str) -> impl Fn(&Value) -> Value {
    move |o| {
        o.pointer(pointer)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .unwrap_or("<none>")
            .into()
    }
}

/// A pod's readiness gates: `<none>`, or how many hold out of how many.
fn readiness_gates(o: &Value) -> Value {
    let gates = o
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if gates.is_empty() {
        return "<none>".into();
    }
    let conditions = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let held = gates
        .iter()
        .filter(|g| {
            conditions
                .iter()
                .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
        })
        .count();
    format!("{held}/{}", gates.len()).into()
}

/// kubectl's claim `STATUS`: the phase, or `Terminating` while being deleted.
fn claim_status(o: &Value) -> Value {
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        return "Terminating".into();
    }
    o.pointer("/status/phase").cloned().unwrap_or_else(|| "".into())
}

fn pod_restarts(o: &Value) -> Value {
    let n: i64 = container_statuses(o)
        .map(|c| c["restartCount"].as_i64().unwrap_or(0))
        .sum();
    n.into()
}

/// A claim's access modes, abbreviated as kubectl prints them (`RWO,ROX`).
fn access_modes(o: &Value) -> Value {
    let modes = o
        .pointer("/status/accessModes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|m| match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>();
    modes.join(",").into()
}

fn path(pointer: &'static str) -> impl Fn(&Value) -> Value {
    move |o| match o.pointer(pointer) {
        Some(Value::String(s)) => s.clone().into(),
        Some(Value::Null) | None => "".into(),
        Some(v) => v.to_string().into(),
    }
}

/// The columns kube-apiserver 1.28 prints for a built-in kind between `Name` and `Age` (none
/// for the kinds this server prints only `Name` and `Age` of, and custom resources, whose
/// printer columns come from their CRD).
fn builtin_columns(rt: &ResourceType) -> Vec<(&'static str, CellFn)> {
    let b = |f: Cell| -> CellFn { Box::new(f) };
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => vec![
            ("Ready", b(pod_ready)),
            ("Status", b(pod_status)),
            ("Restarts", b(pod_restarts)),
        ],
        ("", "services") => vec![
            ("Type", Box::new(path("/spec/type"))),
            ("Cluster-IP", Box::new(path("/spec/clusterIP"))),
        ],
        ("", "namespaces") => vec![("Status", Box::new(path("/status/phase")))],
        ("", "events") => vec![
            ("Type", Box::new(path("/type"))),
            ("Reason", Box::new(path("/reason"))),
            ("Object", Box::new(path("/involvedObject/name"))),
            ("Message", Box::new(path("/message"))),
        ],
        ("", "persistentvolumeclaims") => vec![
            ("Status", b(claim_status)),
            ("Volume", Box::new(path("/spec/volumeName"))),
            ("Capacity", Box::new(path("/status/capacity/storage"))),
            ("Access Modes", b(access_modes)),
            ("StorageClass", Box::new(path("/spec/storageClassName"))),
        ],
        ("apps", "statefulsets") => vec![("Ready", b(ready_of_desired))],
        ("apps", "deployments") => vec![
            ("Ready", b(ready_of_desired)),
            ("Up-to-date", b(|o| int(o, "/status/updatedReplicas").into())),
            ("Available", b(|o| int(o, "/status/availableReplicas").into())),
        ],
        ("apps", "replicasets") => vec![
            (
                "Desired",
                b(|o| {
                    o.pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                        .into()
                }),
            ),
            ("Current", b(|o| int(o, "/status/replicas").into())),
            ("Ready", b(|o| int(o, "/status/readyReplicas").into())),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            ("Min Available", b(|o| int_or_na(o, "/spec/minAvailable"))),
            ("Max Unavailable", b(|o| int_or_na(o, "/spec/maxUnavailable"))),
            (
                "Allowed Disruptions",
                b(|o| int(o, "/status/disruptionsAllowed").into()),
            ),
        ],
        _ => vec![],
    }
}

/// The columns kube-apiserver 1.28 prints after `Age` with priority 1 (`-o wide`).
fn wide_columns(rt: &ResourceType) -> Vec<(&'static str, CellFn)> {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => vec![
            ("IP", Box::new(or_none("/status/podIP"))),
            ("Node", Box::new(or_none("/spec/nodeName"))),
            ("Nominated Node", Box::new(or_none("/status/nominatedNodeName"))),
            ("Readiness Gates", Box::new(readiness_gates)),
        ],
        ("apps", "statefulsets") => vec![
            ("Containers", Box::new(|o: &Value| template_containers(o, "name"))),
            ("Images", Box::new(|o: &Value| template_containers(o, "image"))),
        ],
        ("apps", "deployments" | "replicasets") => vec![
            ("Containers", Box::new(|o: &Value| template_containers(o, "name"))),
            ("Images", Box::new(|o: &Value| template_containers(o, "image"))),
            ("Selector", Box::new(format_selector)),
        ],
        _ => vec![],
    }
}

/// A CRD printer column's value: kube-apiserver's JSONPath subset the column paths use (`.a.b`,
/// `.a[0]`, and filters `.a[?(@.k=="v")].b`, as a condition's `status` column), the first match.
fn printer_column(obj: &Value, path: &str) -> Option<Value> {
    let mut current = vec![obj];
    let mut rest = path.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            current = current.into_iter().filter_map(|v| v.get(key)).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("[?(@") {
            let end = r.find(")]")?;
            let (sub, want) = r[..end].split_once("==")?;
            let want = want.trim().trim_matches(['"', '\'']);
            current = current
                .into_iter()
                .flat_map(|v| v.as_array().into_iter().flatten())
                .filter(|item| {
                    json_path_get(item, sub.trim()).is_some_and(|x| match x {
                        Value::String(s) => s == want,
                        Value::Bool(b) => b.to_string() == want,
                        Value::Number(n) => n.to_string() == want,
                        _ => false,
                    })
                })
                .collect();
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let index: usize = r[..end].trim().parse().ok()?;
            current = current.into_iter().filter_map(|v| v.get(index)).collect();
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    current.first().map(|v| (*v).clone())
}

pub(super) fn to_table(rt: &ResourceType, objs: &[Arc<Value>], rev: u64) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}),
    ];
    let mut cells: Vec<(String, CellFn)> = builtin_columns(rt)
        .into_iter()
        .map(|(n, f)| (n.to_string(), f))
        .collect();
    for (name, ty, path) in &rt.columns {
        if ty == "date" || name == "Age" {
            continue;
        }
        let path = path.clone();
        cells.push((
            name.clone(),
            Box::new(move |o: &Value| printer_column(o, &path).unwrap_or(Value::String(String::new()))),
        ));
    }
    let column = |name: &str, priority: i32| json!({"name": name, "type": "string", "format": "", "description": name, "priority": priority});
    let wide = wide_columns(rt);
    columns.extend(cells.iter().map(|(name, _)| column(name, 0)));
    columns.push(column("Age", 0));
    columns.extend(wide.iter().map(|(name, _)| column(name, 1)));
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut row = vec![o["metadata"]["name"].clone()];
            row.extend(cells.iter().map(|(_, cell)| cell(o)));
            row.push(age(o.pointer("/metadata/creationTimestamp").and_then(Value::as_str)).into());
            row.extend(wide.iter().map(|(_, cell)| cell(o)));
            json!({"cells": row, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rev.to_string()},
           "columnDefinitions": columns, "rows": rows})
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

pub(super) fn filters(
    rt: &ResourceType,
    query: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &rt.plural,
    )
    .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
    Ok((labels, fields))
}

pub(super) fn check_list_rv(current: u64, query: &HashMap<String, String>) -> Result<(), ApiError> {
    let rv = query
        .get("resourceVersion")
        .filter(|r| !r.is_empty() && *r != "0");
    let Some(rv) = rv else { return Ok(()) };
    let rv: u64 = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
    match query.get("resourceVersionMatch").map(String::as_str) {
        Some("Exact") if rv != current => Err(ApiError::gone(format!(
            "the embedded API server serves lists at the latest resourceVersion ({current}) only; {rv} is not available"
        ))),
        _ if rv > current => Err(ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {rv}, current: {current}"),
        )),
        _ => Ok(()),
    }
}

pub(super) fn list(
    shared: &Shared,
    rt: &ResourceType,
    ns: &str,
    query: &HashMap<String, String>,
    table: bool,
    protobuf: bool,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = filters(rt, query)?;
    let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let token = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            use base64::Engine;
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .map_err(|_| ApiError::bad_request("invalid continue token"))?;
            Some(
                serde_json::from_slice::<ContinueToken>(&raw)
                    .map_err(|_| ApiError::bad_request("invalid continue token"))?,
            )
        }
        None => None,
    };
    let after = token.as_ref().map(|t| (t.ns.clone(), t.name.clone()));
    let filter = |o: &Value| labels.matches(o) && fields.matches(o);
    let (items, rev, remaining) = shared.store.list(&rt.key(), ns, &filter, after.as_ref(), limit)?;
    if token.is_none() {
        check_list_rv(rev, query)?;
    }
    if table {
        return Ok(full(StatusCode::OK, to_table(rt, &items, rev)));
    }
    let mut meta = json!({"resourceVersion": token.as_ref().map_or(rev, |t| t.rv).to_string()});
    if remaining > 0
        && let Some(last) = items.last()
    {
        use base64::Engine;
        let t = ContinueToken {
            rv: token.as_ref().map_or(rev, |t| t.rv),
            ns: last["metadata"]["namespace"].as_str().unwrap_or_default().into(),
            name: last["metadata"]["name"].as_str().unwrap_or_default().into(),
        };
        let raw = serde_json::to_vec(&t).unwrap_or_default();
        meta["continue"] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(raw)
            .into();
        meta["remainingItemCount"] = remaining.into();
    }
    let items: Vec<Value> = items.iter().map(|o| (**o).clone()).collect();
    Ok(respond(
        StatusCode::OK,
        json!({"apiVersion": rt.api_version(), "kind": format!("{}List", rt.kind), "metadata": meta, "items": items}),
        protobuf,
    ))
}

#[cfg(test)]
mod printer_tests {
    use super::*;

    #[test]
    fn printer_columns_follow_filters_and_indexes() {
        let o = serde_json::json!({"spec": {"controllerRef": {"name": "slurm"}},
            "status": {"conditions": [{"type": "Other", "status": "False"},
                                      {"type": "Ready", "status": "True", "reason": "ChildrenApplied"}]}});
        assert_eq!(
            printer_column(&o, ".spec.controllerRef.name"),
            Some("slurm".into())
        );
        assert_eq!(
            printer_column(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some("True".into())
        );
        assert_eq!(
            printer_column(&o, ".status.conditions[?(@.type==\"Ready\")].reason"),
            Some("ChildrenApplied".into())
        );
        assert_eq!(
            printer_column(&o, ".status.conditions[0].type"),
            Some("Other".into())
        );
        assert_eq!(
            printer_column(&o, ".status.conditions[?(@.type==\"Gone\")].status"),
            None
        );
    }
}
