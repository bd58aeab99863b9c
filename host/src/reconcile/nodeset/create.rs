//! The creates of a pass: the missing pods built with the `nodeset-pod` builder and sent in
//! slow-start batches (1, 2, 4, … [`BATCH_MOST`]), two batches in flight after the first, each
//! pod after its volume claims, expectations raised before and lowered for every create that is
//! refused or never sent.
//!
//! Batches, not a window without barriers: on a 2-core machine with kube-apiserver and etcd
//! beside it (the scale bench), a window that made room for each create as its answer came built
//! pods in chunks of one or two and queued for permits one at a time: the host's CPU rose by a
//! quarter (10,000 pods in 100 NodeSets: 9.5-12.0 s against 7.3-9.6 s) and the scale-ups were
//! no faster. But one batch at a time left the server idle between batches (each waited for its
//! slowest create, then the next was built): the machine was 5-9 % idle during the host's
//! scale-ups against kcm's 1-2 %. Two batches overlap: one is built and sent while the other's
//! last answers come.

use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt, future::join_all, stream::FuturesUnordered};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    ResourceExt,
    runtime::{events::EventType, reflector::ObjectRef},
};
use slinky_api::{Controller, NodeSet};

use super::{
    Pass,
    pods::{Place, Slot, build_pods, warn_dropped_fields},
    volumes,
};
use crate::{
    plugins::{BuilderKind, Pipeline, PluginError, PodIdentity},
    reconcile::{
        Error, Expectations,
        core::{events::name_list, writer},
    },
};

/// Why a pod of a batch was not created.
enum Refused {
    /// One of its claims could not be made, or is being deleted.
    Claim(volumes::Missing),
    /// The API server refused the pod (after the claims named were made for it).
    Api(kube::Error, Vec<String>),
}

/// At most this many pods are built and being created at once, across all NodeSets (the
/// semaphore [`super::NodeSetContext::create_permits`]; a slow-start batch takes at most
/// [`BATCH_MOST`] of them, so that two batches can be in flight).
///
/// Below the HTTP/2 streams a kube-apiserver allows on one connection (100 since the fix of
/// CVE-2023-44487, about 15 of them held by the watches): a create past them would wait in the
/// client, and an elected host's write timeout (counted from the call) would abandon it.
pub const CREATES_IN_FLIGHT: usize = 64;

/// The largest slow-start batch: half of [`CREATES_IN_FLIGHT`], so a NodeSet's next batch is
/// built and sent while its last one waits for its slowest answers.
const BATCH_MOST: usize = CREATES_IN_FLIGHT / 2;

/// Release the create expectations of pods that will not be created (nothing will observe them).
fn release(expectations: &Expectations, owner: &str, names: impl Iterator<Item = String>) {
    for name in names {
        expectations.creation_observed(owner, &name);
    }
}

/// Create the pods of `slots` in slow-start batches (1, 2, 4, … [`BATCH_MOST`]), each built
/// with the `nodeset-pod` builder just before it is sent, and each pod after its volume claims
/// ([`volumes::ensure`]). After the first batch two are in flight: the next starts as one ends.
/// A name taken meanwhile (409 AlreadyExists) skips that pod and the batches go on; any other
/// refusal (a claim's or the builder's included) starts no batch after it, and every create not
/// made is released.
///
/// A batch holds [`super::NodeSetContext::create_permits`] (one a pod) while it is built and
/// sent: however many NodeSets scale at once, at most that many built pods exist and that many
/// creates are in flight (100 NodeSets building all their pods first held hundreds of MiB).
pub(super) async fn create_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    slots: Vec<Slot>,
    plugin: &Pipeline,
) -> Result<(), Error> {
    if slots.is_empty() {
        return Ok(());
    }
    let ctx = pass.ctx;
    ctx.expectations
        .expect_creations(&pass.uid, slots.iter().map(|s| s.identity.name.clone()));
    let (started, asked) = (std::time::Instant::now(), slots.len());
    let mut done = Created::default();
    let stop = send(pass, controller, slots, plugin, &mut done).await;
    tracing::debug!(
        asked,
        created = done.pods.len(),
        ms = started.elapsed().as_millis() as u64,
        "creates of the pass"
    );
    // Reported once the batches are all answered (they borrow the pass meanwhile).
    for message in std::mem::take(&mut done.failures) {
        pass.failed("FailedCreate", message).await;
    }
    done.announce(ctx.core.as_ref(), pass.ns).await;
    match stop {
        Some(Stop::Builder(e)) => pass.state.builder_error(&e).await,
        Some(Stop::Error(e)) => return Err(e),
        Some(Stop::Refused) | None => {}
    }
    Ok(())
}

