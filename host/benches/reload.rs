//! Hot reload: the time from a plugin file landing in the plugins directory to the new version
//! serving, split by stage (read, compile, validate, swap), for the bundled plugins: raw `.wasm`
//! tiered (Winch before serving, then the time until the Cranelift code runs), raw `.wasm` with
//! Cranelift only, and from the precompiled cache; and reconcile latency (scale a NodeSet by one pod →
//! the pod exists) with and without reloads running.
//!
//! `cargo bench -p slinky-host --bench reload` (prints figures; no assertions).

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use slinky_api::NodeSet;
use slinky_host::{
    PluginRegistry,
    embedded::{ApiServer, ApiServerConfig, LifecycleConfig},
    plugins::{
        BuilderKind, EngineHandle, RuntimeConfig, Tier, Tiering, bundled,
        reload::{self, ReloadConfig, Reloader},
        with_custom_section,
    },
    reconcile::{self, RunConfig},
};

const ROUNDS: usize = 5;

/// How the version that lands gets compiled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A new digest every round, tiered (the default): Winch before serving, Cranelift after.
    Tiered,
    /// A new digest every round, compiled with Cranelift before serving.
    Optimized,
    /// The same digest, whose precompiled artifact is on disk, in a new host every round.
    Cached,
}

/// Wait until every active plugin runs optimized code: background compiles of the bundled
/// plugins must not run during a measurement.
fn settle(registry: &PluginRegistry) -> anyhow::Result<()> {
    for kind in bundled::KINDS {
        anyhow::ensure!(
            registry
                .active(kind)
                .wait_for_tier(Tier::Optimized, Duration::from_secs(120)),
            "{kind} never switched to optimized code"
        );
    }
    Ok(())
}

/// A host of its own for [`pipeline`]: its plugins compiled as `mode` says (artifacts cached in
/// `cache`), settled, and a reloader of `dir`.
fn reload_host(cache: &Path, dir: &Path, mode: Mode) -> anyhow::Result<(Arc<PluginRegistry>, Reloader)> {
    let engine = EngineHandle::new(RuntimeConfig {
        cache_dir: Some(cache.to_path_buf()),
        tiering: if mode == Mode::Optimized {
            Tiering::Optimized
        } else {
            Tiering::Tiered
        },
        ..RuntimeConfig::default()
    })?;
    let registry = Arc::new(PluginRegistry::new(&engine, &[])?);
    settle(&registry)?;
    let config = ReloadConfig {
        dir: dir.to_path_buf(),
        poll: Duration::from_secs(1),
        build: Default::default(),
    };
    Ok((registry.clone(), Reloader::new(registry, config)))
}

/// What [`pipeline`]'s rounds add up to: seconds and count per stage, and the time from landing
/// to serving and to optimized code.
#[derive(Default)]
struct Totals {
    stages: BTreeMap<&'static str, (f64, u64)>,
    landing: Duration,
    optimized: Duration,
}

/// Round `round` of [`pipeline`]: `version` lands in `dir` as `p.wasm`, `reloader` scans (forced)
/// and `kind` reaches optimized code; its times are added to `totals`.
fn land(
    kind: BuilderKind,
    round: usize,
    registry: &PluginRegistry,
    reloader: &mut Reloader,
    dir: &Path,
    version: &[u8],
    totals: &mut Totals,
) -> anyhow::Result<()> {
    let t = Instant::now();
    std::fs::write(dir.join("p.wasm"), version)?;
    let report = reloader.scan(true);
    totals.landing += t.elapsed();
    anyhow::ensure!(report.swapped.len() == 1, "round {round}: {report:?}");
    // The next round starts once this version's background compile is done.
    anyhow::ensure!(
        registry
            .active(kind)
            .wait_for_tier(Tier::Optimized, Duration::from_secs(120)),
        "round {round}: no switch to optimized code"
    );
    totals.optimized += t.elapsed();
    for (stage, (sum, n)) in registry
        .reloads
        .stages
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default()
    {
        let e = totals.stages.entry(stage).or_default();
        e.0 += sum;
        e.1 += n;
    }
    Ok(())
}

