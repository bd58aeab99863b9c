//! The output policy of the children builders (`controller-children`, `nodeset-children`,
//! `restapi-children`, `loginset-children`, `accounting-children`): each
//! object must be of a kind the builder kind may return, in the parent's namespace, named for its
//! parent, valid as the API server checks it, and not listed twice. The host sets owner references
//! (the parent as controller, or every NodeSet of the Controller for the shared workers' objects)
//! and the builder annotations, on a StatefulSet's or Deployment's pod template too.

use std::collections::BTreeSet;

use k8s_openapi::{
    Metadata,
    api::{
        apps::v1::{Deployment, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy},
        core::v1::{ConfigMap, Secret, Service},
        policy::v1::PodDisruptionBudget,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::ResourceExt;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use slinky_api::{
    Accounting, Controller, LoginSet, NodeSet, RestApi,
    checks::WORKER_SUBDOMAIN_PREFIX,
    contract::secret_refs::{self, SecretRef},
    keys,
    labels::Labels,
    validation,
};

use super::{
    Allowances,
    allowances::{self, PodGrants, ServiceGrants},
    builder_annotations, dns1035_label, finish_meta, metadata_problems, pod_spec_problems, require_labels,
};
use crate::{Child, ChildKind, Ownership, Plugin};

/// The children a `controller-children` builder may return: the StatefulSet, ConfigMaps and
/// Services of a Controller, and the ServiceMonitor of its metrics.
const CONTROLLER_KINDS: [ChildKind; 4] = [
    ChildKind::StatefulSet,
    ChildKind::ConfigMap,
    ChildKind::Service,
    ChildKind::ServiceMonitor,
];
/// The children a `nodeset-children` builder may return.
const NODESET_KINDS: [ChildKind; 3] = [
    ChildKind::Service,
    ChildKind::PodDisruptionBudget,
    ChildKind::ConfigMap,
];

/// The children a `restapi-children` builder may return: slurmrestd's Deployment and Service.
const RESTAPI_KINDS: [ChildKind; 2] = [ChildKind::Deployment, ChildKind::Service];

/// The children a `loginset-children` builder may return: the login Deployment, its Service and
/// ConfigMaps (`sshd_config`).
const LOGINSET_KINDS: [ChildKind; 3] = [ChildKind::Deployment, ChildKind::Service, ChildKind::ConfigMap];

/// The children an `accounting-children` builder may return: slurmdbd's StatefulSet, its Service
/// and the `slurmdbd.conf` Secret.
const ACCOUNTING_KINDS: [ChildKind; 3] = [ChildKind::StatefulSet, ChildKind::Service, ChildKind::Secret];

/// Check and finish a `build-loginset-children` output: one Deployment and one Service, both
/// named `<loginset>` and selecting the LoginSet's login pods, and ConfigMaps named
/// `<loginset>-…`, all controlled by the LoginSet. `allow` is what the host lets them reach.
///
/// # Errors
/// The rule an object broke, naming the object.
pub fn loginset_children(
    raw: &[String],
    loginset: &LoginSet,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let name = loginset.name_any();
    let key = loginset.login_key();
    let rules = Rules {
        allow,
        pods: PodGrants::of_loginset(loginset),
        service: Some((
            key.clone(),
            ServiceGrants::asked_by(&loginset.spec.service, "LoginSet"),
        )),
        secret_refs: Vec::new(),
    };
    let selector = slinky_api::labels::LOGIN.selector_labels(&name);
    let prefix = format!("{name}-");
    let mut out = Vec::new();
    for (i, text) in raw.iter().enumerate() {
        let child = check(
            text,
            loginset,
            plugin,
            &LOGINSET_KINDS,
            "loginset-children",
            &rules,
        )
        .map_err(|e| format!("object {i}: {e}"))?;
        if child.kind == ChildKind::ConfigMap {
            if !child.name().starts_with(&prefix) {
                return Err(format!(
                    "{}: a LoginSet's ConfigMaps must be named `{prefix}…` (so a builder cannot take                      another object's name)",
                    child.describe()
                ));
            }
        } else {
            component_child(&child, &key, &selector, "LoginSet", "login", "`<loginset>`")?;
        }
        out.push(child);
    }
    no_duplicates(&out)?;
    Ok(out)
}

/// Check and finish a `build-accounting-children` output: one StatefulSet and one Service, both
/// `<accounting>-accounting` selecting the Accounting's slurmdbd pods, and the Secret
/// `<accounting>-accounting` (`stringData` only, placing no Secret value but the database
/// password's), all controlled by the Accounting. An external Accounting has no children.
/// `allow` is what the host lets them reach.
///
/// # Errors
/// The rule an object broke, naming the object.
pub fn accounting_children(
    raw: &[String],
    accounting: &Accounting,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let name = accounting.name_any();
    let key = accounting.accounting_key();
    if accounting.spec.external && !raw.is_empty() {
        return Err(format!(
            "Accounting {name} is external (spec.external: true): slurmdbd runs elsewhere, so it has              no children; return none"
        ));
    }
    let pass = &accounting.spec.storage_config.password_key_ref;
    let rules = Rules {
        allow,
        pods: PodGrants::of_accounting(accounting),
        service: Some((
            key.clone(),
            ServiceGrants::asked_by(&accounting.spec.service, "Accounting"),
        )),
        secret_refs: vec![SecretRef {
            name: pass.name.clone(),
            key: pass.key.clone(),
        }],
    };
    let selector = slinky_api::labels::ACCOUNTING.selector_labels(&name);
    let mut out = Vec::new();
    for (i, text) in raw.iter().enumerate() {
        let child = check(
            text,
            accounting,
            plugin,
            &ACCOUNTING_KINDS,
            "accounting-children",
            &rules,
        )
        .map_err(|e| format!("object {i}: {e}"))?;
        if child.kind == ChildKind::Secret {
            if child.name() != key {
                return Err(format!(
                    "{}: an Accounting has one Secret, `slurmdbd.conf`'s, named {key:?}                      (`<accounting>-accounting`); name it so and return no other",
                    child.describe()
                ));
            }
        } else {
            component_child(
                &child,
                &key,
                &selector,
                "Accounting",
                "slurmdbd",
                "`<accounting>-accounting`",
            )?;
        }
        out.push(child);
    }
    no_duplicates(&out)?;
    Ok(out)
}

/// A LoginSet's, RestApi's or Accounting's workload and Service: named `key` (so a builder
/// cannot take a name another parent's builders use), each selecting only the parent's pods
/// (`selector`; more labels select fewer pods, still only the parent's).
fn component_child(
    child: &Child,
    key: &str,
    selector: &Labels,
    whose: &str,
    pods: &str,
    pattern: &str,
) -> Result<(), String> {
    let at = child.describe();
    if child.name() != key {
        return Err(format!(
            "{at}: a {whose}'s {} is named {key:?} ({pattern}); name it so and return no other",
            child.kind
        ));
    }
    let pointer = match child.kind {
        ChildKind::Service => "/spec/selector",
        _ => "/spec/selector/matchLabels",
    };
    let have: Labels = child
        .object
        .pointer(pointer)
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let field = pointer.trim_start_matches('/').replace('/', ".");
    if selector.iter().any(|(k, v)| have.get(k) != Some(v)) {
        return Err(format!(
            "{at}: {field} must hold the {whose}'s {pods} selector {selector:?} (so it selects only              its {pods} pods), found {have:?}"
        ));
    }
    Ok(())
}

/// Check and finish a `build-restapi-children` output: a Deployment and Services, each named
/// `<restapi>-…` and controlled by the RestApi; the Deployment selects exactly the RestApi's
/// slurmrestd pods (Slinky's selector labels). `allow` is what the host lets them reach.
///
/// # Errors
/// The rule an object broke, naming the object.
pub fn restapi_children(
    raw: &[String],
    restapi: &RestApi,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let name = restapi.name_any();
    let rules = Rules {
        allow,
        pods: PodGrants::of_restapi(restapi),
        service: Some((
            restapi.restapi_key(),
            ServiceGrants::asked_by(&restapi.spec.service, "RestApi"),
        )),
        secret_refs: Vec::new(),
    };
    let selector = slinky_api::labels::RESTAPI.selector_labels(&name);
    let key = restapi.restapi_key();
    let mut out = Vec::new();
    for (i, text) in raw.iter().enumerate() {
        let child = check(text, restapi, plugin, &RESTAPI_KINDS, "restapi-children", &rules)
            .map_err(|e| format!("object {i}: {e}"))?;
        restapi_child(&child, &key, &selector)?;
        out.push(child);
    }
    no_duplicates(&out)?;
    Ok(out)
}

/// A RestApi has one Deployment and one Service, both `<restapi>-restapi` (so a builder cannot
/// take a name the Controller's builders use: Slinky's chart gives the RestApi the Controller's
/// name), each selecting only the RestApi's slurmrestd pods (the host sends its Slurm token to
/// that Service).
fn restapi_child(child: &Child, key: &str, selector: &Labels) -> Result<(), String> {
    component_child(
        child,
        key,
        selector,
        "RestApi",
        "slurmrestd",
        "`<restapi>-restapi`",
    )
}

/// Check and finish a `build-controller-children` output; `allow` is what the host lets it
/// reach.
///
/// # Errors
/// The rule an object broke, naming the object.
pub fn controller_children(
    raw: &[String],
    controller: &Controller,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let name = controller.name_any();
    let prefix = format!("{name}-");
    let service = controller.controller_key();
    let rules = Rules {
        allow,
        pods: PodGrants::of_controller(controller),
        service: None,
        secret_refs: Vec::new(),
    };
    let mut out = Vec::new();
    for (i, text) in raw.iter().enumerate() {
        let child = check(
            text,
            controller,
            plugin,
            &CONTROLLER_KINDS,
            "controller-children",
            &rules,
        )
        .map_err(|e| format!("object {i}: {e}"))?;
        let at = child.describe();
        if !child.name().starts_with(&prefix) {
            return Err(format!(
                "{at}: a Controller's children must be named `{prefix}…` (so a builder cannot take \
                 another object's name)"
            ));
        }
        if child.kind == ChildKind::Service && child.name() == service {
            return Err(format!(
                "{at}: the Service {service:?} is built by the controller-service builder; return \
                 the Controller's other Services"
            ));
        }
        if child.kind == ChildKind::StatefulSet {
            controller_statefulset(&child, controller)?;
            selects_slurmctld(&child, controller)?;
        }
        if child.kind == ChildKind::ServiceMonitor {
            controller_service_monitor(&child, controller)?;
        }
        out.push(child);
    }
    no_duplicates(&out)?;
    Ok(out)
}

/// A Controller's one StatefulSet is slurmctld's, `<controller>-controller` (as the bundled
/// builder names it); an external Controller has none. The host keeps a StatefulSet a build
/// leaves out (`NotBuilt`) and creates one of a new name, so a renamed or second StatefulSet
/// would get a new, empty state save claim and select the same slurmctld pods as the kept one:
/// slurmctld could start on an empty state. With [`no_duplicates`], a build holds at most one.
fn controller_statefulset(child: &Child, controller: &Controller) -> Result<(), String> {
    let at = child.describe();
    if controller.spec.external {
        return Err(format!(
            "{at}: Controller {} is external (spec.external: true): slurmctld runs elsewhere, so its \
             children have no StatefulSet; return its ConfigMap only",
            controller.name_any()
        ));
    }
    let want = controller.controller_key();
    if child.name() != want {
        return Err(format!(
            "{at}: a Controller has one StatefulSet, slurmctld's, named {want:?} \
             (`<controller>-controller`): a StatefulSet of another name would be created with a new, \
             empty state save claim next to the existing one, both selecting the same slurmctld pods; \
             name it {want:?} and return no other StatefulSet"
        ));
    }
    Ok(())
}

/// A Controller's one ServiceMonitor, `<controller>-controller`, scrapes only its slurmctld
/// Service, in its own namespace (a ServiceMonitor of another namespace, or of any, would let a
/// builder point Prometheus at other workloads).
fn controller_service_monitor(child: &Child, controller: &Controller) -> Result<(), String> {
    let at = child.describe();
    let want = controller.controller_key();
    if child.name() != want {
        return Err(format!(
            "{at}: a Controller has one ServiceMonitor, named {want:?} (`<controller>-controller`)"
        ));
    }
    selects_slurmctld(child, controller)?;
    let ns = controller.namespace().unwrap_or_default();
    let names = child.object.pointer("/spec/namespaceSelector/matchNames");
    let any = child
        .object
        .pointer("/spec/namespaceSelector/any")
        .and_then(Value::as_bool)
        == Some(true);
    let own = names.is_none_or(|n| n == &serde_json::json!([ns]));
    if any || !own {
        return Err(format!(
            "{at}: spec.namespaceSelector must name only the Controller's namespace {ns:?} (or be left out)"
        ));
    }
    Ok(())
}

/// Check and finish a `build-nodeset-children` output: the workers' Service and
/// PodDisruptionBudget of the NodeSet's Controller are [`Ownership::Shared`] (their owner
/// references are set by the reconciler, which knows every NodeSet of the Controller), every other
/// object must be named `<nodeset>-…` and is controlled by the NodeSet.
///
/// `allow` is what the host lets them reach.
///
/// # Errors
/// The rule an object broke, naming the object.
pub fn nodeset_children(
    raw: &[String],
    nodeset: &NodeSet,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let cluster = &nodeset.spec.controller_ref.name;
    let shared = [
        (ChildKind::Service, format!("{WORKER_SUBDOMAIN_PREFIX}{cluster}")),
        (
            ChildKind::PodDisruptionBudget,
            format!("{WORKER_SUBDOMAIN_PREFIX}pdb-{cluster}"),
        ),
    ];
    let prefix = format!("{}-", nodeset.name_any());
    let rules = Rules {
        allow,
        pods: PodGrants::of_nodeset(nodeset),
        service: None,
        secret_refs: Vec::new(),
    };
    let mut out = Vec::new();
    for (i, text) in raw.iter().enumerate() {
        let mut child = check(text, nodeset, plugin, &NODESET_KINDS, "nodeset-children", &rules)
            .map_err(|e| format!("object {i}: {e}"))?;
        let at = child.describe();
        let is_shared = shared.iter().any(|(k, n)| *k == child.kind && n == child.name());
        if child.kind == ChildKind::PodDisruptionBudget {
            pdb_selector(&child, nodeset, is_shared, allow)?;
        }
        if is_shared {
            child.ownership = Ownership::Shared;
            child.set_owners(Vec::new());
        } else if !child.name().starts_with(&prefix) {
            return Err(format!(
                "{at}: a NodeSet's children must be named `{prefix}…`, or be the Controller's shared \
                 workers' objects (Service {:?}, PodDisruptionBudget {:?})",
                shared[0].1, shared[1].1
            ));
        }
        out.push(child);
    }
    no_duplicates(&out)?;
    Ok(out)
}

fn no_duplicates(children: &[Child]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for c in children {
        if !seen.insert((c.kind, c.name().to_string())) {
            return Err(format!("{} is listed twice", c.describe()));
        }
    }
    Ok(())
}

/// What a builder may not return, and why (a hint in the refusal).
fn forbidden_hint(api_version: &str, kind: &str) -> &'static str {
    match (api_version, kind) {
        ("v1", "Secret") => {
            ": builders never see or make Secrets (the host reads the Secrets a Controller references \
             and passes their hashes)"
        }
        ("v1", "Namespace" | "Node" | "PersistentVolume")
        | ("rbac.authorization.k8s.io/v1", "ClusterRole" | "ClusterRoleBinding")
        | ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            ": a builder makes namespaced children of its parent, never cluster-scoped objects"
        }
        _ => "",
    }
}