/// Why no further batch was sent.
enum Stop {
    /// A create was refused (not a name taken, not a claim being deleted).
    Refused,
    /// The builder failed.
    Builder(PluginError),
    /// The build could not be run.
    Error(Error),
}

impl Stop {
    /// Of two reasons (two batches in flight can both fail), the one to report: an error the
    /// pass returns over the builder's failure (a condition) over a refused create (its Event is
    /// reported either way).
    fn graver(self, other: Option<Stop>) -> Stop {
        let rank = |s: &Stop| match s {
            Stop::Refused => 0,
            Stop::Builder(_) => 1,
            Stop::Error(_) => 2,
        };
        match other {
            Some(o) if rank(&o) > rank(&self) => o,
            _ => self,
        }
    }
}

/// What one batch came to: the pods built and each one's create, or the build's failure (the
/// batch's names, none created).
enum Batch {
    Sent(Vec<Pod>, Vec<Made>),
    NotBuilt(Vec<String>, Stop),
    /// Not built nor sent: another batch had stopped the creates by the time it got its permits.
    Skipped(Vec<String>),
}

/// Send the batches of `slots` and record their answers in `done`; why they stopped early.
async fn send(
    pass: &Pass<'_>,
    controller: &Controller,
    slots: Vec<Slot>,
    plugin: &Pipeline,
    done: &mut Created,
) -> Option<Stop> {
    let (expectations, owner) = (&pass.ctx.expectations, pass.uid.as_str());
    let mut pending = slots.into_iter();
    let mut size = 1;
    let stopped = AtomicBool::new(false);
    let mut in_flight = FuturesUnordered::new();
    let first: Vec<Slot> = pending.by_ref().take(1).collect();
    in_flight.push(batch(pass, controller, plugin, first, true, &stopped));
    let mut stop: Option<Stop> = None;
    while let Some(answered) = in_flight.next().await {
        let refused = match answered {
            Batch::Sent(built, results) => {
                if let Some((pod, Ok((Some(stored), _)))) = built.first().zip(results.first()) {
                    // Pods of one pass are built alike: the first tells what the server drops.
                    warn_dropped_fields(pass, pod, stored).await;
                }
                done.record(expectations, owner, &built, results)
                    .then_some(Stop::Refused)
            }
            Batch::NotBuilt(names, why) => {
                release(expectations, owner, names.into_iter());
                Some(why)
            }
            Batch::Skipped(names) => {
                release(expectations, owner, names.into_iter());
                None
            }
        };
        // Any reason stops the batches: the one waiting for its permits is skipped, one already
        // sent is still answered.
        if let Some(why) = refused {
            stopped.store(true, Ordering::Relaxed);
            stop = Some(why.graver(stop));
        }
        while stop.is_none() && in_flight.len() < 2 && pending.len() > 0 {
            if superseded(pass, plugin) {
                // The next pass builds from the NodeSet (and builder) as it is now.
                tracing::debug!(nodeset = %pass.ns.name_any(), "creates stop: the NodeSet or its builder changed");
                break;
            }
            size = (size * 2).min(BATCH_MOST);
            let this: Vec<Slot> = pending.by_ref().take(size).collect();
            in_flight.push(batch(pass, controller, plugin, this, false, &stopped));
        }
    }
    // Creates never attempted are released: nothing will ever observe them.
    release(expectations, owner, pending.map(|s| s.identity.name));
    stop
}

/// The NodeSet changed since the pass began (its spec: a new generation; deleted or being
/// deleted; replaced under its name), or its pods' builder did (a plugin reloaded, a pipeline
/// step that its labels now select or no longer do): the pods still to create would be built
/// from what no longer is, so no further batch is sent.
fn superseded(pass: &Pass<'_>, plugin: &Pipeline) -> bool {
    let (ns, namespace) = (pass.ns, pass.ns.namespace().unwrap_or_default());
    let key = ObjectRef::<NodeSet>::new(&ns.name_any()).within(&namespace);
    pass.ctx.caches.nodesets.get(&key).is_none_or(|now| {
        now.uid() != ns.uid()
            || now.metadata.generation != ns.metadata.generation
            || now.metadata.deletion_timestamp.is_some()
            || pass
                .core()
                .plugins
                .pipeline(BuilderKind::NodesetPod, &now.metadata)
                .digest()
                != plugin.digest()
    })
}