/// Land a new version of `kind`'s bundled plugin `ROUNDS` times and scan (forced): the pipeline
/// alone, without the debounce.
fn pipeline(kind: BuilderKind, mode: Mode) -> anyhow::Result<()> {
    let cached = mode == Mode::Cached;
    let cache = tempfile::tempdir()?;
    let dir = tempfile::tempdir()?;
    let host = || reload_host(cache.path(), dir.path(), mode);
    let bytes = bundled::bundled_bytes(kind);
    let mut totals = Totals::default();
    let (mut registry, mut reloader) = host()?;
    for round in 0..ROUNDS {
        let tag = if cached {
            "same".to_string()
        } else {
            format!("round-{round}")
        };
        let version = with_custom_section(bytes, "bench", tag.as_bytes());
        if cached {
            if round == 0 {
                // Warm the disk cache.
                let (warm_registry, mut warm) = host()?;
                std::fs::write(dir.path().join("p.wasm"), &version)?;
                warm.scan(true);
                settle(&warm_registry)?;
                std::fs::remove_file(dir.path().join("p.wasm"))?;
            }
            (registry, reloader) = host()?;
        } else {
            // Back to the bundled version, so that every round swaps.
            let _ = std::fs::remove_file(dir.path().join("p.wasm"));
            reloader.scan(true);
            registry.reloads.stages.lock().map(|mut m| m.clear()).ok();
        }
        land(
            kind,
            round,
            &registry,
            &mut reloader,
            dir.path(),
            &version,
            &mut totals,
        )?;
    }
    print_pipeline(kind, mode, bytes.len(), &totals);
    Ok(())
}

/// Prints [`pipeline`]'s figures for `kind` (`len` bytes) in `mode`: means per round.
fn print_pipeline(kind: BuilderKind, mode: Mode, len: usize, totals: &Totals) {
    let per_stage: Vec<String> = ["read", "compile", "validate", "swap"]
        .into_iter()
        .map(|s| {
            let (sum, n) = totals.stages.get(s).copied().unwrap_or_default();
            format!("{s} {:.2} ms", sum / n.max(1) as f64 * 1e3)
        })
        .collect();
    let mean_ms = |d: Duration| d.as_secs_f64() * 1e3 / ROUNDS as f64;
    println!(
        "  {kind} ({} KiB), {}: landing -> serving {:.1} ms (mean of {ROUNDS}): {}{}",
        len >> 10,
        match mode {
            Mode::Tiered => "raw .wasm, tiered",
            Mode::Optimized => "raw .wasm, Cranelift only",
            Mode::Cached => "precompiled cache",
        },
        mean_ms(totals.landing),
        per_stage.join(", "),
        if mode == Mode::Tiered {
            format!("; landing -> optimized code {:.1} ms", mean_ms(totals.optimized))
        } else {
            String::new()
        }
    );
}

/// The same through the polling reloader: file written → active, including the debounce.
async fn end_to_end(poll: Duration) -> anyhow::Result<()> {
    let engine = EngineHandle::new(RuntimeConfig::default())?;
    let registry = Arc::new(PluginRegistry::new(&engine, &[])?);
    settle(&registry)?;
    let dir = tempfile::tempdir()?;
    let (_handle, _, task) = reload::start(
        registry.clone(),
        ReloadConfig {
            dir: dir.path().to_path_buf(),
            poll,
            build: Default::default(),
        },
    )
    .await?;
    let bytes = bundled::NODESET_POD;
    // Warm the engine's cache so the figure is the reloader's own latency.
    let version = with_custom_section(bytes, "bench", b"e2e");
    let warm = slinky_host::Plugin::load(&engine, &version, slinky_host::plugins::PluginSource::Bundled)?;
    anyhow::ensure!(warm.wait_for_tier(Tier::Optimized, Duration::from_secs(120)));
    let want = slinky_host::plugins::digest(&version);
    let t = Instant::now();
    std::fs::write(dir.path().join("p.wasm"), &version)?;
    while registry.active(BuilderKind::NodesetPod).digest() != want {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "  polling every {} ms (compiled artifact cached): file written -> serving {:.0} ms",
        poll.as_millis(),
        t.elapsed().as_secs_f64() * 1e3
    );
    task.abort();
    Ok(())
}

