//! The scale benchmark: the host against kube-controller-manager's StatefulSet controller.
//!
//! Two scenarios, each in one run: one NodeSet scaled 0 → `BENCH_PODS` pods (default 1,000), and
//! `BENCH_NODESETS` NodeSets (default 100) scaled 0 → `BENCH_PODS_EACH` pods each (default 100:
//! 10,000 pods). For each it prints the seconds until every pod exists, pod POSTs per pod, the
//! API requests of the scale-up, the steady state afterwards (API writes and requests per resync,
//! passes per object per resync; for the one NodeSet also while another controller writes both
//! parents' status) and the host's RSS.
//!
//! With `REALKUBE_DIR` set (a real kube-apiserver from `shared/tools/realkube`, started), the
//! host runs against it, and so does kube-controller-manager's StatefulSet controller
//! (`$REALKUBE_DIR/kube-controller-manager --controllers statefulset`, unthrottled:
//! `--kube-api-qps 100000`), scaling StatefulSets (`podManagementPolicy: Parallel`, the host's pod
//! as their template) to the same pods in the same run: the ratio host/kcm is printed. Without
//! it, the embedded API server (simulated pod readiness) serves, and there is no ratio.
//!
//! Each host runs in a child process of its own (this binary again, `BENCH_CHILD`), so its RSS
//! is the host's alone (with the embedded server, the server runs in the parent).
//!
//! `cargo bench -p slinky-host --bench scale`; a quick debug run: `BENCH_PODS=100
//! BENCH_NODESETS=10 BENCH_PODS_EACH=10 cargo test -p slinky-host --bench scale`.
//! `BENCH_RESYNC_SECONDS` (default 2) and `BENCH_RESYNCS` (default 5) set the steady state's
//! window; `BENCH_SCENARIOS` (`one,many`) picks scenarios.
//!
//! kcm's own times vary by ±30 % from run to run on a small machine (etcd, kube-apiserver and
//! both controllers share its cores), so with `REALKUBE_DIR` the one-NodeSet scenario runs
//! `BENCH_ROUNDS` rounds (default 5; without it, 1): the host, then kcm, each in a namespace of
//! its own, deleted before the other starts. It prints the medians. `BENCH_MANY_ROUNDS` (default
//! 1) does the same for the other scenario.

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use slinky_api::{Controller, NodeSet};
use slinky_host::{
    PluginRegistry,
    client::ApiRequests,
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

/// A scenario: `nodesets` NodeSets of `pods` pods each, in namespace `namespace`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Scenario {
    name: String,
    nodesets: usize,
    pods: i32,
    namespace: String,
}

impl Scenario {
    fn total(&self) -> usize {
        self.nodesets * self.pods.max(0) as usize
    }

    /// The NodeSets' names (the example's own for one NodeSet).
    fn nodeset_names(&self) -> Vec<String> {
        if self.nodesets == 1 {
            vec!["slurm-worker-slinky".to_string()]
        } else {
            (0..self.nodesets).map(|i| format!("w{i:03}")).collect()
        }
    }
}

/// What a host child reports back.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct HostResult {
    seconds: f64,
    /// One pod as the host created it (the StatefulSets' template).
    pod: Value,
}

/// A client from `kubeconfig` (the host's: HTTP/2 where the server speaks it), its requests
/// counted into `requests`.
async fn client_from(kubeconfig: &Path, requests: Arc<ApiRequests>) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(slinky_host::client::client(config, requests)?)
}

/// The process's RSS field (`VmRSS:`, `VmHWM:`) in MiB.
fn rss_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU seconds (user + system) process `pid` has used (`/proc/PID/stat`, 100 ticks a second).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) end with `)`.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The kube-apiserver's pid, when it runs from `REALKUBE_DIR` (its CPU is printed beside ours).
fn apiserver_pid() -> Option<String> {
    let dir = std::env::var_os("REALKUBE_DIR")?;
    let pid = std::fs::read_to_string(PathBuf::from(dir).join("apiserver.pid")).ok()?;
    Some(pid.trim().to_string())
}

