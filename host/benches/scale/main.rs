//! The scale benchmark: the host against kube-controller-manager's StatefulSet controller.
//!
//! Three scenarios, each in one run: one NodeSet scaled 0 → `BENCH_PODS` pods (default 1,000),
//! `BENCH_NODESETS` NodeSets (default 100) scaled 0 → `BENCH_PODS_EACH` pods each (default 100:
//! 10,000 pods), and one NodeSet scaled 0 → `BENCH_BIG_PODS` (default 5,000). For each it prints
//! the seconds until every pod exists, pod POSTs per pod, the API requests of the scale-up, the
//! steady state afterwards (API writes and requests per resync, passes per object per resync;
//! for one NodeSet also while another controller writes both parents' status) and the host's
//! RSS.
//!
//! With `REALKUBE_DIR` set (a real kube-apiserver from `shared/tools/realkube`, started), the
//! host runs against it, and so does kube-controller-manager's StatefulSet controller
//! (`$REALKUBE_DIR/kube-controller-manager --controllers statefulset`, unthrottled:
//! `--kube-api-qps 100000`), scaling StatefulSets (`podManagementPolicy: Parallel`, the host's pod
//! as their template) to the same pods in the same run: the ratio host/kcm is printed. Without
//! it, the embedded API server (simulated pod readiness) serves, and there is no ratio.
//!
//! The bundled builders' optimized code is put in the plugin cache first (compiled when it is
//! missing), so every round's host starts warm, as a host with its cache does.
//!
//! Each host runs in a child process of its own (this binary again, `BENCH_CHILD`), so its RSS
//! is the host's alone (with the embedded server, the server runs in the parent).
//!
//! `cargo bench -p slinky-host --bench scale`; a quick debug run: `BENCH_PODS=100
//! BENCH_NODESETS=10 BENCH_PODS_EACH=10 cargo test -p slinky-host --bench scale`.
//! `BENCH_RESYNC_SECONDS` (default 2) and `BENCH_RESYNCS` (default 5) set the steady state's
//! window; `BENCH_SCENARIOS` (`one,many,big`) picks scenarios.
//!
//! kcm's own times vary by ±30 % from run to run on a small machine (etcd, kube-apiserver and
//! both controllers share its cores), so with `REALKUBE_DIR` every scenario runs 5 rounds
//! (`BENCH_ROUNDS`, `BENCH_MANY_ROUNDS`, `BENCH_BIG_ROUNDS`; without it, 1): the host and kcm,
//! the host first in odd rounds and kcm first in even ones, each in a namespace of its own,
//! deleted before the other starts. The host's scale-up starts
//! once the host has made no write for a second, and each side's once kube-apiserver and etcd
//! are quiet (`measure::servers_quiet`). It prints the medians.

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

mod host;
mod kcm;
mod measure;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kube::{
    Api, Client,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};
use slinky_host::client::ApiRequests;

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
pub(crate) async fn client_from(kubeconfig: &Path, requests: Arc<ApiRequests>) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(slinky_host::client::client(config, requests)?)
}

async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// The target API server: a real one (`REALKUBE_DIR`) or an embedded one of this process.
enum Target {
    Real(PathBuf),
    Embedded(slinky_host::embedded::ApiServer, tempfile::TempDir),
}

impl Target {
    /// The real API server of `REALKUBE_DIR`, or else an embedded one started now.
    async fn start() -> anyhow::Result<Self> {
        use slinky_host::embedded::{ApiServer, ApiServerConfig, LifecycleConfig};
        Ok(match std::env::var_os("REALKUBE_DIR") {
            Some(dir) => Self::Real(PathBuf::from(dir)),
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
                Self::Embedded(server, dir)
            }
        })
    }

    fn kubeconfig(&self) -> PathBuf {
        match self {
            Self::Real(dir) => dir.join("kubeconfig"),
            Self::Embedded(_, dir) => dir.path().join("kubeconfig"),
        }
    }

    /// Prints which API server serves.
    async fn print(&self, client: &Client) -> anyhow::Result<()> {
        match self {
            Self::Real(dir) => println!(
                "API server: the real kube-apiserver {} ({})",
                client.apiserver_version().await?.git_version,
                dir.display()
            ),
            Self::Embedded(..) => {
                println!("API server: the embedded one (set REALKUBE_DIR for the real one and kcm)")
            }
        }
        Ok(())
    }
}

