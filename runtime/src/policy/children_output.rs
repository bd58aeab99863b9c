//! The output policy of the children builders (`controller-children`, `nodeset-children`,
//! `restapi-children`, `loginset-children`, `accounting-children`): each
//! object must be of a kind the builder kind may return, in the parent's namespace, named for its
//! parent, valid as the API server checks it, and not listed twice. The host sets owner references
//! (the parent as controller, or every NodeSet of the Controller for the shared workers' objects)
//! and the builder annotations (on the objects, never on a StatefulSet's or Deployment's pod
//! template: what a builder builds rolls pods, not who built it).

use std::collections::BTreeSet;

use kube::ResourceExt;

use serde_json::Value;
use slinky_api::{
    Accounting, Controller, LoginSet, NodeSet, RestApi, checks::WORKER_SUBDOMAIN_PREFIX,
    contract::secret_refs::SecretRef, labels::Labels,
};

use super::{
    Allowances,
    allowances::{PodGrants, ServiceGrants, slurm_key},
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
    controller: &Controller,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let name = loginset.name_any();
    let key = loginset.login_key();
    let rules = Rules {
        allow,
        // The host's host-key Secret, and the Controller's slurm.key (Slinky mounts it).
        pods: PodGrants::of_loginset(loginset).with_secrets(
            [loginset.ssh_host_keys_name()]
                .into_iter()
                .chain(slurm_key(controller)),
        ),
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
        // Its `slurmdbd.conf` Secret, which the same output makes.
        pods: PodGrants::of_accounting(accounting).with_secrets([accounting.accounting_key()]),
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
    controller: &Controller,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Vec<Child>, String> {
    let name = restapi.name_any();
    let rules = Rules {
        allow,
        // The Controller's slurm.key (Slinky mounts it).
        pods: PodGrants::of_restapi(restapi).with_secrets(slurm_key(controller)),
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

mod objects;
use objects::{Rules, check, pdb_selector, selects_slurmctld};

#[cfg(test)]
mod tests;
