//! The scale subresource: a `Scale` view of an object's replicas paths, and writes through it.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::{
    ApiError, Store,
    resources::ResourceType,
    store::{Op, Sub},
};

pub(super) fn json_path_get<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let pointer = format!("/{}", path.trim_start_matches('.').replace('.', "/"));
    obj.pointer(&pointer)
}

pub(super) fn to_scale(rt: &ResourceType, obj: &Value) -> Value {
    let Some(paths) = &rt.scale else {
        return Value::Null;
    };
    let replicas = json_path_get(obj, &paths.spec_replicas)
        .cloned()
        .unwrap_or(json!(0));
    let status_replicas = json_path_get(obj, &paths.status_replicas)
        .cloned()
        .unwrap_or(json!(0));
    let mut status = json!({"replicas": status_replicas});
    if let Some(sel) = paths.label_selector.as_ref().and_then(|p| json_path_get(obj, p)) {
        status["selector"] = sel.clone();
    }
    let m = &obj["metadata"];
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
           "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                        "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
           "spec": {"replicas": replicas}, "status": status})
}

pub(super) fn write_scale(
    store: &Store,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    manager: &str,
    f: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Result<Arc<Value>, ApiError> {
    store.modify(
        &rt.key(),
        ns,
        name,
        Sub::Main,
        manager,
        Op::Update,
        |current, rt| {
            let scale = f(&to_scale(rt, current))?;
            let replicas = scale
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if replicas < 0 {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    vec![(
                        "spec.replicas",
                        format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                    )],
                ));
            }
            let mut obj = current.clone();
            let paths = rt
                .scale
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("no scale subresource"))?;
            let segs: Vec<&str> = paths.spec_replicas.trim_start_matches('.').split('.').collect();
            let mut cur = &mut obj;
            for seg in &segs[..segs.len() - 1] {
                if !cur.get(*seg).is_some_and(Value::is_object) {
                    cur[*seg] = json!({});
                }
                cur = &mut cur[*seg];
            }
            cur[segs[segs.len() - 1]] = replicas.into();
            let rv = scale.pointer("/metadata/resourceVersion").cloned();
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                match rv {
                    Some(rv) if rv != "" => m.insert("resourceVersion".into(), rv),
                    _ => m.remove("resourceVersion"),
                };
            }
            Ok(obj)
        },
    )
}
