//! Leader election on a `coordination.k8s.io/v1` Lease (with the `kube-lease-manager` crate),
//! and the write fence built on it.
//!
//! # Guarantees
//! * Only the leader writes: every write of the [`super::Writer`], every Event
//!   ([`super::events::Events`]) and every reconcile first asks [`Leadership::may_write`].
//!   Followers keep their caches warm, reconcile nothing and publish no Event.
//! * **A leader that loses its lease stops writing before another starts.** Besides what the lease
//!   manager says, the fence follows the Lease as this process last *saw it in the API* (a watch):
//!   it is open only while the Lease names this process and `renewTime + leaseDuration - margin`
//!   (`margin` = `grace/2`) has not passed on the local clock. Another candidate takes over only
//!   after `renewTime + leaseDuration`, so a leader partitioned from the API (whose renewals fail,
//!   or whose watch stalls) closes its fence `margin` before anyone else can open one.
//! * **No write outlives the margin.** A write (or Event) that passed the fence is abandoned if
//!   unanswered after [`Leadership::write_timeout`] (`margin/2`): the request is dropped, so none
//!   leaves this process later than `margin/2` after the fence closed, that is at least
//!   `margin/2` = `grace/4` before another replica can take the Lease, as long as the clocks of
//!   the nodes differ by less than that.
//! * On becoming leader, every parent is re-reconciled (see [`Leadership::subscribe`]).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};

/// Settings of leader election.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// The Lease's name.
    pub lease_name: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// This process's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a Lease lasts without renewal (whole seconds, at least 2).
    pub duration: Duration,
    /// Renew this long before expiry (whole seconds, at least 1, less than `duration`). The fence
    /// closes half of it before expiry (the margin) and writes are abandoned after a quarter of it,
    /// so a quarter is the clock skew allowed between nodes.
    pub grace: Duration,
}

/// The write fence: is this process the leader, and until when is that known to hold.
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    elected: bool,
    identity: String,
    /// What the lease manager says.
    holder: std::sync::atomic::AtomicBool,
    /// Until when the Lease, as last seen in the API, names this process (minus the margin).
    valid_until: Mutex<Option<Instant>>,
    /// How long one write may take (shorter than the margin); none without election.
    write_timeout: Option<Duration>,
    changes: tokio::sync::watch::Sender<bool>,
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership::always()
    }
}

/// The error of a write attempted without leadership.
#[derive(Debug, thiserror::Error)]
#[error("not the leader ({identity}): the write was not made; the leader makes it")]
pub struct NotLeader {
    /// This process's identity.
    pub identity: String,
}

impl Leadership {
    /// No election: this process always leads (a single replica, `run --embedded`, tests).
    pub fn always() -> Self {
        Leadership {
            inner: Arc::new(Inner {
                elected: false,
                identity: String::new(),
                holder: std::sync::atomic::AtomicBool::new(true),
                valid_until: Mutex::new(None),
                write_timeout: None,
                changes: tokio::sync::watch::channel(true).0,
            }),
        }
    }

    /// A process that reads the cluster and never writes to it (`plugin diff`).
    pub fn never() -> Self {
        Leadership {
            inner: Arc::new(Inner {
                elected: true,
                identity: "read-only".into(),
                holder: std::sync::atomic::AtomicBool::new(false),
                valid_until: Mutex::new(None),
                write_timeout: None,
                changes: tokio::sync::watch::channel(false).0,
            }),
        }
    }

    /// Whether this process may write now.
    pub fn may_write(&self) -> bool {
        if !self.inner.elected {
            return true;
        }
        self.inner.holder.load(std::sync::atomic::Ordering::SeqCst)
            && self
                .inner
                .valid_until
                .lock()
                .ok()
                .and_then(|v| *v)
                .is_some_and(|until| Instant::now() < until)
    }

    /// Whether leader election is on.
    pub fn elected(&self) -> bool {
        self.inner.elected
    }

