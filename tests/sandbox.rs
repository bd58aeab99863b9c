//! Hostile guests against the real plugin runtime: every limit in its obeyed and violated case,
//! typed errors, the output policy, load-time refusals, and purity (no state survives a call,
//! the host's input is untouched).

use slinky_host::plugins::Builder as _;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use slinky_api::{Controller, NodeSet};
use slinky_host::{
    Plugin, PluginError,
    cmd::render,
    plugins::{
        BuildContext, BuilderKind, CompileSource, EngineHandle, PluginSource, PodIdentity, RuntimeConfig,
        Tier, Tiering, TrapCause,
    },
};
use slinky_tests::{default_engine, engine, example, test_plugin, wat};

fn example_objects() -> Result<(NodeSet, Controller)> {
    let manifests = render::read_manifests(&[example("slurm-cluster.yaml")])?;
    let mut nodeset = None;
    let mut controller = None;
    for m in manifests {
        match m.parent {
            render::Parent::Controller(c) => controller = Some(*c),
            render::Parent::NodeSet(n) => nodeset = Some(*n),
            _ => {}
        }
    }
    let mut nodeset = nodeset.context("example NodeSet")?;
    nodeset.metadata.uid = Some("0a1b2c3d-nodeset".into());
    Ok((nodeset, controller.context("example Controller")?))
}

fn with_behaviour(mut nodeset: NodeSet, behaviour: &str) -> NodeSet {
    nodeset
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("hostile.test/behaviour".into(), behaviour.into());
    nodeset
}

fn with_raw_output(mut nodeset: NodeSet, output: &str) -> NodeSet {
    nodeset
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("raw.test/output".into(), output.into());
    nodeset
}

fn identity(nodeset: &NodeSet) -> PodIdentity {
    PodIdentity::for_ordinal(nodeset, 0, "rev0000001")
}

fn build(
    plugin: &Plugin,
    nodeset: &NodeSet,
    controller: &Controller,
) -> Result<k8s_openapi::api::core::v1::Pod, PluginError> {
    plugin.build_pod(&BuildContext::default(), nodeset, controller, &identity(nodeset))
}

fn load(engine: &std::sync::Arc<slinky_host::plugins::EngineHandle>, name: &str) -> Result<Plugin> {
    Ok(Plugin::load_file(engine, &test_plugin(name))?)
}

#[test]
fn an_infinite_loop_is_stopped_by_the_deadline_and_a_bounded_one_is_not() -> Result<()> {
    let engine = engine(Duration::from_millis(300), 64);
    let plugin = load(&engine, "hostile")?;
    let (nodeset, controller) = example_objects()?;

    let started = std::time::Instant::now();
    match build(&plugin, &with_behaviour(nodeset.clone(), "loop"), &controller) {
        Err(PluginError::Trap {
            cause: TrapCause::Deadline(d),
            plugin,
            call,
            ..
        }) => {
            assert_eq!(d, Duration::from_millis(300));
            assert_eq!((plugin.as_str(), call), ("hostile@0.1.0", "build-pod"));
        }
        other => bail!("expected a deadline trap, got {other:?}"),
    }
    // Stopped near the deadline (generous bound for a loaded CI machine; not a timing assertion
    // on performance, only that the loop did not run forever).
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "the loop ran for {:?}",
        started.elapsed()
    );

    // Obeyed: a few million iterations finish well within the deadline.
    let pod = build(&plugin, &with_behaviour(nodeset.clone(), "spin:2"), &controller)?;
    assert_eq!(pod.metadata.name.as_deref(), Some("slurm-worker-slinky-0"));

    // The plugin keeps serving after a trap: nothing of the trapped call survives.
    build(&plugin, &nodeset, &controller)?;
    Ok(())
}

#[test]
fn a_memory_bomb_is_stopped_by_the_cap_and_a_modest_allocation_is_not() -> Result<()> {
    let engine = engine(Duration::from_secs(5), 32);
    let plugin = load(&engine, "hostile")?;
    let (nodeset, controller) = example_objects()?;
    match build(
        &plugin,
        &with_behaviour(nodeset.clone(), "alloc:256"),
        &controller,
    ) {
        Err(
            e @ PluginError::Trap {
                cause: TrapCause::MemoryCap(_),
                ..
            },
        ) => {
            assert_eq!(e.metric_label(), "memory_cap");
            assert!(e.to_string().contains("memory cap of 32 MiB"), "{e}");
        }
        other => bail!("expected the memory cap, got {other:?}"),
    }
    let pod = build(&plugin, &with_behaviour(nodeset, "alloc:8"), &controller)?;
    assert!(pod.spec.is_some());
    Ok(())
}

