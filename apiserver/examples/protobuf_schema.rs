//! Generates `protobuf/src/schema.json`, the table the embedded server's protobuf codec reads:
//! for every Kubernetes message, its fields' numbers, wire types and JSON names, and which
//! message each `apiVersion`/`kind` is.
//!
//! The field numbers and types come from [k8s-pb](https://crates.io/crates/k8s-pb) (kube-rs's
//! prost bindings of Kubernetes' `.proto` files); the JSON names from k8s-openapi's schemas
//! (prost renames `clusterIPs` to `cluster_i_ps`: the names are matched letter by letter).
//!
//! ```sh
//! cargo info k8s-pb@0.9.0                       # downloads the crate into cargo's cache
//! mkdir -p /tmp/k8s-pb && tar xzf ~/.cargo/registry/cache/*/k8s-pb-0.9.0.crate -C /tmp/k8s-pb
//! cargo run -p slinky-apiserver --example protobuf_schema -- /tmp/k8s-pb/k8s-pb-0.9.0/src \
//!     > protobuf/src/schema.json
//! ```

#![allow(
    clippy::expect_used,
    reason = "a developer tool: a broken input aborts with the reason"
)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde_json::{Value, json};

/// One field as k8s-pb declares it.
struct Field {
    tag: u32,
    rust_name: String,
    /// `string`, `bool`, `int32`, `int64`, `double`, `bytes`, `message`, or `map`.
    kind: String,
    repeated: bool,
    /// For messages and maps of messages: the message's full name.
    message: Option<String>,
    /// For maps: the value kind.
    map_value: Option<String>,
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable k8s-pb source") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The message a Rust type names, resolved from module `module`.
fn resolve(ty: &str, module: &[String]) -> Option<String> {
    let cleaned: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
    let mut last = None;
    for token in cleaned.split(['<', '>', ',']) {
        let name = token.rsplit("::").next().unwrap_or_default();
        if name.chars().next().is_some_and(char::is_uppercase)
            && !["Option", "Vec", "String", "BTreeMap", "Box"].contains(&name)
        {
            last = Some(token.to_string());
        }
    }
    let token = last?;
    let mut path: Vec<String> = module.to_vec();
    let mut parts: Vec<&str> = token.split("::").filter(|p| !p.is_empty()).collect();
    while parts.first() == Some(&"super") {
        path.pop();
        parts.remove(0);
    }
    if parts.first() == Some(&"crate") {
        path.clear();
        parts.remove(0);
    }
    path.extend(parts.iter().map(|p| p.to_string()));
    Some(path.join("."))
}

fn normalize(name: &str) -> String {
    name.trim_start_matches("r#")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn camel(snake: &str) -> String {
    let mut out = String::new();
    for (i, part) in snake.trim_start_matches("r#").split('_').enumerate() {
        if i == 0 {
            out.push_str(part);
        } else {
            let mut cs = part.chars();
            if let Some(c) = cs.next() {
                out.push(c.to_ascii_uppercase());
                out.extend(cs);
            }
        }
    }
    out
}

/// JSON property names of every k8s-openapi definition reachable from the served kinds, by
/// normalized definition name.
fn openapi_properties() -> BTreeMap<String, Vec<String>> {
    use k8s_openapi::{
        api::{apps, coordination, core::v1 as core, events, policy, rbac},
        apiextensions_apiserver::pkg::apis::apiextensions::v1 as ext,
        apimachinery::pkg::apis::meta::v1 as meta,
    };
    let mut generator = schemars::SchemaGenerator::default();
    macro_rules! all {
        ($($t:ty),* $(,)?) => { $( generator.subschema_for::<$t>(); )* };
    }
    all!(
        core::Namespace,
        core::Node,
        core::Pod,
        core::Service,
        core::ConfigMap,
        core::Secret,
        core::Event,
        core::PersistentVolumeClaim,
        core::ServiceAccount,
        core::Binding,
        events::v1::Event,
        apps::v1::StatefulSet,
        apps::v1::Deployment,
        apps::v1::ControllerRevision,
        policy::v1::PodDisruptionBudget,
        coordination::v1::Lease,
        rbac::v1::ClusterRole,
        rbac::v1::ClusterRoleBinding,
        rbac::v1::Role,
        rbac::v1::RoleBinding,
        ext::CustomResourceDefinition,
        meta::DeleteOptions,
        meta::Status,
        k8s_openapi::api::autoscaling::v1::Scale,
    );
    let defs = generator.take_definitions(false);
    defs.iter()
        .map(|(name, schema)| {
            let props = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            (normalize(name.trim_start_matches("io.k8s.")), props)
        })
        .collect()
}

/// Messages by full name (`api.core.v1.Pod`), with their fields.
type Messages = BTreeMap<String, Vec<Field>>;
/// The message of each kind, by `"apiVersion kind"`.
type Kinds = BTreeMap<String, String>;

fn main() {
    let src = std::env::args()
        .nth(1)
        .expect("usage: protobuf_schema K8S_PB_SRC_DIR");
    let (mut messages, mut kinds) = read_k8s_pb(Path::new(&src));
    keep_served(&mut messages, &mut kinds);
    print_schema(&kinds, &field_table(&messages));
}

/// Every message and kind of the k8s-pb sources under `src`.
fn read_k8s_pb(src: &Path) -> (Messages, Kinds) {
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    let mut messages = Messages::new();
    let mut kinds = Kinds::new();
    for file in &files {
        let rel = file.strip_prefix(src).expect("under src");
        let mut module: Vec<String> = rel
            .parent()
            .map(|p| p.iter().map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let stem = rel
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if stem != "mod" && stem != "lib" {
            module.push(stem);
        }
        let text = std::fs::read_to_string(file).expect("readable file");
        read_module(&text, &module, &mut messages, &mut kinds);
    }
    (messages, kinds)
}

/// The messages of one source file, module `module`, and the kinds it implements.
fn read_module(text: &str, module: &[String], messages: &mut Messages, kinds: &mut Kinds) {
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    let mut current: Option<String> = None;
    let mut resource: Option<(String, Option<String>, Option<String>)> = None;
    while i < lines.len() {
        let line = lines[i].trim_end();
        if let Some(rest) = line
            .strip_prefix("pub struct ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            let full = format!("{}.{rest}", module.join("."));
            messages.entry(full.clone()).or_default();
            current = Some(full);
        } else if line == "}" {
            current = None;
            if let Some((name, Some(api_version), Some(kind))) = resource.take() {
                kinds.insert(
                    format!("{api_version} {kind}"),
                    format!("{}.{name}", module.join(".")),
                );
            }
        } else if let Some(rest) = line
            .strip_prefix("impl crate::Resource for ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            resource = Some((rest.to_string(), None, None));
        } else if let Some((_, api_version, kind)) = resource.as_mut() {
            let value = || line.split('"').nth(1).map(str::to_string);
            if line.trim_start().starts_with("const API_VERSION") {
                *api_version = value();
            } else if line.trim_start().starts_with("const KIND") {
                *kind = value();
            }
        } else if let (Some(msg), Some(attr)) = (current.as_ref(), line.trim_start().strip_prefix("#[prost("))
        {
            let (decl, end) = declaration(&lines, i + 1);
            i = end;
            messages
                .entry(msg.clone())
                .or_default()
                .push(field(attr, &decl, module));
        }
        i += 1;
    }
}

/// The field declaration from line `from`, possibly over several lines, up to a ',': its text
/// and the index of its last line.
fn declaration(lines: &[&str], from: usize) -> (String, usize) {
    let mut decl = String::new();
    let mut j = from;
    while j < lines.len() {
        decl.push_str(lines[j].trim());
        decl.push(' ');
        if lines[j].trim_end().ends_with(',') && decl.contains(':') && balanced(&decl) {
            break;
        }
        j += 1;
    }
    (decl, j)
}

/// A field of module `module`, from its attribute (what follows `#[prost(`) and its declaration.
fn field(attr: &str, decl: &str, module: &[String]) -> Field {
    let attr = attr.trim_end_matches(")]");
    let tag: u32 = attr
        .split("tag = \"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .and_then(|t| t.parse().ok())
        .expect("a tag");
    let decl = decl.trim().trim_start_matches("pub ");
    let (name, ty) = decl.split_once(':').expect("name: type");
    let first = attr.split(',').next().unwrap_or_default().trim();
    if first.starts_with("btree_map = \"") {
        let value_kind = attr
            .split('"')
            .nth(1)
            .and_then(|kv| kv.split(',').nth(1))
            .unwrap_or_default()
            .trim()
            .to_string();
        Field {
            tag,
            rust_name: name.trim().to_string(),
            kind: "map".into(),
            repeated: false,
            message: (value_kind == "message").then(|| resolve(ty, module)).flatten(),
            map_value: Some(value_kind),
        }
    } else {
        let kind = first.split(' ').next().unwrap_or_default().to_string();
        Field {
            tag,
            rust_name: name.trim().to_string(),
            message: (kind == "message").then(|| resolve(ty, module)).flatten(),
            kind,
            repeated: attr.contains("repeated"),
            map_value: None,
        }
    }
}

/// Only what the served kinds reach (and the envelopes and options around them).
fn keep_served(messages: &mut Messages, kinds: &mut Kinds) {
    const SERVED: [&str; 8] = [
        "v1 ",
        "apps/v1 ",
        "events.k8s.io/v1 ",
        "policy/v1 ",
        "coordination.k8s.io/v1 ",
        "rbac.authorization.k8s.io/v1 ",
        "apiextensions.k8s.io/v1 ",
        "autoscaling/v1 Scale",
    ];
    kinds.retain(|k, _| SERVED.iter().any(|s| k.starts_with(s)));
    let mut todo: Vec<String> = kinds.values().cloned().collect();
    for (_, m) in kinds.clone() {
        let list = format!("{m}List");
        if messages.contains_key(&list) {
            todo.push(list);
        }
    }
    todo.extend(
        [
            "apimachinery.pkg.runtime.Unknown",
            "apimachinery.pkg.apis.meta.v1.DeleteOptions",
            "apimachinery.pkg.apis.meta.v1.Status",
        ]
        .map(String::from),
    );
    let mut keep = BTreeSet::new();
    while let Some(m) = todo.pop() {
        if !keep.insert(m.clone()) {
            continue;
        }
        for f in messages.get(&m).into_iter().flatten() {
            if let Some(child) = &f.message {
                todo.push(child.clone());
            }
        }
    }
    messages.retain(|m, _| keep.contains(m));
}

/// Each message's fields as the codec reads them, with their JSON names from k8s-openapi (a
/// field it does not name is reported, and camel-cased).
fn field_table(messages: &Messages) -> serde_json::Map<String, Value> {
    let props = openapi_properties();
    let mut unmatched = BTreeSet::new();
    let out_messages: serde_json::Map<String, Value> = messages
        .iter()
        .filter(|(_, fields)| !fields.is_empty())
        .map(|(name, fields)| {
            let known = props.get(&normalize(name));
            let list: Vec<Value> = fields
                .iter()
                .map(|f| {
                    let matched = known
                        .and_then(|p| p.iter().find(|j| normalize(j) == normalize(&f.rust_name)))
                        .cloned();
                    // A message field the JSON form does not have is a Go embedded struct: its
                    // fields appear inline in the parent's JSON (Volume's VolumeSource, Probe's
                    // ProbeHandler, a key selector's LocalObjectReference).
                    let inline = known.is_some() && matched.is_none() && f.kind == "message" && !f.repeated;
                    if known.is_some() && matched.is_none() && !inline {
                        unmatched.insert(format!("{name}.{}", f.rust_name));
                    }
                    let json_name = matched.unwrap_or_else(|| camel(&f.rust_name));
                    let kind = if inline {
                        "inline".to_string()
                    } else {
                        f.kind.clone()
                    };
                    let mut v = json!([f.tag, json_name, kind]);
                    if let Value::Array(a) = &mut v {
                        a.push(f.message.clone().map_or(Value::Null, Value::String));
                        a.push(Value::Bool(f.repeated));
                        a.push(f.map_value.clone().map_or(Value::Null, Value::String));
                    }
                    v
                })
                .collect();
            (name.clone(), Value::Array(list))
        })
        .collect();
    for u in &unmatched {
        eprintln!("no JSON name in k8s-openapi for {u} (camel-cased)");
    }
    out_messages
}

/// The table on standard output.
fn print_schema(kinds: &Kinds, out_messages: &serde_json::Map<String, Value>) {
    let doc = json!({
        "source": "k8s-pb 0.9.0 (field numbers and types), k8s-openapi 0.29 (JSON names)",
        "fields": "[number, json name, kind (inline: an embedded struct), message, repeated, map value kind]",
        "kinds": kinds,
        "messages": out_messages,
    });
    // One message per line: reviewable diffs when Kubernetes adds fields.
    let mut text = String::from("{\n");
    for key in ["source", "fields"] {
        text.push_str(&format!("{:?}: {},\n", key, doc[key]));
    }
    text.push_str(&format!("\"kinds\": {},\n\"messages\": {{\n", doc["kinds"]));
    let entries: Vec<String> = out_messages.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
    text.push_str(&entries.join(",\n"));
    text.push_str("\n}\n}\n");
    print!("{text}");
}

fn balanced(s: &str) -> bool {
    s.matches('<').count() == s.matches('>').count()
}
