//! What every reconciler receives: [`Core`] (the API, the writer, Events, the builders and the
//! pass policy). Each kind's context (in its own room) holds the core, the caches and what only
//! that kind uses.

use std::{sync::Arc, time::Duration};

use kube::{
    Client, Resource,
    runtime::{controller::Action, events::EventType},
};

use super::{
    Error, Metrics, announced::Announced, backoff::Backoff, events::Events, leader::Leadership, object_key,
    writer::Writer,
};
use crate::plugins::{BuildContext, PluginRegistry};

/// What every reconciler uses: the API, the only writer, Events, the builders, metrics, and when
/// a pass runs and comes back.
pub struct Core {
    /// The API client (fresh reads: adoption checks, Secrets, status conflicts, child ownership).
    pub client: Client,
    /// The only writer.
    pub writer: Writer,
    /// Events (fenced like the writes).
    pub events: Events,
    /// The active builder plugins.
    pub plugins: Arc<PluginRegistry>,
    /// What builders may know of the cluster.
    pub build: BuildContext,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// The namespaces served (all when empty).
    pub namespaces: Arc<Vec<String>>,
    /// The write fence (leader election).
    pub leader: Leadership,
    /// Per-object retry backoff after failed writes and errors.
    pub backoff: Backoff,
    /// The once-only child problems announced by an Event, per parent.
    pub announced: Announced,
    /// The period of the resync requeue of healthy objects.
    pub resync: Duration,
    /// Whether a StatefulSet whose immutable fields changed is deleted and recreated (opt-in), or
    /// the difference only reported.
    pub recreate_statefulsets: bool,
}

impl Core {
    /// Whether this host serves objects of namespace `ns`.
    pub fn serves(&self, ns: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == ns)
    }

    /// Publish an Event on `obj` whose action is its reason, only while this replica leads, its
    /// note capped to what the API server accepts (failures are logged, never fatal).
    pub(crate) async fn event<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.event_about(obj, None, type_, reason, note).await;
    }

    /// Publish an Event on `obj` about `related` (a child, which `kubectl describe` and the
    /// Event's `related` then name). Fenced, capped and counted in a series when repeated like
    /// every Event ([`Events::publish`]).
    pub(crate) async fn event_about<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        related: Option<k8s_openapi::api::core::v1::ObjectReference>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.events
            .publish(obj, related, type_, reason, reason, note)
            .await;
    }

    /// Call the pipeline of `kind` for the parent `parent` describes (its namespace and labels)
    /// off the async threads, counted and timed under its kind: `call` gets the pipeline and the
    /// build context.
    pub(crate) async fn call_builder<T: Send + 'static>(
        &self,
        kind: crate::plugins::BuilderKind,
        parent: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        call: impl FnOnce(&crate::plugins::Pipeline, &BuildContext) -> Result<T, crate::plugins::PluginError>
        + Send
        + 'static,
    ) -> Result<Result<T, crate::plugins::PluginError>, Error> {
        let plugin = self.plugins.pipeline(kind, parent);
        let build = self.build.clone();
        let metrics = self.metrics.clone();
        self.metrics.plugin_calls.inc_by(1);
        self.blocking(move || super::time_plugin_call(&metrics, kind, || call(&plugin, &build)))
            .await
    }

    /// Run a builder call off the async threads.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Error::Task(e.to_string()))
    }

    /// The one reconcile wrapper: followers reconcile nothing; every log line carries the
    /// object's kind and key; the time and result are counted.
    pub(crate) async fn instrumented<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        pass: impl std::future::Future<Output = Result<Action, Error>>,
    ) -> Result<Action, Error> {
        if !self.leader.may_write() {
            // A follower: caches only. Becoming the leader re-reconciles everything.
            return Ok(Action::await_change());
        }
        let kind = K::kind(&());
        let started = std::time::Instant::now();
        let span = tracing::info_span!("reconcile", kind = %kind, key = %object_key(obj));
        let r = tracing::Instrument::instrument(pass, span).await;
        let label = match &r {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        self.metrics.record(&kind, label, started.elapsed().as_secs_f64());
        r
    }

    /// The error policy of both kinds: log, and retry with the object's backoff.
    pub(crate) fn retry_after_error<K: Resource<DynamicType = ()>>(&self, obj: &K, error: &Error) -> Action {
        let key = object_key(obj);
        let after = self.backoff.failure(&super::backoff::key(obj));
        tracing::warn!(%error, kind = %K::kind(&()), key, retry_in_ms = after.as_millis() as u64, "reconcile failed; retrying");
        Action::requeue(after)
    }
}