#[test]
fn a_panic_becomes_a_typed_error_with_the_panic_message() -> Result<()> {
    let engine = default_engine();
    let plugin = load(&engine, "hostile")?;
    let (nodeset, controller) = example_objects()?;
    match build(&plugin, &with_behaviour(nodeset, "panic"), &controller) {
        Err(PluginError::Trap {
            cause: TrapCause::Trap(_),
            stderr,
            call,
            ..
        }) => {
            assert_eq!(call, "build-pod");
            assert!(
                stderr.contains("hostile plugin panicked on purpose"),
                "stderr: {stderr}"
            );
        }
        other => bail!("expected a trap, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_builder_error_is_reported_as_the_builder_said_it() -> Result<()> {
    let engine = default_engine();
    let plugin = load(&engine, "hostile")?;
    let (nodeset, controller) = example_objects()?;
    match build(&plugin, &with_behaviour(nodeset, "error"), &controller) {
        Err(PluginError::Build {
            error: slinky_host::plugins::GuestError::InvalidInput(m),
            ..
        }) => {
            assert!(m.contains("spec.hostile"), "{m}");
        }
        other => bail!("expected the builder's error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn output_that_breaks_the_policy_is_refused() -> Result<()> {
    let engine = default_engine();
    let hostile = load(&engine, "hostile")?;
    let raw = load(&engine, "raw")?;
    let (nodeset, controller) = example_objects()?;
    let cases = [
        (
            &hostile,
            with_behaviour(nodeset.clone(), "other-namespace"),
            "namespace \"kube-system\"",
        ),
        (
            &hostile,
            with_behaviour(nodeset.clone(), "wrong-name"),
            "named \"impostor\"",
        ),
        (
            &hostile,
            with_behaviour(nodeset.clone(), "no-selector"),
            "missing the selector label app.kubernetes.io/name=slurmd",
        ),
        (
            &raw,
            with_raw_output(
                nodeset.clone(),
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"slurm-worker-slinky-0"}}"#,
            ),
            "expected apiVersion v1 kind Pod, got apiVersion v1 kind ConfigMap",
        ),
        (
            &raw,
            with_raw_output(nodeset.clone(), "this is not json"),
            "the output is not JSON",
        ),
        (
            &raw,
            with_raw_output(
                nodeset.clone(),
                r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"slurm-worker-slinky-0","uid":"x"},"spec":{"containers":[{"name":"c"}]}}"#,
            ),
            "metadata.uid is set by the API server",
        ),
        (
            &raw,
            with_raw_output(
                nodeset.clone(),
                r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"slurm-worker-slinky-0",
                "labels":{"app.kubernetes.io/name":"slurmd","app.kubernetes.io/instance":"slurm-worker-slinky"}},
                "spec":{"containers":[{"name":"slurmd"}]}}"#,
            ),
            "spec.containers[name=slurmd].image is required",
        ),
    ];
    for (plugin, input, want) in cases {
        match build(plugin, &input, &controller) {
            Err(PluginError::Rejected { reason, .. }) => {
                ensure!(reason.contains(want), "expected {want:?}, got {reason:?}")
            }
            other => bail!("expected a refusal containing {want:?}, got {other:?}"),
        }
    }
    // A Controller's Service must be named `<controller>-controller`: a builder cannot make the
    // host apply (and own) a Service of another name.
    let mut impostor = controller.clone();
    impostor.metadata.annotations.get_or_insert_default().insert(
        "raw.test/output".into(),
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"impostor"},
        "spec":{"selector":{"app.kubernetes.io/name":"slurmctld","app.kubernetes.io/instance":"slurm"}}}"#
            .into(),
    );
    match raw.build_service(&BuildContext::default(), &impostor) {
        Err(PluginError::Rejected { reason, .. }) => {
            ensure!(reason.contains("must be named \"slurm-controller\""), "{reason}")
        }
        other => bail!("a Service named impostor was not refused: {other:?}"),
    }
    // The obeyed case: a well-formed pod from the raw plugin passes, and the host sets the owner
    // reference, builder annotations and revision label itself, whatever the plugin said.
    let good = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"slurm-worker-slinky-0",
        "labels":{"app.kubernetes.io/name":"slurmd","app.kubernetes.io/instance":"slurm-worker-slinky","controller-revision-hash":"forged"},
        "annotations":{"slinky.slurm.net/builder":"forged"},
        "ownerReferences":[{"apiVersion":"v1","kind":"Secret","name":"x","uid":"y"}]},
        "spec":{"automountServiceAccountToken":false,"containers":[{"name":"slurmd","image":"img"}]}}"#;
    let pod = build(&raw, &with_raw_output(nodeset.clone(), good), &controller)?;
    let meta = &pod.metadata;
    assert_eq!(
        meta.namespace.as_deref(),
        Some("slurm"),
        "namespace defaulted to the parent's"
    );
    let owners = meta.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str(),
            owners[0].controller
        ),
        ("NodeSet", "slurm-worker-slinky", "0a1b2c3d-nodeset", Some(true))
    );
    assert_eq!(owners[0].api_version, "slinky.slurm.net/v1beta1");
    let ann = meta.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("slinky.slurm.net/builder").map(String::as_str),
        Some("raw@0.0.1")
    );
    let labels = meta.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("controller-revision-hash").map(String::as_str),
        Some("rev0000001")
    );
    Ok(())
}

