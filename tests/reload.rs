//! Hot reload end to end: a plugins directory watched by the reloader of a running host on the
//! embedded API server, with real plugin files: swaps under load, refusals, ConfigMap-style
//! symlink swaps, rename-into-place, and falling back to the bundled builder.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use slinky_api::{Controller, NodeSet, keys};
use slinky_host::{
    PluginRegistry,
    plugins::{
        BuilderKind, bundled,
        reload::{self, ReloadConfig, ReloadHandle},
    },
    revision::pod_revision,
};
use slinky_tests::{
    TestCluster, default_engine, eventually,
    host::{Host, NS_NAME, apply_example, cluster, pod_ready, scale},
    test_plugin,
};

/// `bytes` with a custom section appended: the same behaviour under another digest.
fn variant(bytes: &[u8], tag: &str) -> Vec<u8> {
    slinky_host::plugins::with_custom_section(bytes, "slinky-test-variant", tag.as_bytes())
}

/// Write `bytes` to `dir/name` the way editors and `kubectl cp` do: a temp file, then a rename.
fn put(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

struct Setup {
    c: TestCluster,
    ns: String,
    plugins: Arc<PluginRegistry>,
    reload: ReloadHandle,
    reload_task: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
    host: Host,
}

async fn setup(replicas: i32, poll_ms: u64) -> Result<Setup> {
    setup_on(cluster(true).await, replicas, poll_ms).await
}

/// [`setup`] on `c`.
async fn setup_on(c: TestCluster, replicas: i32, poll_ms: u64) -> Result<Setup> {
    let ns = c.namespace("reload").await;
    apply_example(&c, &ns, replicas).await?;
    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let dir = tempfile::tempdir()?;
    let (reload, _, reload_task) = reload::start(
        plugins.clone(),
        ReloadConfig {
            dir: dir.path().to_path_buf(),
            poll: Duration::from_millis(poll_ms),
            build: Default::default(),
        },
    )
    .await?;
    let host = Host::start_with(&c, &ns, plugins.clone());
    Ok(Setup {
        c,
        ns,
        plugins,
        reload,
        reload_task,
        dir,
        host,
    })
}

impl Setup {
    async fn stop(self) {
        self.reload_task.abort();
        self.host.stop().await;
    }

    fn active_digest(&self) -> String {
        self.plugins.active(BuilderKind::NodesetPod).digest().to_string()
    }

    async fn wait_active(&self, digest: &str) -> Result<()> {
        let ok = eventually(60, || async { (self.active_digest() == digest).then_some(()) }).await;
        ok.with_context(|| {
            format!(
                "nodeset-pod builder did not become {}; /plugins: {}",
                &digest[..12],
                self.plugins.status_json()
            )
        })
    }

    async fn nodeset_and_controller(&self) -> Result<(NodeSet, Controller)> {
        let nodeset = Api::<NodeSet>::namespaced(self.c.client.clone(), &self.ns)
            .get(NS_NAME)
            .await?;
        let controller = Api::<Controller>::namespaced(self.c.client.clone(), &self.ns)
            .get(&nodeset.spec.controller_ref.name)
            .await?;
        Ok((nodeset, controller))
    }

    /// Wait until `n` pods exist, all Ready, all of the revision the builder with `digest` (the
    /// active one) builds and naming it as their builder.
    async fn rolled_to(&self, n: usize, digest: &str) -> Result<()> {
        let (nodeset, controller) = self.nodeset_and_controller().await?;
        let active = self.plugins.active(BuilderKind::NodesetPod);
        ensure!(
            active.digest() == digest,
            "the active builder is {}",
            active.digest()
        );
        let revision = pod_revision(&active, &nodeset, &controller, &Default::default())?;
        let pods = Api::<Pod>::namespaced(self.c.client.clone(), &self.ns);
        // The NodeSet's pods (not slurmctld's).
        let workers = ListParams::default().labels(&format!("app.kubernetes.io/instance={NS_NAME}"));
        let done = eventually(90, || async {
            let list = pods.list(&workers).await.ok()?;
            let live: Vec<&Pod> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let ok = live.len() == n
                && list.items.len() == n
                && live.iter().all(|p| {
                    p.annotations().get(keys::ANNOTATION_BUILDER_DIGEST) == Some(&format!("sha256:{digest}"))
                        && p.labels().get(keys::LABEL_REVISION_HASH) == Some(&revision)
                        && pod_ready(p)
                });
            ok.then_some(())
        })
        .await;
        if done.is_none() {
            let list = pods.list(&ListParams::default()).await?;
            let seen: Vec<_> = list
                .items
                .iter()
                .map(|p| {
                    (
                        p.name_any(),
                        p.labels().get(keys::LABEL_REVISION_HASH).cloned(),
                        pod_ready(p),
                        p.uid(),
                    )
                })
                .collect();
            let ns = Api::<NodeSet>::namespaced(self.c.client.clone(), &self.ns)
                .get(NS_NAME)
                .await?;
            bail!(
                "pods did not roll to {revision} (builder {}): {seen:?}; replicas {:?}, status {:?}, \
                 pending expectations (creations, deletions) {:?}",
                &digest[..12],
                ns.spec.replicas,
                ns.status,
                self.host
                    .handles
                    .expectations
                    .pending(&ns.metadata.uid.clone().unwrap_or_default()),
            );
        }
        Ok(())
    }
}

/// Every pod version the watch saw, by uid (the first version of each is what its builder made).
fn record_pods(
    c: &TestCluster,
    ns: &str,
) -> (Arc<Mutex<BTreeMap<String, Pod>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let sink = seen.clone();
    let stream = watcher(Api::<Pod>::namespaced(c.client.clone(), ns), Default::default())
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let (Ok(pod), Ok(mut seen)) = (ev, sink.lock())
                && let Some(uid) = pod.uid()
            {
                seen.entry(uid).or_insert(pod);
            }
        }
    });
    (seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_swaps_under_scaling_load_fail_nothing_and_every_pod_names_one_builder() -> Result<()> {
    let s = setup(3, 50).await?;
    let bundled = bundled::NODESET_POD;
    let hostile = std::fs::read(test_plugin("hostile"))?;
    // Four distinct versions (two builders, two digests each), swapped in turn.
    let versions: Vec<(Vec<u8>, &str)> = vec![
        (variant(&hostile, "a"), "hostile"),
        (variant(bundled, "a"), "nodeset-pod"),
        (variant(&hostile, "b"), "hostile"),
        (variant(bundled, "b"), "nodeset-pod"),
    ];
    let names: BTreeMap<String, &str> = versions
        .iter()
        .map(|(b, n)| (slinky_host::plugins::digest(b), *n))
        .chain([(slinky_host::plugins::digest(bundled), "nodeset-pod")])
        .collect();
    let builders: BTreeMap<String, slinky_host::Plugin> = versions
        .iter()
        .map(|(b, _)| b.as_slice())
        .chain([bundled])
        .map(|b| {
            slinky_host::Plugin::load(&default_engine(), b, slinky_host::plugins::PluginSource::Bundled)
                .map(|p| (slinky_host::plugins::digest(b), p))
        })
        .collect::<Result<_, _>>()?;
    s.rolled_to(3, &s.active_digest()).await?;
    let (seen, recorder) = record_pods(&s.c, &s.ns);

    // Continuous load: the NodeSet scales up and down while the builder is swapped.
    let (c2, ns2) = (s.c.client.clone(), s.ns.clone());
    let scaler = tokio::spawn(async move {
        let api = Api::<NodeSet>::namespaced(c2, &ns2);
        for i in 0.. {
            let replicas = [5, 2, 6, 1, 4][i % 5];
            let patch = serde_json::json!({"spec": {"replicas": replicas}});
            let _ = api
                .patch(
                    NS_NAME,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(patch),
                )
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut last = String::new();
    for i in 0..20 {
        let (bytes, _) = &versions[i % versions.len()];
        put(s.dir.path(), "nodeset.wasm", bytes)?;
        last = slinky_host::plugins::digest(bytes);
        s.wait_active(&last).await.with_context(|| format!("swap {i}"))?;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    scaler.abort();
    scale(&s.c, &s.ns, 3).await?;
    s.rolled_to(3, &last).await?;
    recorder.abort();

    assert_eq!(
        s.plugins.swaps(BuilderKind::NodesetPod),
        20,
        "one swap per new file version"
    );
    assert_eq!(s.plugins.reloads.results_of("swapped"), 20);
    assert_eq!(s.plugins.reloads.results_of("refused"), 0);
    let metrics = &s.host.handles.metrics;
    let failed: Vec<_> = metrics
        .snapshot()
        .into_iter()
        .filter(|((_, r), _)| r != "ok")
        .collect();
    assert!(failed.is_empty(), "failed reconciles: {failed:?}");
    assert_eq!(
        metrics.plugin_failures.get(),
        0,
        "no builder call failed across the swaps"
    );

    // Every pod ever created was built by exactly one version: its builder name, digest and
    // revision all name the same plugin.
    let (nodeset, controller) = s.nodeset_and_controller().await?;
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    ensure!(seen.len() > 10, "the load created only {} pods", seen.len());
    let mut digests = BTreeSet::new();
    for pod in seen.values() {
        let a = pod.annotations();
        let digest = a
            .get(keys::ANNOTATION_BUILDER_DIGEST)
            .and_then(|d| d.strip_prefix("sha256:"))
            .with_context(|| format!("{} has no builder digest", pod.name_any()))?;
        let name = names
            .get(digest)
            .with_context(|| format!("{} was built by an unknown digest {digest}", pod.name_any()))?;
        assert_eq!(
            a.get(keys::ANNOTATION_BUILDER)
                .map(|b| b.split('@').next().unwrap_or_default()),
            Some(*name),
            "{}: builder name and digest disagree",
            pod.name_any()
        );
        let builder = builders.get(digest).context("a builder of the test")?;
        assert_eq!(
            pod.labels().get(keys::LABEL_REVISION_HASH),
            Some(&pod_revision(
                builder,
                &nodeset,
                &controller,
                &Default::default()
            )?),
            "{}: its revision is not what its builder builds",
            pod.name_any()
        );
        digests.insert(digest.to_string());
    }
    ensure!(
        digests.len() >= 3,
        "pods of only {} builder versions seen",
        digests.len()
    );
    s.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broken_versions_are_refused_while_the_previous_one_serves_and_a_fix_is_picked_up() -> Result<()> {
    let s = setup(2, 50).await?;
    let hostile = variant(&std::fs::read(test_plugin("hostile"))?, "good");
    put(s.dir.path(), "mine.wasm", &hostile)?;
    let good = slinky_host::plugins::digest(&hostile);
    s.wait_active(&good).await?;
    s.rolled_to(2, &good).await?;

    let raw = std::fs::read(test_plugin("raw"))?;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not wasm", b"#!/bin/sh\necho hi\n".to_vec(), "not a wasm file"),
        (
            "half written",
            hostile[..hostile.len() / 2].to_vec(),
            "not a loadable wasm component",
        ),
        (
            "trapping describe",
            std::fs::read(slinky_tests::wat("trapping-describe"))?,
            "describe",
        ),
        (
            "another contract version",
            std::fs::read(slinky_tests::wat("contract-9.9"))?,
            "contract version 9.9",
        ),
        // `raw` builds whatever its input asks for; the example inputs ask nothing, so its smoke
        // build fails.
        ("failing smoke build", raw, "build-"),
    ];
    for (what, bytes, expect) in cases {
        let refused_before = s.plugins.reloads.results_of("refused");
        put(s.dir.path(), "mine.wasm", &bytes)?;
        let report = s.reload.rescan().await.context("reloader stopped")?;
        let refusal = match report.refused.first() {
            Some(r) => r.clone(),
            // The poll may have beaten the forced rescan to it.
            None => s
                .plugins
                .last_refused(BuilderKind::NodesetPod)
                .with_context(|| format!("{what}: not refused; report {report:?}"))?,
        };
        assert!(
            refusal.reason.contains(expect),
            "{what}: the reason `{}` does not say `{expect}`",
            refusal.reason
        );
        assert_eq!(
            s.plugins.reloads.results_of("refused"),
            refused_before + 1,
            "{what}: refused once"
        );
        assert_eq!(
            s.active_digest(),
            good,
            "{what}: the previous version keeps serving"
        );
        assert_eq!(
            s.plugins.last_refused(BuilderKind::NodesetPod).map(|r| r.reason),
            Some(refusal.reason.clone()),
            "{what}: /plugins shows the refusal for nodeset-pod"
        );
        // The same bytes are not retried at every poll.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            s.plugins.reloads.results_of("refused"),
            refused_before + 1,
            "{what}: retried"
        );
    }
    let status = s.plugins.status_json();
    assert_eq!(status["files"][0]["state"], "refused", "{status}");
    assert_eq!(status["builders"][1]["active"]["digest"], good.as_str());

    // Fixing the file is picked up.
    let fixed = variant(&hostile, "fixed");
    put(s.dir.path(), "mine.wasm", &fixed)?;
    let fixed_digest = slinky_host::plugins::digest(&fixed);
    s.wait_active(&fixed_digest).await?;
    s.rolled_to(2, &fixed_digest).await?;
    s.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn configmap_symlink_swaps_and_renames_are_picked_up_once_and_removal_falls_back() -> Result<()> {
    let s = setup(2, 50).await?;
    let bundled_digest = s.active_digest();
    let dir = s.dir.path();
    let hostile = std::fs::read(test_plugin("hostile"))?;
    let v1 = variant(&hostile, "cm1");
    let v2 = variant(&hostile, "cm2");

    // The layout kubelet makes for a ConfigMap volume: a timestamped directory, `..data`
    // pointing at it, and the keys as symlinks through `..data`.
    let ts1 = dir.join("..2026_11_22_10_00_00.000000001");
    std::fs::create_dir(&ts1)?;
    std::fs::write(ts1.join("nodeset.wasm"), &v1)?;
    std::os::unix::fs::symlink(ts1.file_name().context("name")?, dir.join("..data"))?;
    std::os::unix::fs::symlink("..data/nodeset.wasm", dir.join("nodeset.wasm"))?;
    let d1 = slinky_host::plugins::digest(&v1);
    s.wait_active(&d1).await?;
    assert_eq!(s.plugins.swaps(BuilderKind::NodesetPod), 1);

    // For a moment the key's symlink dangles: the serving version stays, nothing falls back.
    std::fs::remove_file(dir.join("..data"))?;
    let report = s.reload.rescan().await.context("reloader stopped")?;
    assert!(report.swapped.is_empty(), "{report:?}");
    assert_eq!(s.active_digest(), d1, "a dangling symlink made it fall back");
    std::os::unix::fs::symlink(ts1.file_name().context("name")?, dir.join("..data"))?;

    // An update: a new timestamped directory, `..data_tmp` → it, renamed over `..data`, the
    // old directory removed.
    let ts2 = dir.join("..2026_11_22_10_05_00.000000002");
    std::fs::create_dir(&ts2)?;
    std::fs::write(ts2.join("nodeset.wasm"), &v2)?;
    std::os::unix::fs::symlink(ts2.file_name().context("name")?, dir.join("..data_tmp"))?;
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data"))?;
    std::fs::remove_dir_all(&ts1)?;
    let d2 = slinky_host::plugins::digest(&v2);
    s.wait_active(&d2).await?;
    s.rolled_to(2, &d2).await?;
    // Picked up exactly once: no swap, refusal or re-read of the same bytes afterwards.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.plugins.swaps(BuilderKind::NodesetPod), 2);
    assert_eq!(s.plugins.reloads.results_of("refused"), 0);
    assert_eq!(s.plugins.reloads.results_of("unchanged"), 0);

    // Rename into place of a plain file (an editor's temp file is ignored until then).
    for name in ["..data", "nodeset.wasm"] {
        std::fs::remove_file(dir.join(name))?;
    }
    std::fs::remove_dir_all(&ts2)?;
    s.wait_active(&bundled_digest).await?;
    assert_eq!(
        s.plugins.swaps(BuilderKind::NodesetPod),
        3,
        "removal fell back once"
    );
    let v3 = variant(&hostile, "renamed");
    std::fs::write(dir.join("mine.wasm.tmp"), &v3[..1000])?;
    std::fs::write(dir.join(".mine.wasm.swp"), &v3[..1000])?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.active_digest(), bundled_digest, "temp files are ignored");
    std::fs::write(dir.join("mine.wasm.tmp"), &v3)?;
    std::fs::rename(dir.join("mine.wasm.tmp"), dir.join("mine.wasm"))?;
    let d3 = slinky_host::plugins::digest(&v3);
    s.wait_active(&d3).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        s.plugins.swaps(BuilderKind::NodesetPod),
        4,
        "the rename was picked up once"
    );

    // Removing the override falls back to the bundled builder and rolls the pods back.
    std::fs::remove_file(dir.join("mine.wasm"))?;
    s.wait_active(&bundled_digest).await?;
    s.rolled_to(2, &bundled_digest).await?;
    assert_eq!(s.plugins.swaps(BuilderKind::NodesetPod), 5);
    assert_eq!(
        s.plugins.active(BuilderKind::NodesetPod).source().to_string(),
        "bundled"
    );
    s.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_files_building_one_kind_conflict_and_the_serving_one_stays() -> Result<()> {
    let s = setup(1, 50).await?;
    let hostile = std::fs::read(test_plugin("hostile"))?;
    let first = variant(&hostile, "first");
    put(s.dir.path(), "a.wasm", &first)?;
    let d1 = slinky_host::plugins::digest(&first);
    s.wait_active(&d1).await?;
    // `z.wasm` sorts after `a.wasm`, `0.wasm` before it: neither takes over.
    for name in ["z.wasm", "0.wasm"] {
        put(s.dir.path(), name, &variant(&hostile, name))?;
        let report = s.reload.rescan().await.context("reloader stopped")?;
        let status = s.plugins.status_json();
        assert_eq!(s.active_digest(), d1, "{name} took over: {report:?}");
        let refusal = s
            .plugins
            .last_refused(BuilderKind::NodesetPod)
            .context("no refusal recorded")?;
        assert!(
            refusal.source.ends_with(name) && refusal.reason.contains("a.wasm also builds nodeset-pod"),
            "{refusal:?} / {status}"
        );
        std::fs::remove_file(s.dir.path().join(name))?;
    }
    // The Controller's Service builder is untouched by all this.
    assert_eq!(s.plugins.swaps(BuilderKind::ControllerService), 0);

    // A new controller-service builder: the Service is re-applied with its digest, and the
    // Controller gets an Event naming it.
    let svc_builder = variant(bundled::CONTROLLER_SERVICE, "svc");
    put(s.dir.path(), "service.wasm", &svc_builder)?;
    let d = slinky_host::plugins::digest(&svc_builder);
    let services = Api::<k8s_openapi::api::core::v1::Service>::namespaced(s.c.client.clone(), &s.ns);
    let want = format!("sha256:{d}");
    let applied = eventually(30, || async {
        let svc = services.get("slurm-controller").await.ok()?;
        (svc.annotations().get(keys::ANNOTATION_BUILDER_DIGEST) == Some(&want)).then_some(())
    })
    .await;
    ensure!(
        applied.is_some(),
        "the Service was not re-applied by the new builder"
    );
    let note = builder_changed_event(&s, "Controller", &d).await?;
    assert!(
        note.contains("controller-service builder is now controller-service@0.1.0"),
        "{note}"
    );
    let note = builder_changed_event(&s, "NodeSet", &d1).await?;
    assert!(
        note.contains("nodeset-pod builder is now hostile@0.1.0"),
        "{note}"
    );
    s.stop().await;
    Ok(())
}

/// The `/plugins` and `POST /plugins/reload` endpoints and `slinky-host plugin reload`, against
/// the real binary's HTTP server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_endpoint_and_plugin_reload_command() -> Result<()> {
    let s = setup(1, 60_000).await?;
    let any: std::net::SocketAddr = "127.0.0.1:0".parse()?;
    let endpoints =
        slinky_host::serve::Endpoints::new(s.host.handles.clone(), s.plugins.clone(), Some(s.reload.clone()));
    let (http, addr) =
        slinky_host::serve::serve(any, slinky_host::serve::Listener::Admin, endpoints.clone()).await?;
    let (metrics_http, metrics_addr) =
        slinky_host::serve::serve(any, slinky_host::serve::Listener::Metrics, endpoints).await?;
    let hostile = variant(&std::fs::read(test_plugin("hostile"))?, "cli");
    put(s.dir.path(), "cli.wasm", &hostile)?;
    // The poll is a minute: only the command makes it load now.
    let addr_s = addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        slinky_tests::run(&["plugin", "reload", "--admin-addr", &addr_s])
    })
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("swapped: nodeset-pod: hostile@"), "{stdout}");
    assert_eq!(s.active_digest(), slinky_host::plugins::digest(&hostile));

    std::fs::write(s.dir.path().join("bad.wasm"), b"nope")?;
    let addr_s = addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        slinky_tests::run(&["plugin", "reload", "--admin-addr", &addr_s])
    })
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bad.wasm") && stderr.contains("not a wasm file"),
        "{stderr}"
    );

    let body = slinky_tests::http_get(addr, "/plugins").await?;
    let v: serde_json::Value = serde_json::from_str(&body).with_context(|| body.clone())?;
    assert_eq!(v["builders"][1]["kind"], "nodeset-pod");
    assert_eq!(v["builders"][1]["active"]["name"], "hostile");
    assert_eq!(
        v["builders"][1]["active"]["source"],
        s.dir.path().join("cli.wasm").display().to_string()
    );
    assert_eq!(v["builders"][0]["active"]["source"], "bundled");
    let states: BTreeMap<String, String> = v["files"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["path"].as_str().unwrap_or_default().to_string(),
                f["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states.values().cloned().collect::<Vec<_>>(),
        ["refused", "serving"],
        "{v}"
    );
    let metrics = slinky_tests::http_get(metrics_addr, "/metrics").await?;
    assert!(
        metrics.contains("slinky_host_plugin_reloads_total{result=\"swapped\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("slinky_host_plugin_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("slinky_host_plugin_reload_stage_seconds_count{stage=\"compile\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("slinky_host_builder_info{kind=\"nodeset-pod\",name=\"hostile\""),
        "{metrics}"
    );
    http.abort();
    metrics_http.abort();
    s.stop().await;
    Ok(())
}

/// The note of the `BuilderChanged` Event on the `kind` parent naming builder digest `digest`.
async fn builder_changed_event(s: &Setup, kind: &str, digest: &str) -> Result<String> {
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(s.c.client.clone(), &s.ns);
    let found = eventually(30, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let note = e.note.clone().unwrap_or_default();
            (e.reason.as_deref() == Some("BuilderChanged")
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind)
                && note.contains(&digest[..12]))
            .then_some(note)
        })
    })
    .await;
    found.with_context(|| format!("no BuilderChanged Event on the {kind} for {}", &digest[..12]))
}