/// What a build's objects are checked against besides their kind's rules: what the host allows,
/// and what the parent grants the pods of its StatefulSets.
struct Rules<'a> {
    allow: &'a Allowances,
    pods: PodGrants,
    /// The Service the parent's `spec.service` customises, by name, and what it asks for.
    service: Option<(String, ServiceGrants)>,
    /// The Secret values a returned Secret may place (the parent's spec references them).
    secret_refs: Vec<SecretRef>,
}

/// Parse, check and finish one object: its kind is one of `allowed`, then the checks common to
/// every child and those of its kind.
fn check<P>(
    text: &str,
    parent: &P,
    plugin: &Plugin,
    allowed: &[ChildKind],
    builder: &str,
    rules: &Rules<'_>,
) -> Result<Child, String>
where
    P: kube::Resource<DynamicType = ()>,
{
    let value: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "the output is not JSON ({e}): return the object serialized with serde_json \
             (`slinky_guest_sdk::export_plugin!` does this for you)"
        )
    })?;
    let field = |f: &str| {
        value
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let Some(child_kind) = ChildKind::of(&api_version, &kind).filter(|k| allowed.contains(k)) else {
        return Err(format!(
            "apiVersion {api_version} kind {kind} is not allowed: a {builder} builder returns {}{}",
            allowed
                .iter()
                .map(|k| format!("{} {}", k.api_version(), k.kind()))
                .collect::<Vec<_>>()
                .join(", "),
            forbidden_hint(&api_version, &kind)
        ));
    };
    let allow = rules.allow;
    let object = match child_kind {
        ChildKind::ConfigMap => finish::<ConfigMap, P>(value, parent, plugin, allow, config_map_problems)?,
        ChildKind::Secret => {
            finish::<Secret, P>(value, parent, plugin, allow, |s| secret_problems(s, rules))?
        }
        ChildKind::Service => {
            finish::<Service, P>(value, parent, plugin, allow, |s| service_problems(s, rules))?
        }
        ChildKind::PodDisruptionBudget => {
            finish::<PodDisruptionBudget, P>(value, parent, plugin, allow, pdb_problems)?
        }
        ChildKind::StatefulSet => finish::<StatefulSet, P>(value, parent, plugin, allow, |s| {
            statefulset_problems(s, plugin, rules)
        })?,
        ChildKind::Deployment => finish::<Deployment, P>(value, parent, plugin, allow, |d| {
            let spec = &mut d.spec;
            template_problems(&spec.selector, &mut spec.template, plugin, rules)
        })?,
        ChildKind::ServiceMonitor => finish_untyped(value, parent, plugin, allow)?,
    };
    Ok(Child {
        kind: child_kind,
        ownership: Ownership::Controlled,
        object,
    })
}

