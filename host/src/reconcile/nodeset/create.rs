//! The creates of a pass: the missing pods built with the `nodeset-pod` builder and sent through a
//! slow-start window, each after its volume claims, expectations raised before and lowered for
//! every create that is refused or never sent.
//!
//! The window starts at one create and grows by one for each pod created (so it doubles with each
//! round trip, as the StatefulSet controller's slow-start batches 1, 2, 4, … do), up to
//! [`CREATES_IN_FLIGHT`]. Unlike a batch, it has no barrier: a create that comes back makes room
//! for the next at once, and the next pods are built while the creates already sent are being
//! served, so the API server is never left idle waiting for the slowest create of a batch or for
//! the builder.

use futures::{StreamExt, stream::FuturesUnordered};
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::{Controller, NodeSet};
use tokio::sync::SemaphorePermit;

use super::{
    Pass,
    pods::{Place, Slot, build_pods, warn_dropped_fields},
    volumes,
};
use crate::{
    plugins::{Pipeline, PluginError, PodIdentity},
    reconcile::{
        Error, Expectations,
        core::{context::Core, events::name_list, writer},
    },
};

/// At most this many pods are built and being created at once, across all NodeSets (the
/// semaphore [`super::NodeSetContext::create_permits`]; the widest a pass's window gets).
///
/// Below the HTTP/2 streams a kube-apiserver allows on one connection (100 since the fix of
/// CVE-2023-44487, about 15 of them held by the watches): a create past them would wait in the
/// client, and an elected host's write timeout (counted from the call) would abandon it.
pub const CREATES_IN_FLIGHT: usize = 64;

/// Why a pod was not created.
enum Refused {
    /// One of its claims could not be made, or is being deleted.
    Claim(volumes::Missing),
    /// The API server refused the pod (after the claims named were made for it).
    Api(kube::Error, Vec<String>),
}

/// What one create made: the pod as built and as stored (the first of a pass only, read back)
/// and the claims made for it; or why it was refused.
type Made = Result<(Option<(Pod, Pod)>, Vec<String>), Refused>;

/// Whether an answer stops the pass's creates: any refusal but a name found taken (409
/// AlreadyExists: that pod is skipped) or a claim still being deleted (it waits).
fn stops(made: &Made) -> bool {
    match made {
        Ok(_) => false,
        Err(Refused::Claim(missing)) => !missing.deleting,
        Err(Refused::Api(e, _)) => !writer::is_already_exists(e),
    }
}

/// Release the create expectations of pods that will not be created (nothing will observe them).
fn release(expectations: &Expectations, owner: &str, names: impl Iterator<Item = String>) {
    for name in names {
        expectations.creation_observed(owner, &name);
    }
}

/// Create the pods of `slots` through the slow-start window (see the module), each built with
/// the `nodeset-pod` builder just before it is sent, and each after its volume claims
/// ([`volumes::ensure`]). A name taken meanwhile (409 AlreadyExists) skips that pod and the
/// others go on; any other refusal (a claim's or the builder's included) sends nothing more (the
/// creates in flight finish), and every create not made is released.
///
/// Each create holds one of [`super::NodeSetContext::create_permits`] from before its pod is
/// built until its answer: however many NodeSets scale at once, at most that many built pods
/// exist and that many creates are in flight (100 NodeSets building all their pods first held
/// hundreds of MiB).
pub(super) async fn create_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    slots: Vec<Slot>,
    plugin: &Pipeline,
) -> Result<(), Error> {
    if slots.is_empty() {
        return Ok(());
    }
    let (ns, ctx) = (pass.ns, pass.ctx);
    ctx.expectations
        .expect_creations(&pass.uid, slots.iter().map(|s| s.identity.name.clone()));
    let sent = send(pass, controller, slots, plugin).await;
    let mut done = Created::default();
    done.record(pass, sent.answers).await;
    if let Some(e) = &sent.builder {
        pass.state.builder_error(e).await;
    }
    done.announce(ctx.core.as_ref(), ns).await;
    sent.error.map_or(Ok(()), Err)
}

/// What [`send`] did: every answer (name, what it made), and why it stopped sending, if it did
/// for a builder's or the host's own error.
#[derive(Default)]
struct Sent {
    answers: Vec<(String, Made)>,
    builder: Option<PluginError>,
    error: Option<Error>,
}

