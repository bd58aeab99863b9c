//! `slinky-host render` end to end: the real binary, the bundled Wasm builders, the example files.
//! Golden checks are field by field against Slinky's facts (`shared/spec/slinky.md` §2).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{Value, json};
use slinky_tests::{example, render_json, run, test_plugin, wat};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn example_cluster_renders_slinky_shaped_service_and_pods() -> Result<()> {
    let all = render_json(&[&example("slurm-cluster.yaml")], &[])?;
    let kinds: Vec<String> = all
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["kind"].as_str().unwrap_or_default(),
                i["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap/slurm-config",
            "Service/slurm-controller",
            "Service/slurm-controller-internal",
            "StatefulSet/slurm-controller",
            "Service/slurm-workers-slurm",
            "PodDisruptionBudget/slurm-workers-pdb-slurm",
            "Pod/slurm-worker-slinky-0",
            "Pod/slurm-worker-slinky-1",
            "Pod/slurm-worker-slinky-2",
        ],
        "every child, in a stable order: the Controller's by kind, then each NodeSet's, then its pods"
    );
    // The Service and the pods (the other children have their golden tests in golden.rs).
    let items: Vec<Value> = all
        .into_iter()
        .filter(|i| {
            i["kind"] == "Pod" || i["metadata"]["name"] == "slurm-controller" && i["kind"] == "Service"
        })
        .collect();

    // --- The Controller's Service (BuildControllerService) ---
    let svc: Service = serde_json::from_value(items[0].clone())?;
    let meta = &svc.metadata;
    assert_eq!(meta.name.as_deref(), Some("slurm-controller"));
    assert_eq!(meta.namespace.as_deref(), Some("slurm"));
    assert_eq!(
        meta.labels.clone().unwrap_or_default(),
        labels(&[
            ("app.kubernetes.io/part-of", "slurm"), // CR labels first
            ("app.kubernetes.io/name", "slurmctld"),
            ("app.kubernetes.io/instance", "slurm"),
            ("app.kubernetes.io/component", "controller"),
        ])
    );
    let ann = meta.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("example.com/team").map(String::as_str),
        Some("hpc"),
        "service annotations kept"
    );
    assert_eq!(
        ann.get("slinky.slurm.net/builder").map(String::as_str),
        Some("controller-service@0.1.0")
    );
    assert!(
        ann.get("slinky.slurm.net/builder-digest")
            .is_some_and(|d| d.starts_with("sha256:") && d.len() == 71)
    );
    let spec = svc.spec.context("service spec")?;
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(
        spec.selector.unwrap_or_default(),
        labels(&[
            ("app.kubernetes.io/name", "slurmctld"),
            ("app.kubernetes.io/instance", "slurm")
        ])
    );
    let ports = spec.ports.unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name.as_deref(), Some("slurmctld"));
    assert_eq!(ports[0].port, 6817);
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(serde_json::to_value(&ports[0].target_port)?, "slurmctld");
    assert!(spec.external_ips.is_none());

    // --- The NodeSet pods ---
    for (ordinal, item) in items[1..].iter().enumerate() {
        let pod: Pod = serde_json::from_value(item.clone())?;
        let name = format!("slurm-worker-slinky-{ordinal}");
        let hostname = format!("slinky-{ordinal}");
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some(name.as_str()));
        assert_eq!(meta.generate_name.as_deref(), Some("slurm-worker-slinky-"));
        assert_eq!(meta.namespace.as_deref(), Some("slurm"));
        let l = meta.labels.clone().unwrap_or_default();
        let revision = l.get("controller-revision-hash").cloned().unwrap_or_default();
        assert_eq!(revision.len(), 12, "revision hash label (an output revision)");
        let ordinal_s = ordinal.to_string();
        assert_eq!(
            l,
            labels(&[
                ("example.com/pool", "cpu"), // template labels
                ("app.kubernetes.io/name", "slurmd"),
                ("app.kubernetes.io/instance", "slurm-worker-slinky"),
                ("app.kubernetes.io/component", "worker"),
                ("slinky.slurm.net/cluster", "slurm"),
                ("nodeset.slinky.slurm.net/pod-index", &ordinal_s),
                ("nodeset.slinky.slurm.net/pod-name", &name),
                ("nodeset.slinky.slurm.net/pod-hostname", &hostname),
                ("nodeset.slinky.slurm.net/scaling-mode", "StatefulSet"),
                ("controller-revision-hash", &revision),
            ])
        );
        let ann = meta.annotations.clone().unwrap_or_default();
        assert_eq!(
            ann.get("kubectl.kubernetes.io/default-container")
                .map(String::as_str),
            Some("slurmd")
        );
        assert!(ann.contains_key("slinky.slurm.net/sshd-conf-hash"));
        assert!(ann.contains_key("slinky.slurm.net/sssd-conf-hash"));
        assert_eq!(
            ann.get("slinky.slurm.net/builder").map(String::as_str),
            Some("nodeset-pod@0.1.0")
        );

        let spec = pod.spec.context("pod spec")?;
        assert_eq!(
            spec.hostname.as_deref(),
            Some(hostname.as_str()),
            "hostname from the template prefix"
        );
        assert_eq!(spec.subdomain.as_deref(), Some("slurm-workers-slurm"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.enable_service_links, Some(false));
        assert!(spec.node_name.is_none());
        assert_eq!(
            spec.node_selector.clone().unwrap_or_default(),
            labels(&[("kubernetes.io/os", "linux")])
        );
        assert_eq!(
            spec.dns_config
                .as_ref()
                .and_then(|d| d.searches.clone())
                .unwrap_or_default(),
            vec!["slurm-workers-slurm.slurm.svc.cluster.local".to_string()]
        );
        let tol = spec.tolerations.clone().unwrap_or_default();
        assert!(
            tol.iter()
                .any(|t| t.key.as_deref() == Some("nodeset.slinky.slurm.net/worker")
                    && t.operator.as_deref() == Some("Equal")
                    && t.effect.as_deref() == Some("NoExecute"))
        );
        let anti = spec
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.clone())
            .unwrap_or_default();
        assert_eq!(anti.len(), 1);
        assert_eq!(anti[0].topology_key, "kubernetes.io/hostname");
        assert_eq!(
            serde_json::to_value(&anti[0].label_selector)?,
            json!({"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In", "values": ["slurmd"]}]}),
            "anti-affinity against any slurmd pod, in Slinky's words"
        );

        // Volumes: slurm-etc (projected, 0600, slurm key only) and slurm-logfile.
        let vols = spec.volumes.clone().unwrap_or_default();
        let names: Vec<&str> = vols.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["slurm-etc", "slurm-logfile"]);
        let projected = vols[0].projected.as_ref().context("slurm-etc is projected")?;
        assert_eq!(projected.default_mode, Some(0o600));
        let sources = projected.sources.clone().unwrap_or_default();
        assert_eq!(sources.len(), 1);
        let secret = sources[0].secret.as_ref().context("slurm key secret")?;
        assert_eq!(secret.name, "slurm-auth-slurm");
        let items = secret.items.clone().unwrap_or_default();
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("slurm.key", "slurm.key")
        );

        // The logfile native sidecar.
        let init = spec.init_containers.clone().unwrap_or_default();
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].name, "logfile");
        assert_eq!(init[0].image.as_deref(), Some("docker.io/library/alpine:latest"));
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));

        // The slurmd container.
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        assert_eq!(c.name, "slurmd");
        assert_eq!(
            c.image.as_deref(),
            Some("ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04")
        );
        assert_eq!(
            c.args.clone().unwrap_or_default(),
            vec![
                "-Z",
                "--conf-server",
                "slurm-controller.slurm:6817",
                "--conf",
                // The NodeSet's Slurm name (hostname prefix `slinky-`), as slurm.conf's NodeSet line.
                "'Features=gpu,ib,slinky Topology='\"$SLINKY_TOPOLOGY\"' Weight=10'",
            ]
        );
        let env: BTreeMap<String, Value> = c
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| Ok((e.name.clone(), serde_json::to_value(&e)?)))
            .collect::<Result<_>>()?;
        assert_eq!(
            env["SLINKY_TOPOLOGY"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['topology.slinky.slurm.net/spec']"
        );
        assert_eq!(env["POD_CPUS"]["value"], "4");
        assert_eq!(env["POD_MEMORY"]["value"], "8192");
        let ports = c.ports.clone().unwrap_or_default();
        assert_eq!(ports.len(), 1);
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].container_port),
            (Some("slurmd"), 6818)
        );
        for (probe, path) in [
            (&c.startup_probe, "/livez"),
            (&c.liveness_probe, "/livez"),
            (&c.readiness_probe, "/readyz"),
        ] {
            let p = probe.as_ref().context("probe")?;
            let get = p.http_get.as_ref().context("http probe")?;
            assert_eq!(get.path.as_deref(), Some(path));
            assert_eq!(serde_json::to_value(&get.port)?, "slurmd");
        }
        let live = c.liveness_probe.as_ref().context("liveness")?;
        assert_eq!((live.failure_threshold, live.period_seconds), (Some(6), Some(10)));
        let sc = c.security_context.as_ref().context("security context")?;
        assert_eq!(sc.privileged, Some(true));
        assert_eq!(
            sc.capabilities
                .as_ref()
                .and_then(|c| c.add.clone())
                .unwrap_or_default(),
            ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE"]
        );
        let stop = c
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|p| p.exec.as_ref());
        let stop = stop.and_then(|e| e.command.clone()).unwrap_or_default().join(" ");
        assert_eq!(
            stop,
            "/usr/bin/sh -c scontrol update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating';",
            "Slinky's command, word for word: the pod's node is its hostname ({hostname})"
        );
        assert!(stop.contains("slurm-operator: Pod is terminating"));
        let mounts: Vec<(String, bool)> = c
            .volume_mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.mount_path, m.read_only.unwrap_or(false)))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/etc/slurm".to_string(), true),
                ("/var/log/slurm".to_string(), false)
            ]
        );
    }
    Ok(())
}