/// Scenario `which`'s NodeSets, pods per NodeSet and rounds (from the environment).
fn scenario_shape(which: &str, target: &Target) -> anyhow::Result<(usize, i32, usize)> {
    // Rounds compare with kcm: without it (the embedded server), one.
    let rounds = if matches!(target, Target::Real(_)) { 5 } else { 1 };
    Ok(match which {
        "one" => (1, env_or("BENCH_PODS", 1000), env_or("BENCH_ROUNDS", rounds)),
        "many" => (
            env_or("BENCH_NODESETS", 100),
            env_or("BENCH_PODS_EACH", 100),
            env_or("BENCH_MANY_ROUNDS", rounds),
        ),
        "big" => (
            1,
            env_or("BENCH_BIG_PODS", 5000),
            env_or("BENCH_BIG_ROUNDS", rounds),
        ),
        other => anyhow::bail!("unknown scenario {other:?} (one, many, big)"),
    })
}

/// Runs every round of scenario `which` (run `run`): the host and, with a real API server, kcm
/// (first in every second round); prints the medians of several rounds.
async fn scenario(target: &Target, client: &Client, run: u64, which: &str) -> anyhow::Result<()> {
    let kubeconfig = target.kubeconfig();
    let (nodesets, pods, rounds) = scenario_shape(which, target)?;
    println!(
        "{nodesets} NodeSet(s) 0 -> {pods} pods each ({} pods), {rounds} round(s):",
        nodesets * pods.max(0) as usize
    );
    let mut figures = Vec::new();
    // The host's pod, kcm's template (from the first round's host).
    let mut template: Option<Value> = None;
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
        let Target::Real(dir) = target else {
            host::host_round(&kubeconfig, &s)?;
            continue;
        };
        let kcm = Scenario {
            namespace: format!("{}-kcm", s.namespace),
            ..s.clone()
        };
        // Rounds alternate which side goes first (host, kcm; kcm, host; …): a machine that
        // drifts within a round, or a first side that pays for what the last round left, favours
        // neither. Each side starts on an API server without the other's pods.
        let kcm_first = round % 2 == 0 && template.is_some();
        let mut kcm_seconds = None;
        if kcm_first && let Some(pod) = &template {
            kcm_seconds = Some(kcm::kcm_run(client, dir, &kcm, pod).await?);
            kcm::delete_namespace(client, &kcm.namespace).await;
        }
        let host = host::host_round(&kubeconfig, &s)?;
        kcm::delete_namespace(client, &s.namespace).await;
        let template = template.get_or_insert(host.pod);
        let seconds = match kcm_seconds {
            Some(seconds) => seconds,
            None => {
                let seconds = kcm::kcm_run(client, dir, &kcm, template).await?;
                kcm::delete_namespace(client, &kcm.namespace).await;
                seconds
            }
        };
        println!(
            "  ratio host/kcm: {:.2}{}",
            host.seconds / seconds,
            if kcm_first { " (kcm first)" } else { "" }
        );
        figures.push((host.seconds, seconds));
    }
    if figures.len() > 1 {
        print_medians(&figures);
    }
    Ok(())
}

/// The medians of the rounds' (host, kcm) seconds and of their ratios.
fn print_medians(figures: &[(f64, f64)]) {
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

/// Compiles the bundled builders with Cranelift into the plugin cache the host children load
/// from (`default_cache_dir`), so that every round's host starts as a host with its cache does.
/// On an empty cache (a fresh machine) the first round's host compiled them in the background
/// during its scale-up: 13.8 s of its CPU instead of ~3, and 295 MiB resident instead of 85.
fn warm_plugin_cache() -> anyhow::Result<()> {
    use slinky_host::plugins::{EngineHandle, PluginRegistry, RuntimeConfig, Tiering, default_cache_dir};
    let t = std::time::Instant::now();
    let engine = EngineHandle::new(RuntimeConfig {
        tiering: Tiering::Optimized,
        ..RuntimeConfig::default()
    })?;
    drop(PluginRegistry::new(&engine, &[])?);
    println!(
        "plugin cache {}: the bundled builders' optimized code ready in {:.1} s",
        default_cache_dir().map_or_else(|| "(none)".into(), |d| d.display().to_string()),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn parent() -> anyhow::Result<()> {
    warm_plugin_cache()?;
    let target = Target::start().await?;
    let kubeconfig = target.kubeconfig();
    let client = client_from(&kubeconfig, Arc::default()).await?;
    slinky_host::cmd::run::install_crds(&client).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    target.print(&client).await?;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        % 100_000;
    let scenarios: String = env_or("BENCH_SCENARIOS", "one,many,big".to_string());
    for which in scenarios.split(',') {
        scenario(&target, &client, run, which).await?;
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
            rt.block_on(host::host_child(s, kubeconfig, result))
        }
        Err(_) => rt.block_on(parent()),
    }
}