/// The CPU seconds process `pid` (`who`) and the API server used since `cpu_before`
/// ([`cpu_now`]).
fn cpu_note(pid: &str, who: &str, cpu_before: (f64, f64)) -> String {
    let server = apiserver_pid().map(|p| cpu_seconds(&p) - cpu_before.1);
    let ours = cpu_seconds(pid) - cpu_before.0;
    match server {
        Some(s) => format!("CPU: {ours:.1} s {who}, {s:.1} s kube-apiserver's"),
        None => format!("CPU: {ours:.1} s {who} (the embedded API server runs in the parent)"),
    }
}

fn cpu_now(pid: &str) -> (f64, f64) {
    let server = apiserver_pid().map_or(0.0, |p| cpu_seconds(&p));
    (cpu_seconds(pid), server)
}

/// Counts the pods of `namespace` as they appear (a metadata watch); `wait(n)` returns when `n`
/// exist.
struct PodCount {
    seen: Arc<std::sync::Mutex<HashSet<String>>>,
    changed: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl PodCount {
    async fn start(client: &Client, namespace: &str) -> Self {
        let seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let (s, c) = (seen.clone(), changed.clone());
        let api: Api<kube::core::PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), namespace);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        s.lock().expect("lock").insert(p.name_any());
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        s.lock().expect("lock").remove(&p.name_any());
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(watcher::Event::Init) | Err(_) => {}
                }
                c.notify_waiters();
            }
        });
        let _ = ready_rx.await;
        Self { seen, changed, task }
    }

    fn now(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    async fn wait(&self, n: usize) {
        loop {
            let notified = self.changed.notified();
            if self.now() >= n {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }
}

impl Drop for PodCount {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// Passes of every parent (NodeSets and the Controller) so far, whatever their result.
fn passes(handles: &reconcile::Handles) -> u64 {
    handles.metrics.snapshot().values().sum()
}

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
    let mut last = handles.writes.total();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = handles.writes.total();
        if now == last {
            break;
        }
        last = now;
    }
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

/// The host child: starts a host on `s.namespace`, scales, measures, writes its result to
/// `BENCH_RESULT`.
async fn host_child(s: Scenario, kubeconfig: PathBuf, result: PathBuf) -> anyhow::Result<()> {
    let requests = Arc::new(ApiRequests::default());
    let client = client_from(&kubeconfig, requests.clone()).await?;
    let plain = client_from(&kubeconfig, Arc::default()).await?;
    create_namespace(&plain, &s.namespace).await?;
    apply_cluster(&plain, &s).await?;
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
    let nodesets: Api<NodeSet> = Api::namespaced(plain.clone(), &s.namespace);
    // Every NodeSet reconciled at 0 replicas first, so the figures are for the scale-up alone.
    let names = s.nodeset_names();
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
        if done == names.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let count = PodCount::start(&plain, &s.namespace).await;
    let (writes_before, requests_before, posts_before, by_kind_before) = (
        handles.writes.total(),
        requests.total(),
        requests.get("post", "pods"),
        requests.snapshot(),
    );
    let cpu_before = cpu_now("self");
    let passes_before = passes(&handles);
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
    let posts = requests.get("post", "pods") - posts_before;
    let asked = requests.total() - requests_before;
    println!(
        "  host: {} pods in {seconds:.2} s; {posts} pod POSTs ({:.3} per pod); {asked} API requests; {} passes; {}",
        s.total(),
        posts as f64 / s.total().max(1) as f64,
        passes(&handles) - passes_before,
        cpu_note("self", "the host's", cpu_before)
    );
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
    // Let the status writes settle before the steady state.
    let _ = handles.writes.total() - writes_before;
    steady_state(&plain, &s, &handles, &requests, false).await?;
    if s.nodesets == 1 {
        steady_state(&plain, &s, &handles, &requests, true).await?;
    }
    println!(
        "  host RSS: {:.0} MiB now, {:.0} MiB peak ({} pods cached; MALLOC_ARENA_MAX={})",
        rss_mib("VmRSS:"),
        rss_mib("VmHWM:"),
        handles.pods.state().len(),
        std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "unset".into())
    );
    let pod = handles
        .pods
        .state()
        .first()
        .map(|p| serde_json::to_value(p.as_ref()))
        .transpose()?
        .unwrap_or(Value::Null);
    // The template comes from the API (the cache may hold less than the pod).
    let pod = match pod["metadata"]["name"].as_str() {
        Some(name) => serde_json::to_value(
            Api::<Pod>::namespaced(plain.clone(), &s.namespace)
                .get(name)
                .await?,
        )?,
        None => pod,
    };
    std::fs::write(&result, serde_json::to_vec(&HostResult { seconds, pod })?)?;
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    Ok(())
}

/// Runs kube-controller-manager's StatefulSet controller, unthrottled, until dropped.
struct Kcm(std::process::Child);

impl Kcm {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(dir.join("kcm-bench.log"))?;
        let child = std::process::Command::new(dir.join("kube-controller-manager"))
            .args([
                "--kubeconfig",
                &dir.join("kubeconfig").display().to_string(),
                "--controllers",
                "statefulset",
                "--kube-api-qps",
                "100000",
                "--kube-api-burst",
                "100000",
                "--leader-elect=false",
                "--secure-port",
                "0",
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start kube-controller-manager")?;
        Ok(Self(child))
    }
}

impl Drop for Kcm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// kube-controller-manager's StatefulSet controller making the same pods: one StatefulSet per
/// NodeSet (Parallel), `pod` as their template. Returns the seconds until every pod exists.
async fn kcm_run(client: &Client, dir: &Path, s: &Scenario, pod: &Value) -> anyhow::Result<f64> {
    create_namespace(client, &s.namespace).await?;
    let kcm = Kcm::start(dir)?;
    // Its informers synced: give it a moment (the StatefulSet is created after).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut spec = pod["spec"].clone();
    for field in ["nodeName", "hostname", "subdomain"] {
        if let Some(o) = spec.as_object_mut() {
            o.remove(field);
        }
    }
    let count = PodCount::start(client, &s.namespace).await;
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &s.namespace);
    let kcm_pid = kcm.0.id().to_string();
    let cpu_before = cpu_now(&kcm_pid);
    let t = Instant::now();
    futures::stream::iter(s.nodeset_names())
        .map(|name| {
            let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name},
                "spec": {"replicas": s.pods, "podManagementPolicy": "Parallel", "serviceName": "bench",
                    "selector": {"matchLabels": {"bench": name}},
                    "template": {"metadata": {"labels": {"bench": name}}, "spec": spec}}});
            let api = api.clone();
            async move {
                let sts: StatefulSet = serde_json::from_value(sts)?;
                api.create(&PostParams::default(), &sts).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    count.wait(s.total()).await;
    let seconds = t.elapsed().as_secs_f64();
    println!(
        "  kube-controller-manager (StatefulSet controller, Parallel, --kube-api-qps 100000): {} pods in {seconds:.2} s; {}",
        s.total(),
        cpu_note(&kcm_pid, "kcm's", cpu_before)
    );
    Ok(seconds)
}

/// Runs the host child of one round of `s` (a process of its own) and reads its result.
fn host_round(kubeconfig: &Path, s: &Scenario) -> anyhow::Result<HostResult> {
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

/// Deletes namespace `ns` of a real API server (the finalizers of its NodeSets, Controllers and
/// claims dropped first: no host runs any more) and waits up to two minutes for it to be gone.
async fn delete_namespace(client: &Client, ns: &str) {
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        // Again each time: a StatefulSet's claim may appear after the delete.
        drop_finalizers::<NodeSet>(client, ns).await;
        drop_finalizers::<Controller>(client, ns).await;
        // No pvc-protection controller runs beside realkube: its finalizer would hold the
        // namespace.
        drop_finalizers::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(client, ns).await;
        if let Ok(None) = namespaces.get_opt(ns).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("  (namespace {ns} is still there after 120 s: the next round runs beside it)");
}

/// Drops the finalizers of every `K` in namespace `ns`.
async fn drop_finalizers<K>(client: &Client, ns: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let merge = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for o in api
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if o.meta().finalizers.as_ref().is_some_and(|f| !f.is_empty())
            && let Err(e) = api.patch(&o.name_any(), &PatchParams::default(), &merge).await
        {
            println!("  (cannot drop the finalizers of {}: {e})", o.name_any());
        }
    }
}

/// The target API server: a real one (`REALKUBE_DIR`) or an embedded one of this process.
enum Target {
    Real(PathBuf),
    Embedded(slinky_host::embedded::ApiServer, tempfile::TempDir),
}

impl Target {
    fn kubeconfig(&self) -> PathBuf {
        match self {
            Self::Real(dir) => dir.join("kubeconfig"),
            Self::Embedded(_, dir) => dir.path().join("kubeconfig"),
        }
    }
}

async fn parent() -> anyhow::Result<()> {
    use slinky_host::embedded::{ApiServer, ApiServerConfig, LifecycleConfig};
    let target = match std::env::var_os("REALKUBE_DIR") {
        Some(dir) => Target::Real(PathBuf::from(dir)),
        None => {
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
            let dir = tempfile::tempdir()?;
            server.write_kubeconfig(&dir.path().join("kubeconfig"))?;
            Target::Embedded(server, dir)
        }
    };
    let kubeconfig = target.kubeconfig();
    let client = client_from(&kubeconfig, Arc::default()).await?;
    slinky_host::cmd::run::install_crds(&client).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    match &target {
        Target::Real(dir) => println!(
            "API server: the real kube-apiserver {} ({})",
            client.apiserver_version().await?.git_version,
            dir.display()
        ),
        Target::Embedded(..) => {
            println!("API server: the embedded one (set REALKUBE_DIR for the real one and kcm)")
        }
    }
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        % 100_000;
    let scenarios: String = env_or("BENCH_SCENARIOS", "one,many".to_string());
    for which in scenarios.split(',') {
        let (nodesets, pods, rounds) = match which {
            // Rounds compare with kcm: without it (the embedded server), one.
            "one" => (
                1,
                env_or("BENCH_PODS", 1000),
                env_or(
                    "BENCH_ROUNDS",
                    if matches!(target, Target::Real(_)) { 5 } else { 1 },
                ),
            ),
            "many" => (
                env_or("BENCH_NODESETS", 100),
                env_or("BENCH_PODS_EACH", 100),
                env_or("BENCH_MANY_ROUNDS", 1),
            ),
            other => anyhow::bail!("unknown scenario {other:?} (one, many)"),
        };
        let rounds: usize = rounds;
        println!(
            "{nodesets} NodeSet(s) 0 -> {pods} pods each ({} pods), {rounds} round(s):",
            nodesets * pods.max(0) as usize
        );
        let mut figures = Vec::new();
        for round in 1..=rounds {
            if rounds > 1 {
                println!(" round {round}:");
            }
            let s = Scenario {
                name: which.into(),
                nodesets,
                pods,
                namespace: format!("scale-{run}-{which}-{round}"),
            };
            let host = host_round(&kubeconfig, &s)?;
            if let Target::Real(dir) = &target {
                // kcm, as the host, starts on an API server without the other's pods; so does
                // the next round.
                delete_namespace(&client, &s.namespace).await;
                let kcm = Scenario {
                    namespace: format!("{}-kcm", s.namespace),
                    ..s.clone()
                };
                let seconds = kcm_run(&client, dir, &kcm, &host.pod).await?;
                println!("  ratio host/kcm: {:.2}", host.seconds / seconds);
                figures.push((host.seconds, seconds));
                delete_namespace(&client, &kcm.namespace).await;
            }
        }
        if figures.len() > 1 {
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                let mid = v.len() / 2;
                if v.len().is_multiple_of(2) {
                    (v[mid - 1] + v[mid]) / 2.0
                } else {
                    v[mid]
                }
            };
            let ratios: Vec<f64> = figures.iter().map(|(h, k)| h / k).collect();
            println!(
                " median of {} rounds: host {:.2} s, kcm {:.2} s, ratio host/kcm {:.2} (per round: {})",
                figures.len(),
                median(figures.iter().map(|f| f.0).collect()),
                median(figures.iter().map(|f| f.1).collect()),
                median(ratios.clone()),
                ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let Target::Embedded(server, _) = target {
        server.shutdown().await;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match std::env::var("BENCH_CHILD") {
        Ok(s) => {
            let s: Scenario = serde_json::from_str(&s)?;
            let kubeconfig = PathBuf::from(std::env::var("BENCH_KUBECONFIG")?);
            let result = PathBuf::from(std::env::var("BENCH_RESULT")?);
            rt.block_on(host_child(s, kubeconfig, result))
        }
        Err(_) => rt.block_on(parent()),
    }
}
