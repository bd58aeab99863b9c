//! The output policy: plugin output is untrusted input.
//!
//! The host parses the output as the expected kind and refuses another apiVersion/kind, another
//! namespace, a name other than expected (or an invalid one), missing selector labels, and
//! server-owned metadata (`uid`, `resourceVersion`, `managedFields`, `deletionTimestamp`). It then
//! makes the owner reference and builder annotations right itself: whatever the plugin set there
//! is replaced. `status` is dropped (the host owns status). The children builders' outputs are
//! checked by [`controller_children`] and [`nodeset_children`]. What reaches past the parent (a
//! node's namespaces or paths, privileges, an exposed Service, finalizers …) is refused unless the
//! host allows it: see [`Allow`].

mod allowances;
mod children_output;

use std::collections::BTreeMap;

use k8s_openapi::{
    Resource,
    api::core::v1::{Pod, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::ResourceExt;
use slinky_api::{Controller, NodeSet, keys, validation};

pub use allowances::{Allow, Allowances};
pub use children_output::{
    accounting_children, controller_children, loginset_children, nodeset_children, restapi_children,
};

use super::{Plugin, PodIdentity};

/// Check and finish a `build-service` output; `allow` is what the host lets it reach.
///
/// # Errors
/// The rule the output broke, with what it had.
pub fn service(
    raw: &str,
    controller: &Controller,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Service, String> {
    let mut svc: Service = parse(raw)?;
    finish_meta(&mut svc.metadata, controller, plugin)?;
    let name = svc.metadata.name.clone().unwrap_or_default();
    let want = format!("{}-controller", controller.name_any());
    if name != want {
        return Err(format!(
            "the Service is named {name:?}, but a Controller's Service must be named {want:?} \
             (`<controller>-controller`, where workers find slurmctld)"
        ));
    }
    if let Err(why) = dns1035_label(&name) {
        return Err(format!("the Service name {name:?} is invalid: {why}"));
    }
    metadata_problems(&svc.metadata)?;
    let selector = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    require_labels("spec.selector", &selector, &controller.selector_labels())?;
    let grants = allowances::ServiceGrants::of_controller_service(controller);
    allowances::finalizers("metadata", &svc.metadata, allow)
        .and_then(|()| allowances::service_spec(svc.spec.as_ref(), &grants, allow))
        .map_err(|e| format!("Service {name:?}: {e}"))?;
    svc.status = None;
    Ok(svc)
}

/// Check and finish a `build-pod` output; `allow` is what the host lets it reach.
///
/// # Errors
/// The rule the output broke, with what it had.
pub fn pod(
    raw: &str,
    nodeset: &NodeSet,
    controller: &Controller,
    identity: &PodIdentity,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Pod, String> {
    let mut pod: Pod = parse(raw)?;
    finish_meta(&mut pod.metadata, nodeset, plugin)?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    if name != identity.name {
        return Err(format!(
            "the pod is named {name:?}, but pod {:?} was asked for",
            identity.name
        ));
    }
    if pod.spec.as_ref().is_none_or(|s| s.containers.is_empty()) {
        return Err("the pod has no containers".into());
    }
    let labels = pod.metadata.labels.get_or_insert_default();
    require_labels("metadata.labels", labels, &nodeset.selector_labels())?;
    labels.insert(keys::LABEL_REVISION_HASH.to_string(), identity.revision.clone());
    metadata_problems(&pod.metadata)?;
    if let Some(spec) = &pod.spec {
        pod_spec_problems(spec)?;
    }
    allowances::finalizers("metadata", &pod.metadata, allow)
        .and_then(|()| match &pod.spec {
            Some(spec) => allowances::pod_spec(
                spec,
                &allowances::PodGrants::of_worker(nodeset, controller),
                allow,
            ),
            None => Ok(()),
        })
        .map_err(|e| format!("Pod {name:?}: {e}"))?;
    // The host's part of the pod, like its revision label: its volume claims (by its name).
    nodeset.set_claim_volumes(&mut pod);
    pod.status = None;
    Ok(pod)
}

/// Label keys and values, annotation keys and their total size: what the API server checks of
/// every object's metadata, so a builder's mistake is reported as such rather than as a create
/// the API server refuses.
pub(crate) fn metadata_problems(meta: &ObjectMeta) -> Result<(), String> {
    for (k, v) in meta.labels.iter().flatten() {
        if let Some(e) = validation::qualified_name(k).into_iter().next() {
            return Err(format!("metadata.labels: the key {k:?} is invalid: {e}"));
        }
        if let Some(e) = validation::label_value(v).into_iter().next() {
            return Err(format!(
                "metadata.labels: the value {v:?} of {k:?} is invalid: {e}"
            ));
        }
    }
    let mut size = 0;
    for (k, v) in meta.annotations.iter().flatten() {
        if let Some(e) = validation::qualified_name(&k.to_lowercase()).into_iter().next() {
            return Err(format!("metadata.annotations: the key {k:?} is invalid: {e}"));
        }
        size += k.len() + v.len();
    }
    if size > validation::TOTAL_ANNOTATION_SIZE_LIMIT {
        return Err(format!(
            "metadata.annotations are {size} bytes, at most {} are allowed",
            validation::TOTAL_ANNOTATION_SIZE_LIMIT
        ));
    }
    Ok(())
}

/// Container names (DNS labels, unique) and images, hostname and subdomain (DNS labels).
pub(crate) fn pod_spec_problems(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    let all = spec.containers.iter().map(|c| ("containers", c)).chain(
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| ("initContainers", c)),
    );
    for (list, c) in all {
        let field = format!("spec.{list}[name={}]", c.name);
        if let Some(e) = validation::dns1123_label(&c.name).into_iter().next() {
            return Err(format!("{field}.name is invalid: {e}"));
        }
        if !names.insert(c.name.as_str()) {
            return Err(format!("{field}: the container name {:?} is used twice", c.name));
        }
        if c.image.as_deref().is_none_or(str::is_empty) {
            return Err(format!(
                "{field}.image is required: the API server refuses a container without one"
            ));
        }
    }
    for (field, value) in [
        ("spec.hostname", &spec.hostname),
        ("spec.subdomain", &spec.subdomain),
    ] {
        if let Some(v) = value
            && let Some(e) = validation::dns1123_label(v).into_iter().next()
        {
            return Err(format!("{field} {v:?} is invalid: {e}"));
        }
    }
    Ok(())
}

/// A builder's output as a `K`: JSON with `apiVersion` and `kind` set to `K`'s.
///
/// Read straight into `K` (a pod's output once went through a `serde_json::Value` first: a
/// tenth of the host's CPU in a 10,000-pod scale-up was that double read); the head is read
/// first (its two fields alone), for the errors that name what is wrong.
fn parse<K: Resource + serde::de::DeserializeOwned>(raw: &str) -> Result<K, String> {
    /// The output's `apiVersion` and `kind` (whatever their JSON type: one that is not a string
    /// is named missing); every other field skipped unread.
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "apiVersion", default)]
        api_version: Option<serde_json::Value>,
        #[serde(default)]
        kind: Option<serde_json::Value>,
    }
    let head: Head = serde_json::from_str(raw).map_err(|e| {
        format!(
            "the output is not JSON ({e}): return the object serialized with serde_json \
             (`slinky_guest_sdk::export_plugin!` does this for you)"
        )
    })?;
    let (api_version, kind) = (
        head.api_version
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .unwrap_or("<missing>"),
        head.kind
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .unwrap_or("<missing>"),
    );
    if api_version != K::API_VERSION || kind != K::KIND {
        return Err(format!(
            "expected apiVersion {} kind {}, got apiVersion {api_version} kind {kind}: this builder kind \
             must return a {} {} (with apiVersion and kind set)",
            K::API_VERSION,
            K::KIND,
            K::API_VERSION,
            K::KIND
        ));
    }
    serde_json::from_str(raw).map_err(|e| {
        format!(
            "the output is not a valid {} ({e}): build it with the k8s-openapi types rather than by hand",
            K::KIND
        )
    })
}

