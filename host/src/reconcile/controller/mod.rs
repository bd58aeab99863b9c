//! The Controller reconciler: the slurmctld Service (`controller-service` builder) and the
//! Controller's other children (`controller-children` builder: the slurmctld StatefulSet, the
//! `slurm.conf` ConfigMap, the internal Service), applied through the one child path
//! ([`super::core::apply`]); status conditions and `observedGeneration`.
//!
//! # Guarantees
//! * Builders never see a Secret: the host reads the Secrets the Controller references (`get`,
//!   nothing else) and passes Slinky's hashes of their data; of the ConfigMaps it references only
//!   the file names. A missing Secret, Secret key or ConfigMap is a `ReferenceNotFound` condition
//!   and an Event, retried with backoff: the children that need it wait (the existing ones stay),
//!   the Service is still applied.
//! * Every child is applied only over an object this Controller controls, or created; a steady
//!   state makes no writes; children the host built and no longer wants (`external: true`) are
//!   deleted with a UID precondition, but only after a pass in which every builder answered.
//! * `slurm.conf` follows the NodeSets that reference the Controller: a NodeSet added, removed or
//!   repartitioned triggers this reconciler, which rewrites the ConfigMap; without in-place
//!   reconfigure the StatefulSet's pod template carries the config hash, so slurmctld rolls.
//! * A refused write is an Event (`FailedApply`, `FailedDelete`) and a `ChildFailure` condition,
//!   retried with the Controller's exponential backoff.

mod active;

use crate::plugins::Builder as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use slinky_api::{Controller, ControllerStatus, checks, conditions, contract::MissingReference};

use super::{
    ControllerContext, Error,
    core::apply::{ChildSync, keys_of},
    core::backoff,
    core::pass::{PassState, first_of},
    core::status::ConditionChanges,
    core::time_plugin_call,
};
use crate::plugins::{BuilderKind, Child, ChildKind, ControllerInputs, Ownership};

/// The kinds of a Controller's children (what pruning looks at).
const CHILD_KINDS: [ChildKind; 3] = [ChildKind::ConfigMap, ChildKind::Service, ChildKind::StatefulSet];

/// Reconcile one Controller.
///
/// # Errors
/// API errors (retried with the Controller's backoff by the error policy).
pub async fn reconcile(c: Arc<Controller>, ctx: Arc<ControllerContext>) -> Result<Action, Error> {
    ctx.core.instrumented(c.as_ref(), reconcile_inner(&c, &ctx)).await
}

/// What a pass found.
struct Pass<'a> {
    ctx: &'a ControllerContext,
    c: &'a Controller,
    /// The conditions and the problem (a builder failed or refused the input).
    state: PassState<'a, Controller>,
    /// A referenced Secret or ConfigMap is missing: `(reason, message)`.
    missing: Option<(&'static str, String)>,
}

impl Pass<'_> {
    async fn missing(&mut self, reason: &'static str, message: String) {
        if !ConditionChanges::already_true(self.state.current(), conditions::REFERENCE_NOT_FOUND, &message) {
            tracing::warn!(reason, "{message}");
            self.ctx
                .core
                .event(self.c, EventType::Warning, reason, message.clone())
                .await;
        }
        self.missing = Some((reason, message));
    }
}