#[test]
fn yaml_output_is_kubernetes_documents() -> Result<()> {
    let out = run(&[
        "render",
        "-f",
        &example("slurm-cluster.yaml").display().to_string(),
    ]);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout)?;
    let docs: Vec<Value> = text
        .split("---\n")
        .map(serde_saphyr::from_str)
        .collect::<Result<_, _>>()?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Service",
            "Service",
            "StatefulSet",
            "Service",
            "PodDisruptionBudget",
            "Pod",
            "Pod",
            "Pod"
        ]
    );
    assert!(
        text.starts_with("apiVersion: v1\ndata:\n") || text.starts_with("apiVersion: v1\n"),
        "apiVersion comes first"
    );
    Ok(())
}

#[test]
fn edge_cases_behave_as_a_user_expects() -> Result<()> {
    // The edge-case file's first NodeSet names a missing Controller: that is an error naming it.
    let edge = example("edge-cases.yaml");
    let out = run(&["render", "-f", &edge.display().to_string()]);
    assert!(!out.status.success(), "a missing Controller must fail the render");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("edge-cases.yaml (document 1)"),
        "names the document: {err}"
    );
    assert!(
        err.contains("slurm/orphan-workers") && err.contains("slurm/no-such-controller"),
        "{err}"
    );

    // Without the orphan, with the example Controller: zero replicas and padding behave.
    let text = std::fs::read_to_string(&edge)?;
    let rest: Vec<&str> = text.split("\n---\n").skip(1).collect();
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, rest.join("\n---\n"))?;
    let items = render_json(&[&example("slurm-cluster.yaml"), &file], &[])?;
    let pods: Vec<Pod> = items
        .iter()
        .filter(|i| i["kind"] == "Pod")
        .map(|i| serde_json::from_value(i.clone()))
        .collect::<Result<_, _>>()?;
    let names: Vec<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert!(
        !names.iter().any(|n| n.starts_with("idle-workers")),
        "replicas 0 builds no pod"
    );
    let padded: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("padded-"))
        })
        .collect();
    assert_eq!(
        padded
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect::<Vec<_>>(),
        ["padded-000", "padded-001"],
        "ordinalPadding 3 zero-pads names"
    );
    let spec = padded[0].spec.as_ref().context("spec")?;
    assert_eq!(
        spec.hostname.as_deref(),
        Some("padded-000"),
        "no template hostname: the pod name"
    );
    let args = spec.containers[0].args.clone().unwrap_or_default();
    assert_eq!(
        args.last().map(String::as_str),
        Some("-vvv"),
        "user args come after the base args: {args:?}"
    );
    assert_eq!(
        &args[..4],
        ["-Z", "--conf-server", "slurm-controller.slurm:6817", "--conf"]
    );
    assert_eq!(
        args[4], "'Features=padded Topology='\"$SLINKY_TOPOLOGY\"''",
        "with an unparsable extraConf item none of extraConf is passed, as Slinky does"
    );
    assert!(!args[4].contains("NotAKeyValue"));
    Ok(())
}