pub(crate) fn finish_meta<P>(meta: &mut ObjectMeta, parent: &P, plugin: &Plugin) -> Result<(), String>
where
    P: kube::Resource<DynamicType = ()>,
{
    let parent_ns = parent.meta().namespace.clone().unwrap_or_default();
    match meta.namespace.as_deref() {
        None | Some("") => meta.namespace = Some(parent_ns),
        Some(ns) if ns == parent_ns => {}
        Some(ns) => {
            return Err(format!(
                "the object is in namespace {ns:?}, but its parent is in {parent_ns:?}"
            ));
        }
    }
    let server_owned = [
        ("metadata.uid", meta.uid.is_some()),
        ("metadata.resourceVersion", meta.resource_version.is_some()),
        ("metadata.managedFields", meta.managed_fields.is_some()),
        ("metadata.deletionTimestamp", meta.deletion_timestamp.is_some()),
    ];
    if let Some((field, _)) = server_owned.iter().find(|(_, set)| *set) {
        return Err(format!(
            "{field} is set by the API server; a builder must not set it"
        ));
    }
    let name = meta.name.clone().unwrap_or_default();
    if let Err(why) = dns1123_subdomain(&name) {
        return Err(format!("the name {name:?} is invalid: {why}"));
    }
    meta.owner_references = slinky_api::owners::controller_ref(parent).map(|owner| vec![owner]);
    meta.annotations
        .get_or_insert_default()
        .extend(builder_annotations(plugin));
    Ok(())
}