/// Build and create one batch, holding a permit per pod of it until its answers are in; skipped
/// when `stopped` is set by the time it has its permits.
async fn batch(
    pass: &Pass<'_>,
    controller: &Controller,
    plugin: &Pipeline,
    this: Vec<Slot>,
    first_of_pass: bool,
    stopped: &AtomicBool,
) -> Batch {
    // The semaphore is never closed: an error here cannot happen, and would only mean no bound.
    let _permits = pass.ctx.create_permits.acquire_many(this.len() as u32).await.ok();
    let names: Vec<String> = this.iter().map(|s| s.identity.name.clone()).collect();
    if stopped.load(Ordering::Relaxed) {
        return Batch::Skipped(names);
    }
    let (identities, places): (Vec<PodIdentity>, Vec<Option<Place>>) =
        this.into_iter().map(|s| (s.identity, s.place)).unzip();
    let building = pass.ctx.build_permits.acquire().await.ok();
    let built = build_pods(pass.core(), pass.ns, controller, plugin, identities).await;
    drop(building);
    let mut built = match built {
        Ok(Ok(built)) => built,
        Ok(Err(e)) => return Batch::NotBuilt(names, Stop::Builder(e)),
        Err(e) => return Batch::NotBuilt(names, Stop::Error(e)),
    };
    for (pod, place) in built.iter_mut().zip(&places) {
        match place {
            Some(Place::Pin(node)) => slinky_api::pods::pin_to_node(pod, node),
            Some(Place::Node(node)) => slinky_api::placement::place_on_node(pod, node),
            None => {}
        }
    }
    let results = create_batch(pass, &built, first_of_pass).await;
    Batch::Sent(built, results)
}

/// Create one batch of pods, each after its claims (as the StatefulSet controller: no pod
/// without its storage). The pass's first pod is read back (`first_of_pass`: what the server
/// dropped of it is checked; the pods of a pass are built alike); the others' answers are not
/// decoded.
async fn create_batch(pass: &Pass<'_>, built: &[Pod], first_of_pass: bool) -> Vec<Made> {
    let core = pass.core();
    join_all(built.iter().enumerate().map(|(i, pod)| async move {
        let made = volumes::ensure(pass, &pod.name_any())
            .await
            .map_err(Refused::Claim)?;
        let created = if first_of_pass && i == 0 {
            core.writer.create_pod(pod).await.map(Some)
        } else {
            core.writer.create_pod_unread(pod).await.map(|()| None)
        };
        match created {
            Ok(stored) => Ok((stored, made)),
            Err(e) => Err(Refused::Api(e, made)),
        }
    }))
    .await
}

/// What one create made: the pod as stored (the first of a pass, read back) and the claims made
/// for it; or why it was refused.
type Made = Result<(Option<Pod>, Vec<String>), Refused>;

/// What the creates of a pass made: pods, names found taken, claims, and the refusals to report.
#[derive(Default)]
struct Created {
    pods: Vec<String>,
    taken: Vec<String>,
    claims: Vec<String>,
    failures: Vec<String>,
}

impl Created {
    /// Record the answers of one batch (expectations lowered for every pod not created, a
    /// `FailedCreate` message for every refusal); whether a create was refused (no batch
    /// follows).
    fn record(
        &mut self,
        expectations: &Expectations,
        owner: &str,
        built: &[Pod],
        results: Vec<Made>,
    ) -> bool {
        let mut refused = false;
        for (pod, r) in built.iter().zip(results) {
            let name = pod.name_any();
            match r {
                Err(Refused::Claim(missing)) => {
                    expectations.creation_observed(owner, &name);
                    refused |= !missing.deleting;
                    self.failures.push(missing.message);
                }
                Ok((_, made)) => {
                    self.claims.extend(made);
                    expectations.creation_succeeded(owner, &name);
                    self.pods.push(name);
                }
                Err(Refused::Api(e, made)) => {
                    self.claims.extend(made);
                    expectations.creation_observed(owner, &name);
                    if writer::is_already_exists(&e) {
                        self.taken.push(name);
                    } else {
                        refused = true;
                        self.failures
                            .push(format!("Error creating pod {name}: {}", writer::message(&e)));
                    }
                }
            }
        }
        refused
    }

    /// One Event each for the claims and pods created and the names found taken.
    async fn announce(&self, core: &crate::reconcile::core::context::Core, ns: &NodeSet) {
        if !self.claims.is_empty() {
            let note = format!("Created claims: {}", name_list(&self.claims));
            core.event(ns, EventType::Normal, "SuccessfulCreate", note).await;
        }
        if !self.pods.is_empty() {
            let note = format!("Created pods: {}", name_list(&self.pods));
            core.event(ns, EventType::Normal, "SuccessfulCreate", note).await;
        }
        if !self.taken.is_empty() {
            let note = format!(
                "pods {} already exist and are not this NodeSet's (the cache had not shown them yet); \
                 they were skipped",
                name_list(&self.taken)
            );
            core.event(ns, EventType::Warning, "PodNameTaken", note).await;
        }
    }
}
