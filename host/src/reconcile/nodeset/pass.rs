//! One NodeSet pass's record: what it decided about conditions, the writes that failed, what it
//! waits on; and when the NodeSet comes back after it ([`Pass::come_back_after`]).

use std::{sync::Arc, time::Duration};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::runtime::events::EventType;
use slinky_api::{NodeSet, failure::Failure};

use super::{
    NodeSetContext,
    plan::{is_available, is_running_and_ready},
    status::Reached,
};
use crate::reconcile::{
    core::{backoff, context::Core, pass::PassState},
    slurm::Unavailable,
};

/// The longest wait between two passes of a NodeSet whose Slurm could not be asked.
const SLURM_RETRY_CAP: Duration = Duration::from_secs(10);
/// How soon a pass comes back while a pod waits for its Slurm node to drain.
const DRAIN_RECHECK: Duration = Duration::from_secs(3);
/// How soon a pass of a NodeSet whose pods are Slurm nodes comes back, whatever else it waits
/// on: a job that starts on an idle pod gets `pod-protect` within this plus the node list's age
/// (at most [`crate::reconcile::slurm::NODES_TTL`]): 25 s, within Slinky's 30 s refresh.
pub const PROTECT_INTERVAL: Duration = Duration::from_secs(15);

/// One pass: what it decided about conditions, and the writes that failed.
pub(super) struct Pass<'a> {
    pub(super) ctx: &'a NodeSetContext,
    pub(super) ns: &'a NodeSet,
    pub(super) uid: String,
    /// The conditions, the problem that stops the pass, and whether a builder failed.
    pub(super) state: PassState<'a, NodeSet>,
    /// Each refused pod write (`ReplicaFailure`).
    pub(super) failures: Vec<Failure>,
    /// Each refused child write (not a pod) or ownership problem (`ChildFailure`).
    pub(super) child_failures: Vec<Failure>,
    /// The children were synced (so `ChildFailure` is set or cleared by this pass).
    pub(super) children_synced: bool,
    /// Why Slurm could not be asked or refused what was asked (`None`: it answered, or it is
    /// not configured, or the pass did not get that far).
    pub(super) slurm_failure: Option<Failure>,
    /// The pass asked Slurm (so `SlurmFailure` is set or cleared by it).
    pub(super) slurm_asked: bool,
    /// The Slurm node counts of the NodeSet's pods (when Slurm was asked).
    pub(super) slurm_counts: Option<slinky_slurm::Counts>,
    /// A pod waits on its Slurm node: come back soon.
    pub(super) waits_for_slurm: bool,
    /// Slurm listed the nodes in this pass and `pod-protect` was refreshed from the list: the
    /// pass comes back within [`PROTECT_INTERVAL`].
    pub(super) watches_slurm: bool,
    /// A write met a 409 because the cache lagged behind our own previous write: come back soon
    /// (not a failure: no Event, no backoff).
    pub(super) retry_soon: bool,
    /// DaemonSet mode: the nodes the pods should run on (the status' `desired`).
    pub(super) desired: Option<i32>,
    /// The soonest the pass must come back: a DaemonSet-mode node's failure backoff, a
    /// maintenance window's start or end.
    pub(super) come_back: Option<Duration>,
    /// Changes to `status.keptDrains` (node → the drain to keep, `None`: forget it).
    pub(super) kept: std::collections::BTreeMap<String, Option<slinky_api::KeptDrain>>,
}

impl<'a> Pass<'a> {
    /// A pass over `ns` that has decided and written nothing yet.
    pub(super) fn new(
        ctx: &'a NodeSetContext,
        ns: &'a NodeSet,
        uid: String,
        state: PassState<'a, NodeSet>,
    ) -> Self {
        Pass {
            ctx,
            ns,
            uid,
            state,
            failures: Vec::new(),
            child_failures: Vec::new(),
            children_synced: false,
            slurm_failure: None,
            slurm_asked: false,
            slurm_counts: None,
            waits_for_slurm: false,
            watches_slurm: false,
            retry_soon: false,
            desired: None,
            come_back: None,
            kept: Default::default(),
        }
    }