/// Parse as `K` (so the object is well formed), check and finish the metadata (no finalizers
/// unless allowed), run the kind's checks, drop `status`.
fn finish<K, P>(
    value: Value,
    parent: &P,
    plugin: &Plugin,
    allow: &Allowances,
    problems: impl FnOnce(&mut K) -> Result<(), String>,
) -> Result<Value, String>
where
    K: Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned + k8s_openapi::Resource,
    P: kube::Resource<DynamicType = ()>,
{
    let mut obj: K = serde_json::from_value(value).map_err(|e| {
        format!(
            "the output is not a valid {} ({e}): build it with the k8s-openapi types rather than by hand",
            K::KIND
        )
    })?;
    let name = obj.metadata().name.clone().unwrap_or_default();
    let at = format!("{} {name:?}", K::KIND);
    finish_meta(obj.metadata_mut(), parent, plugin).map_err(|e| format!("{at}: {e}"))?;
    metadata_problems(obj.metadata()).map_err(|e| format!("{at}: {e}"))?;
    allowances::finalizers("metadata", obj.metadata(), allow).map_err(|e| format!("{at}: {e}"))?;
    problems(&mut obj).map_err(|e| format!("{at}: {e}"))?;
    let mut value = serde_json::to_value(&obj).map_err(|e| format!("{at}: cannot serialize it: {e}"))?;
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    // A StatefulSet's volume claim templates are embedded objects: the API server keeps no
    // apiVersion or kind on them (k8s-openapi writes both).
    for claim in value
        .pointer_mut("/spec/volumeClaimTemplates")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(c) = claim.as_object_mut() {
            c.remove("apiVersion");
            c.remove("kind");
            c.remove("status");
        }
    }
    Ok(value)
}