/// Scale +1 pod `n` times and return the latencies (patch → pod exists) in ms, sorted.
async fn scale_latencies(client: &kube::Client, n: usize) -> anyhow::Result<Vec<f64>> {
    let nodesets: Api<NodeSet> = Api::namespaced(client.clone(), "slurm");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "slurm");
    let mut out = Vec::new();
    for _ in 0..n {
        let have = nodesets
            .get("slurm-worker-slinky")
            .await?
            .spec
            .replicas
            .unwrap_or(1);
        let want = format!("slurm-worker-slinky-{have}");
        let t = Instant::now();
        nodesets
            .patch(
                "slurm-worker-slinky",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": have + 1}})),
            )
            .await?;
        while pods.get_opt(&want).await?.is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        out.push(t.elapsed().as_secs_f64() * 1e3);
        // Spread the samples over a few seconds (several reloads happen meanwhile).
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn summary(v: &[f64]) -> String {
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms",
        at(0.5),
        at(0.95),
        at(1.0)
    )
}

/// Writes a new controller-service version to `path` every 300 ms (each a fresh compile for the
/// reloader), until aborted or a write fails.
fn spawn_versions(path: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in 0.. {
            let v = with_custom_section(bundled::CONTROLLER_SERVICE, "bench", format!("{i}").as_bytes());
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, v)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Passes so far whose result was not `ok`.
fn failed(h: &reconcile::Handles) -> u64 {
    h.metrics
        .snapshot()
        .iter()
        .filter(|((_, result), _)| result != "ok")
        .map(|(_, n)| n)
        .sum()
}

async fn latency_during_reloads() -> anyhow::Result<()> {
    let server = ApiServer::start(ApiServerConfig {
        lifecycle: Some(LifecycleConfig {
            nodes: 10,
            schedule_delay: Duration::from_millis(5),
            ready_delay: Duration::from_millis(10),
            grace_period_scale: 0.01,
        }),
        ..Default::default()
    })
    .await?;
    let client = server.client()?;
    slinky_host::cmd::run::install_crds(&client).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let example = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slurm-cluster.yaml");
    slinky_host::cmd::run::apply_files(&client, &[example]).await?;
    let cache = tempfile::tempdir()?;
    let engine = EngineHandle::new(RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeConfig::default()
    })?;
    let plugins = Arc::new(PluginRegistry::new(&engine, &[])?);
    settle(&plugins)?;
    let dir = tempfile::tempdir()?;
    let (_reload, _, reload_task) = reload::start(
        plugins.clone(),
        ReloadConfig {
            dir: dir.path().to_path_buf(),
            poll: Duration::from_millis(100),
            build: Default::default(),
        },
    )
    .await?;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let mut rx2 = rx.clone();
    let shutdown = async move {
        let _ = rx2.wait_for(|s| *s).await;
    }
    .boxed();
    let (handles, fut) = reconcile::start(
        client.clone(),
        plugins.clone(),
        RunConfig::default(),
        "bench",
        shutdown,
    );
    let task = tokio::spawn(fut);
    let _ = scale_latencies(&client, 3).await?; // warm-up
    let quiet = scale_latencies(&client, 20).await?;
    // Reloads running: a new controller-service version (a fresh compile each) every 300 ms, so
    // the reloader compiles continuously next to the NodeSet reconciles being measured.
    let writer = spawn_versions(dir.path().join("service.wasm"));
    let failed_before = failed(&handles);
    let busy = scale_latencies(&client, 20).await?;
    writer.abort();
    let failed_during = failed(&handles) - failed_before;
    println!("  scale +1 pod, no reload:     {}", summary(&quiet));
    println!(
        "  scale +1 pod, during reloads: {} ({} controller-service swaps meanwhile, {failed_during} failed reconciles)",
        summary(&busy),
        plugins.swaps(BuilderKind::ControllerService)
    );
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    reload_task.abort();
    server.shutdown().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    println!("reload pipeline (read, compile, instantiate + describe + smoke build = validate, swap):");
    for kind in bundled::KINDS {
        for mode in [Mode::Tiered, Mode::Optimized, Mode::Cached] {
            pipeline(kind, mode)?;
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        println!("reloader, end to end:");
        end_to_end(Duration::from_millis(100)).await?;
        end_to_end(Duration::from_millis(1000)).await?;
        println!("reconcile latency:");
        latency_during_reloads().await
    })
}
