//! After a builder swap: re-reconcile every parent whose children that builder makes, at a
//! bounded rate, with an Event on each saying which builder version took over (published by the
//! leader only: a follower's swap triggers reconciles it skips, and no Event).

use std::{collections::VecDeque, sync::Arc, time::Duration};

use futures::Stream;
use kube::{
    Resource, ResourceExt,
    runtime::{
        events::EventType,
        reflector::{ObjectRef, Store},
    },
};

use super::events::Events;
use crate::plugins::{BuilderKind, PluginRegistry};

/// Parents re-reconciled per second after a swap (each also gets an Event).
pub const PER_SECOND: u64 = 50;

struct State<K: Resource<DynamicType = ()> + Clone + 'static> {
    changes: tokio::sync::watch::Receiver<u64>,
    queue: VecDeque<Arc<K>>,
    note: String,
}

/// A stream of the parents to re-reconcile: after each swap of `kind`, every cached parent (of
/// the served namespaces), [`PER_SECOND`] at most. Ends when the registry is dropped.
pub fn on_swap<K>(
    registry: Arc<PluginRegistry>,
    kind: BuilderKind,
    store: Store<K>,
    events: Events,
    namespaces: Arc<Vec<String>>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    let state: State<K> = State {
        changes: registry.subscribe(kind),
        queue: VecDeque::new(),
        note: String::new(),
    };
    futures::stream::unfold(state, move |mut st| {
        let (registry, store, events, namespaces) = (
            registry.clone(),
            store.clone(),
            events.clone(),
            namespaces.clone(),
        );
        async move {
            loop {
                if let Some(obj) = st.queue.pop_front() {
                    events
                        .publish(
                            obj.as_ref(),
                            None,
                            EventType::Normal,
                            "BuilderChanged",
                            "Reconcile",
                            st.note.clone(),
                        )
                        .await;
                    tokio::time::sleep(Duration::from_millis(1000 / PER_SECOND)).await;
                    return Some((ObjectRef::from_obj(obj.as_ref()), st));
                }
                st.changes.changed().await.ok()?;
                let plugin = registry.active(kind);
                let what = match kind {
                    BuilderKind::ControllerService => "the Service is re-applied",
                    BuilderKind::NodesetPod => "pods roll to the new revision within maxUnavailable",
                    BuilderKind::ControllerChildren => {
                        "the StatefulSet, ConfigMap and internal Service are re-applied (slurmctld rolls)"
                    }
                    BuilderKind::NodesetChildren => {
                        "the workers' Service, PodDisruptionBudget and SSH ConfigMap are re-applied"
                    }
                    BuilderKind::RestapiChildren => {
                        "slurmrestd's Deployment and Service are re-applied (slurmrestd rolls)"
                    }
                    BuilderKind::LoginsetChildren => {
                        "the login Deployment, Service and sshd_config are re-applied (the login pods roll)"
                    }
                    BuilderKind::AccountingChildren => {
                        "slurmdbd's StatefulSet, Service and slurmdbd.conf are re-applied (slurmdbd rolls)"
                    }
                };
                let steps = registry.steps(kind);
                let then = if steps.is_empty() {
                    String::new()
                } else {
                    let names: Vec<String> = steps
                        .iter()
                        .map(|s| format!("{} ({}, {})", s.name, s.plugin.label(), &s.plugin.digest()[..12]))
                        .collect();
                    format!(
                        ", then the BuilderPlugins whose selector matches: {}",
                        names.join(", ")
                    )
                };
                st.note = format!(
                    "{kind} builder is now {} (digest {}, from {}){then}; {what}",
                    plugin.label(),
                    &plugin.digest()[..12],
                    plugin.source()
                );
                st.queue = store
                    .state()
                    .into_iter()
                    .filter(|o| {
                        namespaces.is_empty() || o.namespace().is_some_and(|n| namespaces.contains(&n))
                    })
                    .collect();
                tracing::info!(%kind, parents = st.queue.len(), "builder changed; re-reconciling its parents");
            }
        }
    })
}

/// A stream of every cached parent (of the served namespaces) each time this process becomes the
/// leader: followers reconcile nothing, so the new leader looks at everything once.
pub fn on_elected<K>(
    leadership: super::leader::Leadership,
    store: Store<K>,
    namespaces: Arc<Vec<String>>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    let changes = leadership.subscribe();
    futures::stream::unfold(
        (changes, VecDeque::<Arc<K>>::new()),
        move |(mut changes, mut queue)| {
            let (store, namespaces) = (store.clone(), namespaces.clone());
            async move {
                loop {
                    if let Some(obj) = queue.pop_front() {
                        return Some((ObjectRef::from_obj(obj.as_ref()), (changes, queue)));
                    }
                    changes.changed().await.ok()?;
                    if *changes.borrow_and_update() {
                        queue = store
                            .state()
                            .into_iter()
                            .filter(|o| {
                                namespaces.is_empty()
                                    || o.namespace().is_some_and(|n| namespaces.contains(&n))
                            })
                            .collect();
                    }
                }
            }
        },
    )
}