    /// How long one write may wait for the API server before it is abandoned: half the fence's
    /// margin with election (so a write that passed the fence just before it closed has ended
    /// before the Lease can pass to another replica), none without.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.inner.write_timeout
    }

    /// This process's identity (empty without election).
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// `Err(NotLeader)` unless this process may write now.
    ///
    /// # Errors
    /// [`NotLeader`].
    pub fn fence(&self) -> Result<(), NotLeader> {
        if self.may_write() {
            Ok(())
        } else {
            Err(NotLeader {
                identity: self.inner.identity.clone(),
            })
        }
    }

    /// Changes of the fence (`true`: this replica may write now, after not being able to).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.changes.subscribe()
    }

    /// Apply `change` and tell subscribers when the fence opened (or, on losing the Lease,
    /// closed): a new leader reconciles only once it may really write.
    fn transition(&self, change: impl FnOnce(&Inner)) {
        let was_open = self.may_write();
        change(&self.inner);
        let open = self.may_write();
        if open != was_open {
            self.inner.changes.send_replace(open);
        }
    }

    fn set_holder(&self, holder: bool) {
        self.transition(|inner| {
            inner.holder.store(holder, std::sync::atomic::Ordering::SeqCst);
            if !holder && let Ok(mut v) = inner.valid_until.lock() {
                *v = None;
            }
        });
    }

    /// Follow the Lease as the API shows it: open the fence until its expiry minus `margin`
    /// while it names this process, close it otherwise.
    fn observe(&self, lease: &Lease, margin: Duration) {
        let spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.inner.identity.as_str());
        let until = spec.renew_time.as_ref().and_then(|renewed| {
            let renewed = SystemTime::UNIX_EPOCH
                + Duration::from_micros(u64::try_from(renewed.0.as_microsecond()).unwrap_or(0));
            let secs = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
            let expiry = renewed + Duration::from_secs(secs);
            let left = expiry
                .duration_since(SystemTime::now())
                .ok()?
                .checked_sub(margin)?;
            Some(Instant::now() + left)
        });
        self.transition(|inner| {
            if let Ok(mut v) = inner.valid_until.lock() {
                *v = if ours { until } else { None };
            }
        });
    }
}

/// Start electing: returns the fence and the task (abort it, or drop every receiver, to stop;
/// the lease is released when the manager stops).
///
/// # Errors
/// Invalid durations, or the Lease cannot be created or read.
pub async fn elect(
    client: Client,
    config: LeaderConfig,
) -> Result<(Leadership, tokio::task::JoinHandle<()>), kube_lease_manager::LeaseManagerError> {
    let duration = config.duration.as_secs().max(2);
    let grace = config.grace.as_secs().clamp(1, duration - 1);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager(format!("slinky-host-leader/{}", config.identity))
        .build()
        .await?;
    let margin = Duration::from_millis(grace * 500);
    let leadership = Leadership {
        inner: Arc::new(Inner {
            elected: true,
            identity: config.identity.clone(),
            holder: std::sync::atomic::AtomicBool::new(false),
            valid_until: Mutex::new(None),
            write_timeout: Some(margin / 2),
            changes: tokio::sync::watch::channel(false).0,
        }),
    };
    let (mut rx, manager_task) = manager.watch().await;
    let follow = leadership.clone();
    let leases: Api<Lease> = Api::namespaced(client, &config.namespace);
    let lease_stream = watcher(
        leases,
        watcher::Config::default().fields(&format!("metadata.name={}", config.lease_name)),
    )
    .default_backoff()
    .applied_objects();
    let task = tokio::spawn(async move {
        let observe = async {
            futures::pin_mut!(lease_stream);
            while let Some(ev) = lease_stream.next().await {
                match ev {
                    Ok(lease) => follow.observe(&lease, margin),
                    Err(error) => tracing::warn!(%error, "lease watch error (retrying)"),
                }
            }
        };
        let manage = async {
            loop {
                let leading = *rx.borrow_and_update();
                follow.set_holder(leading);
                tracing::info!(identity = %follow.identity(), leading, "leadership changed");
                if rx.changed().await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            () = observe => {}
            () = manage => {}
        }
        follow.set_holder(false);
        drop(rx);
        // The manager releases the lease when every receiver is gone.
        let _ = tokio::time::timeout(Duration::from_secs(5), manager_task).await;
    });
    Ok((leadership, task))
}

/// The default identity: `$POD_NAME`, else the host name and the process id.
pub fn default_identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "slinky-host".into());
        format!("{host}-{}", std::process::id())
    })
}