/// `*.wasm.gz` (what fits a ConfigMap) loads like the plain component; a corrupt one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gzipped_components_load_and_corrupt_ones_are_refused() -> Result<()> {
    let s = setup(1, 50).await?;
    let plain = variant(&std::fs::read(test_plugin("hostile"))?, "gz");
    let gz = std::process::Command::new("gzip")
        .arg("-c")
        .stdin(std::fs::File::open({
            let p = s.dir.path().join(".plain");
            std::fs::write(&p, &plain)?;
            p
        })?)
        .output()?;
    ensure!(gz.status.success(), "gzip failed");
    ensure!(
        gz.stdout.len() * 2 < plain.len(),
        "gzip should at least halve a component"
    );
    put(s.dir.path(), "small.wasm.gz", &gz.stdout)?;
    // The digest is the component's, whether it arrived gzipped or not.
    s.wait_active(&slinky_host::plugins::digest(&plain)).await?;
    // `--plugin`, `render` and `plugin check` read a gzipped file too.
    let loaded = slinky_host::Plugin::load_file(&default_engine(), &s.dir.path().join("small.wasm.gz"))?;
    assert_eq!(loaded.digest(), slinky_host::plugins::digest(&plain));
    put(s.dir.path(), "small.wasm.gz", &gz.stdout[..gz.stdout.len() / 2])?;
    let report = s.reload.rescan().await.context("reloader stopped")?;
    let refusal = report
        .refused
        .first()
        .cloned()
        .or_else(|| s.plugins.last_refused(BuilderKind::NodesetPod))
        .context("not refused")?;
    ensure!(refusal.reason.contains("not a valid gzip file"), "{refusal:?}");
    assert_eq!(s.active_digest(), slinky_host::plugins::digest(&plain));
    s.stop().await;
    Ok(())
}