#[test]
fn broken_plugins_are_refused_at_load_with_the_reason() -> Result<()> {
    let engine = default_engine();
    let dir = tempfile::tempdir()?;
    let not_wasm = dir.path().join("notes.wasm");
    std::fs::write(&not_wasm, "hello")?;
    let half = dir.path().join("half.wasm");
    let bytes = std::fs::read(test_plugin("hostile"))?;
    std::fs::write(&half, &bytes[..bytes.len() / 2])?;

    let cases = [
        (not_wasm, "not a wasm file"),
        (half, "not a loadable wasm component"),
        (
            wat("no-describe"),
            "does not export `slinky:builder/plugin@0.3.0`",
        ),
        (wat("contract-9.9"), "built against contract version 9.9.0"),
        (
            wat("mixed-versions"),
            "also exports slinky:builder/restapi-children@0.3.0: a plugin speaks one contract version",
        ),
        (wat("trapping-describe"), "describe trapped"),
    ];
    for (path, want) in cases {
        match Plugin::load_file(&engine, &path) {
            Err(e) => ensure!(
                e.to_string().contains(want),
                "{}: expected {want:?}, got {e}",
                path.display()
            ),
            Ok(p) => bail!("{} loaded as {p:?}; it must be refused", path.display()),
        }
    }
    // Obeyed: a good plugin from the same engine loads and describes itself.
    let plugin = load(&engine, "hostile")?;
    assert_eq!(plugin.info().name, "hostile");
    assert_eq!(plugin.info().contract_version, "0.3.0");
    assert_eq!(plugin.source(), &PluginSource::File(test_plugin("hostile")));
    Ok(())
}

#[test]
fn builders_are_pure_and_cannot_touch_the_hosts_objects() -> Result<()> {
    let engine = default_engine();
    let registry = slinky_host::PluginRegistry::new(&engine, &[])?;
    let plugin = registry.active(slinky_host::plugins::BuilderKind::NodesetPod);
    let (nodeset, controller) = example_objects()?;
    let (before_ns, before_ctl) = (
        serde_json::to_string(&nodeset)?,
        serde_json::to_string(&controller)?,
    );

    let first = serde_json::to_string(&build(&plugin, &nodeset, &controller)?)?;
    let second = serde_json::to_string(&build(&plugin, &nodeset, &controller)?)?;
    assert_eq!(first, second, "the same input gives byte-identical output");
    assert_eq!(
        serde_json::to_string(&nodeset)?,
        before_ns,
        "the host's NodeSet is unchanged"
    );
    assert_eq!(
        serde_json::to_string(&controller)?,
        before_ctl,
        "the host's Controller is unchanged"
    );

    // A guest writing to stdout/stderr does not disturb its output either.
    let hostile = load(&engine, "hostile")?;
    let printed = build(&hostile, &with_behaviour(nodeset.clone(), "print"), &controller)?;
    assert_eq!(printed.metadata.name.as_deref(), Some("slurm-worker-slinky-0"));
    Ok(())
}

