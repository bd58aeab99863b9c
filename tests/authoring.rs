//! Writing a plugin, as an author does it, with the real binary and real cargo builds: `plugin
//! new` → `cargo test` → `cargo build --target wasm32-wasip2 --release` → `render`; the example
//! GPU plugin checked field by field, diffed by `plugin check`, and hot-reloaded into a running
//! `run --embedded`; and the messages an author gets for each kind of mistake.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::Value;
use slinky_api::keys;
use slinky_tests::{example, run, test_plugin, wat, workspace};

/// Run `cargo` in `dir` with a target directory shared by these tests (kept between runs), without
/// debug info: a scaffold's native test build would otherwise take GBs of CI's disk.
fn cargo(dir: &Path, args: &[&str]) -> Result<()> {
    let target = workspace().join("target").join("scaffold-tests");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(dir)
        .args(args)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_DEV_DEBUG", "false");
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd.output().context("cannot run cargo")?;
    ensure!(
        out.status.success(),
        "cargo {args:?} in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Render `files` (JSON list items), with `plugin` overriding when given.
fn render(files: &[PathBuf], plugin: Option<&Path>) -> Result<Vec<Value>> {
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let p = plugin.map(|p| p.display().to_string());
    let extra: Vec<&str> = match &p {
        Some(p) => vec!["--plugin", p.as_str()],
        None => vec![],
    };
    slinky_tests::render_json(&files, &extra)
}

/// Without what always differs between two builders (names, digests, the revision).
fn normalized(mut items: Vec<Value>) -> Vec<Value> {
    for item in &mut items {
        if let Some(a) = item
            .pointer_mut("/spec/template/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            a.remove(keys::ANNOTATION_BUILDER);
            a.remove(keys::ANNOTATION_BUILDER_DIGEST);
        }
        if let Some(a) = item["metadata"]["annotations"].as_object_mut() {
            a.remove(keys::ANNOTATION_BUILDER);
            a.remove(keys::ANNOTATION_BUILDER_DIGEST);
        }
        if let Some(l) = item["metadata"]["labels"].as_object_mut() {
            l.remove(keys::LABEL_REVISION_HASH);
        }
    }
    items
}

#[test]
fn plugin_new_builds_for_wasm_on_the_first_try_and_renders_like_the_bundled_builder() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    for (name, kind) in [
        ("site-pods", "nodeset-pod"),
        ("site-service", "controller-service"),
        ("site-controller", "controller-children"),
        ("site-workers", "nodeset-children"),
    ] {
        let dir = tmp.path().join(name);
        let out = run(&[
            "plugin",
            "new",
            name,
            "--kind",
            kind,
            "--dir",
            &dir.display().to_string(),
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "plugin new: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(
            stdout.contains("cargo build --target wasm32-wasip2 --release"),
            "{stdout}"
        );
        for f in [
            "Cargo.toml",
            "Cargo.lock",
            "README.md",
            "src/lib.rs",
            "rust-toolchain.toml",
            "cluster.yaml",
        ] {
            ensure!(dir.join(f).is_file(), "{name}: {f} is missing");
        }
        // Every file the "next" steps and the README name with -f exists in the crate.
        let readme = std::fs::read_to_string(dir.join("README.md"))?;
        for text in [stdout.as_ref(), readme.as_str()] {
            for named in text
                .split("-f ")
                .skip(1)
                .filter_map(|r| r.split_whitespace().next())
            {
                ensure!(
                    dir.join(named).is_file(),
                    "{name}: -f {named} names no file of the crate"
                );
            }
        }
        // The scaffold's own test passes, and it builds for wasm.
        cargo(&dir, &["test", "--offline"])?;
        cargo(
            &dir,
            &["build", "--offline", "--target", "wasm32-wasip2", "--release"],
        )?;
        let wasm = workspace()
            .join("target/scaffold-tests/wasm32-wasip2/release")
            .join(format!("{}.wasm", name.replace('-', "_")));
        ensure!(wasm.is_file(), "{} was not built", wasm.display());

        // It starts from the bundled builder's behaviour: the same objects (for the crate's own
        // cluster.yaml, which its README renders).
        let files = [dir.join("cluster.yaml")];
        let ours = render(&files, Some(&wasm))?;
        let bundled = render(&files, None)?;
        assert_eq!(normalized(ours.clone()), normalized(bundled), "{name}");
        let builder = ours
            .iter()
            .filter_map(|o| o["metadata"]["annotations"][keys::ANNOTATION_BUILDER].as_str())
            .find(|b| b.starts_with(name));
        assert_eq!(
            builder,
            Some(format!("{name}@0.1.0").as_str()),
            "{name} built something"
        );
    }

    // A second `plugin new` into the same place is refused, and so is a bad name.
    let again = run(&[
        "plugin",
        "new",
        "site-pods",
        "--kind",
        "nodeset-pod",
        "--dir",
        &tmp.path().join("site-pods").display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&again.stderr);
    ensure!(
        !again.status.success() && err.contains("exists and is not empty"),
        "{err}"
    );
    let bad = run(&[
        "plugin",
        "new",
        "Site Pods",
        "--kind",
        "nodeset-pod",
        "--dir",
        &tmp.path().join("x").display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    ensure!(
        !bad.status.success() && err.contains("not a valid plugin name"),
        "{err}"
    );
    Ok(())
}

fn gpu_plugin() -> PathBuf {
    test_plugin("gpu_nodeset_pod")
}

#[test]
fn the_gpu_example_builds_gpus_a_toleration_and_a_sidecar_field_by_field() -> Result<()> {
    let items = render(
        &[workspace().join("examples/gpu-plugin/gpu-cluster.yaml")],
        Some(&gpu_plugin()),
    )?;
    let pods: Vec<&Value> = items.iter().filter(|i| i["kind"] == "Pod").collect();
    assert_eq!(pods.len(), 2);
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(
            pod["metadata"]["annotations"][keys::ANNOTATION_BUILDER],
            "gpu-nodeset-pod@0.1.0"
        );
        let slurmd = &pod["spec"]["containers"][0];
        assert_eq!(slurmd["name"], "slurmd", "{name}");
        assert_eq!(slurmd["resources"]["limits"]["nvidia.com/gpu"], "2", "{name}");
        assert_eq!(slurmd["resources"]["requests"]["nvidia.com/gpu"], "2", "{name}");
        let tolerations = pod["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
        assert!(
            tolerations.iter().any(|t| t["key"] == "nvidia.com/gpu"
                && t["operator"] == "Exists"
                && t["effect"] == "NoSchedule"),
            "{name}: {tolerations:?}"
        );
        let sidecar = &pod["spec"]["containers"][1];
        assert_eq!(sidecar["name"], "gpu-monitor", "{name}");
        assert_eq!(
            sidecar["image"], "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9",
            "{name}"
        );
        assert_eq!(sidecar["ports"][0]["containerPort"], 9400, "{name}");
        assert_eq!(
            pod["spec"]["containers"].as_array().map(Vec::len),
            Some(2),
            "{name}"
        );
    }
    // Without the annotations it builds the bundled builder's pods.
    let files = [example("slurm-cluster.yaml")];
    assert_eq!(
        normalized(render(&files, Some(&gpu_plugin()))?),
        normalized(render(&files, None)?)
    );
    Ok(())
}

#[test]
fn plugin_check_diffs_exactly_the_gpu_changes() -> Result<()> {
    let input = workspace().join("examples/gpu-plugin/gpu-cluster.yaml");
    let out = run(&[
        "plugin",
        "check",
        &gpu_plugin().display().to_string(),
        "-f",
        &input.display().to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "plugin: gpu-nodeset-pod@0.1.0",
        "kinds: nodeset-pod",
        "contract: 0.3.0",
        "OK: 2 object(s)",
        "2 differing",
    ] {
        ensure!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let removed: Vec<&str> = text.lines().filter(|l| l.starts_with("- ")).collect();
    ensure!(
        removed.is_empty(),
        "nothing of the bundled pod is removed: {removed:?}"
    );
    let added: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("+ "))
        .map(str::trim)
        .collect();
    // Per pod: the GPU limit and request, the sidecar, the toleration; nothing else.
    let per_pod = [
        "resources:",
        "limits:",
        "nvidia.com/gpu: \"2\"",
        "requests:",
        "nvidia.com/gpu: \"2\"",
        "- image: nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9",
        "name: gpu-monitor",
        "ports:",
        "- containerPort: 9400",
        "name: metrics",
        "- effect: NoSchedule",
        "key: nvidia.com/gpu",
        "operator: Exists",
    ];
    let want: Vec<&str> = per_pod.iter().chain(per_pod.iter()).copied().collect();
    assert_eq!(added, want, "\n{text}");

    // `--settings` asks the plugin's validate-settings, as the host does before a step serves.
    let with = |settings: &str| {
        run(&[
            "plugin",
            "check",
            &gpu_plugin().display().to_string(),
            "-f",
            &input.display().to_string(),
            "--settings",
            settings,
        ])
    };
    let fine = with(r#"{"gpusPerPod": 2}"#);
    let text = String::from_utf8_lossy(&fine.stdout);
    ensure!(
        fine.status.success() && text.starts_with("settings: accepted"),
        "{text}"
    );
    let refused = with(r#"{"gpusPerPod": 99}"#);
    let text = String::from_utf8_lossy(&refused.stdout);
    ensure!(
        !refused.status.success() && text.contains("settings: REFUSED") && text.contains("gpusPerPod is 99"),
        "{text}{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    Ok(())
}

/// The messages an author gets, through `plugin check` (each names the cause and the fix).
#[test]
fn author_errors_name_the_cause_and_the_fix() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let input = |name: &str, annotations: &str| -> Result<PathBuf> {
        let text = std::fs::read_to_string(example("slurm-cluster.yaml"))?;
        let mut docs: Vec<Value> = text
            .split("\n---\n")
            .map(serde_saphyr::from_str)
            .collect::<Result<_, _>>()?;
        for d in &mut docs {
            d["metadata"]["annotations"] = serde_json::from_str(annotations)?;
            if d["kind"] == "NodeSet" {
                d["spec"]["replicas"] = 1.into();
            }
        }
        let path = tmp.path().join(format!("{name}.yaml"));
        let yaml: Vec<String> = docs
            .iter()
            .map(serde_saphyr::to_string)
            .collect::<Result<_, _>>()?;
        std::fs::write(&path, yaml.join("---\n"))?;
        Ok(path)
    };
    let raw = test_plugin("raw");
    let hostile = test_plugin("hostile");
    let cases: Vec<(&str, PathBuf, Option<PathBuf>, Vec<&str>)> = vec![
        (
            "another contract version",
            wat("contract-9.9"),
            None,
            vec![
                "contract version 9.9.0",
                "rebuild it against slinky-guest-sdk 0.3.0",
            ],
        ),
        (
            "missing export",
            wat("no-describe"),
            None,
            vec![
                "does not export `slinky:builder/plugin@0.3.0`",
                "slinky_guest_sdk::export_plugin!",
            ],
        ),
        (
            "invalid JSON",
            raw.clone(),
            Some(input("json", r#"{"raw.test/output": "{not json"}"#)?),
            vec!["the output is not JSON", "serialized with serde_json"],
        ),
        (
            "wrong kind",
            raw.clone(),
            Some(input(
                "kind",
                r#"{"raw.test/output": "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"x\"}}"}"#,
            )?),
            vec![
                "expected apiVersion v1 kind Pod, got apiVersion v1 kind ConfigMap",
                "must return a v1 Pod",
            ],
        ),
        (
            "a panic",
            hostile.clone(),
            Some(input("panic", r#"{"hostile.test/behaviour": "panic"}"#)?),
            vec!["trapped", "panicked on purpose", "return a BuildError"],
        ),
        (
            "a loop",
            hostile.clone(),
            Some(input("loop", r#"{"hostile.test/behaviour": "loop"}"#)?),
            vec!["exceeded its deadline of 200 ms", "--plugin-deadline-ms"],
        ),
        (
            "too much memory",
            hostile,
            Some(input("alloc", r#"{"hostile.test/behaviour": "alloc:100"}"#)?),
            vec!["exceeded its memory cap of 32 MiB", "--plugin-memory-mib"],
        ),
    ];
    for (what, plugin, file, wants) in cases {
        let mut args = vec![
            "--plugin-deadline-ms".to_string(),
            "200".into(),
            "--plugin-memory-mib".into(),
            "32".into(),
            "plugin".into(),
            "check".into(),
            plugin.display().to_string(),
        ];
        if let Some(f) = &file {
            args.extend(["-f".into(), f.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(!out.status.success(), "{what}: plugin check must fail:\n{text}");
        for want in wants {
            ensure!(text.contains(want), "{what}: {want:?} not in:\n{text}");
        }
    }
    Ok(())
}

/// The example plugin hot-reloaded into the real binary's `run --embedded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gpu_example_hot_reloads_into_a_running_host() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let plugins = tmp.path().join("plugins.d");
    std::fs::create_dir(&plugins)?;
    let kubeconfig = tmp.path().join("kubeconfig");
    let mut host = Command::new(slinky_tests::binary())
        .args(["run", "--embedded", "--apply"])
        .arg(example("slurm-cluster.yaml"))
        .arg("--plugins-dir")
        .arg(&plugins)
        .args([
            "--plugins-poll-ms",
            "100",
            "--run-for-seconds",
            "120",
            "--http-addr",
        ])
        // Port 0: it binds its own ports and logs them.
        .arg("127.0.0.1:0")
        .arg("--admin-addr")
        .arg("127.0.0.1:0")
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .env("SLINKY_HOST_PLUGIN_CACHE", slinky_tests::cache_dir())
        .env("RUST_LOG", "slinky_host::serve=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = host.stderr.take().context("no stderr")?;
    let (_http, admin, _log) = slinky_tests::process::bound_addresses(stderr)?;
    let result = async {
        let client = slinky_tests::eventually(60, || async {
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig).ok()?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .ok()?;
            let client = kube::Client::try_from(cfg).ok()?;
            let pods = Api::<Pod>::namespaced(client.clone(), "slurm")
                .list(&ListParams::default().labels("app.kubernetes.io/name=slurmd"))
                .await
                .ok()?;
            (pods.items.len() == 3).then_some(client)
        })
        .await
        .context("the host did not start the example cluster")?;
        std::fs::copy(gpu_plugin(), plugins.join("gpu.wasm"))?;
        Api::<slinky_api::NodeSet>::namespaced(client.clone(), "slurm")
            .patch(
                "slurm-worker-slinky",
                &PatchParams::default(),
                &Patch::Merge(
                    serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
                    "gpu.example.com/count": "1"}}}}}),
                ),
            )
            .await?;
        let pods = Api::<Pod>::namespaced(client, "slurm");
        let rolled = slinky_tests::eventually(90, || async {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=slurmd"))
                .await
                .ok()?;
            let gpu = |p: &Pod| {
                p.spec.as_ref().is_some_and(|s| {
                    s.containers[0]
                        .resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.get("nvidia.com/gpu").is_some_and(|q| q.0 == "1"))
                }) && p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(keys::ANNOTATION_BUILDER))
                    .map(String::as_str)
                    == Some("gpu-nodeset-pod@0.1.0")
            };
            (list.items.len() == 3 && list.items.iter().all(gpu)).then_some(())
        })
        .await;
        if rolled.is_none() {
            bail!("the pods did not roll to the GPU builder");
        }
        // `/plugins` names it.
        let body = slinky_tests::http_get(admin, "/plugins").await?;
        ensure!(body.contains("\"name\": \"gpu-nodeset-pod\""), "{body}");
        Ok(())
    }
    .await;
    let _ = host.kill();
    let _ = host.wait();
    result
}