/// The annotations naming the builder of a child: `slinky.slurm.net/builder: <name>@<version>`
/// and `slinky.slurm.net/builder-digest: sha256:<digest>`.
pub fn builder_annotations(plugin: &Plugin) -> BTreeMap<String, String> {
    BTreeMap::from([
        (keys::ANNOTATION_BUILDER.to_string(), plugin.label()),
        (
            keys::ANNOTATION_BUILDER_DIGEST.to_string(),
            format!("sha256:{}", plugin.digest()),
        ),
    ])
}

pub(crate) fn require_labels(
    field: &str,
    have: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
) -> Result<(), String> {
    for (k, v) in want {
        match have.get(k) {
            Some(h) if h == v => {}
            Some(h) => return Err(format!("{field} has {k}={h}, it must be {k}={v}")),
            None => return Err(format!("{field} is missing the selector label {k}={v}")),
        }
    }
    Ok(())
}

/// A DNS-1123 subdomain (object names), in kube-apiserver's words.
///
/// # Errors
/// What is wrong.
pub fn dns1123_subdomain(name: &str) -> Result<(), String> {
    validation::first_error(validation::dns1123_subdomain(name))
}

/// A DNS-1035 label (Service names), in kube-apiserver's words.
///
/// # Errors
/// What is wrong.
pub fn dns1035_label(name: &str) -> Result<(), String> {
    validation::first_error(validation::dns1035_label(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_read_once_and_its_errors_name_what_is_wrong() {
        let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#;
        let parsed: Result<Pod, String> = parse(pod);
        assert_eq!(parsed.ok().and_then(|p| p.metadata.name), Some("p".to_string()));
        // An escaped head reads as its text.
        let escaped = r#"{"kind":"P\u006fd","apiVersion":"v1","metadata":{"name":"e"}}"#;
        assert!(parse::<Pod>(escaped).is_ok(), "{:?}", parse::<Pod>(escaped).err());
        let err = |raw: &str| parse::<Pod>(raw).err().unwrap_or_default();
        assert!(
            err(r#"{"apiVersion":"v1","metadata":{}}"#).contains("got apiVersion v1 kind <missing>"),
            "{}",
            err(r#"{"apiVersion":"v1","metadata":{}}"#)
        );
        assert!(err(r#"{"apiVersion":"v1","kind":"ConfigMap"}"#).contains("kind ConfigMap"));
        assert!(err(r#"{"apiVersion":1,"kind":"Pod"}"#).contains("got apiVersion <missing> kind Pod"));
        assert!(err("not json").contains("the output is not JSON"));
        assert!(err(r#"{"apiVersion":"v1","kind":"Pod"} x"#).contains("the output is not JSON"));
        let wrong = err(r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":"c"}}"#);
        assert!(wrong.contains("the output is not a valid Pod"), "{wrong}");
    }

    #[test]
    fn pod_output_is_checked_like_the_api_server_would() {
        let meta = |labels: &[(&str, &str)]| ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        assert!(metadata_problems(&meta(&[("app.kubernetes.io/name", "slurmd")])).is_ok());
        let long = "x".repeat(64);
        let e = metadata_problems(&meta(&[("a", long.as_str())]))
            .err()
            .unwrap_or_default();
        assert!(e.contains("must be no more than 63 characters"), "{e}");
        assert!(metadata_problems(&meta(&[("bad key!", "v")])).is_err());
        let spec = |v: serde_json::Value| -> k8s_openapi::api::core::v1::PodSpec {
            serde_json::from_value(v).unwrap_or_default()
        };
        assert!(
            pod_spec_problems(&spec(
                serde_json::json!({"containers": [{"name": "a", "image": "x"}]})
            ))
            .is_ok()
        );
        let e = pod_spec_problems(&spec(serde_json::json!({"containers": [{"name": "a"}]})))
            .err()
            .unwrap_or_default();
        assert!(e.contains("spec.containers[name=a].image is required"), "{e}");
        let e = pod_spec_problems(&spec(
            serde_json::json!({"containers": [{"name": "a", "image": "x"}],
            "initContainers": [{"name": "a", "image": "y"}]}),
        ))
        .err()
        .unwrap_or_default();
        assert!(e.contains("used twice"), "{e}");
        let e = pod_spec_problems(&spec(
            serde_json::json!({"containers": [{"name": "a", "image": "x"}],
            "hostname": "a.b"}),
        ))
        .err()
        .unwrap_or_default();
        assert!(e.contains("spec.hostname"), "{e}");
    }

    #[test]
    fn names_are_validated() {
        assert!(dns1123_subdomain("slurm-worker-0").is_ok());
        assert!(dns1123_subdomain("a.b").is_ok());
        assert!(dns1123_subdomain("Bad").is_err());
        assert!(dns1123_subdomain("-x").is_err());
        assert!(dns1123_subdomain("").is_err());
        assert!(dns1035_label("slurm-controller").is_ok());
        assert!(dns1035_label("0slurm").is_err());
        assert!(dns1035_label(&"a".repeat(64)).is_err());
    }
}
