//! Hot reload: the time from a plugin file landing in the plugins directory to the new version
//! serving, split by stage (read, compile, validate, swap), for the bundled plugins: raw `.wasm`
//! tiered (Winch before serving, then the time until the Cranelift code runs), raw `.wasm` with
//! Cranelift only, and from the precompiled cache; and reconcile latency (scale a NodeSet by one pod →
//! the pod exists) with and without reloads running.
//!
//! `cargo bench -p slinky-host --bench reload` (prints figures; no assertions).

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::{
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

/// Land a new version of `kind`'s bundled plugin `ROUNDS` times and scan (forced): the pipeline
/// alone, without the debounce.
fn pipeline(kind: BuilderKind, mode: Mode) -> anyhow::Result<()> {
    let cached = mode == Mode::Cached;
    let cache = tempfile::tempdir()?;
    let dir = tempfile::tempdir()?;
    let host = || -> anyhow::Result<(Arc<PluginRegistry>, Reloader)> {
        let engine = EngineHandle::new(RuntimeConfig {
            cache_dir: Some(cache.path().to_path_buf()),
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
            dir: dir.path().to_path_buf(),
            poll: Duration::from_secs(1),
            build: Default::default(),
        };
        Ok((registry.clone(), Reloader::new(registry, config)))
    };
    let bytes = bundled::bundled_bytes(kind);
    let mut totals: std::collections::BTreeMap<&str, (f64, u64)> = Default::default();
    let mut landing = Duration::ZERO;
    let mut optimized = Duration::ZERO;
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
        let t = Instant::now();
        std::fs::write(dir.path().join("p.wasm"), &version)?;
        let report = reloader.scan(true);
        landing += t.elapsed();
        anyhow::ensure!(report.swapped.len() == 1, "round {round}: {report:?}");
        // The next round starts once this version's background compile is done.
        anyhow::ensure!(
            registry
                .active(kind)
                .wait_for_tier(Tier::Optimized, Duration::from_secs(120)),
            "round {round}: no switch to optimized code"
        );
        optimized += t.elapsed();
        for (stage, (sum, n)) in registry
            .reloads
            .stages
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
        {
            let e = totals.entry(stage).or_default();
            e.0 += sum;
            e.1 += n;
        }
    }
    let per_stage: Vec<String> = ["read", "compile", "validate", "swap"]
        .into_iter()
        .map(|s| {
            let (sum, n) = totals.get(s).copied().unwrap_or_default();
            format!("{s} {:.2} ms", sum / n.max(1) as f64 * 1e3)
        })
        .collect();
    let mean_ms = |d: Duration| d.as_secs_f64() * 1e3 / ROUNDS as f64;
    println!(
        "  {kind} ({} KiB), {}: landing -> serving {:.1} ms (mean of {ROUNDS}): {}{}",
        bytes.len() >> 10,
        match mode {
            Mode::Tiered => "raw .wasm, tiered",
            Mode::Optimized => "raw .wasm, Cranelift only",
            Mode::Cached => "precompiled cache",
        },
        mean_ms(landing),
        per_stage.join(", "),
        if mode == Mode::Tiered {
            format!("; landing -> optimized code {:.1} ms", mean_ms(optimized))
        } else {
            String::new()
        }
    );
    Ok(())
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
    let path = dir.path().join("service.wasm");
    let writer = tokio::spawn(async move {
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
    });
    let failed = |h: &reconcile::Handles| -> u64 {
        h.metrics
            .snapshot()
            .iter()
            .filter(|((_, result), _)| result != "ok")
            .map(|(_, n)| n)
            .sum()
    };
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
