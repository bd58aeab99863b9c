//! A reconciliation host on an embedded test cluster, and the example objects.

use std::{sync::Arc, time::Duration};

use std::collections::BTreeSet;

use anyhow::Result;
use futures::FutureExt;
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{
    ResourceExt,
    api::{Api, ListParams, Patch, PatchParams},
};
use serde_json::json;
use slinky_api::{Controller, NodeSet};
use slinky_host::{
    PluginRegistry,
    embedded::{ApiServerConfig, LifecycleConfig},
    reconcile::{self, Handles, RunConfig},
};

use crate::{TestCluster, default_engine, eventually};

/// A running host on a test cluster.
pub struct Host {
    /// The host's handles (caches, counters).
    pub handles: Handles,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Host {
    /// Start a host with the bundled builders serving namespace `ns` (resync 1 s).
    ///
    /// # Errors
    /// When the bundled plugins do not load.
    pub fn start(c: &TestCluster, ns: &str) -> Result<Self> {
        Ok(Self::start_with(
            c,
            ns,
            Arc::new(PluginRegistry::new(&default_engine(), &[])?),
        ))
    }

    /// Start a host with these plugins serving namespace `ns` (resync 1 s).
    pub fn start_with(c: &TestCluster, ns: &str, plugins: Arc<PluginRegistry>) -> Self {
        let config = RunConfig {
            namespaces: vec![ns.into()],
            resync: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        Self::start_config(c.client.clone(), plugins, config)
    }

    /// Start a host with the bundled builders serving namespace `ns`, resyncing only every
    /// `resync` (so retries seen sooner come from the backoff, not the resync).
    ///
    /// # Errors
    /// When the bundled plugins do not load.
    pub fn start_resync(c: &TestCluster, ns: &str, resync: Duration) -> Result<Self> {
        let config = RunConfig {
            namespaces: vec![ns.into()],
            resync: Some(resync),
            ..Default::default()
        };
        Ok(Self::start_config(
            c.client.clone(),
            Arc::new(PluginRegistry::new(&default_engine(), &[])?),
            config,
        ))
    }

    /// Start a host with this client, plugins and configuration.
    pub fn start_config(client: kube::Client, plugins: Arc<PluginRegistry>, config: RunConfig) -> Self {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let mut rx2 = rx.clone();
        let shutdown = async move {
            let _ = rx2.wait_for(|s| *s).await;
        }
        .boxed();
        let (handles, fut) = reconcile::start(client, plugins, config, "slinky-host-test", shutdown);
        Host {
            handles,
            stop,
            task: tokio::spawn(fut),
        }
    }

    /// Passes of every kind, whatever their result, so far.
    pub fn passes(&self) -> u64 {
        self.handles.metrics.reconciles.snapshot().values().sum()
    }

    /// Wait until the host has made `n` more passes (at most 60 s): a check that nothing happens
    /// waits for the host's work, not for wall-clock time a slow machine may spend elsewhere.
    ///
    /// # Errors
    /// When the host makes fewer passes in 60 s.
    pub async fn passes_later(&self, n: u64) -> Result<()> {
        use anyhow::Context as _;
        let start = self.passes();
        eventually(60, || async { (self.passes() >= start + n).then_some(()) })
            .await
            .with_context(|| format!("the host made {} of {n} passes", self.passes() - start))
    }

    /// Wait (up to 30 s) until the host's caches have synced and it reconciles.
    pub async fn wait_ready(&self) -> Result<()> {
        use anyhow::Context as _;
        eventually(30, || async {
            self.handles
                .ready
                .load(std::sync::atomic::Ordering::SeqCst)
                .then_some(())
        })
        .await
        .context("the host never became ready")
    }

    /// Stop the host (in-flight reconciles finish).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

/// An embedded cluster with the CRDs, simulated pod lifecycle and the simulated StatefulSet
/// controller (so the slurmctld StatefulSet gets its pods).
pub async fn cluster_with_statefulsets() -> TestCluster {
    let c = TestCluster::start_with(ApiServerConfig {
        lifecycle: Some(lifecycle_config()),
        statefulsets: true,
        ..Default::default()
    })
    .await;
    needs_nodes(&c).await;
    c.install_crds(&slinky_host::cmd::crds::crds()).await;
    c
}

/// A test that needs pods to run (the embedded server's simulated lifecycle) fails at once, and
/// says why, on a real cluster (`SLINKY_TEST_KUBECONFIG`) without a Ready node: there nothing
/// schedules or runs its pods (realkube has no scheduler and no kubelet), and it would only time
/// out later on a misleading assertion. With a real node (`docs/realnode.md`) it runs.
async fn needs_nodes(c: &TestCluster) {
    if c.server.is_some() {
        return;
    }
    let ready = |n: &k8s_openapi::api::core::v1::Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    match Api::<k8s_openapi::api::core::v1::Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) if list.items.iter().any(ready) => {}
        Ok(_) => panic!(
            "this test needs its pods to run, and the real cluster at {} has no Ready node (no \
             kubelet: realkube runs none): run it on the embedded server (unset the variable) or \
             on a cluster with a node (docs/realnode.md)",
            slinky_apiserver::testing::KUBECONFIG_ENV
        ),
        Err(e) => panic!("listing the real cluster's nodes: {e}"),
    }
}

fn lifecycle_config() -> LifecycleConfig {
    LifecycleConfig {
        nodes: 3,
        schedule_delay: Duration::from_millis(20),
        ready_delay: Duration::from_millis(50),
        // Terminating pods' grace periods pass 100x faster (30 s in 300 ms).
        grace_period_scale: 0.01,
    }
}

/// Apply every document of the example `file` into `ns` (its namespace replaced), each changed
/// by `edit` first.
///
/// # Errors
/// API errors, or a document that does not parse.
pub async fn apply_file(
    c: &TestCluster,
    ns: &str,
    file: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> Result<()> {
    let text = std::fs::read_to_string(crate::example(file))?;
    for doc in slinky_host::cmd::render::yaml_documents(&text) {
        let mut v: serde_json::Value = serde_saphyr::from_str(doc)?;
        if v.is_null() {
            continue;
        }
        v["metadata"]["namespace"] = ns.into();
        edit(&mut v);
        apply(c, ns, &v).await?;
    }
    Ok(())
}

/// An embedded cluster with the CRDs, and with simulated pod lifecycle when `lifecycle`.
pub async fn cluster(lifecycle: bool) -> TestCluster {
    let lc = lifecycle.then(lifecycle_config);
    let c = TestCluster::start_with(ApiServerConfig {
        lifecycle: lc,
        ..Default::default()
    })
    .await;
    if lifecycle {
        needs_nodes(&c).await;
    }
    c.install_crds(&slinky_host::cmd::crds::crds()).await;
    c
}

/// Apply the example Controller and NodeSet into `ns` with `replicas`.
///
/// # Errors
/// API errors.
pub async fn apply_example(c: &TestCluster, ns: &str, replicas: i32) -> Result<()> {
    apply_example_with(c, ns, replicas, |_| {}).await
}

/// Apply the example Controller and NodeSet into `ns` with `replicas`, the NodeSet changed by
/// `edit` (its JSON) first.
///
/// # Errors
/// API errors.
pub async fn apply_example_with(
    c: &TestCluster,
    ns: &str,
    replicas: i32,
    edit: impl Fn(&mut serde_json::Value),
) -> Result<()> {
    let text = std::fs::read_to_string(crate::example("slurm-cluster.yaml"))?;
    for doc in text.split("\n---\n") {
        let mut v: serde_json::Value = serde_saphyr::from_str(doc)?;
        v["metadata"]["namespace"] = ns.into();
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = replicas.into();
            edit(&mut v);
        }
        apply(c, ns, &v).await?;
    }
    Ok(())
}

/// The example cluster without its NodeSet (the Controller and its Secrets and ConfigMaps),
/// applied into `ns`.
///
/// # Errors
/// API errors, or a document that does not parse.
pub async fn apply_controller(c: &TestCluster, ns: &str) -> Result<()> {
    let text = std::fs::read_to_string(crate::example("slurm-cluster.yaml"))?;
    for doc in slinky_host::cmd::render::yaml_documents(&text) {
        let mut v: serde_json::Value = serde_saphyr::from_str(doc)?;
        if v["kind"] == "NodeSet" {
            continue;
        }
        v["metadata"]["namespace"] = ns.into();
        apply(c, ns, &v).await?;
    }
    Ok(())
}

/// The usual start of a test: a fresh namespace `<prefix>-<random>`, the example Controller and
/// NodeSet applied into it with `replicas`, and a host (bundled builders, resync 1 s) serving
/// it. Returns the namespace and the host.
///
/// # Errors
/// API errors, or the bundled plugins do not load.
pub async fn start_example(c: &TestCluster, prefix: &str, replicas: i32) -> Result<(String, Host)> {
    let ns = c.namespace(prefix).await;
    apply_example(c, &ns, replicas).await?;
    let host = Host::start(c, &ns)?;
    Ok((ns, host))
}

/// Server-side apply a Controller, NodeSet, Secret or ConfigMap (JSON) into `ns`, as `test-user`.
///
/// # Errors
/// API errors, or another kind.
pub async fn apply(c: &TestCluster, ns: &str, v: &serde_json::Value) -> Result<()> {
    let name = v["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let pp = PatchParams::apply("test-user").force();
    match v["kind"].as_str().unwrap_or_default() {
        "Controller" => drop(
            Api::<Controller>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        "NodeSet" => drop(
            Api::<NodeSet>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        "Secret" => drop(
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        "ConfigMap" => drop(
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        "RestApi" => drop(
            Api::<slinky_api::RestApi>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        "LoginSet" => drop(
            Api::<slinky_api::LoginSet>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        "Accounting" => drop(
            Api::<slinky_api::Accounting>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(v))
                .await?,
        ),
        other => anyhow::bail!("apply: unexpected kind {other:?}"),
    }
    Ok(())
}

/// The example NodeSet's name.
pub const NS_NAME: &str = "slurm-worker-slinky";

/// Scale the example NodeSet; returns the new generation.
///
/// # Errors
/// API errors.
pub async fn scale(c: &TestCluster, ns: &str, replicas: i32) -> Result<i64> {
    let api = Api::<NodeSet>::namespaced(c.client.clone(), ns);
    let r = api
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(r.metadata.generation.unwrap_or_default())
}

/// The names of the pods of `ns` that are not terminating.
///
/// # Errors
/// API errors.
pub async fn pod_names(c: &TestCluster, ns: &str) -> Result<BTreeSet<String>> {
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(ResourceExt::name_any)
        .collect())
}

/// Pod names of the example NodeSet for these ordinals.
pub fn names(ordinals: &[u32]) -> BTreeSet<String> {
    ordinals.iter().map(|o| format!("{NS_NAME}-{o}")).collect()
}

/// Wait (60 s at most) until exactly `want` pods exist and the example NodeSet's status says so
/// for `generation` (all ready when `ready`).
///
/// # Errors
/// It did not converge: what was there instead.
pub async fn converge(
    c: &TestCluster,
    ns: &str,
    want: &BTreeSet<String>,
    generation: i64,
    ready: bool,
) -> Result<()> {
    let n = want.len() as i32;
    let done = eventually(60, || async {
        let have = pod_names(c, ns).await.ok()?;
        let obj = Api::<NodeSet>::namespaced(c.client.clone(), ns)
            .get(NS_NAME)
            .await
            .ok()?;
        let st = obj.status?;
        let ok = have == *want
            && st.replicas == n
            && st.observed_generation == Some(generation)
            && (!ready || (st.ready_replicas == n && st.available_replicas == n && st.updated_replicas == n));
        ok.then_some(())
    })
    .await;
    if done.is_none() {
        let have = pod_names(c, ns).await?;
        let st = Api::<NodeSet>::namespaced(c.client.clone(), ns)
            .get(NS_NAME)
            .await?
            .status;
        anyhow::bail!("did not converge to {want:?} (generation {generation}): pods {have:?}, status {st:?}");
    }
    Ok(())
}

/// [`converge`] at the example NodeSet's current generation (read once, now).
///
/// # Errors
/// API errors, or it did not converge: what was there instead.
pub async fn converge_current(c: &TestCluster, ns: &str, want: &BTreeSet<String>, ready: bool) -> Result<()> {
    let generation = generation(c, ns).await?;
    converge(c, ns, want, generation, ready).await
}

/// Whether the pod's `Ready` condition is `True`.
pub fn pod_ready(p: &Pod) -> bool {
    slinky_api::pods::is_ready(p)
}

/// The example NodeSet's current generation.
///
/// # Errors
/// API errors.
pub async fn generation(c: &TestCluster, ns: &str) -> Result<i64> {
    Ok(Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .get(NS_NAME)
        .await?
        .metadata
        .generation
        .unwrap_or(1))
}

/// Events of namespace `ns` about the object named `name`, as `(reason, note)`, oldest first
/// (events.k8s.io, as the host writes them).
///
/// # Errors
/// API errors.
pub async fn events(c: &TestCluster, ns: &str, name: &str) -> Result<Vec<(String, String)>> {
    let list = Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let mut items: Vec<_> = list
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    items.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

/// The example NodeSet's condition of `type_`, if set.
///
/// # Errors
/// API errors.
pub async fn nodeset_condition(c: &TestCluster, ns: &str, type_: &str) -> Result<Option<Condition>> {
    let obj = Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .get(NS_NAME)
        .await?;
    Ok(obj
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_)))
}

/// A child object of kind `kind` named `name` in `ns`, as JSON, if it exists.
pub async fn child(
    c: &TestCluster,
    ns: &str,
    kind: slinky_host::plugins::ChildKind,
    name: &str,
) -> Option<serde_json::Value> {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(c.client.clone(), ns, &kind.api_resource());
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|o| serde_json::to_value(o).ok())
}

/// The condition `type_` of the parent `K` named `name` in `ns` (its status' `conditions`), as
/// JSON, if set.
pub async fn condition_of<K>(c: &TestCluster, ns: &str, name: &str, type_: &str) -> Option<serde_json::Value>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let obj = Api::<K>::namespaced(c.client.clone(), ns).get(name).await.ok()?;
    let v = serde_json::to_value(obj).ok()?;
    v.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// Wait until `host` makes no write across 6 passes, then check that the next 10 make none
/// either (a steady state makes zero writes). Counted in passes, not seconds: a slow machine
/// waits longer instead of checking less.
///
/// # Errors
/// When writes never stop, or a steady state writes.
pub async fn settled_without_writes(host: &Host) -> Result<()> {
    let settled = eventually(90, || async {
        let before = host.handles.writes.total();
        host.passes_later(6).await.ok()?;
        (host.handles.writes.total() == before).then_some(())
    })
    .await;
    anyhow::ensure!(
        settled.is_some(),
        "writes never stopped: {:?}",
        host.handles.writes.snapshot()
    );
    let before = host.handles.writes.total();
    host.passes_later(10).await?;
    anyhow::ensure!(
        host.handles.writes.total() == before,
        "a steady state makes zero writes: {:?}",
        host.handles.writes.snapshot()
    );
    Ok(())
}
