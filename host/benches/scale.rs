//! Scale one NodeSet 0 → 1,000 pods on the embedded API server (in this process, with simulated
//! pod readiness), then the same with 10,000 unrelated pods in the caches; after each, the steady
//! state: API writes and passes per object per resync. (The API server alone:
//! `cargo bench -p slinky-apiserver --bench throughput`.)
//!
//! `cargo bench -p slinky-host --bench scale` (prints figures; no assertions). RSS figures are for
//! the whole process: the host *and* the embedded API server holding every object.
//! `BENCH_PODS` (default 1000), `BENCH_FILLER` (default 10000), `BENCH_RESYNC_SECONDS` (default 2)
//! and `BENCH_RESYNCS` (resyncs measured at steady state, default 5) change the sizes; a quick
//! debug run: `BENCH_PODS=100 BENCH_FILLER=1000 cargo test -p slinky-host --bench scale`.

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
use slinky_api::{Controller, NodeSet};
use slinky_host::{
    PluginRegistry,
    embedded::{ApiServer, ApiServerConfig, LifecycleConfig},
    plugins::{EngineHandle, RuntimeConfig},
    reconcile::{self, RunConfig},
};

/// `name` from the environment, or `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Passes of every parent (NodeSet and Controller) so far, whatever their result.
fn passes(handles: &reconcile::Handles) -> u64 {
    handles.metrics.snapshot().values().sum()
}

/// Set condition `SiteCheck` (message `message`) on the status of the example Controller and
/// NodeSet, as another controller would (server-side apply as `site-checker`: the conditions are
/// a list map, so the host's stay).
async fn other_status_writes(client: &kube::Client, message: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply("site-checker");
    for (kind, name) in [("Controller", "slurm"), ("NodeSet", "slurm-worker-slinky")] {
        let body = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": kind,
            "metadata": {"name": name, "namespace": "slurm"},
            "status": {"conditions": [{"type": "SiteCheck", "status": "True", "reason": "Checked",
                "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        if kind == "NodeSet" {
            Api::<NodeSet>::namespaced(client.clone(), "slurm")
                .patch_status(name, &pp, &Patch::Apply(&body))
                .await?;
        } else {
            Api::<Controller>::namespaced(client.clone(), "slurm")
                .patch_status(name, &pp, &Patch::Apply(&body))
                .await?;
        }
    }
    Ok(())
}

/// Once the host has made no write for a second, `resyncs` resync periods at steady state: the
/// API writes per resync and the passes per parent (one NodeSet, one Controller) per resync;
/// with `others`, while another controller writes both parents' status every 500 ms.
async fn steady_state(
    client: &kube::Client,
    handles: &reconcile::Handles,
    resync: Duration,
    resyncs: u32,
    others: bool,
) -> anyhow::Result<()> {
    let mut last = handles.writes.total();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = handles.writes.total();
        if now == last {
            break;
        }
        last = now;
    }
    let (writes, passes_before) = (handles.writes.total(), passes(handles));
    let window = resync * resyncs;
    let started = Instant::now();
    let mut other_writes = 0;
    while started.elapsed() < window {
        if others {
            other_status_writes(client, &format!("check {other_writes}")).await?;
            other_writes += 2;
        }
        tokio::time::sleep(Duration::from_millis(500).min(window.saturating_sub(started.elapsed()))).await;
    }
    let written = handles.writes.total() - writes;
    let passed = passes(handles) - passes_before;
    let what = if others {
        format!(", another controller writing their status ({other_writes} writes)")
    } else {
        String::new()
    };
    println!(
        "  steady state over {resyncs} resyncs of {} s{what}: {:.1} API writes per resync, {:.2} passes per object per resync",
        resync.as_secs_f64(),
        written as f64 / f64::from(resyncs),
        passed as f64 / 2.0 / f64::from(resyncs)
    );
    Ok(())
}

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
    let resync = Duration::from_secs(env_or("BENCH_RESYNC_SECONDS", 2));
    let config = RunConfig {
        resync: Some(resync),
        ..RunConfig::default()
    };
    let (handles, fut) = reconcile::start(client.clone(), plugins, config, "bench", shutdown);
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
    let resyncs = env_or("BENCH_RESYNCS", 5);
    steady_state(&client, &handles, resync, resyncs, false).await?;
    steady_state(&client, &handles, resync, resyncs, true).await?;
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    server.shutdown().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (pods, filler) = (env_or("BENCH_PODS", 1000), env_or("BENCH_FILLER", 10_000));
    rt.block_on(async {
        println!("NodeSet scale-up:");
        scale_run(0, pods).await?;
        println!("NodeSet scale-up with {filler} other pods cached:");
        scale_run(filler, pods).await
    })
}
