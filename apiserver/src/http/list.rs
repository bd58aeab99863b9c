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

pub(super) fn to_table(rt: &ResourceType, objs: &[Arc<Value>], rev: u64) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}),
    ];
    let builtin: Vec<(&str, &str)> = match rt.plural.as_str() {
        "pods" => vec![("Status", ".status.phase"), ("Node", ".spec.nodeName")],
        "services" => vec![("Type", ".spec.type"), ("Cluster-IP", ".spec.clusterIP")],
        "namespaces" => vec![("Status", ".status.phase")],
        "events" if rt.group.is_empty() => vec![
            ("Type", ".type"),
            ("Reason", ".reason"),
            ("Object", ".involvedObject.name"),
            ("Message", ".message"),
        ],
        _ => vec![],
    };
    let mut paths: Vec<(String, String)> = builtin
        .iter()
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect();
    for (name, ty, path) in &rt.columns {
        if ty == "date" || name == "Age" {
            continue;
        }
        paths.push((name.clone(), path.clone()));
    }
    for (name, _) in &paths {
        columns
            .push(json!({"name": name, "type": "string", "format": "", "description": name, "priority": 0}));
    }
    columns.push(json!({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0}));
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut cells = vec![o["metadata"]["name"].clone()];
            for (_, path) in &paths {
                cells.push(json_path_get(o, path).cloned().unwrap_or(Value::String(String::new())));
            }
            cells.push(age(o.pointer("/metadata/creationTimestamp").and_then(Value::as_str)).into());
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
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