#[test]
fn bad_input_fails_with_a_message_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases = [
        (
            "broken.yaml",
            "apiVersion: v1\nkind: [unclosed\n",
            "not valid YAML or JSON",
        ),
        (
            "deployment.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n",
            "unknown kind \"Deployment\"",
        ),
        (
            "negative.yaml",
            "apiVersion: slinky.slurm.net/v1beta1\nkind: NodeSet\nmetadata:\n  name: n\nspec:\n  controllerRef:\n    name: c\n  replicas: -1\n",
            "spec.replicas is -1",
        ),
        (
            "long-name.yaml",
            &format!(
                "{}---\napiVersion: slinky.slurm.net/v1beta1\nkind: NodeSet\nmetadata:\n  name: {}\n  namespace: slurm\nspec:\n  controllerRef:\n    name: slurm\n  replicas: 1\n  slurmd:\n    image: slurmd\n",
                std::fs::read_to_string(example("slurm-cluster.yaml"))?
                    .split("\n---\n")
                    .find(|d| d.contains("kind: Controller"))
                    .unwrap_or_default()
                    .to_string()
                    + "\n",
                "w".repeat(64)
            ),
            "metadata.name: \"wwww",
        ),
        (
            "nameless.yaml",
            "apiVersion: slinky.slurm.net/v1beta1\nkind: Controller\nmetadata: {}\nspec: {}\n",
            "metadata.name is missing",
        ),
    ];
    for (file, text, want) in cases {
        let path = dir.path().join(file);
        std::fs::write(&path, text)?;
        let out = run(&["render", "-f", &path.display().to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{file}: must fail");
        ensure!(
            err.contains(file) && err.contains(want),
            "{file}: expected {want:?} naming the file, got: {err}"
        );
    }
    let out = run(&["render", "-f", "/no/such/file.yaml"]);
    ensure!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("/no/such/file.yaml"));
    Ok(())
}

