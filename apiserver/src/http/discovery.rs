//! Discovery (`/api`, `/apis`, group-versions), `/version` and a minimal OpenAPI v3.

use serde_json::{Value, json};

use crate::{Shared, resources::ResourceType};

/// The Kubernetes release whose API server this one answers as: its validation messages,
/// defaults and tables are kube-apiserver v1.28.7's (the differential suites judge it against
/// that release), so `/version` says so, and version-aware clients (kubectl's dispatcher picks
/// the kubectl nearest the server's minor) talk to it as to a 1.28 server.
const KUBERNETES_VERSION: (&str, &str, &str) = ("1", "28", "v1.28.7+slinky-embedded");

pub(super) fn version() -> Value {
    let (major, minor, git_version) = KUBERNETES_VERSION;
    json!({"major": major, "minor": minor, "gitVersion": git_version, "gitCommit": "embedded",
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
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (slinky-host embedded)", "version": KUBERNETES_VERSION.2},
                "paths": paths, "components": {"schemas": {}}}),
    )
}

/// `/openapi/v2`: a document without paths or schemas, in protobuf when the client asks for it
/// (client-go's `OpenAPISchema()`, which kubectl up to 1.29 builds its validator and apply
/// patcher from: without a document they fail; with an empty one they leave validation to the
/// server and use their compiled-in types), else in JSON.
pub(super) fn openapi_v2(wants_protobuf: bool) -> (&'static str, Vec<u8>) {
    let (title, version) = ("Kubernetes (slinky-host embedded)", KUBERNETES_VERSION.2);
    if wants_protobuf {
        return (
            crate::protobuf::OPENAPI_V2_MEDIA_TYPE,
            crate::protobuf::openapi_v2_document(title, version),
        );
    }
    let doc = json!({"swagger": "2.0", "info": {"title": title, "version": version}, "paths": {}, "definitions": {}});
    ("application/json", doc.to_string().into_bytes())
}