/// The `log` import: a guest's line reaches the host's log with the plugin's name, version and
/// digest and is counted by level; a flood is cut (32 lines a call, ~50 a second per plugin),
/// the rest counted as dropped, and the build is not disturbed.
#[test]
fn guest_log_lines_reach_the_host_labelled_and_bounded() -> Result<()> {
    use slinky_host::plugins::guest_log::{LINES_PER_CALL, Level};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
        .finish();
    let engine = engine(Duration::from_secs(5), 64);
    let hostile = load(&engine, "hostile")?;
    let (nodeset, controller) = example_objects()?;
    let (said, flooded) = {
        let _guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
        let said = build(&hostile, &with_behaviour(nodeset.clone(), "log"), &controller)?;
        let flooded = build(
            &hostile,
            &with_behaviour(nodeset.clone(), "log-flood:1000"),
            &controller,
        )?;
        (said, flooded)
    };
    for pod in [said, flooded] {
        assert_eq!(pod.metadata.name.as_deref(), Some("slurm-worker-slinky-0"));
    }
    let text = String::from_utf8(
        captured
            .0
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .clone(),
    )?;
    let line = text
        .lines()
        .find(|l| l.contains("hostile says hello"))
        .with_context(|| format!("the guest's line is not in the host's log:\n{text}"))?;
    for part in [
        "WARN",
        "plugin=\"hostile@",
        &format!("digest=\"{}\"", &hostile.digest()[..12]),
        "call=\"build-pod\"",
    ] {
        ensure!(line.contains(part), "{part:?} not in {line:?}");
    }
    let flood = text.lines().filter(|l| l.contains("flood line")).count();
    assert_eq!(
        flood, LINES_PER_CALL,
        "one call keeps its first {LINES_PER_CALL} lines"
    );
    let counts = engine
        .guest_log_counts()
        .into_iter()
        .find(|c| c.plugin == "hostile")
        .context("no counts for the hostile plugin")?;
    assert_eq!(counts.lines.get(&Level::Warn), Some(&1));
    assert_eq!(counts.lines.get(&Level::Debug), Some(&(LINES_PER_CALL as u64)));
    assert_eq!(counts.dropped, 1000 - LINES_PER_CALL as u64);
    Ok(())
}

#[test]
fn no_state_survives_between_two_calls() -> Result<()> {
    let engine = default_engine();
    let hostile = load(&engine, "hostile")?;
    let (nodeset, controller) = example_objects()?;
    let nodeset = with_behaviour(nodeset, "count");
    for call in 1..=3 {
        let pod = build(&hostile, &nodeset, &controller)?;
        let calls = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("hostile.test/calls"))
            .cloned();
        assert_eq!(
            calls.as_deref(),
            Some("1"),
            "call {call}: the guest's static counter must start at 0 in every call (a fresh instance)"
        );
    }
    Ok(())
}

#[test]
fn precompiled_artifacts_are_reused_and_keyed_by_digest() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = slinky_host::plugins::RuntimeConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        // Cranelift before serving: the artifact exists when `load` returns (tiering is tested
        // on its own below).
        tiering: Tiering::Optimized,
        ..Default::default()
    };
    let bytes = std::fs::read(test_plugin("hostile"))?;
    let first_engine = slinky_host::plugins::EngineHandle::new(config.clone())?;
    let first = Plugin::load(&first_engine, &bytes, PluginSource::Bundled)?;
    assert_eq!(
        first.compiled_from(),
        slinky_host::plugins::CompileSource::Compiled
    );
    let again = Plugin::load(&first_engine, &bytes, PluginSource::Bundled)?;
    assert_eq!(again.compiled_from(), slinky_host::plugins::CompileSource::Memory);
    let second_engine = slinky_host::plugins::EngineHandle::new(config)?;
    let second = Plugin::load(&second_engine, &bytes, PluginSource::Bundled)?;
    assert_eq!(
        second.compiled_from(),
        slinky_host::plugins::CompileSource::Disk,
        "a new process loads the artifact"
    );
    let files: Vec<String> = std::fs::read_dir(dir.path())?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].starts_with(first.digest()) && files[0].ends_with(".cwasm"),
        "{files:?}"
    );
    // Served mapped from the file, once stored as once loaded (its code pages are the file's:
    // only those a call runs are resident).
    let stored = dir.path().join(&files[0]);
    let mappings = std::fs::read_to_string("/proc/self/maps")?
        .lines()
        .filter(|l| l.ends_with(&*stored.to_string_lossy()))
        .count();
    ensure!(mappings > 0, "{} is not mapped", stored.display());

    // A corrupt artifact is discarded and recompiled, not trusted.
    let garbage = dir.path().join("garbage.tmp");
    std::fs::write(&garbage, b"garbage")?;
    std::fs::rename(&garbage, &stored)?;
    // What the file held before stays mapped, whole: a rename over it (as the host stores an
    // artifact) leaves the mapped file as it was.
    let (nodeset, controller) = example_objects()?;
    build(&first, &nodeset, &controller)?;
    build(&second, &nodeset, &controller)?;
    let fourth_engine = slinky_host::plugins::EngineHandle::new(slinky_host::plugins::RuntimeConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        tiering: Tiering::Optimized,
        ..Default::default()
    })?;
    let fourth = Plugin::load(&fourth_engine, &bytes, PluginSource::Bundled)?;
    assert_eq!(
        fourth.compiled_from(),
        slinky_host::plugins::CompileSource::Compiled
    );
    Ok(())
}