#[test]
fn a_trapping_plugin_fails_the_render_with_a_typed_error() -> Result<()> {
    // The hostile plugin panics when the NodeSet asks it to.
    let dir = tempfile::tempdir()?;
    let text = std::fs::read_to_string(example("slurm-cluster.yaml"))?.replace(
        "name: slurm-worker-slinky\n",
        "name: slurm-worker-slinky\n  annotations:\n    hostile.test/behaviour: panic\n",
    );
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, text)?;
    let plugin = test_plugin("hostile");
    let out = run(&[
        "render",
        "-f",
        &file.display().to_string(),
        "--plugin",
        &plugin.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "must fail");
    for want in [
        "NodeSet slurm/slurm-worker-slinky",
        "hostile@0.1.0",
        "build-pod",
        "trapped",
        "panicked on purpose",
    ] {
        ensure!(err.contains(want), "expected {want:?} in: {err}");
    }
    Ok(())
}

#[test]
fn a_plugin_override_replaces_the_bundled_builder_of_its_kind_only() -> Result<()> {
    let plugin = test_plugin("hostile");
    let items = render_json(
        &[&example("slurm-cluster.yaml")],
        &["--plugin", &plugin.display().to_string()],
    )?;
    ensure!(items.len() == 9);
    let builder = |kind: &str, name: &str| {
        items
            .iter()
            .find(|i| i["kind"] == kind && i["metadata"]["name"] == name)
            .map(|i| i["metadata"]["annotations"]["slinky.slurm.net/builder"].clone())
    };
    assert_eq!(
        builder("Service", "slurm-controller"),
        Some("controller-service@0.1.0".into())
    );
    assert_eq!(
        builder("StatefulSet", "slurm-controller"),
        Some("controller-children@0.1.0".into())
    );
    let pods: Vec<&Value> = items.iter().filter(|i| i["kind"] == "Pod").collect();
    ensure!(pods.len() == 3);
    for pod in pods {
        assert_eq!(
            pod["metadata"]["annotations"]["slinky.slurm.net/builder"],
            "hostile@0.1.0"
        );
    }
    Ok(())
}

#[test]
fn plugin_inspect_reports_describe_digest_and_contract() -> Result<()> {
    let plugin = test_plugin("hostile");
    let out = run(&["plugin", "inspect", &plugin.display().to_string()]);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_saphyr::from_slice(&out.stdout)?;
    assert_eq!(report["name"], "hostile");
    assert_eq!(report["kinds"], serde_json::json!(["nodeset-pod"]));
    assert_eq!(report["contractVersion"], "0.3.0");
    // A plugin built against the first contract is reported as such.
    let out = run(&["plugin", "inspect", &test_plugin("raw").display().to_string()]);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let raw: Value = serde_saphyr::from_slice(&out.stdout)?;
    assert_eq!(raw["contractVersion"], "0.1.0");
    assert_eq!(raw["hostContractVersion"], "0.3.0");
    let digest = slinky_host::plugins::digest(&std::fs::read(&plugin)?);
    assert_eq!(report["digest"], format!("sha256:{digest}"));

    let out = run(&["plugin", "inspect", &wat("contract-9.9").display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        bail!("a 9.9.0 plugin must be refused");
    }
    ensure!(
        err.contains("contract version 9.9.0") && err.contains("rebuild it"),
        "{err}"
    );
    Ok(())
}

/// A one-shot command compiles the optimized code before it renders (it would exit before a
/// background compile ends), so the artifacts are cached for the next run; `--plugin-tiering
/// baseline` leaves the cache empty.
#[test]
fn one_shot_commands_fill_the_plugin_cache() -> Result<()> {
    let example = example("slurm-cluster.yaml").display().to_string();
    let artifacts = |dir: &std::path::Path| -> Result<usize> {
        Ok(std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .count())
    };
    let optimized = tempfile::tempdir()?;
    let dir = optimized.path().display().to_string();
    let out = run(&["render", "-f", &example, "--plugin-cache-dir", &dir]);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        artifacts(optimized.path())?,
        slinky_host::plugins::BuilderKind::ALL.len(),
        "one artifact per bundled plugin"
    );
    let again = run(&["render", "-f", &example, "--plugin-cache-dir", &dir]);
    ensure!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(again.stdout, out.stdout, "the same objects from cached code");

    let baseline = tempfile::tempdir()?;
    let dir = baseline.path().display().to_string();
    let out = run(&[
        "render",
        "-f",
        &example,
        "--plugin-cache-dir",
        &dir,
        "--plugin-tiering",
        "baseline",
    ]);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, again.stdout, "Winch code renders the same objects");
    assert_eq!(artifacts(baseline.path())?, 0);
    Ok(())
}

/// The features a pod's slurmd registers with (`--conf`'s `Features=`).
fn registered_features(pod: &Value) -> Option<Vec<String>> {
    let args = pod["spec"]["containers"][0]["args"].as_array()?;
    let conf = args.iter().skip_while(|a| *a != "--conf").nth(1)?.as_str()?;
    let features = conf
        .trim_matches('\'')
        .split_whitespace()
        .find_map(|i| i.strip_prefix("Features="))?;
    Some(features.split(',').map(str::to_string).collect())
}

