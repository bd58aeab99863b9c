//! What asking Slurm costs the host, for one NodeSet of 1,000 pods: the same runs without and
//! with a slurmrestd, each on the embedded API server in this process.
//!
//! With Slurm, a real slurmctld and slurmrestd (25.05, `slinky-slurm-local`) serve the example
//! Controller, whose `extraConf` declares 1,010 static nodes named like the NodeSet's pods (so
//! slurmrestd lists 1,000+ nodes; no slurmd runs, so they are DOWN and a scale-in needs no drain).
//! The NodeSet lives in another namespace than the Controller, so the harness runs slurmctld
//! alone. Needs root and a Slurm build; without them only the run without Slurm is printed.
//!
//! Printed per run: the scale-up 3 → N (creates need no Slurm), the steady state (NodeSet passes,
//! Slurm requests per pass and per minute for the Controller, API writes per resync), a scale-in
//! of 100 pods (with Slurm their nodes are idle first, so it drains them), and with Slurm the
//! steady state again with 9 more NodeSets on the Controller (the rate per Controller must not
//! grow) and the latency of the node list, read whole and as the host reads it (since the last
//! one's time).
//!
//! `cargo bench -p slinky-host --bench slurm` (`BENCH_PODS`, default 1000; `BENCH_RESYNCS`,
//! default 5; resync 2 s).

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use slinky_api::NodeSet;
use slinky_host::{
    PluginRegistry,
    embedded::{ApiServer, ApiServerConfig, LifecycleConfig},
    plugins::{EngineHandle, RuntimeConfig},
    reconcile::{self, RunConfig},
};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const WORKERS: &str = "workers";
const NODESET: &str = "slurm-worker-slinky";

/// NodeSet passes so far.
fn nodeset_passes(h: &reconcile::Handles) -> u64 {
    h.metrics
        .snapshot()
        .iter()
        .filter(|(k, _)| k.0.eq_ignore_ascii_case("nodeset"))
        .map(|(_, v)| *v)
        .sum()
}

/// The example: Controller (with `extra_conf`) and Secrets in `slurm`, the NodeSet in `workers`.
async fn apply_example(client: &kube::Client, extra_conf: &str) -> anyhow::Result<()> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slurm-cluster.yaml");
    let text = std::fs::read_to_string(path)?;
    let dir = tempfile::tempdir()?;
    let mut docs = Vec::new();
    for doc in slinky_host::cmd::render::yaml_documents(&text) {
        let mut v: serde_json::Value = serde_saphyr::from_str(doc)?;
        if v.is_null() {
            continue;
        }
        if v["kind"] == "Controller" {
            v["spec"]["extraConf"] = json!(extra_conf);
            v["spec"]["persistence"] = json!({"enabled": false});
        }
        if v["kind"] == "NodeSet" {
            v["metadata"]["namespace"] = json!(WORKERS);
            v["spec"]["controllerRef"]["namespace"] = json!("slurm");
        }
        docs.push(serde_json::to_string(&v)?);
    }
    let file = dir.path().join("bench.yaml");
    std::fs::write(&file, docs.join("\n---\n"))?;
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": WORKERS}}))?;
    Api::all(client.clone()).create(&Default::default(), &ns).await?;
    slinky_host::cmd::run::apply_files(client, &[file]).await?;
    Ok(())
}

