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
mod stuck;

use crate::plugins::Builder as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};
use slinky_api::{
    Controller, ControllerStatus, checks, conditions, contract::MissingReference, failure::Failure,
};

use super::{
    core::{
        Error,
        applied::AppliedVersions,
        apply::{ChildSync, keys_of},
        backoff,
        caches::Caches,
        context::Core,
        pass::PassState,
        status,
    },
    slurm::SlurmClients,
};
use crate::plugins::{BuilderKind, Child, ChildKind, ControllerInputs, Ownership};

/// What the Controller reconciler gets.
pub struct ControllerContext {
    /// What every reconciler shares.
    pub core: Arc<Core>,
    /// The caches (it reads the NodeSets, the referenced ConfigMaps and its children).
    pub caches: Caches,
    /// What the host last applied to each child (hash and resulting resourceVersion).
    pub applied: Arc<AppliedVersions>,
    /// The slurmrestd clients of the Controllers (which slurmctld is in control, for the HA
    /// `active` label).
    pub slurm: Arc<SlurmClients>,
}

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
    /// A referenced Secret, ConfigMap or Accounting is missing (`ReferenceNotFound`).
    missing: Option<Failure>,
}

impl Pass<'_> {
    async fn missing(&mut self, failure: Failure) {
        self.ctx.core.report(self.c, self.state.current(), &failure).await;
        self.missing = Some(failure);
    }
}

/// What the children builder needs from the cluster, or the first missing reference that holds
/// the children back; and a missing reference that does not (the Accounting). The Secrets the Controller references are read from the API (`get`, nothing
/// else), its ConfigMaps, NodeSets and Accounting from the caches; [`ControllerInputs::gather`]
/// makes the inputs of them by the rule `render` uses too.
async fn read_inputs(
    ctx: &ControllerContext,
    c: &Controller,
) -> Result<(Result<ControllerInputs, Failure>, Option<Failure>), Error> {
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
    let failure = |m: &MissingReference| Failure::reference_not_found(m.reason(), missing_message(&ns, m));
    let soft = missing.iter().find(|m| !m.holds_back()).map(failure);
    Ok((
        match missing.iter().find(|m| m.holds_back()) {
            Some(m) => Err(failure(m)),
            None => Ok(inputs),
        },
        soft,
    ))
}

/// The `ReferenceNotFound` condition's (and Event's) message for a missing reference of a
/// Controller of namespace `ns`.
fn missing_message(ns: &str, missing: &MissingReference) -> String {
    if let MissingReference::Accounting { name } = missing {
        return format!(
            "{}: slurm.conf names its default address ({}:{}) and slurmctld keeps the accounting \
             records until slurmdbd answers; create it, or remove spec.accountingRef",
            missing.describe(ns),
            slinky_api::accounting_key(name),
            slinky_api::SLURMDBD_PORT
        );
    }
    format!(
        "{}: the slurmctld StatefulSet and its configuration wait for it",
        missing.describe(ns)
    )
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
        let copy = c.clone();
        let built = core
            .call_builder(
                BuilderKind::ControllerService,
                &c.metadata,
                move |plugin, build| plugin.build_service(build, &copy),
            )
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
    if let Some(failure) = soft {
        pass.missing(failure).await;
    }
    match inputs {
        Err(failure) => {
            pass.missing(failure).await;
            complete = false;
        }
        Ok(inputs) => {
            let copy = c.clone();
            let built = core
                .call_builder(
                    BuilderKind::ControllerChildren,
                    &c.metadata,
                    move |plugin, build| plugin.build_controller_children(build, &copy, &inputs),
                )
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
    let current = status::HasStatus::conditions(c);
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
    let problem = match checks::summary(&c.spec_problems()) {
        Some(p) => Some(p),
        None => unshared_claim(core, c).await?,
    };
    if let Some(problem) = problem {
        pass.state.problem(Failure::invalid_spec(problem)).await;
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

    let retry = !failures.is_empty() || pass.missing.is_some() || pass.state.retry_problem();
    write_status(&mut pass, &failures, &applied).await?;
    let requeue = core
        .backoff
        .record(&backoff::key(c), backoff::Outcome::of(true, retry))
        .unwrap_or(core.resync)
        .min(ha_recheck.unwrap_or(core.resync));
    Ok(Action::requeue(requeue))
}

/// With high availability, the existing claim every slurmctld mounts must be `ReadWriteMany`
/// (Slinky refuses the StatefulSet otherwise): what is wrong, read from the API. A claim not made
/// yet is no problem here (its pods wait for it).
async fn unshared_claim(core: &crate::reconcile::Core, c: &Controller) -> Result<Option<String>, Error> {
    let claim = c
        .spec
        .persistence
        .as_ref()
        .and_then(|p| p.existing_claim.as_deref());
    let (true, Some(claim)) = (c.ha_enabled() && !c.spec.external, claim) else {
        return Ok(None);
    };
    let ns = c.namespace().unwrap_or_default();
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(core.client.clone(), &ns);
    let Some(pvc) = api.get_opt(claim).await? else {
        return Ok(None);
    };
    let modes = pvc.spec.and_then(|s| s.access_modes).unwrap_or_default();
    Ok((!modes.iter().any(|m| m == "ReadWriteMany")).then(|| {
        format!(
            "spec.persistence.existingClaim: high availability needs the PersistentVolumeClaim              {ns}/{claim} to have the access mode ReadWriteMany (every slurmctld mounts it; it has              {modes:?}): use a ReadWriteMany claim, or turn HA off"
        )
    }))
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

async fn write_status(pass: &mut Pass<'_>, failures: &[Failure], applied: &[String]) -> Result<(), Error> {
    let (ctx, c) = (pass.ctx, pass.c);
    let readiness = slurmctld_readiness(ctx, c);
    let conds = &mut pass.state.conditions;
    #[allow(deprecated, reason = "clearing the condition older hosts set")]
    let legacy = conditions::SERVICE_FAILURE;
    for t in [conditions::INVALID_SPEC, conditions::BUILDER_FAILED, legacy] {
        conds.clear(t);
    }
    match &pass.missing {
        Some(f) => conds.set_failure(f),
        None => conds.clear(conditions::REFERENCE_NOT_FOUND),
    }
    if let Some(f) = Failure::first_of(failures, "") {
        conds.set_failure(&f);
    } else if pass.state.problem.is_none() {
        conds.clear(conditions::CHILD_FAILURE);
    }
    if let Some(f) = &pass.state.problem {
        conds.set_problem(f);
    } else if let Some(f) = failures.first().or(pass.missing.as_ref()) {
        conds.set(conditions::READY, false, f.reason, f.message.clone());
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
    let generation = c.metadata.generation;
    status::write(&ctx.core, c, &pass.state.conditions, |_, conditions| {
        ControllerStatus {
            observed_generation: generation,
            conditions,
        }
    })
    .await
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