/// The baseline (Winch) code keeps every guarantee: the deadline, the memory cap, a panic as a
/// typed error, and no state between calls.
#[test]
fn baseline_code_keeps_every_limit() -> Result<()> {
    // An optimized artifact in the cache, which a baseline-only engine must not use.
    let cache = tempfile::tempdir()?;
    let config = RuntimeConfig {
        call_deadline: Duration::from_millis(300),
        memory_limit: 32 << 20,
        cache_dir: Some(cache.path().to_path_buf()),
        tiering: Tiering::Optimized,
        ..RuntimeConfig::default()
    };
    let optimized = load(&EngineHandle::new(config.clone())?, "hostile")?;
    assert_eq!(optimized.tier(), Tier::Optimized);
    let engine = EngineHandle::new(RuntimeConfig {
        tiering: Tiering::Baseline,
        ..config
    })?;
    let plugin = load(&engine, "hostile")?;
    assert_eq!(plugin.tier(), Tier::Baseline);
    let (nodeset, controller) = example_objects()?;

    let started = std::time::Instant::now();
    match build(&plugin, &with_behaviour(nodeset.clone(), "loop"), &controller) {
        Err(PluginError::Trap {
            cause: TrapCause::Deadline(d),
            ..
        }) => assert_eq!(d, Duration::from_millis(300)),
        other => bail!("expected a deadline trap on baseline code, got {other:?}"),
    }
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "the loop ran for {:?}",
        started.elapsed()
    );
    match build(
        &plugin,
        &with_behaviour(nodeset.clone(), "alloc:256"),
        &controller,
    ) {
        Err(PluginError::Trap {
            cause: TrapCause::MemoryCap(cap),
            ..
        }) => assert_eq!(cap, 32 << 20),
        other => bail!("expected the memory cap on baseline code, got {other:?}"),
    }
    match build(&plugin, &with_behaviour(nodeset.clone(), "panic"), &controller) {
        Err(e @ PluginError::Trap { .. }) => {
            assert!(
                e.to_string().contains("hostile plugin panicked on purpose"),
                "{e}"
            );
        }
        other => bail!("expected a trap with the panic message, got {other:?}"),
    }
    for call in 1..=2 {
        let pod = build(&plugin, &with_behaviour(nodeset.clone(), "count"), &controller)?;
        let calls = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("hostile.test/calls"));
        assert_eq!(calls.map(String::as_str), Some("1"), "call {call}");
    }
    let pod = build(&plugin, &nodeset, &controller)?;
    assert_eq!(pod.metadata.name.as_deref(), Some("slurm-worker-slinky-0"));
    assert_eq!(
        plugin.tier(),
        Tier::Baseline,
        "a baseline-only engine never switches"
    );
    Ok(())
}

