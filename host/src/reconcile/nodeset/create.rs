//! The creates of a pass: the missing pods built with the `nodeset-pod` builder and sent through a
//! slow-start window, each after its volume claims, expectations raised before and lowered for
//! every create that is refused or never sent.
//!
//! The window starts at one create and grows by one for each pod created (so it doubles with each
//! round trip, as the StatefulSet controller's slow-start batches 1, 2, 4, … do), up to
//! [`CREATES_IN_FLIGHT`]. Unlike a batch, it has no barrier: a create that comes back makes room
//! for the next at once, so the API server is not left waiting for the slowest create of a batch
//! (the creates already sent are served while the next pods are built; their answers are read
//! after the build, which a builder's per-pod deadline bounds).

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

/// What one create made: the claims made for it; or why it was refused.
type Made = Result<Vec<String>, Refused>;

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
    let mut sent = send(pass, controller, slots, plugin).await;
    // Events in ordinal order, whatever order the answers came in.
    sent.answers.sort_by_key(|a| a.0);
    let mut done = Created::default();
    done.record(pass, sent.answers).await;
    if let Some(e) = &sent.builder {
        pass.state.builder_error(e).await;
    }
    done.announce(ctx.core.as_ref(), ns).await;
    sent.error.map_or(Ok(()), Err)
}

/// What [`send`] did: every answer (the pod's place in the pass, its name, what it made), and
/// why it stopped sending, if it did for a builder's or the host's own error.
#[derive(Default)]
struct Sent {
    answers: Vec<(usize, String, Made)>,
    builder: Option<PluginError>,
    error: Option<Error>,
}

/// The window itself (see the module). Reads the pass only: its Events and conditions are
/// recorded after; expectations are lowered as each answer comes.
///
/// Permits: a pass takes those free now, up to its window's room; when none is free it queues
/// for one (and, with creates in flight, reads an answer if that comes first). Queued passes are
/// served one permit each in turn, so NodeSets scaling at once share the 64 evenly; a pass never
/// waits for many permits at once (which would hold every other pass back until that many were
/// free: a barrier across NodeSets).
async fn send(pass: &Pass<'_>, controller: &Controller, slots: Vec<Slot>, plugin: &Pipeline) -> Sent {
    let (ctx, owner) = (pass.ctx, pass.uid.as_str());
    let permits = &ctx.create_permits;
    let mut pending = slots.into_iter();
    let mut in_flight = FuturesUnordered::new();
    let mut sent = Sent::default();
    let (mut window, mut stopped, mut next) = (1usize, false, 0usize);
    loop {
        let room = window.min(CREATES_IN_FLIGHT).saturating_sub(in_flight.len());
        let want = room.min(pending.len());
        let mut answer = None;
        if !stopped && want > 0 {
            let free = permits.available_permits().min(want);
            let mut taken = (free > 0)
                .then(|| permits.try_acquire_many(free as u32).ok())
                .flatten();
            if taken.is_none() {
                // The semaphore is never closed: an error cannot happen, and would only mean no
                // bound.
                if in_flight.is_empty() {
                    taken = permits.acquire().await.ok();
                } else {
                    tokio::select! {
                        p = permits.acquire() => taken = p.ok(),
                        a = in_flight.next() => answer = a,
                    }
                }
            }
            if let Some(mut taken) = taken {
                let slots: Vec<Slot> = pending.by_ref().take(taken.num_permits()).collect();
                let names: Vec<String> = slots.iter().map(|s| s.identity.name.clone()).collect();
                match build(pass, controller, plugin, slots).await {
                    Ok(built) => {
                        for pod in built {
                            let permit = taken.split(1);
                            in_flight.push(create_one(pass, next, pod, permit));
                            next += 1;
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
        let answer = match answer {
            Some(a) => a,
            None => match in_flight.next().await {
                Some(a) => a,
                None => break,
            },
        };
        let (_, name, made) = &answer;
        // Lowered now, not at the end of the pass: a relist started meanwhile compares with the
        // moment the create returned.
        match made {
            Ok(_) => ctx.expectations.creation_succeeded(owner, name),
            Err(_) => ctx.expectations.creation_observed(owner, name),
        }
        if stops(made) {
            stopped = true;
        } else if made.is_ok() {
            window += 1;
        }
        sent.answers.push(answer);
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

/// Create the pass's `index`th pod after its claims (as the StatefulSet controller: no pod
/// without its storage), holding `_permit` until the answer. The pass's first pod is read back:
/// what the server dropped of it is a Warning (the pods of a pass are built alike); the others'
/// answers are not decoded.
async fn create_one(
    pass: &Pass<'_>,
    index: usize,
    pod: Pod,
    _permit: Option<SemaphorePermit<'_>>,
) -> (usize, String, Made) {
    let name = pod.name_any();
    let made = match volumes::ensure(pass, &name).await {
        Err(missing) => Err(Refused::Claim(missing)),
        Ok(claims) => {
            let writer = &pass.core().writer;
            let created = if index == 0 {
                match writer.create_pod(&pod).await {
                    Ok(stored) => {
                        warn_dropped_fields(pass, &pod, &stored).await;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            } else {
                writer.create_pod_unread(&pod).await
            };
            match created {
                Ok(()) => Ok(claims),
                Err(e) => Err(Refused::Api(e, claims)),
            }
        }
    };
    (index, name, made)
}

/// What the creates of a pass made: pods, names found taken, claims.
#[derive(Default)]
struct Created {
    pods: Vec<String>,
    taken: Vec<String>,
    claims: Vec<String>,
}

impl Created {
    /// Record the answers (their expectations already lowered): a `FailedCreate` for every
    /// refusal, the names for [`Created::announce`].
    async fn record(&mut self, pass: &mut Pass<'_>, answers: Vec<(usize, String, Made)>) {
        for (_, name, r) in answers {
            match r {
                Err(Refused::Claim(missing)) => pass.failed("FailedCreate", missing.message).await,
                Ok(made) => {
                    self.claims.extend(made);
                    self.pods.push(name);
                }
                Err(Refused::Api(e, made)) => {
                    self.claims.extend(made);
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
