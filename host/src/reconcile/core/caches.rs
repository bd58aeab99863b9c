//! The caches the reconcilers read: one reflector store per kind, filled by the watches
//! ([`super::watch`]) with managedFields stripped, and "synced" readiness.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    apps::v1::{ControllerRevision, Deployment, StatefulSet},
    core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service},
    policy::v1::PodDisruptionBudget,
};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::Value;
use slinky_api::{Accounting, BuilderPlugin, Controller, LoginSet, NodeSet, RestApi};

use crate::plugins::ChildKind;

/// Every cache of a host (of the served namespaces). Cloning clones the handles, not the objects.
#[derive(Clone)]
pub struct Caches {
    /// Pods (slimmed: see `watch::slim`).
    pub pods: Store<Pod>,
    /// The pods each NodeSet may concern, by name (a pass reads its own, not every pod).
    pub pod_index: super::pod_index::PodIndex,
    /// Services, ConfigMaps, StatefulSets, Deployments and PodDisruptionBudgets.
    pub children: ChildCaches,
    /// Controllers.
    pub controllers: Store<Controller>,
    /// NodeSets.
    pub nodesets: Store<NodeSet>,
    /// RestApis.
    pub restapis: Store<RestApi>,
    /// LoginSets.
    pub loginsets: Store<LoginSet>,
    /// Accountings.
    pub accountings: Store<Accounting>,
    /// PersistentVolumeClaims (the NodeSets' per-pod claims are read from it; not waited for at
    /// start: a host without RBAC on claims still reconciles NodeSets without claim templates,
    /// and a claim missing from it is created, a 409 meaning it exists).
    pub claims: Store<PersistentVolumeClaim>,
    /// Kubernetes Nodes, slimmed to their cordon (not waited for at start: a host without RBAC
    /// on Nodes still reconciles).
    pub nodes: Store<k8s_openapi::api::core::v1::Node>,
    /// The NodeSets' ControllerRevisions (those labelled `app.kubernetes.io/name=slurmd`), without
    /// their `data`: a pass needs their names, numbers and owners, never what they record.
    pub revisions: Store<ControllerRevision>,
    /// BuilderPlugins (cluster-wide), when the host serves them (`--builder-plugins` and the CRD
    /// installed).
    pub builder_plugins: Option<Store<BuilderPlugin>>,
}

impl Caches {
    /// Wait until every cache has synced.
    pub(crate) async fn synced(&self) {
        synced(&self.pods).await;
        synced(&self.children.services).await;
        synced(&self.children.configmaps).await;
        synced(&self.children.statefulsets).await;
        synced(&self.children.pdbs).await;
        synced(&self.children.deployments).await;
        synced(&self.controllers).await;
        synced(&self.nodesets).await;
        synced(&self.restapis).await;
        synced(&self.loginsets).await;
        synced(&self.accountings).await;
        synced(&self.revisions).await;
        if let Some(store) = &self.builder_plugins {
            synced(store).await;
        }
    }
}

/// Wait until a store has synced. Re-polls with a fresh future every 100 ms: a single
/// `wait_until_ready` future was seen to miss its wake-up when polled before the store synced.
async fn synced<K: kube::Resource + Clone + 'static>(store: &Store<K>)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(Ok(())) => return,
            Ok(Err(_)) => {
                tracing::error!("a cache's writer stopped before it synced");
                return std::future::pending().await;
            }
            Err(_) => {}
        }
    }
}

/// The caches of the child kinds (of the served namespaces, managedFields stripped; foreign
/// ConfigMaps keep their keys only).
#[derive(Clone)]
pub struct ChildCaches {
    /// Services.
    pub services: Store<Service>,
    /// ConfigMaps.
    pub configmaps: Store<ConfigMap>,
    /// StatefulSets.
    pub statefulsets: Store<StatefulSet>,
    /// PodDisruptionBudgets.
    pub pdbs: Store<PodDisruptionBudget>,
    /// Deployments.
    pub deployments: Store<Deployment>,
}

/// `$body` with `$store` bound to the store of child kind `$kind`; `$none` for the kinds never
/// cached: Secrets (read from the API by name) and ServiceMonitors (the kind may not be served:
/// a watch of it would never sync).
macro_rules! with_store {
    ($caches:expr, $kind:expr, |$store:ident| $body:expr, $none:expr) => {
        match $kind {
            ChildKind::Service => {
                let $store = &$caches.services;
                $body
            }
            ChildKind::ConfigMap => {
                let $store = &$caches.configmaps;
                $body
            }
            ChildKind::StatefulSet => {
                let $store = &$caches.statefulsets;
                $body
            }
            ChildKind::PodDisruptionBudget => {
                let $store = &$caches.pdbs;
                $body
            }
            ChildKind::Deployment => {
                let $store = &$caches.deployments;
                $body
            }
            ChildKind::Secret | ChildKind::ServiceMonitor => $none,
        }
    };
}

fn get<K>(store: &Store<K>, ns: &str, name: &str) -> Option<Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(ns))
}

/// The name and UID of each object of `store` in `ns` that parent `uid` controls and the host
/// built (its builder annotation).
fn controlled<K>(store: &Store<K>, ns: &str, uid: &str) -> Vec<(String, String)>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .map(|o| o.meta())
        .filter(|m| m.namespace.as_deref() == Some(ns))
        .filter(|m| {
            m.owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true) && r.uid == uid)
        })
        .filter(|m| {
            m.annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(slinky_api::keys::ANNOTATION_BUILDER))
        })
        .filter_map(|m| Some((m.name.clone()?, m.uid.clone().unwrap_or_default())))
        .collect()
}

impl ChildCaches {
    /// The cached object, as JSON.
    pub fn get(&self, kind: ChildKind, ns: &str, name: &str) -> Option<Value> {
        with_store!(
            self,
            kind,
            |s| get(s, ns, name).and_then(|o| serde_json::to_value(o.as_ref()).ok()),
            None
        )
    }

    /// The cached object's resourceVersion (`None` when the cache has none), read without
    /// copying the object.
    pub fn resource_version(&self, kind: ChildKind, ns: &str, name: &str) -> Option<String> {
        with_store!(
            self,
            kind,
            |s| get(s, ns, name).and_then(|o| kube::Resource::meta(o.as_ref()).resource_version.clone()),
            None
        )
    }

    /// The name and UID of each cached object of `kind` in `ns` that parent `uid` controls and
    /// the host built (its builder annotation): what pruning deletes unless it is still built.
    pub fn controlled(&self, kind: ChildKind, ns: &str, uid: &str) -> Vec<(String, String)> {
        with_store!(self, kind, |s| controlled(s, ns, uid), Vec::new())
    }
}