/// Tiered (the default): a plugin that is not in the cache serves from Winch code at once,
/// switches to Cranelift code compiled in the background, builds byte-identical objects on both,
/// and leaves the optimized artifact in the disk cache for the next start.
#[test]
fn a_new_plugin_serves_baseline_code_then_switches_to_optimized_code() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = RuntimeConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        tiering: Tiering::Tiered,
        ..RuntimeConfig::default()
    };
    let engine = EngineHandle::new(config.clone())?;
    let registry = slinky_host::PluginRegistry::new(&engine, &[])?;
    let (nodeset, controller) = example_objects()?;
    let ctx = BuildContext::default();
    let outputs = |registry: &slinky_host::PluginRegistry| -> Result<Vec<String>> {
        let (ns, ctl) = (
            serde_json::to_string(&nodeset)?,
            serde_json::to_string(&controller)?,
        );
        let mut out = vec![
            registry
                .active(BuilderKind::ControllerService)
                .build_service_raw(&ctx, &ctl)?,
            registry
                .active(BuilderKind::NodesetPod)
                .build_pod_raw(&ctx, &ns, &ctl, &identity(&nodeset))?,
        ];
        out.extend(
            registry
                .active(BuilderKind::ControllerChildren)
                .build_controller_children_raw(&ctx, &ctl, &Default::default())?,
        );
        out.extend(
            registry
                .active(BuilderKind::NodesetChildren)
                .build_nodeset_children_raw(&ctx, &ns, &ctl)?,
        );
        let restapi = serde_json::to_string(
            &slinky_api::contract::example_restapi().map_err(|e| anyhow::anyhow!("{e:?}"))?,
        )?;
        out.extend(
            registry
                .active(BuilderKind::RestapiChildren)
                .build_restapi_children_raw(&ctx, &restapi, &ctl)?,
        );
        Ok(out)
    };
    let tiers = |registry: &slinky_host::PluginRegistry| -> Vec<serde_json::Value> {
        registry.status_json()["builders"]
            .as_array()
            .map(|b| b.iter().map(|b| b["active"]["tier"].clone()).collect())
            .unwrap_or_default()
    };

    // Nothing cached: every bundled plugin starts on baseline code (its Cranelift compile takes
    // seconds; the Winch compile done before serving took milliseconds).
    let first = outputs(&registry)?;
    let baseline_seen = BuilderKind::ALL
        .iter()
        .filter(|&&kind| registry.active(kind).tier() == Tier::Baseline)
        .count();
    assert!(
        baseline_seen > 0,
        "a plugin that is not in the cache must serve before its optimized code exists"
    );

    for kind in BuilderKind::ALL {
        let plugin = registry.active(kind);
        assert!(
            plugin.wait_for_tier(Tier::Optimized, Duration::from_secs(300)),
            "{kind} never switched to optimized code"
        );
        assert_eq!(plugin.compiled_from(), CompileSource::Compiled);
    }
    assert_eq!(
        tiers(&registry),
        vec![serde_json::json!("optimized"); BuilderKind::ALL.len()],
        "/plugins shows the tier"
    );
    assert_eq!(
        outputs(&registry)?,
        first,
        "both tiers build byte-identical objects"
    );

    // The optimized artifacts are on disk: the next start serves optimized code at once.
    let cached = std::fs::read_dir(dir.path())?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .count();
    assert_eq!(
        cached,
        BuilderKind::ALL.len(),
        "one optimized artifact per bundled plugin"
    );
    let restarted = slinky_host::PluginRegistry::new(&EngineHandle::new(config)?, &[])?;
    for kind in BuilderKind::ALL {
        let plugin = restarted.active(kind);
        assert_eq!(
            (plugin.tier(), plugin.compiled_from()),
            (Tier::Optimized, CompileSource::Disk),
            "{kind}"
        );
    }
    assert_eq!(outputs(&restarted)?, first);
    Ok(())
}

/// The memory cap holds for a call's memories together: a component making 16 memories of
/// 30 MiB each (480 MiB) under a 32 MiB cap is refused at load, as a memory cap, before its
/// describe() runs.
#[test]
fn the_memory_cap_is_per_call_across_every_memory() -> Result<()> {
    let engine = engine(Duration::from_secs(5), 32);
    match Plugin::load_file(&engine, &slinky_tests::wat("many-memories")) {
        Err(
            e @ PluginError::Trap {
                cause: TrapCause::MemoryCap(_),
                ..
            },
        ) => assert!(e.to_string().contains("memory cap of 32 MiB"), "{e}"),
        Err(other) => bail!("expected the memory cap, got {other}"),
        Ok(_) => bail!("16 memories of 30 MiB loaded under a 32 MiB cap"),
    }
    Ok(())
}

/// A memory cap below what a plugin's memory starts with refuses the plugin with an error that
/// names both sizes and the flag to raise, on every tier; the cached optimized artifact is kept
/// (a pool slot fits it whatever the cap), so raising the cap again loads it from disk.
#[test]
fn a_cap_below_the_initial_memory_is_named_as_such_and_keeps_the_cache() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        tiering: Tiering::Optimized,
        ..RuntimeConfig::default()
    };
    // The optimized artifact, compiled under the default cap.
    load(&EngineHandle::new(config.clone())?, "hostile")?;
    let artifacts = || -> Result<usize> { Ok(std::fs::read_dir(cache.path())?.count()) };
    assert_eq!(artifacts()?, 1);

    for tiering in [Tiering::Optimized, Tiering::Tiered, Tiering::Baseline] {
        let engine = EngineHandle::new(RuntimeConfig {
            memory_limit: 1 << 20,
            tiering,
            ..config.clone()
        })?;
        match load(&engine, "hostile") {
            Err(error) => match error.downcast_ref::<PluginError>() {
                Some(
                    e @ PluginError::Trap {
                        cause: TrapCause::InitialMemoryAboveCap { initial, cap },
                        ..
                    },
                ) => {
                    assert_eq!((*initial, *cap), (2 << 20, 1 << 20), "{tiering:?}");
                    let message = e.to_string();
                    assert!(
                        message.contains("raise --plugin-memory-mib to at least 2"),
                        "{tiering:?}: {message}"
                    );
                    assert_eq!(e.metric_label(), "memory_cap");
                }
                other => bail!("{tiering:?}: expected the initial memory above the cap, got {other:?}"),
            },
            Ok(plugin) => bail!("{tiering:?}: loaded under a 1 MiB cap, tier {:?}", plugin.tier()),
        }
    }
    assert_eq!(artifacts()?, 1, "the cached artifact survives the low cap");
    let plugin = load(&EngineHandle::new(config)?, "hostile")?;
    assert_eq!(plugin.compiled_from(), CompileSource::Disk);
    Ok(())
}