/// An object of a kind k8s-openapi has no type for (a ServiceMonitor): its metadata checked and
/// finished as [`finish`] does, the rest kept as it is (`status` dropped).
fn finish_untyped<P>(
    mut value: Value,
    parent: &P,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Value, String>
where
    P: kube::Resource<DynamicType = ()>,
{
    let mut meta: ObjectMeta = serde_json::from_value(value.get("metadata").cloned().unwrap_or_default())
        .map_err(|e| format!("the output's metadata is not valid ({e})"))?;
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let at = format!("{kind} {:?}", meta.name.clone().unwrap_or_default());
    finish_meta(&mut meta, parent, plugin).map_err(|e| format!("{at}: {e}"))?;
    metadata_problems(&meta).map_err(|e| format!("{at}: {e}"))?;
    allowances::finalizers("metadata", &meta, allow).map_err(|e| format!("{at}: {e}"))?;
    if !value.get("spec").is_some_and(Value::is_object) {
        return Err(format!("{at}: spec is required"));
    }
    let map = value
        .as_object_mut()
        .ok_or_else(|| format!("{at}: not an object"))?;
    map.insert(
        "metadata".into(),
        serde_json::to_value(&meta).map_err(|e| format!("{at}: cannot serialize it: {e}"))?,
    );
    map.remove("status");
    Ok(value)
}

fn config_map_problems(cm: &mut ConfigMap) -> Result<(), String> {
    let keys = cm
        .data
        .iter()
        .flat_map(|d| d.keys())
        .chain(cm.binary_data.iter().flat_map(|d| d.keys()));
    for key in keys {
        if let Some(e) = validation::config_map_key(key).into_iter().next() {
            return Err(format!("the key {key:?} is invalid: {e}"));
        }
    }
    Ok(())
}

/// A Secret a builder returns: `stringData` only (a builder has no secret of its own to put in
/// `data`), valid keys, an `Opaque` type, and placeholders only of the values the parent's spec
/// references (the host resolves them after this check).
fn secret_problems(secret: &mut Secret, rules: &Rules<'_>) -> Result<(), String> {
    if secret.data.as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(
            "data is set: a builder returns a Secret's content as stringData, and places Secret              values it may not see with ${secretKeyRef:<name>/<key>} placeholders"
                .into(),
        );
    }
    if let Some(t) = secret.type_.as_deref().filter(|t| *t != "Opaque") {
        return Err(format!("type is {t:?}: a builder's Secret is Opaque"));
    }
    for (key, value) in secret.string_data.iter().flatten() {
        if let Some(e) = validation::config_map_key(key).into_iter().next() {
            return Err(format!("the key {key:?} is invalid: {e}"));
        }
        for r in secret_refs::references(value).map_err(|e| format!("stringData[{key:?}]: {e}"))? {
            if !rules.secret_refs.contains(&r) {
                let may = rules
                    .secret_refs
                    .iter()
                    .map(|r| secret_refs::placeholder(&r.name, &r.key))
                    .collect::<Vec<_>>();
                return Err(format!(
                    "stringData[{key:?}] places key {:?} of Secret {:?}, which the parent's spec does not                      reference for it: a builder may place only {}",
                    r.key,
                    r.name,
                    if may.is_empty() {
                        "no Secret value".to_string()
                    } else {
                        may.join(", ")
                    }
                ));
            }
        }
    }
    Ok(())
}

