//! Scale one NodeSet 0 → 1,000 pods on the embedded API server (in this process, with simulated
//! pod readiness), then the same with 10,000 unrelated pods in the caches. (The API server alone:
//! `cargo bench -p slinky-apiserver --bench throughput`.)
//!
//! `cargo bench -p slinky-host --bench scale` (prints figures; no assertions). RSS figures are for
//! the whole process: the host *and* the embedded API server holding every object.

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use slinky_api::NodeSet;
use slinky_host::{
    PluginRegistry,
    embedded::{ApiServer, ApiServerConfig, LifecycleConfig},
    plugins::{EngineHandle, RuntimeConfig},
    reconcile::{self, RunConfig},
};

fn rss_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn scale_run(filler: usize, target: i32) -> anyhow::Result<()> {
    let server = ApiServer::start(ApiServerConfig {
        lifecycle: Some(LifecycleConfig {
            nodes: 50,
            schedule_delay: Duration::from_millis(10),
            ready_delay: Duration::from_millis(50),
            grace_period_scale: 0.01,
        }),
        watch_window: 100_000,
        ..Default::default()
    })
    .await?;
    let client = server.client()?;
    slinky_host::cmd::run::install_crds(&client).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    if filler > 0 {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "filler"}}))?;
        Api::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "filler");
        let t = Instant::now();
        let chunks: Vec<_> = (0..filler).collect();
        for chunk in chunks.chunks(200) {
            futures::future::try_join_all(chunk.iter().map(|i| {
                let pod: Pod = serde_json::from_value(
                    json!({"metadata": {"name": format!("filler-{i}"), "labels": {"app": "other"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": "elsewhere"}}),
                )
                .expect("pod");
                let pods = pods.clone();
                async move { pods.create(&PostParams::default(), &pod).await }
            }))
            .await?;
        }
        println!(
            "  created {filler} filler pods in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let example = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slurm-cluster.yaml");
    slinky_host::cmd::run::apply_files(&client, &[example]).await?;
    let engine = EngineHandle::new(RuntimeConfig::default())?;
    let plugins = Arc::new(PluginRegistry::new(&engine, &[])?);
    let (stop, rx) = tokio::sync::watch::channel(false);
    let mut rx2 = rx.clone();
    let shutdown = async move {
        let _ = rx2.wait_for(|s| *s).await;
    }
    .boxed();
    let (handles, fut) = reconcile::start(client.clone(), plugins, RunConfig::default(), "bench", shutdown);
    let task = tokio::spawn(fut);
    let nodesets: Api<NodeSet> = Api::namespaced(client.clone(), "slurm");
    // Converge the example's 3 pods first, so the figures are for the scale-up alone.
    while nodesets
        .get("slurm-worker-slinky")
        .await?
        .status
        .is_none_or(|s| s.available_replicas != 3)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes_before = handles.writes.total();
    let t = Instant::now();
    nodesets
        .patch(
            "slurm-worker-slinky",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": target}})),
        )
        .await?;
    loop {
        let st = nodesets
            .get("slurm-worker-slinky")
            .await?
            .status
            .unwrap_or_default();
        if st.available_replicas == target && st.replicas == target {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = t.elapsed();
    let writes = handles.writes.snapshot();
    let total = handles.writes.total() - writes_before;
    let created = (target - 3) as f64;
    println!(
        "  scale 3 -> {target} pods (all ready): {:.1} s",
        elapsed.as_secs_f64()
    );
    println!(
        "  API writes: {total} ({:.2} per pod created) {writes:?}",
        total as f64 / created
    );
    println!(
        "  peak RSS of the process (host + embedded API server): {:.0} MiB",
        rss_mib("VmHWM:")
    );
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    server.shutdown().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        println!("NodeSet scale-up:");
        scale_run(0, 1000).await?;
        println!("NodeSet scale-up with 10,000 other pods cached:");
        scale_run(10_000, 1000).await
    })
}