/// Every pod's node joins its NodeSet in the slurm.conf built from the same objects: one of the
/// pod's features is the `Feature=` of a `NodeSet=` line, and that NodeSet's partition lists it.
/// Shape-by-shape parity never caught that the two disagreed for NodeSets with a hostname prefix
/// (every example): nodes joined no NodeSet and the partitions had no nodes.
#[test]
fn every_pod_registers_the_feature_its_nodeset_line_selects() -> Result<()> {
    // The edge cases without their first document (a NodeSet naming a missing Controller).
    let dir = tempfile::tempdir()?;
    let edge = dir.path().join("edge.yaml");
    let text = std::fs::read_to_string(example("edge-cases.yaml"))?;
    std::fs::write(
        &edge,
        text.split("\n---\n").skip(1).collect::<Vec<_>>().join("\n---\n"),
    )?;
    let mut inputs: Vec<Vec<std::path::PathBuf>> = vec![
        vec![example("slurm-cluster.yaml")],
        vec![example("hpc-cluster.yaml")],
        vec![example("slurm-cluster.yaml"), edge],
    ];
    let fixture = slinky_tests::workspace().join("../shared/fixtures/slurm-cluster.yaml");
    if fixture.exists() {
        inputs.push(vec![fixture]);
    }
    for files in inputs {
        let paths: Vec<&std::path::Path> = files.iter().map(|p| p.as_path()).collect();
        let all = render_json(&paths, &[])?;
        let mut features_of_nodesets = BTreeMap::new();
        let mut partitions = BTreeMap::new();
        for cm in all.iter().filter(|i| i["kind"] == "ConfigMap") {
            let conf = cm["data"]["slurm.conf"].as_str().unwrap_or_default();
            for line in conf.lines() {
                let items: BTreeMap<&str, &str> = line
                    .split_whitespace()
                    .filter_map(|i| i.split_once('='))
                    .collect();
                if let (Some(n), Some(f)) = (items.get("NodeSet"), items.get("Feature")) {
                    features_of_nodesets.insert(f.to_string(), n.to_string());
                }
                if let (Some(p), Some(nodes)) = (items.get("PartitionName"), items.get("Nodes")) {
                    partitions.insert(p.to_string(), nodes.to_string());
                }
            }
        }
        let pods: Vec<&Value> = all.iter().filter(|i| i["kind"] == "Pod").collect();
        ensure!(!pods.is_empty(), "{files:?} rendered no pods");
        for pod in pods {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let features =
                registered_features(pod).with_context(|| format!("{name}: no Features= in --conf"))?;
            let Some(nodeset) = features.iter().find_map(|f| features_of_nodesets.get(f)) else {
                bail!(
                    "{files:?}: pod {name} registers Features={features:?}, but slurm.conf's NodeSet lines \
                     select {:?}: its node would join no NodeSet",
                    features_of_nodesets.keys().collect::<Vec<_>>()
                );
            };
            if let Some(nodes) = partitions.get(nodeset) {
                ensure!(
                    nodes.split(',').any(|n| n == nodeset),
                    "{files:?}: partition {nodeset} lists {nodes}, not the NodeSet of pod {name}"
                );
            }
        }
    }
    Ok(())
}

/// The example cluster with annotations on the Controller and the NodeSet, written to `dir`.
fn annotated_example(
    dir: &std::path::Path,
    controller: &[(&str, &str)],
    nodeset: &[(&str, &str)],
) -> Result<std::path::PathBuf> {
    let block = |pairs: &[(&str, &str)]| {
        let mut s = String::from("  annotations:\n");
        for (k, v) in pairs {
            s.push_str(&format!("    {k}: '{v}'\n"));
        }
        s
    };
    let text = std::fs::read_to_string(example("slurm-cluster.yaml"))?
        .replacen(
            "\n  name: slurm\n",
            &format!("\n  name: slurm\n{}", block(controller)),
            1,
        )
        .replacen(
            "\n  name: slurm-worker-slinky\n",
            &format!("\n  name: slurm-worker-slinky\n{}", block(nodeset)),
            1,
        );
    let file = dir.join("cluster.yaml");
    std::fs::write(&file, text)?;
    Ok(file)
}