/// A valid name; `ClusterIP`, no external IPs, unless the host allows exposing it (only the
/// Service a parent's `spec.service` customises may be what it asks for: the `controller-service`
/// builder's, a RestApi's `<restapi>-restapi`).
fn service_problems(svc: &mut Service, rules: &Rules<'_>) -> Result<(), String> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    dns1035_label(&name).map_err(|why| format!("the Service name is invalid: {why}"))?;
    let grants = match &rules.service {
        Some((customised, grants)) if *customised == name => grants,
        _ => &ServiceGrants::default(),
    };
    allowances::service_spec(svc.spec.as_ref(), grants, rules.allow)
}

fn pdb_problems(pdb: &mut PodDisruptionBudget) -> Result<(), String> {
    let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
    if selector
        .is_none_or(|s| s.match_labels.as_ref().is_none_or(|l| l.is_empty()) && s.match_expressions.is_none())
    {
        return Err("spec.selector is required: a PodDisruptionBudget without one selects no pod".into());
    }
    Ok(())
}

/// The claim retention of every StatefulSet the host applies (`whenDeleted`, `whenScaled`).
const RETAIN: &str = "Retain";

/// A StatefulSet: its claims are retained whatever the builder says; its pod template as
/// [`template_problems`] checks it.
fn statefulset_problems(sts: &mut StatefulSet, plugin: &Plugin, rules: &Rules<'_>) -> Result<(), String> {
    let spec = &mut sts.spec;
    // Its claims outlive it, whatever the builder says: slurmctld's state save claim must survive
    // a deleted or scaled-in StatefulSet (a plugin setting `Delete` would erase the cluster's
    // state with it).
    if let Some(p) = &spec.persistent_volume_claim_retention_policy
        && (p.when_deleted.as_deref().is_some_and(|w| w != RETAIN)
            || p.when_scaled.as_deref().is_some_and(|w| w != RETAIN))
    {
        tracing::warn!(plugin = %plugin.label(), policy = ?p,
            "a builder set a StatefulSet's claim retention other than Retain; the host keeps Retain");
    }
    spec.persistent_volume_claim_retention_policy = Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some(RETAIN.into()),
        when_scaled: Some(RETAIN.into()),
    });
    template_problems(&spec.selector, &mut spec.template, plugin, rules)
}