    /// What both reconcilers share.
    pub(super) fn core(&self) -> &Core {
        &self.ctx.core
    }

    /// A refused write: an Event now, the `ReplicaFailure` condition at the end of the pass.
    pub(super) async fn failed(&mut self, reason: &'static str, message: String) {
        tracing::warn!(reason, "{message}");
        self.core()
            .event(self.ns, EventType::Warning, reason, message.clone())
            .await;
        self.failures.push(Failure::replica(reason, message));
    }

    /// Slurm could not be asked or refused: an Event when the message is new, the
    /// `SlurmFailure` condition at the end of the pass (the first failure of the pass).
    pub(super) async fn slurm_failed(&mut self, u: Unavailable) {
        let failure = Failure::slurm(u.reason, u.message);
        self.core().report(self.ns, self.state.current(), &failure).await;
        self.slurm_failure.get_or_insert(failure);
    }

    /// A Normal `Draining` Event naming the Slurm nodes just drained, and what waits for them.
    pub(super) async fn draining(&self, nodes: &[String], until: &str) {
        if nodes.is_empty() {
            return;
        }
        let note = format!(
            "Draining Slurm nodes {}: {until} once no job runs there",
            crate::reconcile::core::events::name_list(nodes)
        );
        self.core()
            .event(self.ns, EventType::Normal, "Draining", note)
            .await;
    }

    /// A pod waits for its Slurm node to drain.
    pub(super) fn wait_for_slurm(&mut self) {
        self.waits_for_slurm = true;
    }

    /// Come back within seconds (see [`Pass::retry_soon`]).
    pub(super) fn retry_soon(&mut self) {
        self.retry_soon = true;
    }

    /// Come back within `after` (a node's backoff, a maintenance window's start or end).
    pub(super) fn come_back_within(&mut self, after: Duration) {
        self.come_back = Some(self.come_back.map_or(after, |c| c.min(after)));
    }

    /// When the NodeSet comes back after this pass (`requeue` unless something sooner): its
    /// backoff after a failure, within seconds while Slurm cannot be asked or a pod waits on its
    /// node, at a maintenance window's edge, when a pod becomes available.
    pub(super) fn come_back_after(
        &self,
        mut requeue: Duration,
        reached: Reached,
        owned: &[Arc<Pod>],
    ) -> Duration {
        let failed = !self.failures.is_empty()
            || !self.child_failures.is_empty()
            || self.state.retry_problem()
            || self.slurm_failure.is_some();
        let synced = reached == Reached::Synced;
        if let Some(after) = self
            .core()
            .backoff
            .record(&backoff::key(self.ns), backoff::Outcome::of(synced, failed))
        {
            requeue = after;
        }
        if self.slurm_failure.is_some() && self.failures.is_empty() && self.child_failures.is_empty() {
            // Slurm unreachable holds scale-ins and updates: ask again within seconds of its
            // return, whatever the backoff has grown to (Slinky: every 30 s).
            requeue = requeue.min(SLURM_RETRY_CAP);
        }
        if let Some(after) = self.come_back {
            requeue = requeue.min(after);
        }
        if self.watches_slurm && owned.iter().any(|p| p.metadata.deletion_timestamp.is_none()) {
            requeue = requeue.min(PROTECT_INTERVAL);
        }
        if (self.waits_for_slurm || self.retry_soon) && !failed {
            // A node drains as its jobs end: look again soon (Slinky: 30 s).
            requeue = requeue.min(DRAIN_RECHECK);
        }
        let min_ready = i64::from(self.ns.spec.min_ready_seconds.unwrap_or(0));
        let now = Timestamp::now();
        if owned
            .iter()
            .any(|p| is_running_and_ready(p) && !is_available(p, min_ready, now))
        {
            requeue = requeue.min(Duration::from_secs(min_ready.max(0) as u64 + 1));
        }
        requeue
    }
}