/// Builds reaching past their parent: (plugin, whose annotation asks, behaviour, what the refusal
/// names, the flag that allows it).
#[rustfmt::skip]
const REACHING_PAST_THE_PARENT: [(&str, &str, &str, &str, &str); 18] = [
    ("hostile", "NodeSet", "host-network", "spec.hostNetwork", "host-namespaces"),
    ("hostile", "NodeSet", "host-pid", "spec.hostPID", "host-namespaces"),
    ("hostile", "NodeSet", "host-path", "spec.volumes[name=node-root].hostPath", "host-path"),
    ("hostile", "NodeSet", "node-name", "spec.nodeName", "node-name"),
    ("hostile", "NodeSet", "service-account", "spec.serviceAccountName", "service-account"),
    ("hostile", "NodeSet", "automount-token", "spec.automountServiceAccountToken is true", "service-account"),
    ("hostile", "NodeSet", "privileged-sidecar", "[name=escape].securityContext.privileged", "privileges"),
    ("hostile", "NodeSet", "capability", "capabilities.add has \"SYS_PTRACE\"", "privileges"),
    ("hostile", "NodeSet", "finalizer", "metadata.finalizers", "finalizers"),
    ("hostile_children", "Controller", "host-path", "spec.template.spec.volumes[name=node-root].hostPath", "host-path"),
    ("hostile_children", "Controller", "host-network", "spec.template.spec.hostNetwork", "host-namespaces"),
    ("hostile_children", "Controller", "service-account", "spec.template.spec.serviceAccountName", "service-account"),
    ("hostile_children", "Controller", "automount-token", "spec.template.spec.automountServiceAccountToken is not set", "service-account"),
    ("hostile_children", "Controller", "privileged", "[name=slurmctld].securityContext.privileged", "privileges"),
    ("hostile_children", "Controller", "finalizer", "metadata.finalizers", "finalizers"),
    ("hostile_children", "Controller", "load-balancer", "spec.type is LoadBalancer", "service-exposure"),
    ("hostile_children", "NodeSet", "external-ips", "spec.externalIPs", "service-exposure"),
    ("hostile_children", "NodeSet", "wide-pdb", "PodDisruptionBudget slurm-workers-pdb-slurm: spec.selector", "wide-pdb"),
];

