//! The host's side of the scale benchmark: [`host_round`] runs a host child (this binary again,
//! `BENCH_CHILD`) from the parent, and [`host_child`] is that child: it applies the example
//! cluster, starts a host on the scenario's namespace, scales it up and measures the scale-up, the
//! steady state afterwards and its RSS, and reports the seconds and one pod back.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use slinky_api::{Controller, NodeSet};
use slinky_host::{
    PluginRegistry,
    client::ApiRequests,
    plugins::{EngineHandle, RuntimeConfig},
    reconcile::{self, RunConfig},
};

use super::{
    HostResult, Scenario, client_from, create_namespace, env_or,
    measure::{CpuBefore, PodCount, cpu_note, cpu_now, passes, pprof, rss_mib, servers_quiet},
};

/// Set condition `SiteCheck` (message `message`) on the status of the Controller and the first
/// NodeSet, as another controller would (server-side apply as `site-checker`: the conditions are
/// a list map, so the host's stay).
async fn other_status_writes(client: &Client, ns: &str, nodeset: &str, message: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply("site-checker");
    for (kind, name) in [("Controller", "slurm"), ("NodeSet", nodeset)] {
        let body = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": kind,
            "metadata": {"name": name, "namespace": ns},
            "status": {"conditions": [{"type": "SiteCheck", "status": "True", "reason": "Checked",
                "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        if kind == "NodeSet" {
            Api::<NodeSet>::namespaced(client.clone(), ns)
                .patch_status(name, &pp, &Patch::Apply(&body))
                .await?;
        } else {
            Api::<Controller>::namespaced(client.clone(), ns)
                .patch_status(name, &pp, &Patch::Apply(&body))
                .await?;
        }
    }
    Ok(())
}

/// Returns once the host has made no write for a second.
async fn writes_settled(handles: &reconcile::Handles) {
    let mut last = handles.writes.total();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = handles.writes.total();
        if now == last {
            return;
        }
        last = now;
    }
}

/// Once the host has made no write for a second, `resyncs` resync periods at steady state: API
/// writes and requests per resync, passes per parent per resync; with `others`, while another
/// controller writes two parents' status every 500 ms.
async fn steady_state(
    client: &Client,
    s: &Scenario,
    handles: &reconcile::Handles,
    requests: &ApiRequests,
    others: bool,
) -> anyhow::Result<()> {
    let resync = Duration::from_secs(env_or("BENCH_RESYNC_SECONDS", 2));
    let resyncs: u32 = env_or("BENCH_RESYNCS", 5);
    writes_settled(handles).await;
    let (writes, passes_before, requests_before) =
        (handles.writes.total(), passes(handles), requests.total());
    let window = resync * resyncs;
    let started = Instant::now();
    let mut other_writes = 0;
    let first = s.nodeset_names().remove(0);
    while started.elapsed() < window {
        if others {
            other_status_writes(client, &s.namespace, &first, &format!("check {other_writes}")).await?;
            other_writes += 2;
        }
        tokio::time::sleep(Duration::from_millis(500).min(window.saturating_sub(started.elapsed()))).await;
    }
    let written = handles.writes.total() - writes;
    let passed = passes(handles) - passes_before;
    let asked = requests.total() - requests_before;
    let objects = s.nodesets as f64 + 1.0;
    let what = if others {
        format!(", another controller writing two parents' status ({other_writes} writes)")
    } else {
        String::new()
    };
    println!(
        "  steady state over {resyncs} resyncs of {} s{what}: {:.1} API writes per resync, {:.1} API \
         requests per resync ({:.2} per pass), {:.2} passes per object per resync",
        resync.as_secs_f64(),
        written as f64 / f64::from(resyncs),
        asked as f64 / f64::from(resyncs),
        asked as f64 / (passed.max(1) as f64),
        passed as f64 / objects / f64::from(resyncs)
    );
    Ok(())
}

/// The example cluster in `namespace`, its NodeSet at 0 replicas; for several NodeSets, copies
/// named `w000`… (each with its own hostname prefix) instead of the example's.
async fn apply_cluster(client: &Client, s: &Scenario) -> anyhow::Result<()> {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slurm-cluster.yaml");
    let text = std::fs::read_to_string(&example)?
        .replace("namespace: slurm", &format!("namespace: {}", s.namespace))
        .replace("replicas: 3", "replicas: 0");
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, text)?;
    slinky_host::cmd::run::apply_files(client, &[file]).await?;
    if s.nodesets > 1 {
        let api: Api<NodeSet> = Api::namespaced(client.clone(), &s.namespace);
        let mut template = serde_json::to_value(api.get("slurm-worker-slinky").await?)?;
        template["metadata"] = json!({"namespace": s.namespace});
        template.as_object_mut().expect("object").remove("status");
        api.delete("slurm-worker-slinky", &DeleteParams::default())
            .await?;
        let names = s.nodeset_names();
        futures::stream::iter(names.iter().enumerate())
            .map(|(i, name)| {
                let mut n = template.clone();
                n["metadata"]["name"] = json!(name);
                n["spec"]["template"]["spec"]["hostname"] = json!(format!("n{i:03}-"));
                let api = api.clone();
                async move {
                    let n: NodeSet = serde_json::from_value(n)?;
                    api.create(&PostParams::default(), &n).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
    }
    Ok(())
}

/// A host running in this process on one namespace, until [`Running::stop`].
struct Running {
    handles: reconcile::Handles,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Kept for as long as the host runs (its plugin pool is read at the end).
    engine: Arc<EngineHandle>,
}

impl Running {
    /// Starts a host on `s.namespace` through `client`, whose requests `requests` counts.
    fn start(client: &Client, s: &Scenario, requests: &Arc<ApiRequests>) -> anyhow::Result<Self> {
        let engine = EngineHandle::new(RuntimeConfig::default())?;
        let plugins = Arc::new(PluginRegistry::new(&engine, &[])?);
        let (stop, rx) = tokio::sync::watch::channel(false);
        let mut rx2 = rx.clone();
        let shutdown = async move {
            let _ = rx2.wait_for(|s| *s).await;
        }
        .boxed();
        let config = RunConfig {
            namespaces: vec![s.namespace.clone()],
            resync: Some(Duration::from_secs(env_or("BENCH_RESYNC_SECONDS", 2))),
            api_requests: requests.clone(),
            ..RunConfig::default()
        };
        let (handles, fut) = reconcile::start(client.clone(), plugins, config, "bench", shutdown);
        let task = tokio::spawn(fut);
        Ok(Self {
            handles,
            stop,
            task,
            engine,
        })
    }

    /// Stops the host and waits up to 30 s for it to end.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

/// Waits until each of the `n` NodeSets has been reconciled at its current generation.
async fn wait_reconciled(nodesets: &Api<NodeSet>, n: usize) -> anyhow::Result<()> {
    loop {
        let list = nodesets.list(&Default::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .is_some_and(|st| st.observed_generation == n.metadata.generation)
            })
            .count();
        if done == n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Scales every NodeSet of `s` to `s.pods`, waits until `count` sees every pod and prints the
/// host's figures of the scale-up. Returns its seconds.
async fn scale_up(
    nodesets: &Api<NodeSet>,
    s: &Scenario,
    count: &PodCount,
    handles: &reconcile::Handles,
    requests: &ApiRequests,
) -> anyhow::Result<f64> {
    let names = s.nodeset_names();
    // Before the counts: what the host does while the servers quieten is not the scale-up's.
    let quiet = servers_quiet().await;
    let (writes_before, requests_before, posts_before, by_kind_before) = (
        handles.writes.total(),
        requests.total(),
        requests.get("post", "pods"),
        requests.snapshot(),
    );
    let cpu_before = cpu_now("self");
    let count_cpu_before = count.cpu_seconds();
    let passes_before = passes(handles);
    let profile = pprof(&nodesets.clone().into_client(), &format!("{}-host", s.namespace));
    let t = Instant::now();
    futures::stream::iter(names.iter())
        .map(|name| {
            let nodesets = nodesets.clone();
            async move {
                nodesets
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": s.pods}})),
                    )
                    .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    count.wait(s.total()).await;
    let seconds = t.elapsed().as_secs_f64();
    // The pod count's thread is not the host's.
    let counting = count.cpu_seconds() - count_cpu_before;
    let cpu_before = CpuBefore {
        ours: cpu_before.ours + counting,
        ..cpu_before
    };
    let posts = requests.get("post", "pods") - posts_before;
    let asked = requests.total() - requests_before;
    println!(
        "  host: {} pods in {seconds:.2} s; {posts} pod POSTs ({:.3} per pod); {asked} API requests; {} passes; {}{}",
        s.total(),
        posts as f64 / s.total().max(1) as f64,
        passes(handles) - passes_before,
        cpu_note("self", "the host's", cpu_before),
        quiet
            .map(|q| format!(" ({q} before it; the pod count's {counting:.1} s left out)"))
            .unwrap_or_default()
    );
    print_other_requests(requests, &by_kind_before);
    if let Some(p) = profile {
        let _ = p.await;
    }
    // Let the status writes settle before the steady state.
    let _ = handles.writes.total() - writes_before;
    Ok(seconds)
}

/// Prints the requests other than pod POSTs made since `by_kind_before`, by verb and resource.
fn print_other_requests(requests: &ApiRequests, by_kind_before: &BTreeMap<(String, String), u64>) {
    let others: Vec<String> = requests
        .snapshot()
        .into_iter()
        .filter_map(|((verb, resource), n)| {
            let n = n - by_kind_before
                .get(&(verb.clone(), resource.clone()))
                .copied()
                .unwrap_or(0);
            (n > 0 && (verb.as_str(), resource.as_str()) != ("post", "pods"))
                .then(|| format!("{verb} {resource} {n}"))
        })
        .collect();
    println!("  host's other requests of the scale-up: {}", others.join(", "));
}

/// One pod as the host made it (`null` without pods), read from the API: the cache may hold less
/// than the pod.
async fn template_pod(plain: &Client, s: &Scenario, handles: &reconcile::Handles) -> anyhow::Result<Value> {
    let pod = handles
        .pods
        .state()
        .first()
        .map(|p| serde_json::to_value(p.as_ref()))
        .transpose()?
        .unwrap_or(Value::Null);
    // The template comes from the API (the cache may hold less than the pod).
    Ok(match pod["metadata"]["name"].as_str() {
        Some(name) => serde_json::to_value(
            Api::<Pod>::namespaced(plain.clone(), &s.namespace)
                .get(name)
                .await?,
        )?,
        None => pod,
    })
}

/// The host child: starts a host on `s.namespace`, scales, measures, writes its result to
/// `BENCH_RESULT`.
pub(crate) async fn host_child(s: Scenario, kubeconfig: PathBuf, result: PathBuf) -> anyhow::Result<()> {
    // `BENCH_LOG` (a `RUST_LOG` filter, e.g. `slinky_host::reconcile::nodeset=debug`): the host's
    // log on stderr, with the time since start, to see where a scale-up spends its time.
    if let Ok(filter) = std::env::var("BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_writer(std::io::stderr)
            .init();
    }
    let requests = Arc::new(ApiRequests::default());
    let client = client_from(&kubeconfig, requests.clone()).await?;
    let plain = client_from(&kubeconfig, Arc::default()).await?;
    create_namespace(&plain, &s.namespace).await?;
    apply_cluster(&plain, &s).await?;
    let host = Running::start(&client, &s, &requests)?;
    let handles = &host.handles;
    let nodesets: Api<NodeSet> = Api::namespaced(plain.clone(), &s.namespace);
    // Every NodeSet reconciled at 0 replicas and the Controller's children made first, so the
    // figures are for the scale-up alone (the Controller's first pass, which creates slurmctld's
    // StatefulSet and the Services, ran into the scale-up of some rounds: about half a second of
    // the host's CPU and a dozen requests that kcm's side does not have).
    wait_reconciled(&nodesets, s.nodeset_names().len()).await?;
    writes_settled(handles).await;
    let count = PodCount::start(&kubeconfig, &s.namespace).await?;
    let seconds = scale_up(&nodesets, &s, &count, handles, &requests).await?;
    steady_state(&plain, &s, handles, &requests, false).await?;
    if s.nodesets == 1 {
        steady_state(&plain, &s, handles, &requests, true).await?;
    }
    println!(
        "  host RSS: {:.0} MiB now ({:.0} anonymous, {:.0} file), {:.0} MiB peak ({} pods cached; MALLOC_ARENA_MAX={})",
        rss_mib("VmRSS:"),
        rss_mib("RssAnon:"),
        rss_mib("RssFile:"),
        rss_mib("VmHWM:"),
        handles.pods.state().len(),
        std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "unset".into())
    );
    if let Some(pool) = host.engine.pool_resident() {
        println!(
            "  plugin pool: {} idle memory slots holding {:.1} MiB, tables {:.1} MiB",
            pool.warm_memories,
            pool.memory_bytes as f64 / f64::from(1 << 20),
            pool.table_bytes as f64 / f64::from(1 << 20)
        );
    }
    let pod = template_pod(&plain, &s, handles).await?;
    std::fs::write(&result, serde_json::to_vec(&HostResult { seconds, pod })?)?;
    host.stop().await;
    Ok(())
}

/// Runs the host child of one round of `s` (a process of its own) and reads its result.
pub(crate) fn host_round(kubeconfig: &Path, s: &Scenario) -> anyhow::Result<HostResult> {
    let result_file = tempfile::NamedTempFile::new()?;
    // glibc's malloc arenas as the install sets them (`MALLOC_ARENA_MAX=2` in the manifests,
    // the chart and the image), unless set already.
    let arenas = std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2".into());
    let status = std::process::Command::new(std::env::current_exe()?)
        .env("MALLOC_ARENA_MAX", &arenas)
        .env("BENCH_CHILD", serde_json::to_string(s)?)
        .env("BENCH_KUBECONFIG", kubeconfig)
        .env("BENCH_RESULT", result_file.path())
        .status()?;
    anyhow::ensure!(status.success(), "the host child failed: {status}");
    Ok(serde_json::from_slice(&std::fs::read(result_file.path())?)?)
}
