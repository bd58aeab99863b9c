//! Discovery (`/api`, `/apis`, group-versions), `/version` and a minimal OpenAPI v3.

use serde_json::{Value, json};

use crate::{Shared, resources::ResourceType};

pub(super) fn version() -> Value {
    json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0+slinky-embedded", "gitCommit": "embedded",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "n/a",
           "compiler": "rustc", "platform": "linux/amd64"})
}

pub(super) fn group_list(shared: &Shared) -> Value {
    let mut groups: Vec<(String, String)> = shared
        .store
        .types()
        .into_iter()
        .filter(|t| !t.group.is_empty())
        .map(|t| (t.group, t.version))
        .collect();
    groups.sort();
    groups.dedup();
    let groups: Vec<Value> = groups
        .iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(super) fn resource_list(shared: &Shared, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = shared
        .store
        .types()
        .into_iter()
        .filter(|t| t.group == group && t.version == version)
        .flat_map(|t| t.discovery())
        .collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// `/openapi/v3`: one document per group-version.
pub(super) fn openapi_root(shared: &Shared) -> Value {
    let mut paths = serde_json::Map::new();
    let rev = shared.store.revision();
    for t in shared.store.types() {
        let gv = if t.group.is_empty() {
            format!("api/{}", t.version)
        } else {
            format!("apis/{}/{}", t.group, t.version)
        };
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={rev:016X}")}),
        );
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for a group-version: the PATCH operations with their GVK and
/// the `fieldValidation` parameter, which is what kubectl checks before it sends objects for
/// server-side validation. No schemas are published.
pub(super) fn openapi_gv(shared: &Shared, gv: &str) -> Option<Value> {
    let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    let types: Vec<ResourceType> = shared
        .store
        .types()
        .into_iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for t in types {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}});
        let op = json!({
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": t.kind},
            "x-kubernetes-action": "patch",
            "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation"), param("force")],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"patch": op}));
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (slinky-host embedded)", "version": "v1.32.0"},
                "paths": paths, "components": {"schemas": {}}}),
    )
}