/// What a plugin may not reach past its parent (the node's namespaces, filesystem and scheduler,
/// another service account, privileges, an exposed Service, a PodDisruptionBudget over other
/// pods, finalizers) is refused by `render` and `plugin check`, naming the field and the flag,
/// and rendered when the host is given that flag.
#[test]
fn output_reaching_past_its_parent_is_refused_unless_the_host_allows_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let behaviour = "hostile.test/behaviour";
    let mut cases = REACHING_PAST_THE_PARENT.to_vec();
    // The Controller's Service (the `raw` plugin returns the annotation's text; its pods are
    // minimal).
    let nodeport = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"slurm-controller"},"spec":{"type":"NodePort","selector":{"app.kubernetes.io/name":"slurmctld","app.kubernetes.io/instance":"slurm"},"ports":[{"name":"slurmctld","port":6817}]}}"#;
    cases.push((
        "raw",
        "raw",
        nodeport,
        "spec.type is NodePort",
        "service-exposure",
    ));
    for (plugin, whose, asked, names, flag) in cases {
        let file = match whose {
            "Controller" => annotated_example(dir.path(), &[(behaviour, asked)], &[])?,
            "NodeSet" => annotated_example(dir.path(), &[], &[(behaviour, asked)])?,
            _ => annotated_example(
                dir.path(),
                &[("raw.test/output", asked)],
                &[("raw.test/build", "minimal")],
            )?,
        };
        let file = file.display().to_string();
        let plugin = test_plugin(plugin).display().to_string();
        let case = format!("{whose} {asked}");
        let render = ["render", "-f", &file, "--plugin", &plugin];
        let out = run(&render);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{case}: not refused");
        for want in ["output refused", names, &format!("--allow {flag}")] {
            ensure!(err.contains(want), "{case}: expected {want:?} in: {err}");
        }
        let out = run(&[&render[..], &["--allow", flag]].concat());
        ensure!(
            out.status.success(),
            "{case}: refused with --allow {flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // `plugin check` runs the same policy, with the same flag.
        let check = ["plugin", "check", &plugin, "-f", &file];
        let out = run(&check);
        ensure!(
            !out.status.success() && String::from_utf8_lossy(&out.stdout).contains(names),
            "{case}: plugin check did not refuse it: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let out = run(&[&check[..], &["--allow", flag]].concat());
        ensure!(
            out.status.success(),
            "{case}: plugin check refused it with --allow {flag}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The host creates pods in Kubernetes' protobuf encoding (as kube-controller-manager does): the
/// rendered pods of the examples (the plain and the HPC cluster) (every field the bundled builder
/// sets) are carried whole by the schema, and the API server (the embedded one, or the cluster
/// of `SLINKY_TEST_KUBECONFIG`, which is the judge) stores each exactly as it stores the same pod
/// created as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_created_in_protobuf_is_stored_as_the_same_pod_created_as_json() -> Result<()> {
    use kube::{Api, api::PostParams};
    let c = slinky_tests::host::cluster(false).await;
    let ns = c.namespace("proto").await;
    let mut pods = Vec::new();
    for file in ["slurm-cluster.yaml", "hpc-cluster.yaml"] {
        let items = render_json(&[&example(file)], &[])?;
        pods.extend(items.into_iter().filter(|i| i["kind"] == "Pod"));
    }
    ensure!(pods.len() >= 2, "the examples render no pods");
    let api: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    // What the API server adds or names per object, and ownership (the NodeSet does not exist).
    let comparable = |p: &Pod| {
        let mut v = serde_json::to_value(p).unwrap_or_default();
        for key in [
            "name",
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
        ] {
            v["metadata"].as_object_mut().map(|m| m.remove(key));
        }
        v.as_object_mut().map(|m| m.remove("status"));
        v
    };
    for (i, rendered) in pods.iter().enumerate() {
        // As the host sends it: the typed pod, serialized.
        let mut pod: Pod = serde_json::from_value(rendered.clone())?;
        pod.metadata.namespace = Some(ns.clone());
        pod.metadata.owner_references = None;
        pod.metadata.name = Some(format!("json-{i}"));
        let by_json = api.create(&PostParams::default(), &pod).await?;
        pod.metadata.name = Some(format!("proto-{i}"));
        let body = slinky_protobuf::encode_exact(&serde_json::to_value(&pod)?)
            .map_err(|path| anyhow::anyhow!("the schema cannot carry {path} of pod {i}"))?;
        let mut req = kube::core::Request::new(format!("/api/v1/namespaces/{ns}/pods"))
            .create(&PostParams::default(), body)?;
        req.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(slinky_protobuf::MEDIA_TYPE),
        );
        let again = req.clone();
        let by_proto: Pod = c.client.request(req).await?;
        let (j, p) = (comparable(&by_json), comparable(&by_proto));
        ensure!(j == p, "pod {i}: created as JSON\n{j:#}\nin protobuf\n{p:#}");
        if i == 0 {
            // The host asks for the answers to its creates in protobuf: an error comes back as
            // a protobuf Status it reads (here: the name is taken).
            let mut again = again;
            again.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(slinky_protobuf::MEDIA_TYPE),
            );
            let res = c.client.send(again.map(kube::client::Body::from)).await?;
            ensure!(res.status() == 409, "a second create answered {}", res.status());
            let body = http_body_util::BodyExt::collect(res.into_body())
                .await?
                .to_bytes();
            let status = slinky_protobuf::decode(&body).map_err(|e| anyhow::anyhow!("{e}"))?;
            ensure!(
                status["kind"] == "Status" && status["code"] == 409 && status["reason"] == "AlreadyExists",
                "{status}"
            );
        }
    }
    Ok(())
}

/// The host's pod watch reads kube-apiserver's protobuf stream (as kcm's informers do) and hands
/// kube's watcher the same pods it would have read as JSON: on the embedded server and, with
/// `SLINKY_TEST_KUBECONFIG`, on a real one.
#[tokio::test]
async fn the_hosts_pod_watch_reads_protobuf_and_sees_the_pods_as_json_shows_them() -> Result<()> {
    use futures::StreamExt;
    use kube::{Api, api::PostParams, runtime::watcher};
    let c = slinky_tests::host::cluster(false).await;
    let ns = c.namespace("proto-watch").await;
    let host_client = host_client(&c).await?;
    let before = slinky_host::client::events_in_protobuf();
    let watched: Api<Pod> = Api::namespaced(host_client, &ns);
    let mut events = std::pin::pin!(watcher(watched, watcher::Config::default()));
    // Listed (as JSON) first: the pod must come by the watch.
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(ev) = events.next().await {
            if matches!(ev, Ok(watcher::Event::InitDone)) {
                return Ok(());
            }
        }
        Err(anyhow::anyhow!("the watch ended before its list"))
    })
    .await
    .context("the watch never listed")??;
    let items = render_json(&[&example("slurm-cluster.yaml")], &[])?;
    let rendered = items
        .into_iter()
        .find(|i| i["kind"] == "Pod")
        .context("the example renders no pod")?;
    let mut pod: Pod = serde_json::from_value(rendered)?;
    pod.metadata.namespace = Some(ns.clone());
    pod.metadata.owner_references = None;
    pod.metadata.name = Some("watched".into());
    let created = Api::<Pod>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &pod)
        .await?;
    let seen = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(ev) = events.next().await {
            match ev {
                Ok(watcher::Event::Apply(p)) if p.metadata.name.as_deref() == Some("watched") => {
                    return Ok(p);
                }
                Ok(_) => {}
                Err(e) => return Err(anyhow::anyhow!("the watch failed: {e}")),
            }
        }
        Err(anyhow::anyhow!("the watch ended"))
    })
    .await
    .context("the watch never showed the pod")??;
    // The host's cache keeps a slim pod: metadata but managedFields, spec.nodeName, hostname and
    // node affinity, status.phase, reason and conditions. The watch hands on just those, as the
    // API server's JSON shows them.
    let kept = |p: &Pod| {
        let v = serde_json::to_value(p).unwrap_or_default();
        let mut metadata = v["metadata"].clone();
        metadata.as_object_mut().map(|m| m.remove("managedFields"));
        let pick = |obj: &serde_json::Value, keys: &[&str]| {
            let mut out = serde_json::Map::new();
            for k in keys {
                if let Some(x) = obj.get(*k) {
                    out.insert((*k).to_string(), x.clone());
                }
            }
            serde_json::Value::Object(out)
        };
        let mut spec = pick(&v["spec"], &["nodeName", "hostname"]);
        if let Some(n) = v["spec"]["affinity"].get("nodeAffinity") {
            spec["affinity"] = serde_json::json!({"nodeAffinity": n});
        }
        serde_json::json!({"metadata": metadata, "spec": spec,
            "status": pick(&v["status"], &["phase", "reason", "conditions"])})
    };
    let differences = go_zero_differences(&kept(&seen), &kept(&created), "");
    ensure!(
        differences.is_empty(),
        "the host's watch and the created pod (JSON) differ at {differences:?}\n{:#}",
        kept(&seen)
    );
    ensure!(
        seen.spec.as_ref().is_some_and(|s| s.containers.is_empty()),
        "the host's watch decoded the containers, which its cache does not keep"
    );
    // The whole pod as the stream carries it decodes to the created one: the same pod, but that
    // Go writes every non-pointer field in protobuf (where JSON leaves an `omitempty` field
    // out, protobuf shows 0 or false, the same value to Kubernetes).
    let mut req = kube::core::Request::new(format!("/api/v1/namespaces/{ns}/pods"))
        .watch(&kube::api::WatchParams::default(), "0")?;
    req.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(slinky_protobuf::WATCH_MEDIA_TYPE),
    );
    let res = c.client.send(req.map(kube::client::Body::from)).await?;
    let mut body = res.into_body();
    let mut frames = slinky_protobuf::Frames::default();
    let message = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            if let Some(m) = frames.next_message()? {
                return anyhow::Ok(m);
            }
            let frame = http_body_util::BodyExt::frame(&mut body)
                .await
                .context("the watch ended")??;
            if let Ok(data) = frame.into_data() {
                frames.push(&data);
            }
        }
    })
    .await
    .context("no watch event in protobuf")??;
    let (_, whole) = slinky_protobuf::decode_watch_event(&message).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (mut whole, mut created_json) = (whole, serde_json::to_value(&created)?);
    for v in [&mut whole, &mut created_json] {
        v["metadata"].as_object_mut().map(|m| m.remove("managedFields"));
    }
    let differences = go_zero_differences(&whole, &created_json, "");
    ensure!(
        differences.is_empty(),
        "the pod in protobuf and created (JSON) differ at {differences:?}\n{whole:#}"
    );
    ensure!(
        slinky_host::client::events_in_protobuf() > before,
        "the watch was read as JSON: the server did not stream protobuf, or the host did not ask"
    );
    Ok(())
}

