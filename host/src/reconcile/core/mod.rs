//! The machinery every kind's reconciler shares: the caches and the watches that fill them
//! ([`caches`], [`watch`]), what a pass receives ([`context`]) and keeps ([`pass`], [`status`]),
//! the child path ([`apply`]) and the only writer ([`writer`]), Events ([`events`]),
//! expectations, backoff and leader election.

pub mod announced;
pub mod applied;
pub mod apply;
pub mod backoff;
pub mod caches;
pub(crate) mod compare;
pub mod context;
pub mod events;
pub mod expectations;
pub mod leader;
pub(crate) mod parents;
pub(crate) mod pass;
pub mod pod_index;
pub mod rollout;
pub mod secrets;
pub mod status;
pub mod watch;
pub mod writer;

use kube::Resource;

pub use crate::metrics::{ReconcileMetrics as Metrics, WriteMetrics};
use crate::plugins::{BuilderKind, PluginError};

/// Errors of a reconcile; each becomes a backoff, never a crash.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("API request failed: {0}")]
    Kube(#[source] kube::Error),
    /// A builder plugin failed.
    #[error("builder failed: {0}")]
    Plugin(#[source] Box<PluginError>),
    /// A blocking task could not run.
    #[error("internal task failed: {0}")]
    Task(String),
}

impl Error {
    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Plugin(p) => p.metric_label(),
            Error::Task(_) => "task",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

/// Call a builder once, counting and timing the call under its kind and result.
pub(crate) fn time_plugin_call<T>(
    metrics: &Metrics,
    kind: BuilderKind,
    call: impl FnOnce() -> Result<T, PluginError>,
) -> Result<T, PluginError> {
    let started = std::time::Instant::now();
    let r = call();
    let result = match &r {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    metrics.record_plugin_call(kind.as_str(), result, started.elapsed().as_secs_f64());
    r
}
/// Run `f` on what `m` guards, also after a thread panicked holding it (the maps it guards stay
/// consistent between calls: a poisoned lock loses nothing).
pub(crate) fn locked<T, R>(m: &std::sync::Mutex<T>, f: impl FnOnce(&mut T) -> R) -> R {
    match m.lock() {
        Ok(mut g) => f(&mut g),
        Err(p) => f(&mut p.into_inner()),
    }
}

/// `namespace/name` of an object.
pub(crate) fn object_key<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}