/// A workload's pod template (a StatefulSet's, a Deployment's): labels matching its selector,
/// valid containers, nothing past the parent's grants (unless allowed); the host puts the builder
/// annotations on the template too, so a new builder rolls its pods.
fn template_problems(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    template: &mut k8s_openapi::api::core::v1::PodTemplateSpec,
    plugin: &Plugin,
    rules: &Rules<'_>,
) -> Result<(), String> {
    let selector = selector.match_labels.clone().unwrap_or_default();
    if selector.is_empty() {
        return Err("spec.selector.matchLabels is required".into());
    }
    let template_meta = template.metadata.get_or_insert_default();
    require_labels(
        "spec.template.metadata.labels",
        template_meta.labels.as_ref().unwrap_or(&Default::default()),
        &selector,
    )?;
    template_meta
        .annotations
        .get_or_insert_default()
        .extend(builder_annotations(plugin));
    let template_check = ObjectMeta {
        labels: template_meta.labels.clone(),
        annotations: template_meta.annotations.clone(),
        ..Default::default()
    };
    metadata_problems(&template_check).map_err(|e| format!("spec.template.{e}"))?;
    // The workload controllers copy the template's finalizers to every pod.
    allowances::finalizers("spec.template.metadata", template_meta, rules.allow)?;
    let pod = template.spec.as_ref().ok_or("spec.template.spec is required")?;
    if pod.containers.is_empty() {
        return Err("spec.template.spec has no containers".into());
    }
    pod_spec_problems(pod)
        .and_then(|()| allowances::pod_spec(pod, &rules.pods, rules.allow))
        .map_err(|e| format!("spec.template.{e}"))
}