/// Where `watched` and `created` differ, but for fields only `watched` has that are `0` or
/// `false` (Go's zero values, which its protobuf writes and its JSON leaves out).
fn go_zero_differences(watched: &serde_json::Value, created: &serde_json::Value, at: &str) -> Vec<String> {
    use serde_json::Value;
    match (watched, created) {
        (Value::Object(w), Value::Object(c)) => {
            let mut out = Vec::new();
            for (k, wv) in w {
                let path = format!("{at}/{k}");
                match c.get(k) {
                    Some(cv) => out.extend(go_zero_differences(wv, cv, &path)),
                    None if *wv == Value::Bool(false) || wv.as_f64() == Some(0.0) => {}
                    None => out.push(format!("{path} (only watched)")),
                }
            }
            out.extend(
                c.keys()
                    .filter(|k| !w.contains_key(*k))
                    .map(|k| format!("{at}/{k} (only created)")),
            );
            out
        }
        (Value::Array(w), Value::Array(c)) if w.len() == c.len() => w
            .iter()
            .zip(c)
            .enumerate()
            .flat_map(|(i, (a, b))| go_zero_differences(a, b, &format!("{at}/{i}")))
            .collect(),
        (w, c) if w == c => Vec::new(),
        _ => vec![at.to_string()],
    }
}

/// A pod watch the API server refuses before it starts (here a bad label selector; on a cluster
/// also a 403 of RBAC) answers in protobuf to the host's client, which asked for protobuf
/// first: the host still reads the code and message of the `Status`, not bytes.
#[tokio::test]
async fn a_refused_pod_watch_in_protobuf_still_says_why() -> Result<()> {
    use kube::{Api, api::WatchParams};
    let c = slinky_tests::host::cluster(false).await;
    let ns = c.namespace("proto-refused").await;
    let pods: Api<Pod> = Api::namespaced(host_client(&c).await?, &ns);
    match pods.watch(&WatchParams::default().labels("a in ("), "0").await {
        Err(kube::Error::Api(s)) => ensure!(
            s.code == 400 && s.reason == "BadRequest" && !s.message.is_empty(),
            "the refusal read as {s:?}"
        ),
        Err(e) => bail!("the refusal was not read as the API's Status: {e}"),
        Ok(_) => bail!("a watch with a bad selector started"),
    }
    Ok(())
}

/// A client of `c` as the host makes its own (`slinky_host::client`: HTTP/2, protobuf pod
/// watches).
async fn host_client(c: &slinky_tests::TestCluster) -> Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&c.kubeconfig)?,
        &Default::default(),
    )
    .await?;
    Ok(slinky_host::client::client(config, Default::default())?)
}