/// A new `controller-children` version that builds the example inputs into fewer children (here
/// without slurmctld's StatefulSet) is refused with the children it leaves out named; the
/// serving version keeps serving and the StatefulSet stays in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_children_version_leaving_out_a_child_is_refused() -> Result<()> {
    let s = setup(1, 50).await?;
    let statefulsets = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(s.c.client.clone(), &s.ns);
    let uid = eventually(60, || async {
        statefulsets
            .get_opt("slurm-controller")
            .await
            .ok()
            .flatten()?
            .uid()
    })
    .await
    .context("no slurmctld StatefulSet")?;
    let serving = s
        .plugins
        .active(BuilderKind::ControllerChildren)
        .digest()
        .to_string();
    put(
        s.dir.path(),
        "children.wasm",
        &std::fs::read(test_plugin("partial_children"))?,
    )?;
    let report = s.reload.rescan().await.context("reloader stopped")?;
    let refusal = match s.plugins.last_refused(BuilderKind::ControllerChildren) {
        Some(r) => r,
        None => {
            // The file may need one more scan to settle.
            let report2 = s.reload.rescan().await.context("reloader stopped")?;
            s.plugins
                .last_refused(BuilderKind::ControllerChildren)
                .with_context(|| format!("not refused: {report:?} / {report2:?}"))?
        }
    };
    ensure!(
        refusal.reason.contains("missing: [StatefulSet slurm-controller]"),
        "{refusal:?}"
    );
    assert_eq!(
        s.plugins.active(BuilderKind::ControllerChildren).digest(),
        serving,
        "the serving version keeps serving"
    );
    // Two resyncs of the Controller and the NodeSet (and more): the StatefulSet is not pruned.
    s.host.passes_later(6).await?;
    let still = statefulsets
        .get_opt("slurm-controller")
        .await?
        .and_then(|s| s.uid());
    assert_eq!(still, Some(uid), "the StatefulSet stays");
    s.stop().await;
    Ok(())
}