async fn wait_available(nodesets: &Api<NodeSet>, n: i32) -> anyhow::Result<()> {
    loop {
        let st = nodesets.get(NODESET).await?.status.unwrap_or_default();
        if st.available_replicas == n && st.replicas == n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn scale(nodesets: &Api<NodeSet>, n: i32) -> anyhow::Result<Instant> {
    let t = Instant::now();
    nodesets
        .patch(
            NODESET,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": n}})),
        )
        .await?;
    Ok(t)
}

/// An embedded API server (StatefulSets and simulated pod readiness) with the CRDs and the
/// example, whose Controller declares `pods` + 10 static Slurm nodes.
async fn start_server(pods: i32) -> anyhow::Result<(ApiServer, kube::Client)> {
    let server = ApiServer::start(ApiServerConfig {
        lifecycle: Some(LifecycleConfig {
            nodes: 50,
            schedule_delay: Duration::from_millis(10),
            ready_delay: Duration::from_millis(50),
            grace_period_scale: 0.001,
        }),
        statefulsets: true,
        watch_window: 100_000,
        ..Default::default()
    })
    .await?;
    let client = server.client()?;
    slinky_host::cmd::run::install_crds(&client).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let extra = format!(
        "NodeName=slinky-[0-{last}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17000-{}] CPUs=1 State=UNKNOWN\n\
         PartitionName=bench Nodes=slinky-[0-{last}] State=UP",
        17000 + pods + 9,
        // The generated slurm.conf's MaxNodeCount is 1024.
        last = pods + 9,
    );
    apply_example(&client, &extra).await?;
    Ok((server, client))
}

/// A host running in this process, until [`Running::stop`].
struct Running {
    handles: reconcile::Handles,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Kept for as long as the host runs.
    _engine: Arc<EngineHandle>,
}

impl Running {
    /// Starts a host on every namespace, resyncing every `resync`, asking `harness`'s slurmrestd
    /// if any.
    fn start(
        client: &kube::Client,
        harness: Option<&slinky_slurm_local::SlurmLocal>,
        resync: Duration,
    ) -> anyhow::Result<Self> {
        let engine = EngineHandle::new(RuntimeConfig::default())?;
        let plugins = Arc::new(PluginRegistry::new(&engine, &[])?);
        let (stop, rx) = tokio::sync::watch::channel(false);
        let mut rx2 = rx.clone();
        let shutdown = async move {
            let _ = rx2.wait_for(|s| *s).await;
        }
        .boxed();
        let config = RunConfig {
            resync: Some(resync),
            slurmrestd_urls: harness.iter().map(|h| h.restapi_url()).collect(),
            ..RunConfig::default()
        };
        let (handles, fut) = reconcile::start(client.clone(), plugins, config, "bench", shutdown);
        let task = tokio::spawn(fut);
        Ok(Self {
            handles,
            stop,
            task,
            _engine: engine,
        })
    }

    /// Stops the host and waits up to 30 s for it to end.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

/// Waits (up to two minutes) until slurmctld answers, so that it serves the static nodes before
/// the figures start.
async fn wait_slurmctld(h: &slinky_slurm_local::SlurmLocal) -> anyhow::Result<()> {
    let t = Instant::now();
    while !h
        .exec_ok(&["scontrol", "ping"])
        .await
        .is_ok_and(|o| o.contains("is UP"))
    {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "slurmctld never answered");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Once nothing was written for a second, `BENCH_RESYNCS` resyncs of `resync` at steady state:
/// NodeSet passes and API writes per resync, Slurm requests per pass.
async fn steady_state(handles: &reconcile::Handles, resync: Duration) {
    // Quiet for a pod-protect refresh (15 s, when the pods' Slurm conditions are written), so
    // the window holds no write of the scale before it.
    let quiet = slinky_host::reconcile::nodeset::PROTECT_INTERVAL + Duration::from_secs(1);
    let mut last = (handles.writes.total(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = handles.writes.total();
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= quiet {
            break;
        }
    }
    let resyncs: u32 = env_or("BENCH_RESYNCS", 5);
    let writes_before = handles.writes.snapshot();
    let (w0, p0, s0) = (
        handles.writes.total(),
        nodeset_passes(handles),
        handles.slurm.requests(),
    );
    tokio::time::sleep(resync * resyncs).await;
    let (w, p, s) = (
        handles.writes.total() - w0,
        nodeset_passes(handles) - p0,
        handles.slurm.requests() - s0,
    );
    let by_verb: Vec<String> = handles
        .writes
        .snapshot()
        .into_iter()
        .filter_map(|((verb, outcome), n)| {
            let n = n - writes_before
                .get(&(verb.clone(), outcome.clone()))
                .copied()
                .unwrap_or(0);
            (n > 0).then(|| format!("{verb}/{outcome} {n}"))
        })
        .collect();
    if !by_verb.is_empty() {
        println!("  writes at steady state: {}", by_verb.join(", "));
    }
    println!(
        "  steady state over {resyncs} resyncs of {} s: {:.2} NodeSet passes per resync, {:.2} Slurm requests per pass ({:.1} per minute for the Controller, pod-protect refresh included), {:.1} API writes per resync",
        resync.as_secs_f64(),
        p as f64 / f64::from(resyncs),
        if p == 0 { 0.0 } else { s as f64 / p as f64 },
        s as f64 * 60.0 / (resync.as_secs_f64() * f64::from(resyncs)),
        w as f64 / f64::from(resyncs)
    );
}

/// Scales `pods` → `pods` - 100 and prints the time until done, the NodeSet passes and the Slurm
/// requests meanwhile.
async fn scale_in(nodesets: &Api<NodeSet>, handles: &reconcile::Handles, pods: i32) -> anyhow::Result<()> {
    let (p0, s0) = (nodeset_passes(handles), handles.slurm.requests());
    let t = scale(nodesets, pods - 100).await?;
    wait_available(nodesets, pods - 100).await?;
    let (p, s) = (nodeset_passes(handles) - p0, handles.slurm.requests() - s0);
    println!(
        "  scale-in {pods} -> {} (100 pods deleted): {:.2} s, {p} NodeSet passes, {s} Slurm requests",
        pods - 100,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// NodeSets added to the Controller for the second steady state.
const EXTRA_NODESETS: usize = 9;

/// Adds `n` NodeSets of 10 pods each (hostnames `x<i>-<ordinal>`, which Slurm does not list) to
/// the Controller and waits until their pods are available.
async fn more_nodesets(client: &kube::Client, n: usize) -> anyhow::Result<()> {
    let api: Api<NodeSet> = Api::namespaced(client.clone(), WORKERS);
    let mut template = serde_json::to_value(api.get(NODESET).await?)?;
    template["metadata"] = json!({"namespace": WORKERS});
    template.as_object_mut().map(|o| o.remove("status"));
    for i in 0..n {
        let mut ns = template.clone();
        ns["metadata"]["name"] = json!(format!("extra-{i}"));
        ns["spec"]["replicas"] = json!(10);
        ns["spec"]["template"]["spec"]["hostname"] = json!(format!("x{i}-"));
        api.create(&Default::default(), &serde_json::from_value(ns)?)
            .await?;
    }
    let t = Instant::now();
    loop {
        let done = api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("extra-"))
            })
            .filter(|s| s.status.as_ref().is_some_and(|st| st.available_replicas == 10))
            .count();
        if done == n {
            return Ok(());
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "only {done} of {n} extra NodeSets available"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client of `h`'s slurmrestd with the example Controller's key.
async fn slurm_client(
    client: &kube::Client,
    h: &slinky_slurm_local::SlurmLocal,
) -> anyhow::Result<slinky_slurm::Client> {
    let key = jwt_key(client).await?;
    Ok(slinky_slurm::Client::new(
        &h.restapi_url(),
        slinky_slurm::jwt::Tokens::new(key, "slurm", slinky_slurm::jwt::LIFETIME),
        slinky_slurm::DEFAULT_TIMEOUT,
    )?)
}

/// Median and max of `times` (ms).
fn p50_max(mut times: Vec<f64>) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() - 1])
}

/// Prints the latency of the node list through `h`'s slurmrestd, 20 reads each: read whole,
/// and read since the last one's time as the host reads it (a 304 while nothing changed).
async fn node_list_latency(client: &kube::Client, h: &slinky_slurm_local::SlurmLocal) -> anyhow::Result<()> {
    use slinky_slurm::NodeList;
    let c = slurm_client(client, h).await?;
    let (mut whole, mut since) = (Vec::new(), Vec::new());
    let (mut listed, mut last, mut unchanged) = (0, None, 0);
    for _ in 0..20 {
        let t = Instant::now();
        if let NodeList::Changed { nodes, last_update } = c.nodes_since(None).await? {
            listed = nodes.len();
            last = last_update;
        }
        whole.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    for _ in 0..20 {
        let t = Instant::now();
        match c.nodes_since(last).await? {
            NodeList::Unchanged => unchanged += 1,
            NodeList::Changed { last_update, .. } => last = last_update,
        }
        since.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (w50, wmax) = p50_max(whole);
    let (s50, smax) = p50_max(since);
    println!(
        "  node list ({listed} nodes) through slurmrestd: whole p50 {w50:.1} ms, max {wmax:.1} ms; since the last one's time (the host's steady read) p50 {s50:.1} ms, max {smax:.1} ms ({unchanged} of 20 answered 304, nothing changed)"
    );
    Ok(())
}

/// Prints how long one request draining 100 nodes and one undraining them take (the host
/// stopped): `slinky-[first-first+99]`.
async fn drain_latency(
    client: &kube::Client,
    h: &slinky_slurm_local::SlurmLocal,
    first: i32,
) -> anyhow::Result<()> {
    let c = slurm_client(client, h).await?;
    let names: Vec<String> = (first..first + 100).map(|i| format!("slinky-{i}")).collect();
    let t = Instant::now();
    if let (_, Some(e)) = c
        .update_nodes(&names, slinky_slurm::NodeUpdate::Drain("slurm-operator: bench"))
        .await
    {
        return Err(e.into());
    }
    let drain = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    // No slurmd runs: slurmctld may have set nodes DOWN meanwhile, and refuses some returns.
    let resumed = match c.update_nodes(&names, slinky_slurm::NodeUpdate::Resume).await {
        (_, None) => String::new(),
        (done, Some(e)) => format!(" ({} resumed; {e})", done.len()),
    };
    println!(
        "  one request draining 100 nodes: {drain:.1} ms; resuming them: {:.1} ms{resumed}",
        t.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}

/// Marks the nodes `slinky-[0-last]` IDLE (no slurmd runs, so slurmctld has them UNKNOWN), so a
/// scale-in must drain them, and waits until Slurm lists the 100 to go idle.
async fn idle_nodes(h: &slinky_slurm_local::SlurmLocal, last: i32, first_gone: i32) -> anyhow::Result<()> {
    // Slurm takes no IDLE for a node that never registered: DOWN, then RESUME (IDLE, not
    // responding: no slurmd runs).
    let nodes = format!("nodename=slinky-[0-{last}]");
    h.exec_ok(&["scontrol", "update", &nodes, "state=down", "reason=bench"])
        .await?;
    h.exec_ok(&["scontrol", "update", &nodes, "state=resume"]).await?;
    let t = Instant::now();
    loop {
        let nodes = h.nodes(Some("bench")).await?;
        let idle = nodes
            .iter()
            .filter(|n| {
                n.name
                    .strip_prefix("slinky-")
                    .and_then(|i| i.parse::<i32>().ok())
                    .is_some_and(|i| i >= first_gone && i < first_gone + 100)
                    && n.state.to_ascii_lowercase().starts_with("idle")
            })
            .count();
        if idle >= 100 {
            return Ok(());
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(60),
            "only {idle} of the 100 nodes to go are idle"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run(with_slurm: Option<&std::path::Path>, pods: i32) -> anyhow::Result<()> {
    let (server, client) = start_server(pods).await?;
    let harness = match with_slurm {
        Some(dir) => {
            let h = slinky_slurm_local::SlurmLocal::start(client.clone(), dir, "slurm", "slurm").await?;
            Some(h)
        }
        None => None,
    };
    let resync = Duration::from_secs(2);
    let host = Running::start(&client, harness.as_ref(), resync)?;
    let nodesets: Api<NodeSet> = Api::namespaced(client.clone(), WORKERS);
    wait_available(&nodesets, 3).await?;
    if let Some(h) = &harness {
        // slurmctld serves the static nodes before the figures start.
        wait_slurmctld(h).await?;
    }
    let label = if harness.is_some() {
        "with Slurm"
    } else {
        "without Slurm"
    };
    println!("{label}:");

    if let Some(h) = &harness {
        // Idle nodes (no slurmd runs: slurmctld has them UNKNOWN): a scale-in drains them (one
        // request) before their pods go. Done before the scale-up, so the pods' Slurm
        // conditions are written during it, not in the steady state.
        idle_nodes(h, pods + 9, pods - 100).await?;
    }
    let t = scale(&nodesets, pods).await?;
    wait_available(&nodesets, pods).await?;
    println!(
        "  scale 3 -> {pods} pods (all ready): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    steady_state(&host.handles, resync).await;
    scale_in(&nodesets, &host.handles, pods).await?;

    if let Some(h) = &harness {
        // The steady request rate stays flat with the NodeSet count (one shared node list).
        more_nodesets(&client, EXTRA_NODESETS).await?;
        println!("  with {} NodeSets on the Controller:", EXTRA_NODESETS + 1);
        steady_state(&host.handles, resync).await;
        node_list_latency(&client, h).await?;
        host.stop().await;
        drain_latency(&client, h, 0).await?;
        h.shutdown().await;
    } else {
        host.stop().await;
    }
    server.shutdown().await;
    Ok(())
}

/// The example Controller's JWT key, as the host reads it.
async fn jwt_key(client: &kube::Client) -> anyhow::Result<Vec<u8>> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "slurm")
        .get("slurm-auth-jwths256")
        .await?;
    secret
        .data
        .and_then(|mut d| d.remove("jwt_hs256.key"))
        .map(|b| b.0)
        .ok_or_else(|| anyhow::anyhow!("no key"))
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let pods = env_or("BENCH_PODS", 1000);
    rt.block_on(run(None, pods))?;
    match slinky_slurm_local::usable() {
        Ok(dir) => rt.block_on(run(Some(&dir), pods))?,
        Err(why) => println!("with Slurm: skipped ({why})"),
    }
    Ok(())
}