/// With tiering, a version the reloader refuses (its example builds fail) is never compiled with
/// Cranelift, while an accepted one is, and switches to optimized code after its checks.
#[test]
fn a_refused_version_is_never_compiled_with_cranelift() -> Result<()> {
    use slinky_host::plugins::{BuildContext as Ctx, PluginRegistry, digest, reload};
    let (cache, dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let engine = EngineHandle::new(RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        tiering: Tiering::Tiered,
        ..RuntimeConfig::default()
    })?;
    let registry = std::sync::Arc::new(PluginRegistry::new(&engine, &[])?);
    // The optimizer is idle once the bundled plugins run optimized code.
    for kind in slinky_host::plugins::bundled::KINDS {
        ensure!(
            registry
                .active(kind)
                .wait_for_tier(Tier::Optimized, Duration::from_secs(300)),
            "bundled {kind} never switched to optimized code"
        );
    }
    let mut reloader = reload::Reloader::new(
        registry.clone(),
        reload::ReloadConfig {
            dir: dir.path().to_path_buf(),
            poll: Duration::from_secs(60),
            build: Ctx::default(),
        },
    );

    // `raw` builds whatever its input asks for; the example inputs ask nothing: refused.
    let raw = std::fs::read(test_plugin("raw"))?;
    std::fs::write(dir.path().join("raw.wasm"), &raw)?;
    let report = reloader.scan(true);
    ensure!(report.refused.len() == 1, "raw was not refused: {report:?}");

    let hostile = std::fs::read(test_plugin("hostile"))?;
    std::fs::remove_file(dir.path().join("raw.wasm"))?;
    std::fs::write(dir.path().join("hostile.wasm"), &hostile)?;
    let report = reloader.scan(true);
    ensure!(report.swapped.len() == 1, "hostile did not swap in: {report:?}");
    let serving = registry.active(BuilderKind::NodesetPod);
    assert_eq!(serving.digest(), digest(&hostile));
    ensure!(
        serving.wait_for_tier(Tier::Optimized, Duration::from_secs(300)),
        "the accepted version never switched to optimized code"
    );
    assert!(engine.cached(&digest(&hostile))?.is_some());
    // The one optimizer thread works in order: had raw been queued, it would have been compiled
    // before hostile.
    assert!(
        engine.cached(&digest(&raw))?.is_none(),
        "the refused version was compiled with Cranelift"
    );
    Ok(())
}

#[test]
fn calls_past_the_concurrency_limit_wait_for_a_slot_on_either_tier() -> Result<()> {
    for tiering in [Tiering::Optimized, Tiering::Baseline] {
        let config = RuntimeConfig {
            call_deadline: Duration::from_millis(200),
            max_concurrent_calls: 1,
            tiering,
            cache_dir: Some(slinky_tests::cache_dir()),
            ..RuntimeConfig::default()
        };
        let engine = EngineHandle::new(config)?;
        let plugin = load(&engine, "hostile")?;
        let (nodeset, controller) = example_objects()?;
        let looping = with_behaviour(nodeset, "loop");
        // Three calls at once, each running until its deadline: with one slot, two wait.
        let barrier = std::sync::Barrier::new(3);
        let results: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        matches!(
                            build(&plugin, &looping, &controller),
                            Err(PluginError::Trap {
                                cause: TrapCause::Deadline(_),
                                ..
                            })
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(false)).collect()
        });
        ensure!(
            results.iter().all(|&trapped| trapped),
            "{tiering:?}: every call ran to its own deadline (waiting does not count): {results:?}"
        );
        ensure!(
            engine.calls_waited() == 2,
            "{tiering:?}: {} calls waited, expected 2",
            engine.calls_waited()
        );
    }
    Ok(())
}