/// Every pod of the namespace: name → UID.
async fn pod_uids(c: &TestCluster, ns: &str) -> Result<BTreeMap<String, String>> {
    let list = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

/// Every StatefulSet of the namespace: name → (generation, builder digest annotation).
async fn statefulsets(c: &TestCluster, ns: &str) -> Result<BTreeMap<String, (i64, String)>> {
    let list = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .iter()
        .map(|s| {
            let digest = s
                .annotations()
                .get(keys::ANNOTATION_BUILDER_DIGEST)
                .cloned()
                .unwrap_or_default();
            (s.name_any(), (s.metadata.generation.unwrap_or(0), digest))
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builders_with_the_same_output_restart_nothing_and_one_adding_an_annotation_rolls_only_the_workers()
-> Result<()> {
    // The simulated StatefulSet controller makes slurmctld's pod.
    let s = setup_on(slinky_tests::host::cluster_with_statefulsets().await, 3, 50).await?;
    s.rolled_to(3, &s.active_digest()).await?;
    // A NodeSet annotation the bundled builder copies onto pods and the hostile builder reads.
    Api::<NodeSet>::namespaced(s.c.client.clone(), &s.ns)
        .patch(
            NS_NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!(
                {"metadata": {"annotations": {"hostile.test/behaviour": "count"}}})),
        )
        .await?;
    let ctld = eventually(60, || async {
        let sets = statefulsets(&s.c, &s.ns).await.ok()?;
        (!sets.is_empty()).then_some(sets)
    })
    .await
    .context("the Controller's StatefulSet was not made")?;
    // The workers and the StatefulSets' pods (slurmctld).
    let before = eventually(60, || async {
        let pods = pod_uids(&s.c, &s.ns).await.ok()?;
        (pods.len() > 3).then_some(pods)
    })
    .await
    .context("slurmctld's pod was not made")?;

    // Byte-different builders of the same objects: the workers' and the Controller's.
    let pod_variant = variant(bundled::NODESET_POD, "same-output");
    let ctld_variant = variant(bundled::CONTROLLER_CHILDREN, "same-output");
    put(s.dir.path(), "workers.wasm", &pod_variant)?;
    put(s.dir.path(), "controller.wasm", &ctld_variant)?;
    let pod_digest = slinky_host::plugins::digest(&pod_variant);
    let ctld_digest = format!("sha256:{}", slinky_host::plugins::digest(&ctld_variant));
    s.wait_active(&pod_digest).await?;
    // Provenance is patched in place: the pods name the new builder, the StatefulSet too.
    s.rolled_to(3, &pod_digest).await?;
    let patched = eventually(60, || async {
        let sets = statefulsets(&s.c, &s.ns).await.ok()?;
        sets.values().all(|(_, d)| *d == ctld_digest).then_some(sets)
    })
    .await
    .with_context(|| format!("the StatefulSets do not name {ctld_digest}"))?;
    let after = pod_uids(&s.c, &s.ns).await?;
    assert_eq!(after, before, "a builder with the same output restarts no pod");
    for (name, (generation, _)) in &ctld {
        assert_eq!(
            patched.get(name).map(|p| p.0),
            Some(*generation),
            "StatefulSet {name}: its template did not change"
        );
    }

    // A builder whose pods carry one more annotation: the workers roll, nothing else.
    let hostile = variant(&std::fs::read(test_plugin("hostile"))?, "counts");
    put(s.dir.path(), "workers.wasm", &hostile)?;
    let hostile_digest = slinky_host::plugins::digest(&hostile);
    s.wait_active(&hostile_digest).await?;
    s.rolled_to(3, &hostile_digest).await?;
    let rolled = pod_uids(&s.c, &s.ns).await?;
    for (name, uid) in &before {
        let worker = name.starts_with(&format!("{NS_NAME}-"));
        assert_eq!(
            rolled.get(name) != Some(uid),
            worker,
            "{name}: {}",
            if worker {
                "a worker rolls"
            } else {
                "not a worker: it stays"
            }
        );
    }
    let pods = Api::<Pod>::namespaced(s.c.client.clone(), &s.ns)
        .list(&ListParams::default())
        .await?;
    for p in pods
        .items
        .iter()
        .filter(|p| p.name_any().starts_with(&format!("{NS_NAME}-")))
    {
        assert_eq!(
            p.annotations().get("hostile.test/calls").map(String::as_str),
            Some("1"),
            "{}: built by the new builder",
            p.name_any()
        );
    }
    s.stop().await;
    Ok(())
}

/// A builder that fails for a NodeSet (its probe cannot be built) leaves the last revision in
/// force: the NodeSet still scales down (no Slurm here: pods go at once), and the failure is its
/// condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nodeset_whose_builder_fails_still_scales_down() -> Result<()> {
    let s = setup(3, 50).await?;
    let hostile = variant(&std::fs::read(test_plugin("hostile"))?, "fails");
    put(s.dir.path(), "nodeset.wasm", &hostile)?;
    let digest = slinky_host::plugins::digest(&hostile);
    s.wait_active(&digest).await?;
    s.rolled_to(3, &digest).await?;
    Api::<NodeSet>::namespaced(s.c.client.clone(), &s.ns)
        .patch(
            NS_NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!(
                {"metadata": {"annotations": {"hostile.test/behaviour": "error"}}})),
        )
        .await?;
    let failing = eventually(60, || async {
        let cond = slinky_tests::host::nodeset_condition(&s.c, &s.ns, "InvalidSpec")
            .await
            .ok()??;
        (cond.status == "True").then_some(cond.message)
    })
    .await
    .context("the builder's failure is not the NodeSet's condition")?;
    scale(&s.c, &s.ns, 1).await?;
    let workers = ListParams::default().labels(&format!("app.kubernetes.io/instance={NS_NAME}"));
    let pods = Api::<Pod>::namespaced(s.c.client.clone(), &s.ns);
    let scaled = eventually(60, || async {
        let list = pods.list(&workers).await.ok()?;
        (list.items.len() == 1).then_some(())
    })
    .await;
    ensure!(
        scaled.is_some(),
        "the NodeSet did not scale down while its builder failed ({failing}): {:?}",
        pods.list(&workers)
            .await?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    s.stop().await;
    Ok(())
}