/// What the children builder needs from the cluster, or the first missing reference that holds
/// the children back, as `(reason, message)`; and a missing reference that does not (the
/// Accounting). The Secrets the Controller references are read from the API (`get`, nothing
/// else), its ConfigMaps, NodeSets and Accounting from the caches; [`ControllerInputs::gather`]
/// makes the inputs of them by the rule `render` uses too.
async fn read_inputs(
    ctx: &ControllerContext,
    c: &Controller,
) -> Result<
    (
        Result<ControllerInputs, (&'static str, String)>,
        Option<(&'static str, String)>,
    ),
    Error,
> {
    let ns = c.namespace().unwrap_or_default();
    let mut secrets: BTreeMap<String, Secret> = BTreeMap::new();
    let mut config_maps: BTreeMap<String, Arc<ConfigMap>> = BTreeMap::new();
    if !c.spec.external {
        let api: Api<Secret> = Api::namespaced(ctx.core.client.clone(), &ns);
        for r in c.key_secret_refs() {
            if secrets.contains_key(&r.name) {
                continue;
            }
            // The first missing reference is the one reported: read no further.
            let Some(secret) = api.get_opt(&r.name).await? else {
                break;
            };
            secrets.insert(r.name.clone(), secret);
        }
        for name in c.config_map_refs() {
            let key = ObjectRef::<ConfigMap>::new(&name).within(&ns);
            if let Some(cm) = ctx.caches.children.configmaps.get(&key) {
                config_maps.insert(name, cm);
            }
        }
    }
    let nodesets = ctx.caches.nodesets.state();
    let accounting = c
        .spec
        .accounting_ref
        .as_ref()
        .and_then(|r| ctx.caches.accountings.get(&ObjectRef::new(&r.name).within(&ns)));
    let (inputs, missing) = ControllerInputs::gather(
        c,
        nodesets.iter().map(AsRef::as_ref),
        |name| secrets.get(name),
        |name| config_maps.get(name).map(AsRef::as_ref),
        |name| {
            accounting
                .as_deref()
                .filter(|a| a.metadata.name.as_deref() == Some(name))
        },
    );
    let soft = missing
        .iter()
        .find(|m| !m.holds_back())
        .map(|m| (m.reason(), missing_message(&ns, m)));
    Ok((
        match missing.iter().find(|m| m.holds_back()) {
            Some(m) => Err((m.reason(), missing_message(&ns, m))),
            None => Ok(inputs),
        },
        soft,
    ))
}

/// The `ReferenceNotFound` condition's (and Event's) message for a missing reference of a
/// Controller of namespace `ns`.
fn missing_message(ns: &str, missing: &MissingReference) -> String {
    let what = match missing {
        MissingReference::Secret { field, name } => format!("Secret {ns}/{name} ({field}) does not exist"),
        MissingReference::SecretKey { field, name, key } => {
            format!("Secret {ns}/{name} ({field}) has no key {key:?}")
        }
        MissingReference::ConfigMap { name } => {
            format!("ConfigMap {ns}/{name} (referenced by the Controller's spec) does not exist")
        }
        MissingReference::ConfigMapKey { name, key } => {
            format!("ConfigMap {ns}/{name} (spec.jwksKeyRef) has no key {key:?}")
        }
        MissingReference::Accounting { name } => {
            return format!(
                "Accounting {ns}/{name} (spec.accountingRef) does not exist: slurm.conf names its \
                 default address ({}:{}) and slurmctld keeps the accounting records until slurmdbd \
                 answers; create it, or remove spec.accountingRef",
                slinky_api::accounting_key(name),
                slinky_api::SLURMDBD_PORT
            );
        }
    };
    format!("{what}: the slurmctld StatefulSet and its configuration wait for it")
}

/// Build every child of `c`: the Service (unless external) and the other children (when the
/// references are there). `None` when a builder failed or a reference is missing (then nothing
/// is pruned).
async fn build(pass: &mut Pass<'_>) -> Result<(Vec<Child>, bool), Error> {
    let (ctx, c) = (pass.ctx, pass.c);
    let core = ctx.core.as_ref();
    let mut desired = Vec::new();
    let mut complete = true;
    if !c.spec.external {
        let plugin = core.plugins.pipeline(BuilderKind::ControllerService, c.labels());
        let (copy, build) = (c.clone(), core.build.clone());
        let metrics = core.metrics.clone();
        core.metrics.plugin_calls.inc_by(1);
        let built = core
            .blocking(move || {
                time_plugin_call(&metrics, BuilderKind::ControllerService, || {
                    plugin.build_service(&build, &copy)
                })
            })
            .await?;
        match built {
            Ok(svc) => desired.push(Child {
                kind: ChildKind::Service,
                ownership: Ownership::Controlled,
                object: serde_json::to_value(&svc).unwrap_or_default(),
            }),
            Err(e) => {
                pass.state.builder_error(&e).await;
                complete = false;
            }
        }
    }
    let (inputs, soft) = read_inputs(ctx, c).await?;
    if let Some((reason, message)) = soft {
        pass.missing(reason, message).await;
    }
    match inputs {
        Err((reason, message)) => {
            pass.missing(reason, message).await;
            complete = false;
        }
        Ok(inputs) => {
            let plugin = core.plugins.pipeline(BuilderKind::ControllerChildren, c.labels());
            let (copy, build) = (c.clone(), core.build.clone());
            let metrics = core.metrics.clone();
            core.metrics.plugin_calls.inc_by(1);
            let built = core
                .blocking(move || {
                    time_plugin_call(&metrics, BuilderKind::ControllerChildren, || {
                        plugin.build_controller_children(&build, &copy, &inputs)
                    })
                })
                .await?;
            match built {
                Ok(children) => desired.extend(children),
                Err(e) => {
                    pass.state.builder_error(&e).await;
                    complete = false;
                }
            }
        }
    }
    desired.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
    Ok((desired, complete))
}

async fn reconcile_inner(c: &Controller, ctx: &ControllerContext) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    if c.metadata.deletion_timestamp.is_some() || !core.serves(&c.namespace().unwrap_or_default()) {
        return Ok(Action::await_change());
    }
    let current = c
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut pass = Pass {
        ctx,
        c,
        state: PassState::new(core, c, current),
        missing: None,
    };
    let mut sync = ChildSync::new(
        core,
        &ctx.caches.children,
        &ctx.applied,
        c,
        current,
        BTreeSet::new(),
    );
    let mut applied = Vec::new();
    if let Some(problem) = checks::summary(&c.spec_problems()) {
        pass.state.problem(conditions::INVALID_SPEC, problem).await;
    } else {
        let (desired, complete) = build(&mut pass).await?;
        for child in &desired {
            if sync.ensure(child).await? {
                applied.push(child.describe());
            }
        }
        if complete {
            // slurmctld's StatefulSet (and its state save claims) go with the Controller, or
            // when its spec says slurmctld runs elsewhere: never because a build left it out.
            let kept: &[ChildKind] = if c.spec.external {
                &[]
            } else {
                &[ChildKind::StatefulSet]
            };
            sync.prune(&CHILD_KINDS, &keys_of(&desired), kept).await;
            // The ServiceMonitor is not cached (its kind may not be served): looked up by name.
            if !desired.iter().any(|d| d.kind == ChildKind::ServiceMonitor) {
                sync.prune_uncached(ChildKind::ServiceMonitor, &c.controller_key())
                    .await;
            }
        }
    }
    let failures = sync.finish();
    let ha_recheck = active::sync_active(ctx, c).await;

    let retry = !failures.is_empty()
        || pass.missing.is_some()
        || pass
            .state
            .problem
            .as_ref()
            .is_some_and(|(t, _)| *t == conditions::BUILDER_FAILED);
    write_status(&mut pass, &failures, &applied).await?;
    let requeue = core
        .backoff
        .record(&backoff::key(c), backoff::Outcome::of(true, retry))
        .unwrap_or(core.resync)
        .min(ha_recheck.unwrap_or(core.resync));
    Ok(Action::requeue(requeue))
}

/// slurmctld's readiness, as its StatefulSet reports it.
fn slurmctld_readiness(ctx: &ControllerContext, c: &Controller) -> Option<String> {
    let sts = ctx
        .caches
        .children
        .statefulsets
        .get(&ObjectRef::new(&c.controller_key()).within(&c.namespace().unwrap_or_default()))?;
    let ready = sts.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    Some(format!("slurmctld {ready}/{} ready", c.replicas()))
}

async fn write_status(
    pass: &mut Pass<'_>,
    failures: &[(&'static str, String)],
    applied: &[String],
) -> Result<(), Error> {
    let (ctx, c) = (pass.ctx, pass.c);
    let readiness = slurmctld_readiness(ctx, c);
    let conds = &mut pass.state.conditions;
    #[allow(deprecated, reason = "clearing the condition older hosts set")]
    let legacy = conditions::SERVICE_FAILURE;
    for t in [conditions::INVALID_SPEC, conditions::BUILDER_FAILED, legacy] {
        conds.clear(t);
    }
    match &pass.missing {
        Some((reason, msg)) => conds.set(conditions::REFERENCE_NOT_FOUND, true, reason, msg.clone()),
        None => conds.clear(conditions::REFERENCE_NOT_FOUND),
    }
    if let Some((reason, message)) = first_of(failures, "") {
        conds.set(conditions::CHILD_FAILURE, true, reason, message);
    } else if pass.state.problem.is_none() {
        conds.clear(conditions::CHILD_FAILURE);
    }
    if let Some((type_, msg)) = &pass.state.problem {
        conds.set(type_, true, type_, msg.clone());
        conds.set(conditions::READY, false, type_, msg.clone());
    } else if let Some((reason, msg)) = failures.first().or(pass.missing.as_ref()) {
        conds.set(conditions::READY, false, reason, msg.clone());
    } else if c.spec.external {
        conds.set(
            conditions::READY,
            true,
            "External",
            "slurmctld runs outside Kubernetes; its minimal slurm.conf is applied",
        );
    } else {
        let mut message = format!("applied {}", applied.join(", "));
        if let Some(r) = readiness {
            message.push_str(&format!("; {r}"));
        }
        conds.set(conditions::READY, true, "ChildrenApplied", message);
    }
    let api: Api<Controller> = Api::namespaced(ctx.core.client.clone(), &c.namespace().unwrap_or_default());
    let changes = pass.state.conditions.clone();
    let generation = c.metadata.generation;
    let compute = move |obj: &Controller| ControllerStatus {
        observed_generation: generation,
        conditions: changes.apply(
            obj.status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default(),
        ),
    };
    ctx.core
        .writer
        .update_status(&api, c, compute, |obj: &Controller| obj.status.clone())
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use slinky_api::contract::secret_hash;

    use super::*;

    #[test]
    fn secret_hashes_are_slinkys() {
        let mut s = Secret::default();
        assert_eq!(secret_hash(&s), "", "no data: Slinky's empty hash");
        s.data = Some(BTreeMap::from([
            ("b".to_string(), ByteString(b"2".to_vec())),
            ("a".to_string(), ByteString(b"1".to_vec())),
        ]));
        assert_eq!(secret_hash(&s), slinky_api::hash::sha256_hex(b"12"));
    }

    #[test]
    fn missing_reference_messages_name_the_object_and_the_field() {
        let cases = [
            (
                MissingReference::Secret {
                    field: "spec.slurmKeyRef",
                    name: "k".into(),
                },
                "Secret ns/k (spec.slurmKeyRef) does not exist",
            ),
            (
                MissingReference::SecretKey {
                    field: "spec.jwtKeyRef",
                    name: "k".into(),
                    key: "jwt".into(),
                },
                "Secret ns/k (spec.jwtKeyRef) has no key \"jwt\"",
            ),
            (
                MissingReference::ConfigMap { name: "c".into() },
                "ConfigMap ns/c (referenced by the Controller's spec) does not exist",
            ),
            (
                MissingReference::ConfigMapKey {
                    name: "c".into(),
                    key: "jwks.json".into(),
                },
                "ConfigMap ns/c (spec.jwksKeyRef) has no key \"jwks.json\"",
            ),
        ];
        for (missing, start) in cases {
            assert_eq!(
                missing_message("ns", &missing),
                format!("{start}: the slurmctld StatefulSet and its configuration wait for it")
            );
        }
    }
}