/// The window itself (see the module). Reads the pass only: what it decides is recorded after.
async fn send(pass: &Pass<'_>, controller: &Controller, slots: Vec<Slot>, plugin: &Pipeline) -> Sent {
    let (ctx, owner) = (pass.ctx, pass.uid.as_str());
    let permits = &ctx.create_permits;
    let mut pending = slots.into_iter();
    let mut in_flight = FuturesUnordered::new();
    let mut sent = Sent::default();
    let (mut window, mut stopped, mut first) = (1usize, false, true);
    loop {
        let room = window.min(CREATES_IN_FLIGHT).saturating_sub(in_flight.len());
        let want = room.min(pending.len());
        if !stopped && want > 0 {
            let taken = if in_flight.is_empty() {
                // None of ours holds a permit: wait for them (other NodeSets release theirs). The
                // semaphore is never closed: an error cannot happen, and would only mean no bound.
                permits.acquire_many(want as u32).await.ok()
            } else {
                // Ours hold permits and give them back only as their answers are read: take
                // what is free now, or read an answer first.
                let free = permits.available_permits().min(want);
                (free > 0)
                    .then(|| permits.try_acquire_many(free as u32).ok())
                    .flatten()
            };
            if let Some(mut taken) = taken {
                let slots: Vec<Slot> = pending.by_ref().take(taken.num_permits()).collect();
                let names: Vec<String> = slots.iter().map(|s| s.identity.name.clone()).collect();
                match build(pass, controller, plugin, slots).await {
                    Ok(built) => {
                        for pod in built {
                            let permit = taken.split(1);
                            in_flight.push(create_one(pass, pod, std::mem::take(&mut first), permit));
                        }
                    }
                    Err(stop) => {
                        // Nothing of this chunk or after it is created.
                        release(&ctx.expectations, owner, names.into_iter());
                        match stop {
                            Stop::Builder(e) => sent.builder = Some(e),
                            Stop::Host(e) => sent.error = Some(e),
                        }
                        stopped = true;
                    }
                }
                continue;
            }
        }
        let Some((name, made)) = in_flight.next().await else {
            break;
        };
        if stops(&made) {
            stopped = true;
        } else if made.is_ok() {
            window += 1;
        }
        sent.answers.push((name, made));
    }
    // Creates never sent are released: nothing will ever observe them.
    release(&ctx.expectations, owner, pending.map(|s| s.identity.name));
    sent
}

/// Why a chunk could not be built.
enum Stop {
    Builder(PluginError),
    Host(Error),
}

/// The pods of `slots`, built and placed (pinned to their last node, or on their daemon node).
async fn build(
    pass: &Pass<'_>,
    controller: &Controller,
    plugin: &Pipeline,
    slots: Vec<Slot>,
) -> Result<Vec<Pod>, Stop> {
    let (identities, places): (Vec<PodIdentity>, Vec<Option<Place>>) =
        slots.into_iter().map(|s| (s.identity, s.place)).unzip();
    let mut built = match build_pods(pass.core(), pass.ns, controller, plugin, identities).await {
        Ok(Ok(built)) => built,
        Ok(Err(e)) => return Err(Stop::Builder(e)),
        Err(e) => return Err(Stop::Host(e)),
    };
    for (pod, place) in built.iter_mut().zip(&places) {
        match place {
            Some(Place::Pin(node)) => slinky_api::pods::pin_to_node(pod, node),
            Some(Place::Node(node)) => slinky_api::placement::place_on_node(pod, node),
            None => {}
        }
    }
    Ok(built)
}

/// Create one pod after its claims (as the StatefulSet controller: no pod without its storage),
/// holding `_permit` until the answer. The pass's first pod is read back (`read_back`: what the
/// server dropped of it is checked; the pods of a pass are built alike); the others' answers are
/// not decoded.
async fn create_one(
    pass: &Pass<'_>,
    pod: Pod,
    read_back: bool,
    _permit: Option<SemaphorePermit<'_>>,
) -> (String, Made) {
    let name = pod.name_any();
    let made = match volumes::ensure(pass, &name).await {
        Err(missing) => Err(Refused::Claim(missing)),
        Ok(claims) => {
            let writer = &pass.core().writer;
            let created = if read_back {
                writer.create_pod(&pod).await.map(|stored| Some((pod, stored)))
            } else {
                writer.create_pod_unread(&pod).await.map(|()| None)
            };
            match created {
                Ok(stored) => Ok((stored, claims)),
                Err(e) => Err(Refused::Api(e, claims)),
            }
        }
    };
    (name, made)
}

/// What the creates of a pass made: pods, names found taken, claims.
#[derive(Default)]
struct Created {
    pods: Vec<String>,
    taken: Vec<String>,
    claims: Vec<String>,
}

impl Created {
    /// Record the answers (expectations lowered for every pod not created, a `FailedCreate` for
    /// every refusal).
    async fn record(&mut self, pass: &mut Pass<'_>, answers: Vec<(String, Made)>) {
        let (ctx, owner) = (pass.ctx, pass.uid.clone());
        for (name, r) in answers {
            match r {
                Err(Refused::Claim(missing)) => {
                    ctx.expectations.creation_observed(&owner, &name);
                    pass.failed("FailedCreate", missing.message).await;
                }
                Ok((stored, made)) => {
                    self.claims.extend(made);
                    ctx.expectations.creation_succeeded(&owner, &name);
                    // Pods of one pass are built alike: the first tells what the server drops.
                    if let Some((built, stored)) = stored {
                        warn_dropped_fields(pass, &built, &stored).await;
                    }
                    self.pods.push(name);
                }
                Err(Refused::Api(e, made)) => {
                    self.claims.extend(made);
                    ctx.expectations.creation_observed(&owner, &name);
                    if writer::is_already_exists(&e) {
                        self.taken.push(name);
                    } else {
                        pass.failed(
                            "FailedCreate",
                            format!("Error creating pod {name}: {}", writer::message(&e)),
                        )
                        .await;
                    }
                }
            }
        }
    }

    /// One Event each for the claims and pods created and the names found taken.
    async fn announce(&self, core: &Core, ns: &NodeSet) {
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