/// A NodeSet's PodDisruptionBudget selects only its pods; the workers' shared one, only the
/// Controller's protected workers (as Slinky's does), unless the host allows a wider one.
fn pdb_selector(child: &Child, nodeset: &NodeSet, shared: bool, allow: &Allowances) -> Result<(), String> {
    let have: Labels = child
        .object
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let cluster = &nodeset.spec.controller_ref.name;
    let (want, whose) = if shared {
        (
            Labels::from([
                (keys::LABEL_POD_PROTECT.to_string(), "true".to_string()),
                (keys::LABEL_CLUSTER.to_string(), cluster.clone()),
            ]),
            format!("the protected workers of Controller {cluster}"),
        )
    } else {
        (
            nodeset.selector_labels(),
            format!("the pods of NodeSet {}", nodeset.name_any()),
        )
    };
    allowances::pdb_selector(&have, &want, &whose, allow).map_err(|e| format!("{}: {e}", child.describe()))
}

/// A child (the StatefulSet, the ServiceMonitor) selects by `spec.selector.matchLabels` exactly
/// the Controller's slurmctld pods.
fn selects_slurmctld(child: &Child, controller: &Controller) -> Result<(), String> {
    let selector: std::collections::BTreeMap<String, String> = child
        .object
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    require_labels(
        "spec.selector.matchLabels",
        &selector,
        &controller.selector_labels(),
    )
    .map_err(|e| format!("{}: {e}", child.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_kinds_say_why() {
        assert!(forbidden_hint("v1", "Secret").contains("never see or make Secrets"));
        assert!(forbidden_hint("v1", "Namespace").contains("cluster-scoped"));
        assert_eq!(forbidden_hint("v1", "Pod"), "");
    }

    fn controller(external: bool) -> Controller {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
            "metadata": {"name": "slurm", "namespace": "slurm"},
            "spec": {"external": external, "externalConfig": {"host": "ctld", "port": 6817}},
        }))
        .unwrap_or_else(|e| panic!("the test Controller: {e}"))
    }

    fn statefulset(name: &str) -> Child {
        Child {
            kind: ChildKind::StatefulSet,
            ownership: Ownership::Controlled,
            object: serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name, "namespace": "slurm"}}),
        }
    }

    fn restapi_child_of(kind: ChildKind, name: &str, selector: serde_json::Value) -> Child {
        let (api_version, spec) = match kind {
            ChildKind::Deployment => (
                "apps/v1",
                serde_json::json!({"selector": {"matchLabels": selector}}),
            ),
            _ => ("v1", serde_json::json!({"selector": selector})),
        };
        Child {
            kind,
            ownership: Ownership::Controlled,
            object: serde_json::json!({"apiVersion": api_version, "kind": kind.kind(),
                "metadata": {"name": name, "namespace": "slurm"}, "spec": spec}),
        }
    }

    /// A RestApi's children are its one Deployment and one Service, selecting its slurmrestd
    /// pods only: not a name the Controller's builders use, not a wider or foreign selector.
    #[test]
    fn a_restapi_has_one_deployment_and_one_service_selecting_its_pods() {
        let ours = serde_json::json!({"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm"});
        let selector: Labels = serde_json::from_value(ours.clone()).unwrap_or_default();
        for kind in [ChildKind::Deployment, ChildKind::Service] {
            assert_eq!(
                restapi_child(
                    &restapi_child_of(kind, "slurm-restapi", ours.clone()),
                    "slurm-restapi",
                    &selector
                ),
                Ok(())
            );
            let e = restapi_child(
                &restapi_child_of(kind, "slurm-controller", ours.clone()),
                "slurm-restapi",
                &selector,
            )
            .err()
            .unwrap_or_default();
            assert!(e.contains("is named \"slurm-restapi\""), "{kind}: {e}");
            for bad in [
                serde_json::json!({"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": "slurm"}),
                serde_json::json!({"app.kubernetes.io/name": "slurmrestd"}),
                serde_json::json!({"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "other"}),
            ] {
                let e = restapi_child(
                    &restapi_child_of(kind, "slurm-restapi", bad.clone()),
                    "slurm-restapi",
                    &selector,
                )
                .err()
                .unwrap_or_default();
                assert!(e.contains("slurmrestd selector"), "{kind} {bad}: {e}");
            }
        }
        let two = [
            restapi_child_of(ChildKind::Deployment, "slurm-restapi", ours.clone()),
            restapi_child_of(ChildKind::Deployment, "slurm-restapi", ours),
        ];
        assert!(no_duplicates(&two).is_err_and(|e| e.contains("listed twice")));
    }

    /// slurmctld's StatefulSet is `<controller>-controller`, and only it: a renamed or second
    /// one would get an empty state save claim; an external Controller has none.
    #[test]
    fn a_controller_has_one_statefulset_named_for_it() {
        let ours = controller(false);
        assert_eq!(
            controller_statefulset(&statefulset("slurm-controller"), &ours),
            Ok(())
        );
        for name in ["slurm-controller-2", "slurm-ctld", "slurm-controller-internal"] {
            let e = controller_statefulset(&statefulset(name), &ours)
                .err()
                .unwrap_or_default();
            assert!(
                e.contains(&format!("StatefulSet {name}"))
                    && e.contains("named \"slurm-controller\"")
                    && e.contains("empty state save claim"),
                "{name}: {e}"
            );
        }
        let e = controller_statefulset(&statefulset("slurm-controller"), &controller(true))
            .err()
            .unwrap_or_default();
        assert!(e.contains("is external") && e.contains("no StatefulSet"), "{e}");
        // Two of the right name are listed twice.
        let two = [statefulset("slurm-controller"), statefulset("slurm-controller")];
        assert!(no_duplicates(&two).is_err_and(|e| e.contains("listed twice")));
    }
}