/// A freed pool slot keeps the pages its call touched: with two call slots, calls of five
/// components one after another come to hold two idle memory slots, not one each (wasmtime's
/// default takes a never-used slot before one another component used: over a long run every
/// slot of the pool stays resident).
#[test]
fn the_plugin_pool_keeps_no_more_idle_slots_resident_than_calls_may_run_at_once() -> Result<()> {
    let engine = EngineHandle::new(RuntimeConfig {
        max_concurrent_calls: 2,
        tiering: Tiering::Optimized,
        cache_dir: Some(slinky_tests::cache_dir()),
        ..RuntimeConfig::default()
    })?;
    let Some(before) = engine.pool_resident() else {
        bail!(
            "the pooling allocator is unavailable on this machine ({:?}): nothing to test",
            engine.allocator()
        );
    };
    ensure!(before.warm_memories == 0, "a new pool holds {before:?}");
    let registry = slinky_host::PluginRegistry::new(&engine, &[])?;
    let (nodeset, controller) = example_objects()?;
    let (ns, ctl) = (
        serde_json::to_string(&nodeset)?,
        serde_json::to_string(&controller)?,
    );
    let restapi = serde_json::to_string(
        &slinky_api::contract::example_restapi().map_err(|e| anyhow::anyhow!("{e:?}"))?,
    )?;
    let ctx = BuildContext::default();
    for _ in 0..3 {
        registry
            .active(BuilderKind::ControllerService)
            .build_service_raw(&ctx, &ctl)?;
        registry
            .active(BuilderKind::NodesetPod)
            .build_pod_raw(&ctx, &ns, &ctl, &identity(&nodeset))?;
        registry
            .active(BuilderKind::ControllerChildren)
            .build_controller_children_raw(&ctx, &ctl, &Default::default())?;
        registry
            .active(BuilderKind::NodesetChildren)
            .build_nodeset_children_raw(&ctx, &ns, &ctl)?;
        registry
            .active(BuilderKind::RestapiChildren)
            .build_restapi_children_raw(&ctx, &restapi, &ctl)?;
    }
    let after = engine.pool_resident().context("the pool is gone")?;
    ensure!(
        after.warm_memories == 2 && after.memory_bytes > 0,
        "15 calls of 5 components, one at a time, hold {after:?}: two slots (the calls' own), reused, \
         were expected"
    );
    Ok(())
}

/// Anonymous memory resident in this process, in MiB (`RssAnon` of `/proc/self/status`).
fn rss_anon_mib() -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no RssAnon in /proc/self/status")?
        .parse()?;
    Ok(kib / 1024.0)
}

/// A Cranelift compile leaves no compiler memory behind in the serving engine: compiling the
/// bundled pod builder into an empty cache (as a tiered host's background compile does) grows
/// this process's anonymous memory by under 64 MiB once it is served: 2-28 MiB in three runs
/// here, where compiled on the serving engine, whose compiler keeps its buffers for the next
/// compile, it grew by 164-181 MiB. Measured in a process of its own (this test binary again,
/// running only this test), so other tests' memory is not counted.
#[test]
fn a_compile_leaves_no_compiler_memory_in_the_serving_engine() -> Result<()> {
    const CHILD: &str = "SLINKY_TEST_COMPILE_MEMORY_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let cache = tempfile::tempdir()?;
        // Tiered, the default: its Cranelift compiles run on one thread, as a host's do.
        let engine = EngineHandle::new(RuntimeConfig {
            tiering: Tiering::Tiered,
            cache_dir: Some(cache.path().to_path_buf()),
            ..RuntimeConfig::default()
        })?;
        let before = rss_anon_mib()?;
        let kind = BuilderKind::NodesetPod;
        let (component, source) = engine.component(
            "nodeset-pod",
            slinky_host::plugins::bundled::bundled_digest(kind),
            slinky_host::plugins::bundled::bundled_bytes(kind),
        )?;
        ensure!(source == CompileSource::Compiled, "compiled, not {source:?}");
        let after = rss_anon_mib()?;
        drop(component);
        println!("rss-anon-growth-mib={:.1} (from {before:.1})", after - before);
        return Ok(());
    }
    let name = "sandbox::a_compile_leaves_no_compiler_memory_in_the_serving_engine";
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "the measuring child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("rss-anon-growth-mib=").map(|(_, figure)| figure))
        .with_context(|| format!("no figure in the child's output: {stdout}"))?;
    let growth: f64 = line
        .split_whitespace()
        .next()
        .context("an empty figure")?
        .parse()?;
    ensure!(
        growth < 64.0,
        "compiling the pod builder left {growth:.1} MiB more anonymous memory resident ({line}): the \
         serving engine kept the compiler's buffers, or the freed heap was not handed back"
    );
    Ok(())
}
