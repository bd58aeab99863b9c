//! A reconciliation host on an embedded test cluster, and the example objects.

use std::{sync::Arc, time::Duration};

use anyhow::Result;
use futures::FutureExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use slinky_api::{Controller, NodeSet};
use slinky_host::{
    PluginRegistry,
    embedded::{ApiServerConfig, LifecycleConfig},
    reconcile::{self, Handles, RunConfig},
};

use crate::{TestCluster, default_engine};

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
        let (stop, rx) = tokio::sync::watch::channel(false);
        let mut rx2 = rx.clone();
        let shutdown = async move {
            let _ = rx2.wait_for(|s| *s).await;
        }
        .boxed();
        let config = RunConfig {
            namespaces: vec![ns.into()],
            resync: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        let (handles, fut) =
            reconcile::start(c.client.clone(), plugins, config, "slinky-host-test", shutdown);
        Host {
            handles,
            stop,
            task: tokio::spawn(fut),
        }
    }

    /// Stop the host (in-flight reconciles finish).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

/// An embedded cluster with the CRDs, and with simulated pod lifecycle when `lifecycle`.
pub async fn cluster(lifecycle: bool) -> TestCluster {
    let lc = lifecycle.then(|| LifecycleConfig {
        nodes: 3,
        schedule_delay: Duration::from_millis(20),
        ready_delay: Duration::from_millis(50),
        // Terminating pods' grace periods pass 100x faster (30 s in 300 ms).
        grace_period_scale: 0.01,
    });
    let c = TestCluster::start_with(ApiServerConfig {
        lifecycle: lc,
        ..Default::default()
    })
    .await;
    c.install_crds(&slinky_host::crds::crds()).await;
    c
}

/// Apply the example Controller and NodeSet into `ns` with `replicas`.
///
/// # Errors
/// API errors.
pub async fn apply_example(c: &TestCluster, ns: &str, replicas: i32) -> Result<()> {
    let text = std::fs::read_to_string(crate::example("slurm-cluster.yaml"))?;
    for doc in text.split("\n---\n") {
        let mut v: serde_json::Value = serde_yaml::from_str(doc)?;
        v["metadata"]["namespace"] = ns.into();
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = replicas.into();
        }
        let name = v["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let pp = PatchParams::apply("test-user").force();
        if v["kind"] == "Controller" {
            Api::<Controller>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(&v))
                .await?;
        } else {
            Api::<NodeSet>::namespaced(c.client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(&v))
                .await?;
        }
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
