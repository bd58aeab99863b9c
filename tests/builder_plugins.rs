//! BuilderPlugins end to end: two `nodeset-pod` steps declared as custom resources, one pulled
//! by digest from a real OCI registry (Debian's `docker-registry`) and cosign-signed with a key
//! made by `slinky-host plugin keygen` and pushed by `slinky-host plugin push`, one read from a
//! ConfigMap; pods built by the bundled builder and both steps, in order; a setting change rolls
//! the pods; a wrong setting, an unsigned module and an unknown digest are each refused with a
//! clear status while the previous version serves; a contract 0.1.0 plugin still loads; one the
//! host cannot decode is refused alone.
//!
//! Skips (saying why) where `docker-registry` is not installed (`apt-get install docker-registry`;
//! `.ci/run` installs it).

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use slinky_api::{BuilderPlugin, NodeSet};
use slinky_host::{
    PluginRegistry,
    oci::{Credentials, DigestStore, ModuleSource, Oci, Proxies, PublicKey},
    plugins::{BuilderKind, Pipeline},
    reconcile::{RunConfig, builder_plugin},
};
use slinky_tests::{
    TestCluster, default_engine, eventually,
    host::{Host, NS_NAME, apply_example_with, cluster, pod_ready, scale},
    run, test_plugin,
};

const REGISTRY: &str = "/usr/bin/docker-registry";

/// The tests whose hosts reconcile BuilderPlugins take turns: BuilderPlugins are cluster-scoped,
/// so on a shared real cluster each host would also report on the other test's.
static BP_HOSTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A `docker-registry` on a free loopback port, storing in a temporary directory.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// One serving anonymously, or with `htpasswd` (a line `user:bcrypt-hash`): `Basic` auth.
    fn start(htpasswd: Option<&str>) -> Result<Option<Registry>> {
        if !Path::new(REGISTRY).is_file() {
            return Ok(None);
        }
        let dir = tempfile::tempdir()?;
        let addr = slinky_tests::process::free_addr()?.to_string();
        let config = dir.path().join("config.yml");
        let mut text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        );
        if let Some(line) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{line}\n"))?;
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: slinky-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, text)?;
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {REGISTRY}"))?;
        Ok(Some(Registry {
            child,
            addr,
            _dir: dir,
        }))
    }

    /// Wait until it answers; an error when it exited (its port taken meanwhile: the caller
    /// starts another) or never answered.
    async fn wait(&mut self) -> Result<()> {
        let addr: std::net::SocketAddr = self.addr.parse()?;
        for _ in 0..300 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                bail!("the registry exited (its port {addr} was taken)");
            }
            if slinky_tests::http_get(addr, "/v2/").await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the registry never answered /v2/")
    }

    /// A registry that answers (another port when one was taken meanwhile), or none when it is
    /// not installed.
    async fn start_answering() -> Result<Option<Registry>> {
        Registry::start_answering_with(None).await
    }

    /// [`Registry::start_answering`], with `htpasswd` as [`Registry::start`] takes it.
    async fn start_answering_with(htpasswd: Option<&str>) -> Result<Option<Registry>> {
        for _ in 0..3 {
            let Some(mut registry) = Registry::start(htpasswd)? else {
                return Ok(None);
            };
            if registry.wait().await.is_ok() {
                return Ok(Some(registry));
            }
        }
        bail!("no registry answered after 3 tries")
    }
}

/// `slinky-host` with `args`; its stdout, or an error with its stderr.
fn host_cli(args: &[&str]) -> Result<String> {
    let out = run(args);
    ensure!(
        out.status.success(),
        "slinky-host {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `bytes` gzipped: a ConfigMap holds at most 1 MiB, a component often more.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

/// Ready, on the embedded server (its simulated kubelet runs pods); on a real cluster without
/// nodes, any pod counts.
fn ready_or_no_kubelet(p: &Pod) -> bool {
    slinky_apiserver::testing::real_cluster() || pod_ready(p)
}

/// Create the ConfigMap `ns/name` holding `bytes` under `key` (binaryData) and, when given, its
/// signature under `plugin.wasm.sig` (data, as `kubectl create configmap --from-file` puts it).
async fn module_config_map(
    c: &TestCluster,
    ns: &str,
    name: &str,
    key: &str,
    bytes: Vec<u8>,
    sig: Option<String>,
) -> Result<()> {
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        binary_data: Some([(key.to_string(), ByteString(bytes))].into()),
        data: sig.map(|sig| [("plugin.wasm.sig".to_string(), sig)].into()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await?;
    Ok(())
}

/// Where BuilderPlugins' modules come from: registries (kept in `cache`), ConfigMaps, signatures
/// verified with `public_key` when given.
fn source(c: &TestCluster, cache: Option<&Path>, public_key: Option<&str>) -> Result<Arc<ModuleSource>> {
    let oci = Oci::new(DigestStore::new(cache.map(Path::to_path_buf)), Vec::new())?;
    let key = public_key.map(PublicKey::from_pem).transpose()?;
    // The tests keep modules in their own namespaces.
    Ok(Arc::new(
        ModuleSource::new(
            oci,
            c.client.clone(),
            key,
            slinky_host::plugins::gunzip_if_gzipped,
        )
        .with_config_map_namespaces(vec![slinky_host::oci::ANY_NAMESPACE.into()]),
    ))
}

/// A host serving namespace `ns` with `plugins` and the cluster's BuilderPlugins from `source`
/// (loaded before anything reconciles, watched after).
fn host_with_builder_plugins(
    c: &TestCluster,
    ns: &str,
    plugins: &Arc<PluginRegistry>,
    source: Arc<ModuleSource>,
) -> Host {
    let config = RunConfig {
        namespaces: vec![ns.into()],
        resync: Some(Duration::from_secs(1)),
        builder_plugins: Some(source),
        ..Default::default()
    };
    Host::start_config(c.client.clone(), plugins.clone(), config)
}

/// The Warning Events with `reason` about the BuilderPlugin `name` (cluster-scoped: in any
/// namespace), counting a series as its count.
async fn warnings(c: &TestCluster, name: &str, reason: &str) -> Result<i32> {
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(c.client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(events
        .items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum())
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

async fn put_plugin(c: &TestCluster, name: &str, spec: serde_json::Value) -> Result<()> {
    let api = Api::<BuilderPlugin>::all(c.client.clone());
    let bp = json!({
        "apiVersion": "plugins.slinky.slurm.net/v1alpha1",
        "kind": "BuilderPlugin",
        "metadata": {"name": name},
        "spec": spec,
    });
    api.patch(name, &PatchParams::apply("test-user").force(), &Patch::Apply(&bp))
        .await?;
    Ok(())
}

async fn patch_spec(c: &TestCluster, name: &str, spec: serde_json::Value) -> Result<()> {
    Api::<BuilderPlugin>::all(c.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await?;
    Ok(())
}

/// Wait until BuilderPlugin `name`'s status is `phase` for its current generation, with a
/// `Loaded` condition reason `reason`; returns its status.
async fn wait_phase(c: &TestCluster, name: &str, phase: &str, reason: &str) -> Result<serde_json::Value> {
    let api = Api::<BuilderPlugin>::all(c.client.clone());
    let last = std::sync::Mutex::new(json!(null));
    let found = eventually(60, || {
        let api = api.clone();
        let last = &last;
        async move {
            let bp = api.get(name).await.ok()?;
            let status = serde_json::to_value(bp.status.clone()?).ok()?;
            if let Ok(mut l) = last.lock() {
                *l = status.clone();
            }
            let current = status["observedGeneration"].as_i64() == bp.metadata.generation;
            (current && status["phase"] == phase && status["conditions"][0]["reason"] == reason)
                .then_some(status)
        }
    })
    .await;
    let last = last.lock().map(|l| l.clone()).unwrap_or_default();
    found.with_context(|| format!("BuilderPlugin {name} never became {phase}/{reason}; its status: {last}"))
}

/// The GPU count in the slurmd limits of `pod`.
fn gpus(p: &Pod) -> Option<String> {
    let c = p.spec.as_ref()?.containers.iter().find(|c| c.name == "slurmd")?;
    Some(
        c.resources
            .as_ref()?
            .limits
            .as_ref()?
            .get("nvidia.com/gpu")?
            .0
            .clone(),
    )
}

/// Wait until `n` Ready pods exist in `ns`, every one with `gpus` GPUs and the site label.
async fn pods_with(c: &TestCluster, ns: &str, n: usize, want_gpus: &str) -> Result<Vec<Pod>> {
    let api = Api::<Pod>::namespaced(c.client.clone(), ns);
    let ok = eventually(90, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let live: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        (live.len() == n
            && live.iter().all(|p| {
                ready_or_no_kubelet(p)
                    && gpus(p).as_deref() == Some(want_gpus)
                    && p.labels().get("site.example.com/rack").map(String::as_str) == Some("a")
            }))
        .then_some(live)
    })
    .await;
    match ok {
        Some(p) => Ok(p),
        None => {
            let list = api.list(&ListParams::default()).await?;
            let seen: Vec<String> = list
                .items
                .iter()
                .map(|p| format!("{} gpus={:?} labels={:?}", p.name_any(), gpus(p), p.labels()))
                .collect();
            bail!("never {n} Ready pods with {want_gpus} GPUs and the site label; saw {seen:#?}")
        }
    }
}

fn uids(pods: &[Pod]) -> Vec<String> {
    let mut u: Vec<String> = pods.iter().filter_map(|p| p.uid()).collect();
    u.sort();
    u
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_steps_as_custom_resources_settings_roll_and_refusals_keep_the_previous_version() -> Result<()> {
    let Some(registry) = Registry::start_answering().await? else {
        slinky_apiserver::testing::skip(
            "two_steps_as_custom_resources_settings_roll_and_refusals_keep_the_previous_version",
            "registry",
            &format!("{REGISTRY} is not installed (apt-get install docker-registry)"),
        );
        return Ok(());
    };
    let _turn = BP_HOSTS.lock().await;
    let keys = tempfile::tempdir()?;
    let prefix = keys.path().join("signing");
    host_cli(&["plugin", "keygen", path(&prefix)])?;
    let (key, public) = (keys.path().join("signing.key"), keys.path().join("signing.pub"));
    let gpu = test_plugin("gpu_nodeset_pod");
    let signed = host_cli(&[
        "plugin",
        "push",
        path(&gpu),
        &format!("{}/site/gpu:1", registry.addr),
        "--sign-key",
        path(&key),
    ])?;
    ensure!(signed.contains("@sha256:"), "push printed {signed:?}");
    // The same plugin under another digest, never signed.
    let unsigned_file = keys.path().join("gpu-unsigned.wasm");
    std::fs::write(
        &unsigned_file,
        slinky_host::plugins::with_custom_section(&std::fs::read(&gpu)?, "slinky-test-variant", b"unsigned"),
    )?;
    let unsigned = host_cli(&[
        "plugin",
        "push",
        path(&unsigned_file),
        &format!("{}/site/gpu:unsigned", registry.addr),
    ])?;

    let c = cluster(true).await;
    let ns = c.namespace("bp").await;
    let site = std::fs::read(test_plugin("site_pod"))?;
    let site_digest = slinky_host::oci::sha256(&site);
    // Signed (this host verifies every module), as `plugin sign` does it.
    let signer = slinky_host::oci::SigningKey::from_pem(&std::fs::read_to_string(&key)?)?;
    let site_sig = signer.sign_blob(&site)?;
    let site = gzip(&site)?;
    module_config_map(&c, &ns, "site-pod", "plugin.wasm.gz", site, Some(site_sig)).await?;

    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let pem = std::fs::read_to_string(&public)?;
    let cache = tempfile::tempdir()?;
    let host = host_with_builder_plugins(&c, &ns, &plugins, source(&c, Some(cache.path()), Some(&pem))?);
    // Only this namespace's NodeSet: other tests' NodeSets (on a shared real cluster) never match.
    let selector = json!({"matchLabels": {"bp-test": ns}});
    put_plugin(
        &c,
        &format!("{ns}-gpu"),
        json!({"module": {"image": signed}, "kinds": ["nodeset-pod"], "order": 10,
               "settings": {"gpusPerPod": 1}, "selector": selector}),
    )
    .await?;
    put_plugin(
        &c,
        &format!("{ns}-site"),
        json!({"module": {"configMap": {"namespace": ns, "name": "site-pod", "key": "plugin.wasm.gz"}, "digest": site_digest},
               "kinds": ["nodeset-pod"], "order": 20,
               "settings": {"labels": {"site.example.com/rack": "a"}}, "selector": selector}),
    )
    .await?;
    let result = async {
        let gpu_status = wait_phase(&c, &format!("{ns}-gpu"), "Loaded", "Loaded").await?;
        ensure!(
            gpu_status["digest"] == format!("sha256:{}", slinky_host::plugins::digest(&std::fs::read(&gpu)?)),
            "{gpu_status}"
        );
        wait_phase(&c, &format!("{ns}-site"), "Loaded", "Loaded").await?;
        apply_example_with(&c, &ns, 2, |v| v["metadata"]["labels"]["bp-test"] = json!(ns)).await?;

        // Built by the bundled builder, then the GPU step, then the site step.
        let pods = pods_with(&c, &ns, 2, "1").await?;
        let builder = pods[0].annotations().get(slinky_api::keys::ANNOTATION_BUILDER).cloned().unwrap_or_default();
        ensure!(
            builder.starts_with("nodeset-pod@") && builder.ends_with(" > gpu-nodeset-pod@0.1.0 > site-pod@0.2.0"),
            "builder annotation {builder:?}"
        );
        let applies = wait_phase(&c, &format!("{ns}-gpu"), "Loaded", "Loaded").await?;
        let applies_ok = eventually(30, || async {
            let bp = Api::<BuilderPlugin>::all(c.client.clone()).get(&format!("{ns}-gpu")).await.ok()?;
            let s = bp.status?;
            (s.applies_to == vec![format!("NodeSet {ns}/slurm-worker-slinky")]).then_some(())
        })
        .await;
        ensure!(applies_ok.is_some(), "appliesTo never named the NodeSet: {applies}");
        if slinky_apiserver::testing::on_path("kubectl") {
            let out = Command::new("kubectl")
                .args(["--kubeconfig", path(&c.kubeconfig), "get", "builderplugins"])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            ensure!(
                out.status.success()
                    && text.contains("STATUS")
                    && text.contains("Loaded")
                    && text.contains("gpu-nodeset-pod@0.1.0"),
                "kubectl get builderplugins:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            slinky_apiserver::testing::skip("kubectl get builderplugins", "kubectl", "kubectl is not on PATH");
        }

        // A setting change rolls the pods.
        patch_spec(&c, &format!("{ns}-gpu"), json!({"settings": {"gpusPerPod": 2}})).await?;
        let rolled = pods_with(&c, &ns, 2, "2").await?;
        ensure!(uids(&rolled).iter().all(|u| !uids(&pods).contains(u)), "the pods were not replaced");

        // A wrong setting: refused with the plugin's own message; the previous settings serve.
        patch_spec(&c, &format!("{ns}-gpu"), json!({"settings": {"gpusPerPod": 99}})).await?;
        let s = wait_phase(&c, &format!("{ns}-gpu"), "Refused", "InvalidSettings").await?;
        let message = s["conditions"][0]["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("gpusPerPod is 99") && message.contains("keeps serving"),
            "{message}"
        );
        // An unsigned module: refused.
        patch_spec(&c, &format!("{ns}-gpu"), json!({"module": {"image": unsigned}, "settings": {"gpusPerPod": 2}})).await?;
        let s = wait_phase(&c, &format!("{ns}-gpu"), "Refused", "BadSignature").await?;
        ensure!(s["conditions"][0]["message"].as_str().unwrap_or_default().contains("no cosign signature"), "{s}");
        // Signed, but with another key: refused.
        let stranger = keys.path().join("stranger");
        host_cli(&["plugin", "keygen", path(&stranger)])?;
        let stranger_file = keys.path().join("gpu-stranger.wasm");
        std::fs::write(
            &stranger_file,
            slinky_host::plugins::with_custom_section(&std::fs::read(&gpu)?, "slinky-test-variant", b"stranger"),
        )?;
        let other_key = host_cli(&[
            "plugin",
            "push",
            path(&stranger_file),
            &format!("{}/site/gpu:other-key", registry.addr),
            "--sign-key",
            path(&keys.path().join("stranger.key")),
        ])?;
        patch_spec(&c, &format!("{ns}-gpu"), json!({"module": {"image": other_key}})).await?;
        let s = wait_phase(&c, &format!("{ns}-gpu"), "Refused", "BadSignature").await?;
        ensure!(s["conditions"][0]["message"].as_str().unwrap_or_default().contains("does not verify"), "{s}");
        // A selector Kubernetes would not accept: refused, not "matches nothing".
        patch_spec(
            &c,
            &format!("{ns}-site"),
            json!({"selector": {"matchExpressions": [{"key": "bp-test", "operator": "Near", "values": ["x"]}]}}),
        )
        .await?;
        wait_phase(&c, &format!("{ns}-site"), "Refused", "InvalidSpec").await?;
        patch_spec(&c, &format!("{ns}-site"), json!({"selector": {"matchExpressions": null}})).await?;
        wait_phase(&c, &format!("{ns}-site"), "Loaded", "Loaded").await?;
        // An unknown digest: refused.
        let unknown = format!("{}/site/gpu@sha256:{}", registry.addr, "0".repeat(64));
        patch_spec(&c, &format!("{ns}-gpu"), json!({"module": {"image": unknown}})).await?;
        let s = wait_phase(&c, &format!("{ns}-gpu"), "Refused", "UnknownDigest").await?;
        ensure!(s["digest"] == gpu_status["digest"], "the serving version is not the one loaded before: {s}");
        // A ConfigMap module whose digest is not the pinned one: refused.
        patch_spec(&c, &format!("{ns}-site"), json!({"module": {"digest": format!("sha256:{}", "1".repeat(64))}})).await?;
        wait_phase(&c, &format!("{ns}-site"), "Refused", "UnknownDigest").await?;
        // Through all of it the previous versions served: the pods never rolled (over several
        // passes of the host, not a fixed time).
        host.passes_later(6).await?;
        let still = pods_with(&c, &ns, 2, "2").await?;
        ensure!(uids(&still) == uids(&rolled), "a refused version rolled the pods");

        // A restart while both current specs are refused: the new host loads the versions their
        // status says served (from its module cache), so the NodeSet keeps its pipeline.
        let nodeset = Api::<slinky_api::NodeSet>::namespaced(c.client.clone(), &ns)
            .get("slurm-worker-slinky")
            .await?;
        let serving = plugins.pipeline(BuilderKind::NodesetPod, &nodeset.metadata);
        ensure!(
            serving.steps().len() == 2 && serving.label().ends_with(" > gpu-nodeset-pod@0.1.0 > site-pod@0.2.0"),
            "before the restart the pipeline is {}: both steps should serve",
            serving.label()
        );
        let fresh = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
        let steps = builder_plugin::Steps::new(
            fresh.clone(),
            source(&c, Some(cache.path()), Some(&pem))?,
            Default::default(),
        );
        builder_plugin::load_once(&c.client, &steps).await?;
        let after = fresh.pipeline(BuilderKind::NodesetPod, &nodeset.metadata);
        ensure!(
            after.digest() == serving.digest() && after.label() == serving.label(),
            "after a restart the pipeline is {} ({}), before it {} ({})",
            after.label(),
            after.digest(),
            serving.label(),
            serving.digest()
        );

        // The status is a hint, not a source of trust: a restart whose keys no longer include
        // the one both steps were signed with restores neither (the kept ConfigMap module's
        // signature is checked again under today's keys too); one with the old and the new key
        // restores both; one without keys restores the ConfigMap module (pinned, from its cache)
        // and not the registry one (closed by default: no key, no registry module), and one
        // without keys and without the module in its cache restores nothing it cannot vouch for.
        let restart = |pem: Option<String>, cache: std::path::PathBuf| {
            let c = &c;
            async move {
                let fresh = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
                let steps = builder_plugin::Steps::new(fresh.clone(), source(c, Some(&cache), pem.as_deref())?, Default::default());
                builder_plugin::load_once(&c.client, &steps).await?;
                anyhow::Ok(fresh)
            }
        };
        let stranger_pem = std::fs::read_to_string(keys.path().join("stranger.pub"))?;
        let rotated = restart(Some(stranger_pem.clone()), cache.path().to_path_buf()).await?;
        let label = rotated.pipeline(BuilderKind::NodesetPod, &nodeset.metadata).label().to_string();
        ensure!(
            !label.contains("gpu-nodeset-pod") && !label.contains("site-pod"),
            "after a restart with another key the pipeline is {label}: neither step's signature verifies"
        );
        let overlap = restart(Some(format!("{stranger_pem}{pem}")), cache.path().to_path_buf()).await?;
        let label = overlap.pipeline(BuilderKind::NodesetPod, &nodeset.metadata).label().to_string();
        ensure!(label == serving.label(), "with both keys the pipeline is {label}, before {}", serving.label());
        let closed = restart(None, cache.path().to_path_buf()).await?;
        let label = closed.pipeline(BuilderKind::NodesetPod, &nodeset.metadata).label().to_string();
        ensure!(
            !label.contains("gpu-nodeset-pod") && label.ends_with(" > site-pod@0.2.0"),
            "after a restart without keys the pipeline is {label}: only the pinned ConfigMap step may serve"
        );
        let empty = tempfile::tempdir()?;
        let unkeyed = restart(None, empty.path().to_path_buf()).await?;
        let label = unkeyed.pipeline(BuilderKind::NodesetPod, &nodeset.metadata).label().to_string();
        ensure!(
            !label.contains("gpu-nodeset-pod") && !label.contains("site-pod"),
            "a host that never loaded them restored {label} on the status' word"
        );

        // A contract 0.2.0 plugin loads as a step (compiled, described, contract checked), is
        // refused settings (its contract has no way to receive them), and is judged on what it
        // builds: this one builds only the workers' Service, which would delete the PDB and the
        // SSH ConfigMap from every NodeSet, so it is refused too.
        let raw = std::fs::read(test_plugin("raw_v2"))?;
        let raw_digest = slinky_host::oci::sha256(&raw);
        let raw_sig = signer.sign_blob(&raw)?;
        let raw = gzip(&raw)?;
        module_config_map(&c, &ns, "raw-v2", "plugin.wasm", raw, Some(raw_sig)).await?;
        let nothing = json!({"matchLabels": {"bp-test": "nothing"}});
        put_plugin(
            &c,
            &format!("{ns}-legacy"),
            json!({"module": {"configMap": {"namespace": ns, "name": "raw-v2"}, "digest": raw_digest}, "kinds": ["nodeset-children"],
                   "settings": {"x": 1}, "selector": nothing}),
        )
        .await?;
        let s = wait_phase(&c, &format!("{ns}-legacy"), "Refused", "InvalidSettings").await?;
        let message = s["conditions"][0]["message"].as_str().unwrap_or_default();
        ensure!(message.contains("contract 0.2.0, which has no settings"), "{s}");
        Api::<BuilderPlugin>::all(c.client.clone())
            .patch(
                &format!("{ns}-legacy"),
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(json!([{"op": "remove", "path": "/spec/settings"}]))?),
            )
            .await?;
        let s = wait_phase(&c, &format!("{ns}-legacy"), "Refused", "Refused").await?;
        let message = s["conditions"][0]["message"].as_str().unwrap_or_default();
        ensure!(message.contains("raw-v2@0.0.2") && message.contains("left out PodDisruptionBudget"), "{s}");

        // A refusal is one Warning Event, however many passes see it again.
        let refusals = warnings(&c, &format!("{ns}-gpu"), "InvalidSettings").await?;
        ensure!(refusals == 1, "{refusals} InvalidSettings Events for one refusal");
        // The pipeline's digest does not hold a step's name: renaming a BuilderPlugin rolls
        // nothing.
        let steps = plugins.steps(BuilderKind::NodesetPod);
        ensure!(!steps.is_empty(), "no step serves");
        let renamed: Vec<_> = steps
            .iter()
            .cloned()
            .map(|mut s| {
                s.name = format!("{}-renamed", s.name);
                s
            })
            .collect();
        let base = plugins.active(BuilderKind::NodesetPod);
        ensure!(
            Pipeline::new(base.clone(), steps).digest() == Pipeline::new(base, renamed).digest(),
            "a step's name changes the pipeline's digest"
        );
        // A deleted BuilderPlugin leaves the pipelines: the pods roll without its label.
        Api::<BuilderPlugin>::all(c.client.clone())
            .delete(&format!("{ns}-site"), &Default::default())
            .await?;
        let unsited = eventually(120, || async {
            let list = Api::<Pod>::namespaced(c.client.clone(), &ns).list(&ListParams::default()).await.ok()?;
            let live: Vec<&Pod> = list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            (live.len() == 2
                && live.iter().all(|p| ready_or_no_kubelet(p) && !p.labels().contains_key("site.example.com/rack")))
            .then_some(())
        })
        .await;
        ensure!(unsited.is_some(), "the deleted site step still builds the pods");
        ensure!(
            !plugins
                .pipeline(BuilderKind::NodesetPod, &nodeset.metadata)
                .label()
                .contains("site-pod"),
            "the deleted step is still in the pipeline"
        );
        // One deleted while the host's watch is down (its deletion event never arrives): the
        // re-list no longer has it, and its step leaves the pipelines.
        if let Some(server) = c.embedded("a BuilderPlugin deleted while the watch is down (fault injection)") {
            server.faults().hold_watch("builderplugins");
            Api::<BuilderPlugin>::all(c.client.clone())
                .delete(&format!("{ns}-gpu"), &Default::default())
                .await?;
            server.faults().force_relist("builderplugins");
            server.faults().release_watch("builderplugins");
            let left = eventually(60, || async {
                let pipeline = plugins.pipeline(BuilderKind::NodesetPod, &nodeset.metadata);
                (!pipeline.label().contains("gpu-nodeset-pod")).then_some(())
            })
            .await;
            ensure!(
                left.is_some(),
                "a BuilderPlugin deleted during a watch gap still serves: {}",
                plugins.pipeline(BuilderKind::NodesetPod, &nodeset.metadata).label()
            );
        }
        Ok(())
    }
    .await;
    host.stop().await;
    for name in ["gpu", "site", "legacy"] {
        let _ = Api::<BuilderPlugin>::all(c.client.clone())
            .delete(&format!("{ns}-{name}"), &Default::default())
            .await;
    }
    drop(registry);
    result
}

/// `plugin diff` on a live cluster: the field diff of each pod the plugin changes against the live
/// pod, the pods that would roll; refused settings are an error naming the setting; nothing is
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_diff_shows_the_changes_and_the_pods_that_would_roll() -> Result<()> {
    let _turn = BP_HOSTS.lock().await;
    let c = cluster(true).await;
    let ns = c.namespace("diff").await;
    apply_example_with(&c, &ns, 2, |v| v["metadata"]["labels"]["bp-test"] = json!(ns)).await?;
    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let host = host_with_builder_plugins(&c, &ns, &plugins, source(&c, None, None)?);
    let result = async {
        let api = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let ready = eventually(60, || async {
            let list = api.list(&ListParams::default()).await.ok()?;
            (list.items.len() == 2 && list.items.iter().all(ready_or_no_kubelet)).then_some(list.items)
        })
        .await
        .context("the example's pods never became Ready")?;
        let site = test_plugin("site_pod");
        let kubeconfig = c.kubeconfig.display().to_string();
        let settings = r#"{"labels": {"site.example.com/rack": "a"}}"#;
        let out = host_cli(&[
            "plugin", "diff", path(&site), "--kubeconfig", &kubeconfig, "-n", &ns, "--settings", settings,
        ])?;
        ensure!(out.contains("+     site.example.com/rack: a"), "{out}");
        ensure!(
            out.contains(&format!(
                "NodeSet {ns}/slurm-worker-slinky: 2 pod(s) would roll: slurm-worker-slinky-0, slurm-worker-slinky-1"
            )),
            "{out}"
        );
        ensure!(out.ends_with("2 object(s) would change; 2 pod(s) would roll"), "{out}");
        // A selector matching nothing: nothing changes.
        let none = host_cli(&[
            "plugin", "diff", path(&site), "--kubeconfig", &kubeconfig, "-n", &ns, "--settings", settings,
            "--selector", "canary=true",
        ])?;
        ensure!(none.ends_with("0 object(s) would change; 0 pod(s) would roll"), "{none}");
        // Settings the plugin refuses: an error with its message.
        let refused = run(&[
            "plugin", "diff", path(&site), "--kubeconfig", &kubeconfig, "-n", &ns, "--settings",
            r#"{"labels": {"app.kubernetes.io/name": "x"}}"#,
        ]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        ensure!(!refused.status.success() && stderr.contains("labels.app.kubernetes.io/name"), "{stderr}");
        // Nothing was written.
        let after = api.list(&ListParams::default()).await?.items;
        ensure!(uids(&after) == uids(&ready), "plugin diff changed the pods");

        // With a BuilderPlugin serving (the site step), the diff of another plugin compares with
        // what serves: it shows the GPU changes, not the site step undone.
        let site_bytes = std::fs::read(&site)?;
        module_config_map(&c, &ns, "site-pod", "plugin.wasm", gzip(&site_bytes)?, None).await?;
        let selector = json!({"matchLabels": {"bp-test": ns}});
        put_plugin(
            &c,
            &format!("{ns}-site"),
            json!({"module": {"configMap": {"namespace": ns, "name": "site-pod"},
                              "digest": slinky_host::oci::sha256(&site_bytes)},
                   "kinds": ["nodeset-pod"],
                   "settings": {"labels": {"site.example.com/rack": "a"}}, "selector": selector}),
        )
        .await?;
        let outcome = async {
            wait_phase(&c, &format!("{ns}-site"), "Loaded", "Loaded").await?;
            let sited = eventually(90, || async {
                let list = api.list(&ListParams::default()).await.ok()?;
                let live: Vec<&Pod> = list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
                (live.len() == 2
                    && live.iter().all(|p| {
                        ready_or_no_kubelet(p) && p.labels().get("site.example.com/rack").map(String::as_str) == Some("a")
                    }))
                .then_some(())
            })
            .await;
            ensure!(sited.is_some(), "the site step never rolled the pods");
            let gpu = test_plugin("gpu_nodeset_pod");
            let out = host_cli(&[
                "plugin", "diff", path(&gpu), "--kubeconfig", &kubeconfig, "-n", &ns, "--settings",
                r#"{"gpusPerPod": 1}"#,
            ])?;
            ensure!(out.contains(&format!("BuilderPlugins serving: {ns}-site")) || out.contains(&format!("{ns}-site,")) || out.contains(&format!(", {ns}-site")), "{out}");
            ensure!(out.contains("nvidia.com/gpu") && out.lines().any(|l| l.starts_with('+') && l.contains("nvidia.com/gpu")), "{out}");
            ensure!(!out.lines().any(|l| l.starts_with('-') && l.contains("site.example.com/rack")), "the diff undoes the site step:\n{out}");
            ensure!(out.ends_with("2 object(s) would change; 2 pod(s) would roll"), "{out}");
            Ok(())
        }
        .await;
        let _ = Api::<BuilderPlugin>::all(c.client.clone())
            .delete(&format!("{ns}-site"), &Default::default())
            .await;
        outcome
    }
    .await;
    host.stop().await;
    result
}

/// A ConfigMap module is pinned by its digest (the API server refuses one without it, with the
/// same message on both servers) and read only from the namespaces the host allows (default: its
/// own): an editor of another namespace's ConfigMaps cannot choose code every pod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_map_module_is_pinned_and_read_only_where_the_host_allows() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("tenant").await;
    let name = format!("{ns}-unpinned");
    let refused = put_plugin(
        &c,
        &name,
        json!({"module": {"configMap": {"namespace": ns, "name": "site-pod"}}, "kinds": ["nodeset-pod"]}),
    )
    .await;
    let message = format!(
        "{:#}",
        refused
            .as_ref()
            .err()
            .context("a ConfigMap module without a digest was stored")?
    );
    ensure!(
        message.contains("spec.module.digest: Invalid value") && message.contains(slinky_api::CONFIG_MAP_PIN),
        "{message}"
    );

    let site = std::fs::read(test_plugin("site_pod"))?;
    let digest = slinky_host::oci::sha256(&site);
    module_config_map(&c, &ns, "site-pod", "plugin.wasm", gzip(&site)?, None).await?;
    let module: slinky_api::PluginModule = serde_json::from_value(json!(
        {"configMap": {"namespace": ns, "name": "site-pod"}, "digest": digest}))?;
    let oci = Oci::new(DigestStore::new(None), Vec::new())?;
    let default = ModuleSource::new(
        oci,
        c.client.clone(),
        None,
        slinky_host::plugins::gunzip_if_gzipped,
    );
    ensure!(
        default.config_map_namespaces() == ["default"],
        "{:?}",
        default.config_map_namespaces()
    );
    let failure = default
        .fetch(&module)
        .await
        .err()
        .context("read from a namespace the host does not allow")?;
    ensure!(
        failure.reason == "InvalidSpec" && failure.message.contains("--plugin-configmap-namespace"),
        "{failure:?}"
    );
    let allowed = default.with_config_map_namespaces(vec![ns.clone()]);
    let fetched = allowed
        .fetch(&module)
        .await
        .map_err(|f| anyhow::anyhow!("{f:?}"))?;
    ensure!(fetched.digest == digest, "{}", fetched.digest);
    // One stored before the schema required the digest is refused by the host too.
    let unpinned: slinky_api::PluginModule =
        serde_json::from_value(json!({"configMap": {"namespace": ns, "name": "site-pod"}}))?;
    let failure = allowed
        .fetch(&unpinned)
        .await
        .err()
        .context("an unpinned module was read")?;
    ensure!(failure.message == slinky_api::CONFIG_MAP_PIN, "{failure:?}");
    Ok(())
}

/// Closed by default, and every module signed where the host has keys: a host without keys runs
/// no registry module (refused `Unverified` before anything is pulled) unless its admin allows
/// unsigned ones; a host with keys runs a ConfigMap module only with a `plugin.wasm.sig` that
/// verifies (made by `plugin sign`) and trusts the module it kept again only under today's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_unverified_runs_registry_modules_need_a_key_and_config_map_modules_a_signature() -> Result<()>
{
    let c = cluster(false).await;
    let ns = c.namespace("signed").await;
    let source = |key: Option<&str>, cache: Option<&Path>| -> Result<ModuleSource> {
        let oci = Oci::new(DigestStore::new(cache.map(Path::to_path_buf)), Vec::new())?;
        let key = key.map(PublicKey::from_pem).transpose()?;
        Ok(ModuleSource::new(
            oci,
            c.client.clone(),
            key,
            slinky_host::plugins::gunzip_if_gzipped,
        )
        .with_config_map_namespaces(vec![ns.clone()]))
    };
    // A registry module on a host without keys: refused as Unverified, naming both ways out; no
    // request reaches the registry (nothing listens on this port).
    let image: slinky_api::PluginModule = serde_json::from_value(json!(
        {"image": format!("127.0.0.1:9/site/gpu@sha256:{}", "a".repeat(64))}))?;
    let failure = source(None, None)?
        .fetch(&image)
        .await
        .err()
        .context("an unsigned registry module ran")?;
    ensure!(
        failure.reason == "Unverified"
            && failure.message.contains("--plugin-public-key")
            && failure.message.contains("--allow-unsigned-plugins"),
        "{failure:?}"
    );
    ensure!(
        failure.retry() == slinky_api::failure::Retry::OnChange,
        "{failure:?}"
    );
    // Allowed by the admin: the module is pulled (and this registry is not there).
    let failure = source(None, None)?
        .allowing_unsigned(true)
        .fetch(&image)
        .await
        .err()
        .context("pulled from nowhere")?;
    ensure!(failure.reason == "PullFailed", "{failure:?}");

    // A ConfigMap module on a host with keys.
    let keys = tempfile::tempdir()?;
    host_cli(&["plugin", "keygen", path(&keys.path().join("signing"))])?;
    host_cli(&["plugin", "keygen", path(&keys.path().join("stranger"))])?;
    let public = std::fs::read_to_string(keys.path().join("signing.pub"))?;
    let stranger = std::fs::read_to_string(keys.path().join("stranger.pub"))?;
    let site = std::fs::read(test_plugin("site_pod"))?;
    let gz = keys.path().join("site.wasm.gz");
    std::fs::write(&gz, gzip(&site)?)?;
    let printed = host_cli(&[
        "plugin",
        "sign",
        path(&gz),
        "--key",
        path(&keys.path().join("signing.key")),
    ])?;
    let digest = slinky_host::oci::sha256(&site);
    ensure!(
        printed.contains(&digest),
        "plugin sign printed {printed:?}, not the digest {digest}"
    );
    let sig = std::fs::read_to_string(keys.path().join("site.wasm.gz.sig"))?;
    let module = |name: &str| -> Result<slinky_api::PluginModule> {
        Ok(serde_json::from_value(json!(
            {"configMap": {"namespace": ns, "name": name, "key": "plugin.wasm.gz"}, "digest": digest}))?)
    };
    module_config_map(&c, &ns, "unsigned", "plugin.wasm.gz", gzip(&site)?, None).await?;
    module_config_map(&c, &ns, "signed", "plugin.wasm.gz", gzip(&site)?, Some(sig)).await?;
    let cache = tempfile::tempdir()?;
    let keyed = source(Some(&public), Some(cache.path()))?;
    let failure = keyed
        .fetch(&module("unsigned")?)
        .await
        .err()
        .context("an unsigned ConfigMap module ran")?;
    ensure!(
        failure.reason == "BadSignature" && failure.message.contains("plugin sign"),
        "{failure:?}"
    );
    let fetched = keyed
        .fetch(&module("signed")?)
        .await
        .map_err(|f| anyhow::anyhow!("{f:?}"))?;
    ensure!(fetched.digest == digest, "{}", fetched.digest);
    let failure = source(Some(&stranger), None)?
        .fetch(&module("signed")?)
        .await
        .err()
        .context("a module signed with another key ran")?;
    ensure!(
        failure.reason == "BadSignature" && failure.message.contains("does not verify"),
        "{failure:?}"
    );
    // What the host kept is trusted again only under today's keys: after a rotation to the old
    // and the new key, yes; to the new key alone, no; without keys, on its pin.
    let both = format!("{stranger}{public}");
    let kept = |key: Option<&str>| -> Result<Result<(), slinky_api::failure::Failure>> {
        Ok(source(key, Some(cache.path()))?.vouch_kept(&module("signed")?, &digest, &fetched.bytes))
    };
    ensure!(kept(Some(&both))?.is_ok(), "{:?}", kept(Some(&both))?);
    ensure!(
        kept(Some(&stranger))?.is_err_and(|f| f.reason == "BadSignature"),
        "a rotated-out key still vouches"
    );
    ensure!(kept(None)?.is_ok(), "{:?}", kept(None)?);
    Ok(())
}

/// BuilderPlugin requests whose answers the test reads as text: a BuilderPlugin nested deeper
/// than a JSON decoder goes cannot be read or written typed.
fn bp_request() -> kube::core::Request {
    kube::core::Request::new("/apis/plugins.slinky.slurm.net/v1alpha1/builderplugins")
}

/// The `status` of BuilderPlugin `name`, read from its text (the rest is skipped unread).
async fn raw_status(c: &TestCluster, name: &str) -> Result<serde_json::Value> {
    #[derive(serde::Deserialize)]
    struct Only {
        #[serde(default)]
        status: serde_json::Value,
    }
    let text = c
        .client
        .request_text(bp_request().get(name, &kube::api::GetParams::default())?)
        .await?;
    Ok(serde_json::from_str::<Only>(&text)?.status)
}

/// A BuilderPlugin the host cannot decode (settings 120 levels deep, which the API servers
/// store, and the managedFields mirroring them go past the 128 levels of a JSON decoder) is
/// refused alone, with a condition saying why, while the others load and serve. Before each
/// BuilderPlugin was decoded on its own, its list never decoded: no cache synced and the host
/// reconciled nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_builder_plugin_too_deep_to_decode_is_refused_alone_and_the_others_serve() -> Result<()> {
    let _turn = BP_HOSTS.lock().await;
    let c = cluster(true).await;
    let ns = c.namespace("deep").await;
    let site = std::fs::read(test_plugin("site_pod"))?;
    let digest = slinky_host::oci::sha256(&site);
    module_config_map(&c, &ns, "site-pod", "plugin.wasm.gz", gzip(&site)?, None).await?;
    let module = json!({"configMap": {"namespace": ns, "name": "site-pod", "key": "plugin.wasm.gz"}, "digest": digest});
    let selector = json!({"matchLabels": {"bp-test": ns}});
    let deep_settings = (1..120).fold(json!({"a": 1}), |v, _| json!({"a": v}));
    let deep = format!("{ns}-deep");
    let bp = json!({
        "apiVersion": "plugins.slinky.slurm.net/v1alpha1",
        "kind": "BuilderPlugin",
        "metadata": {"name": deep},
        "spec": {"module": module, "kinds": ["nodeset-pod"], "order": 10, "settings": deep_settings,
                 "selector": selector},
    });
    // Created (the embedded server's apply parses YAML with a depth budget of 64).
    let create = bp_request().create(&PostParams::default(), serde_json::to_vec(&bp)?)?;
    c.client
        .request_text(create)
        .await
        .context("the API server did not store the deep BuilderPlugin")?;
    put_plugin(
        &c,
        &format!("{ns}-site"),
        json!({"module": module, "kinds": ["nodeset-pod"], "order": 20,
               "settings": {"labels": {"site.example.com/rack": "a"}}, "selector": selector}),
    )
    .await?;

    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let host = host_with_builder_plugins(&c, &ns, &plugins, source(&c, None, None)?);
    let result = async {
        wait_phase(&c, &format!("{ns}-site"), "Loaded", "Loaded").await?;
        let refused = eventually(60, || async {
            let s = raw_status(&c, &deep).await.ok()?;
            (s["phase"] == "Refused" && s["conditions"][0]["reason"] == "InvalidSpec").then_some(s)
        })
        .await;
        let refused = match refused {
            Some(s) => s,
            None => bail!(
                "the deep BuilderPlugin was never refused; its status: {}",
                raw_status(&c, &deep).await?
            ),
        };
        let message = refused["conditions"][0]["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("spec.settings: nested 120 levels deep, more than the 32 allowed"),
            "{message}"
        );
        // The other one serves: the NodeSet's pods carry its label.
        apply_example_with(&c, &ns, 2, |v| v["metadata"]["labels"]["bp-test"] = json!(ns)).await?;
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let labelled = eventually(90, || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            (list.items.len() == 2
                && list.items.iter().all(|p| {
                    // Built by the bundled builder and the site step once: not by the deep one.
                    p.labels().get("site.example.com/rack").map(String::as_str) == Some("a")
                        && p.annotations()
                            .get(slinky_api::keys::ANNOTATION_BUILDER)
                            .is_some_and(|b| b.matches("site-pod@").count() == 1)
                }))
            .then_some(())
        })
        .await;
        ensure!(
            labelled.is_some(),
            "the NodeSet's pods never carried the site step's label"
        );
        Ok(())
    }
    .await;
    host.stop().await;
    // Not left behind on a shared cluster (a typed list of BuilderPlugins would fail on it).
    let delete = bp_request().delete(&deep, &kube::api::DeleteParams::default())?;
    c.client.request_text(delete).await?;
    result
}

/// A registry that accepts and never answers delays only its own step: start-up waits for the
/// BuilderPlugins at most its budget (2 s here), the ConfigMap step serves and the NodeSet's pods
/// are built with it while the tarpit's three BuilderPlugins are still being pulled (their
/// requests are still open: each is bounded at 60 s, so none is decided yet); before, the host
/// loaded them one after the other before reconciling anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_never_answers_delays_only_its_own_steps() -> Result<()> {
    let _turn = BP_HOSTS.lock().await;
    let c = cluster(true).await;
    let ns = c.namespace("tarpit").await;
    let tarpit = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = tarpit.local_addr()?;
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let holder = {
        let asked = asked.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = tarpit.accept().await {
                asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(socket);
            }
        })
    };
    let selector = json!({"matchLabels": {"bp-test": ns}});
    let tarpits: Vec<String> = (0..3).map(|i| format!("{ns}-tarpit-{i}")).collect();
    for name in &tarpits {
        let image = format!("{addr}/site/gpu@sha256:{}", "a".repeat(64));
        put_plugin(
            &c,
            name,
            json!({"module": {"image": image}, "kinds": ["nodeset-pod"], "order": 10, "selector": selector}),
        )
        .await?;
    }
    let site = std::fs::read(test_plugin("site_pod"))?;
    let digest = slinky_host::oci::sha256(&site);
    module_config_map(&c, &ns, "site-pod", "plugin.wasm", gzip(&site)?, None).await?;
    put_plugin(
        &c,
        &format!("{ns}-site"),
        json!({"module": {"configMap": {"namespace": ns, "name": "site-pod"}, "digest": digest},
               "kinds": ["nodeset-pod"], "order": 20,
               "settings": {"labels": {"site.example.com/rack": "a"}}, "selector": selector}),
    )
    .await?;
    apply_example_with(&c, &ns, 1, |v| v["metadata"]["labels"]["bp-test"] = json!(ns)).await?;

    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let oci = Oci::new(DigestStore::new(None), Vec::new())?;
    let source = ModuleSource::new(
        oci,
        c.client.clone(),
        None,
        slinky_host::plugins::gunzip_if_gzipped,
    )
    .allowing_unsigned(true)
    .with_config_map_namespaces(vec![ns.clone()]);
    let config = RunConfig {
        namespaces: vec![ns.clone()],
        resync: Some(Duration::from_secs(1)),
        builder_plugins: Some(Arc::new(source)),
        builder_plugins_startup: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let host = Host::start_config(c.client.clone(), plugins.clone(), config);
    let result = async {
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let built = eventually(60, || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|p| p.labels().get("site.example.com/rack").map(String::as_str) == Some("a"))
                .then_some(())
        })
        .await;
        ensure!(
            built.is_some(),
            "the NodeSet's pod was never built with the ConfigMap step"
        );
        ensure!(
            asked.load(std::sync::atomic::Ordering::SeqCst) >= tarpits.len(),
            "the tarpit was asked {} times: not every tarpit BuilderPlugin was being pulled",
            asked.load(std::sync::atomic::Ordering::SeqCst)
        );
        for name in &tarpits {
            let bp = Api::<BuilderPlugin>::all(c.client.clone()).get(name).await?;
            ensure!(
                bp.status.as_ref().and_then(|s| s.phase.clone()).is_none(),
                "{name} was decided before the pods were built: {:?}",
                bp.status
            );
        }
        Ok(())
    }
    .await;
    host.stop().await;
    holder.abort();
    for name in tarpits.iter().chain([&format!("{ns}-site")]) {
        let _ = Api::<BuilderPlugin>::all(c.client.clone())
            .delete(name, &Default::default())
            .await;
    }
    result
}

/// A private registry (Debian's `docker-registry` with an htpasswd file: `Basic` auth) works with
/// the credentials of a Docker config, as `kubectl create secret docker-registry` and `docker
/// login` write it: `plugin push --registry-credentials` pushes, and the host's pull fetches the
/// module; without them the push fails and the pull is refused, each naming the flag. Before,
/// there were no credentials at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_registry_works_with_the_credentials_of_a_docker_config() -> Result<()> {
    // The registry takes bcrypt hashes; Python's crypt makes one (as htpasswd -B would).
    let hash = Command::new("python3")
        .args([
            "-W",
            "ignore",
            "-c",
            "import crypt; print(crypt.crypt('s3cret', crypt.mksalt(crypt.METHOD_BLOWFISH)))",
        ])
        .output()
        .context("cannot run python3 to hash the test password")?;
    let hash = String::from_utf8_lossy(&hash.stdout).trim().to_string();
    ensure!(hash.starts_with("$2"), "python3 made no bcrypt hash: {hash:?}");
    let Some(registry) = Registry::start_answering_with(Some(&format!("alice:{hash}"))).await? else {
        slinky_apiserver::testing::skip(
            "a_private_registry_works_with_the_credentials_of_a_docker_config",
            "registry",
            &format!("{REGISTRY} is not installed (apt-get install docker-registry)"),
        );
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.json");
    let auth = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("alice:s3cret")
    };
    std::fs::write(
        &config,
        json!({"auths": {registry.addr.clone(): {"auth": auth}}}).to_string(),
    )?;
    let gpu = test_plugin("gpu_nodeset_pod");
    let target = format!("{}/site/gpu:1", registry.addr);

    let refused = run(&["plugin", "push", path(&gpu), &target]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success() && stderr.contains("--registry-credentials"),
        "a push without credentials: {stderr}"
    );
    let pinned = host_cli(&[
        "plugin",
        "push",
        path(&gpu),
        &target,
        "--registry-credentials",
        path(&config),
    ])?;
    ensure!(pinned.contains("@sha256:"), "push printed {pinned:?}");

    let c = cluster(false).await;
    let module: slinky_api::PluginModule = serde_json::from_value(json!({"image": pinned}))?;
    let source = |credentials: Credentials| -> Result<ModuleSource> {
        let oci = Oci::new(DigestStore::new(None), Vec::new())?.with_credentials(credentials);
        Ok(ModuleSource::new(
            oci,
            c.client.clone(),
            None,
            slinky_host::plugins::gunzip_if_gzipped,
        )
        .allowing_unsigned(true))
    };
    let failure = source(Credentials::none())?
        .fetch(&module)
        .await
        .err()
        .context("pulled from a private registry without credentials")?;
    ensure!(
        failure.reason == "PullFailed" && failure.message.contains("--registry-credentials"),
        "{failure:?}"
    );
    let fetched = source(Credentials::from_file(config.clone())?)?
        .fetch(&module)
        .await
        .map_err(|f| anyhow::anyhow!("{f:?}"))?;
    ensure!(
        fetched.digest == slinky_host::oci::sha256(&std::fs::read(&gpu)?),
        "{}",
        fetched.digest
    );
    Ok(())
}

/// `python tests/python/SCRIPT args…`; its stdout, or an error with its stderr.
fn python_script(script: &str, args: &[&str]) -> Result<String> {
    let python = slinky_tests::python::python()?;
    let path = slinky_tests::workspace().join("tests/python").join(script);
    let out = Command::new(python).arg(path).args(args).output()?;
    ensure!(
        out.status.success(),
        "{script} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The ORAS project's client (`tests/python/oras_check.py`).
fn oras(args: &[&str]) -> Result<String> {
    python_script("oras_check.py", args)
}

/// Plugin artifacts as other tools see them, and signatures that add up: `plugin push` makes the
/// CNCF Wasm artifact (config with `created`, `component` and its exports; the layer titled) that
/// the ORAS project's client pulls to a file holding the component; a module pushed with oras,
/// as an author might, loads; the same plugin pushed twice is the same artifact, and a second
/// `--sign-key` adds its signature beside the first (both keys verify; before, the second push
/// replaced the first signature).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_interoperate_with_oras_and_signatures_add_up() -> Result<()> {
    let Some(registry) = Registry::start_answering().await? else {
        slinky_apiserver::testing::skip(
            "artifacts_interoperate_with_oras_and_signatures_add_up",
            "registry",
            &format!("{REGISTRY} is not installed (apt-get install docker-registry)"),
        );
        return Ok(());
    };
    let keys = tempfile::tempdir()?;
    for k in ["first", "second"] {
        host_cli(&["plugin", "keygen", path(&keys.path().join(k))])?;
    }
    let gpu = test_plugin("gpu_nodeset_pod");
    let component = std::fs::read(&gpu)?;
    let target = format!("{}/site/gpu:1", registry.addr);
    let push = |key: &str| {
        host_cli(&[
            "plugin",
            "push",
            path(&gpu),
            &target,
            "--sign-key",
            path(&keys.path().join(format!("{key}.key"))),
        ])
    };
    let first = push("first")?;
    let second = push("second")?;
    ensure!(
        first == second,
        "the same plugin pushed twice: {first} and {second}"
    );
    // Pushed again with the first key: its earlier signature is replaced, not piled up.
    ensure!(push("first")? == first, "a third push changed the digest");
    let hex = first
        .rsplit_once("@sha256:")
        .map(|(_, h)| h.to_string())
        .unwrap_or_default();
    let signatures: serde_json::Value = serde_json::from_str(&oras(&[
        "manifest",
        &format!("{}/site/gpu:sha256-{hex}.sig", registry.addr),
    ])?)?;
    ensure!(
        signatures["layers"].as_array().map(Vec::len) == Some(2),
        "one signature per key: {signatures}"
    );

    let c = cluster(false).await;
    let module: slinky_api::PluginModule = serde_json::from_value(json!({"image": first}))?;
    for k in ["first", "second"] {
        let pem = std::fs::read_to_string(keys.path().join(format!("{k}.pub")))?;
        let oci = Oci::new(DigestStore::new(None), Vec::new())?;
        let source = ModuleSource::new(
            oci,
            c.client.clone(),
            Some(PublicKey::from_pem(&pem)?),
            slinky_host::plugins::gunzip_if_gzipped,
        );
        source
            .fetch(&module)
            .await
            .map_err(|f| anyhow::anyhow!("the {k} key's signature: {f:?}"))?;
    }

    let config: serde_json::Value = serde_json::from_str(&oras(&["config", &first])?)?;
    let exports = config["component"]["exports"].to_string();
    ensure!(
        config["created"].as_str().is_some_and(|t| t.ends_with('Z'))
            && config["os"] == "wasip2"
            && exports.contains("slinky:builder/plugin@"),
        "{config}"
    );
    let out = tempfile::tempdir()?;
    let files = oras(&["pull", &first, path(out.path())])?;
    let pulled = out.path().join("gpu-nodeset-pod.wasm");
    ensure!(
        files.contains("gpu-nodeset-pod.wasm") && std::fs::read(&pulled)? == component,
        "oras pulled {files:?}"
    );

    // Pushed by oras with the CNCF layout: it loads (unsigned, where the admin allows it).
    let config_file = keys.path().join("config.json");
    std::fs::write(&config_file, config.to_string())?;
    let copy = keys.path().join("plugin.wasm");
    std::fs::write(&copy, &component)?;
    let digest = oras(&[
        "push",
        path(&copy),
        path(&config_file),
        &format!("{}/site/oras:1", registry.addr),
    ])?;
    // What the oras artifact `repo@digest` fetches as, on a host allowing unsigned modules.
    let fetch_unsigned = |at: String| {
        let c = &c;
        async move {
            let module: slinky_api::PluginModule = serde_json::from_value(json!({"image": at}))?;
            let oci = Oci::new(DigestStore::new(None), Vec::new())?;
            let source = ModuleSource::new(
                oci,
                c.client.clone(),
                None,
                slinky_host::plugins::gunzip_if_gzipped,
            )
            .allowing_unsigned(true);
            anyhow::Ok(source.fetch(&module).await)
        }
    };
    let fetched = fetch_unsigned(format!("{}/site/oras@{digest}", registry.addr))
        .await?
        .map_err(|f| anyhow::anyhow!("the module oras pushed: {f:?}"))?;
    ensure!(
        fetched.bytes == component,
        "the module oras pushed came back different"
    );
    // oras's default layer type: not a plugin artifact, which what the digest pins never becomes,
    // so it is refused until the spec changes, not pulled again every 10 s.
    let tar = oras(&[
        "push",
        path(&copy),
        path(&config_file),
        &format!("{}/site/oras:tar", registry.addr),
        "application/vnd.oci.image.layer.v1.tar",
    ])?;
    let failure = fetch_unsigned(format!("{}/site/oras@{tar}", registry.addr))
        .await?
        .err()
        .context("a tar layer loaded as a plugin")?;
    ensure!(
        failure.reason == "Refused"
            && failure.retry() == slinky_api::failure::Retry::OnChange
            && failure.message.contains("not a plugin artifact"),
        "{failure:?}"
    );
    Ok(())
}

/// cosign 3's formats made a second way (`tests/python/cosign3.py`).
fn cosign3(args: &[&str]) -> Result<String> {
    python_script("cosign3.py", args)
}

/// cosign 3's default signatures verify: a Sigstore bundle attached to the plugin as an OCI 1.1
/// referrer (found through the referrers tag where the registry has no referrers API, as
/// Debian's `docker-registry` has none, with the entries go-containerregistry writes there: no
/// bundle type; a referrer too big to be a bundle skipped), and a blob's bundle as a ConfigMap
/// module's `plugin.wasm.sig`. Both are made by a second implementation of cosign 3's code (Python,
/// `cryptography`). An attestation attached the same way (another predicate type) vouches for
/// nothing, and a bundle of other bytes is refused. Before, only cosign 2's `.sig` tag and bare
/// signatures verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosign_3_bundles_verify_as_referrers_and_as_config_map_signatures() -> Result<()> {
    let Some(registry) = Registry::start_answering().await? else {
        slinky_apiserver::testing::skip(
            "cosign_3_bundles_verify_as_referrers_and_as_config_map_signatures",
            "registry",
            &format!("{REGISTRY} is not installed (apt-get install docker-registry)"),
        );
        return Ok(());
    };
    let keys = tempfile::tempdir()?;
    host_cli(&["plugin", "keygen", path(&keys.path().join("cosign"))])?;
    let private = keys.path().join("cosign.key");
    let public = std::fs::read_to_string(keys.path().join("cosign.pub"))?;
    let gpu = test_plugin("gpu_nodeset_pod");
    let pushed = host_cli(&[
        "plugin",
        "push",
        path(&gpu),
        &format!("{}/site/gpu3:1", registry.addr),
    ])?;
    let c = cluster(false).await;
    let module: slinky_api::PluginModule = serde_json::from_value(json!({"image": pushed}))?;
    // A fresh store each time: a verified signature is kept, and this is about finding one.
    let fetch = |module: slinky_api::PluginModule| {
        let c = &c;
        let public = &public;
        async move { anyhow::Ok(source(c, None, Some(public))?.fetch(&module).await) }
    };
    let unsigned = fetch(module.clone())
        .await?
        .err()
        .context("an unsigned module loaded")?;
    ensure!(
        unsigned.reason == "BadSignature" && unsigned.message.contains("no cosign signature"),
        "{unsigned:?}"
    );
    cosign3(&[
        "attach",
        &pushed,
        path(&private),
        "https://slsa.dev/provenance/v1",
    ])?;
    let attested = fetch(module.clone())
        .await?
        .err()
        .context("an attestation vouched for a module")?;
    ensure!(
        attested.reason == "BadSignature" && attested.message.contains("attestation"),
        "{attested:?}"
    );
    // A referrer that cannot be read (a 100 KiB "bundle") does not hide the signature beside it.
    cosign3(&["junk", &pushed, path(&private)])?;
    cosign3(&["attach", &pushed, path(&private)])?;
    fetch(module.clone())
        .await?
        .map_err(|f| anyhow::anyhow!("the cosign 3 signature: {f:?}"))?;

    // A ConfigMap module with the bundle `cosign sign-blob --key --bundle plugin.wasm.sig` writes.
    let ns = c.namespace("bundle").await;
    let component = std::fs::read(&gpu)?;
    let blob_bundle = cosign3(&["sign-blob", path(&gpu), path(&private)])?;
    let other = keys.path().join("other.wasm");
    std::fs::write(&other, b"other bytes")?;
    let other_bundle = cosign3(&["sign-blob", path(&other), path(&private)])?;
    for (name, sig, ok) in [("signed", blob_bundle, true), ("other", other_bundle, false)] {
        module_config_map(&c, &ns, name, "plugin.wasm.gz", gzip(&component)?, Some(sig)).await?;
        let module: slinky_api::PluginModule = serde_json::from_value(json!({
            "configMap": {"name": name, "namespace": ns, "key": "plugin.wasm.gz"},
            "digest": slinky_host::oci::sha256(&component),
        }))?;
        let fetched = fetch(module).await?;
        match (ok, fetched) {
            (true, Ok(_)) => {}
            (false, Err(f)) if f.reason == "BadSignature" && f.message.contains("signs other bytes") => {}
            (_, other) => bail!("the ConfigMap module {name}: {other:?}"),
        }
    }
    Ok(())
}

/// An HTTP proxy on a free loopback port, as corporate networks run them: `CONNECT host:port`
/// with `Proxy-Authorization: Basic` (`user:secret`) opens a tunnel, anything else is refused
/// with `407`. It records each tunnel's target.
async fn connect_proxy() -> Result<(String, Arc<std::sync::Mutex<Vec<String>>>)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let tunnels = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = tunnels.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut client = BufReader::new(stream);
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    if client.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push(line.trim_end().to_string());
                }
                let target = head
                    .first()
                    .and_then(|l| l.strip_prefix("CONNECT "))
                    .and_then(|l| l.split(' ').next())
                    .map(str::to_string);
                // base64("user:secret")
                let authorized = head
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case("proxy-authorization: Basic dXNlcjpzZWNyZXQ="));
                let (Some(target), true) = (target, authorized) else {
                    let _ = client
                        .get_mut()
                        .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                };
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                if let Ok(mut log) = seen.lock() {
                    log.push(target);
                }
                let mut client = client.into_inner();
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    Ok((addr, tunnels))
}

/// Behind an HTTP proxy, as `HTTPS_PROXY`/`NO_PROXY` name it: the manifest, the layer and the
/// signature are pulled through `CONNECT` tunnels, with the proxy's credentials; wrong credentials
/// fail the pull with the proxy's refusal, naming the proxy (never its credentials); an https://
/// proxy is refused; a registry `NO_PROXY` names is reached directly.
/// Before, the client connected directly, so a pod behind a proxy reached no registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_behind_an_http_proxy_are_reached_through_it() -> Result<()> {
    let Some(registry) = Registry::start_answering().await? else {
        slinky_apiserver::testing::skip(
            "registries_behind_an_http_proxy_are_reached_through_it",
            "registry",
            &format!("{REGISTRY} is not installed (apt-get install docker-registry)"),
        );
        return Ok(());
    };
    let keys = tempfile::tempdir()?;
    host_cli(&["plugin", "keygen", path(&keys.path().join("k"))])?;
    let public = std::fs::read_to_string(keys.path().join("k.pub"))?;
    let gpu = test_plugin("gpu_nodeset_pod");
    let pushed = host_cli(&[
        "plugin",
        "push",
        path(&gpu),
        &format!("{}/site/proxied:1", registry.addr),
        "--sign-key",
        path(&keys.path().join("k.key")),
    ])?;
    let (proxy, tunnels) = connect_proxy().await?;
    let c = cluster(false).await;
    let module: slinky_api::PluginModule = serde_json::from_value(json!({"image": pushed}))?;
    let fetch = |proxies: Proxies| {
        let (c, module, public) = (&c, &module, &public);
        async move {
            let oci = Oci::with_proxies(DigestStore::new(None), Vec::new(), proxies)?;
            let source = ModuleSource::new(
                oci,
                c.client.clone(),
                Some(PublicKey::from_pem(public)?),
                slinky_host::plugins::gunzip_if_gzipped,
            );
            anyhow::Ok(source.fetch(module).await)
        }
    };
    let tunnelled = |tunnels: &std::sync::Mutex<Vec<String>>| tunnels.lock().map(|t| t.len()).unwrap_or(0);
    fetch(Proxies::through(&format!("http://user:secret@{proxy}"), ""))
        .await?
        .map_err(|f| anyhow::anyhow!("through the proxy: {f:?}"))?;
    let through = tunnels.lock().map(|t| t.clone()).unwrap_or_default();
    ensure!(
        !through.is_empty() && through.iter().all(|t| *t == registry.addr),
        "the proxy tunnelled {through:?}"
    );
    let failure = fetch(Proxies::through(&format!("http://user:wrong@{proxy}"), ""))
        .await?
        .err()
        .context("pulled through a proxy that refused the credentials")?;
    ensure!(
        failure.reason == "PullFailed"
            && failure
                .message
                .contains(&format!("through proxy http://{proxy} to {}", registry.addr))
            && !failure.message.contains("wrong"),
        "{failure:?}"
    );
    // An https:// proxy would get the CONNECT and its credentials in the clear: refused.
    let failure = fetch(Proxies::through(&format!("https://user:secret@{proxy}"), ""))
        .await?
        .err()
        .context("pulled through an https:// proxy")?;
    ensure!(
        failure.reason == "PullFailed"
            && failure.message.contains("only an http:// proxy")
            && !failure.message.contains("secret"),
        "{failure:?}"
    );
    let before = tunnelled(&tunnels);
    fetch(Proxies::through(
        &format!("http://user:secret@{proxy}"),
        "127.0.0.1",
    ))
    .await?
    .map_err(|f| anyhow::anyhow!("NO_PROXY=127.0.0.1: {f:?}"))?;
    ensure!(
        tunnelled(&tunnels) == before,
        "a registry NO_PROXY names went through the proxy"
    );
    Ok(())
}

/// A step scoped by namespace, without a selector, is mandatory there: every NodeSet of the
/// namespace goes through it whatever its labels (a tenant relabelling its NodeSet does not leave
/// it), and no NodeSet of another namespace does (`status.appliesTo` names only this one's, on a
/// shared real cluster too). Before, only labels selected, and whoever may edit a NodeSet
/// controls those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_scoped_by_namespace_is_mandatory_there_and_absent_elsewhere() -> Result<()> {
    let _turn = BP_HOSTS.lock().await;
    let c = cluster(true).await;
    let ns = c.namespace("scoped").await;
    let site = std::fs::read(test_plugin("site_pod"))?;
    let digest = slinky_host::oci::sha256(&site);
    module_config_map(&c, &ns, "site-pod", "plugin.wasm", gzip(&site)?, None).await?;
    let name = format!("{ns}-mandatory");
    put_plugin(
        &c,
        &name,
        json!({"module": {"configMap": {"namespace": ns, "name": "site-pod"}, "digest": digest},
               "kinds": ["nodeset-pod"], "namespaces": [ns],
               "settings": {"labels": {"site.example.com/hardened": "yes"}}}),
    )
    .await?;
    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let host = host_with_builder_plugins(&c, &ns, &plugins, source(&c, None, None)?);
    let result = async {
        wait_phase(&c, &name, "Loaded", "Loaded").await?;
        // The tenant's NodeSet carries a label meant to opt out of label-selected steps.
        apply_example_with(&c, &ns, 1, |v| {
            v["metadata"]["labels"]["hardening"] = json!("off")
        })
        .await?;
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let hardened = eventually(60, || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|p| p.labels().get("site.example.com/hardened").map(String::as_str) == Some("yes"))
                .then_some(())
        })
        .await;
        ensure!(
            hardened.is_some(),
            "the namespace's NodeSet was built without the mandatory step"
        );
        let applies = eventually(30, || async {
            let bp = Api::<BuilderPlugin>::all(c.client.clone())
                .get(&name)
                .await
                .ok()?;
            let s = bp.status?;
            (s.applies_to == vec![format!("NodeSet {ns}/slurm-worker-slinky")]).then_some(())
        })
        .await;
        ensure!(
            applies.is_some(),
            "status.appliesTo is not exactly this namespace's NodeSet: {:?}",
            Api::<BuilderPlugin>::all(c.client.clone())
                .get(&name)
                .await?
                .status
        );
        // Another namespace's parent: not in scope.
        let elsewhere: slinky_api::NodeSet = serde_json::from_value(json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": "w", "namespace": format!("{ns}-other")},
            "spec": {"controllerRef": {"name": "slurm"}}}))?;
        let label = plugins
            .pipeline(BuilderKind::NodesetPod, &elsewhere.metadata)
            .label()
            .to_string();
        ensure!(
            !label.contains("site-pod"),
            "a NodeSet of another namespace got {label}"
        );
        Ok(())
    }
    .await;
    host.stop().await;
    let _ = Api::<BuilderPlugin>::all(c.client.clone())
        .delete(&name, &Default::default())
        .await;
    result
}

/// A pass stops creating when its pods' builder changes mid-scale-up: here a step that the
/// NodeSet's new label selects (a metadata change: no new generation). Scaled 0 → 30 with the
/// first create held at the API server, then labelled: the held pod is the only one built
/// without the step, the pass sends nothing after it, and the next pass builds the other 29
/// with it. (Without the check the pass created all 30 with the builder it began with, to be
/// rolled one by one after.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_selected_mid_scale_up_builds_the_pods_still_to_create() -> Result<()> {
    let _turn = BP_HOSTS.lock().await;
    let c = cluster(false).await;
    let Some(server) = c.embedded("mid-scale-up builder change") else {
        return Ok(());
    };
    let ns = c.namespace("midstep").await;
    let site = std::fs::read(test_plugin("site_pod"))?;
    let digest = slinky_host::oci::sha256(&site);
    module_config_map(&c, &ns, "site-pod", "plugin.wasm", gzip(&site)?, None).await?;
    let name = format!("{ns}-midstep");
    let rack = "site.example.com/rack";
    put_plugin(
        &c,
        &name,
        json!({"module": {"configMap": {"namespace": ns, "name": "site-pod"}, "digest": digest},
               "kinds": ["nodeset-pod"], "selector": {"matchLabels": {"mid-step": ns}},
               "settings": {"labels": {rack: "a"}}}),
    )
    .await?;
    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let host = host_with_builder_plugins(&c, &ns, &plugins, source(&c, None, None)?);
    let result = async {
        wait_phase(&c, &name, "Loaded", "Loaded").await?;
        apply_example_with(&c, &ns, 0, |_| {}).await?;
        host.wait_ready().await?;
        server.faults().hold_requests("create", "pods");
        scale(&c, &ns, 30).await?;
        eventually(30, || async {
            (server.faults().waiting_requests() == 1).then_some(())
        })
        .await
        .context("the pass's first create never reached the API server")?;
        Api::<NodeSet>::namespaced(c.client.clone(), &ns)
            .patch(
                NS_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"mid-step": ns}}})),
            )
            .await?;
        let key = kube::runtime::reflector::ObjectRef::<NodeSet>::new(NS_NAME).within(&ns);
        eventually(30, || async {
            host.handles
                .nodesets
                .get(&key)?
                .labels()
                .contains_key("mid-step")
                .then_some(())
        })
        .await
        .context("the host's cache never showed the label")?;
        server.faults().release_requests("create", "pods");
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let all = eventually(60, || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            (list.items.len() >= 30).then_some(list.items)
        })
        .await
        .context("the 30 pods were never made")?;
        let without: Vec<String> = all
            .iter()
            .filter(|p| !p.labels().contains_key(rack))
            .map(|p| p.name_any())
            .collect();
        ensure!(
            without.len() <= 1,
            "pods built with the builder the pass began with, after it changed: {without:?}"
        );
        Ok(())
    }
    .await;
    host.stop().await;
    let _ = Api::<BuilderPlugin>::all(c.client.clone())
        .delete(&name, &Default::default())
        .await;
    result
}

/// `status.serving` is no source of trust on a host without keys either: a status writer who
/// relabels a registry module this host once ran (cached while unsigned modules were allowed) as a
/// ConfigMap module of an allowed namespace gets nothing restored: a ConfigMap module is restored
/// only if this host loaded it from that very ConfigMap under a pinned digest. Before, a host
/// without keys skipped that check and served the relabelled registry module although it now
/// refuses registry modules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relabelled_status_restores_nothing_on_a_host_without_keys() -> Result<()> {
    let Some(registry) = Registry::start_answering().await? else {
        slinky_apiserver::testing::skip(
            "a_relabelled_status_restores_nothing_on_a_host_without_keys",
            "registry",
            &format!("{REGISTRY} is not installed (apt-get install docker-registry)"),
        );
        return Ok(());
    };
    let _turn = BP_HOSTS.lock().await;
    let gpu = test_plugin("gpu_nodeset_pod");
    let digest = slinky_host::oci::sha256(&std::fs::read(&gpu)?);
    let image = host_cli(&[
        "plugin",
        "push",
        path(&gpu),
        &format!("{}/site/gpu:1", registry.addr),
    ])?;
    let c = cluster(true).await;
    let ns = c.namespace("relabel").await;
    let name = format!("{ns}-gpu");
    let cache = tempfile::tempdir()?;
    let steps_with = |allow_unsigned: bool| -> Result<(Arc<PluginRegistry>, builder_plugin::Steps)> {
        let oci = Oci::new(DigestStore::new(Some(cache.path().to_path_buf())), Vec::new())?;
        let source = ModuleSource::new(
            oci,
            c.client.clone(),
            None,
            slinky_host::plugins::gunzip_if_gzipped,
        )
        .allowing_unsigned(allow_unsigned)
        .with_config_map_namespaces(vec![ns.clone()]);
        let registry = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
        let steps = builder_plugin::Steps::new(registry.clone(), Arc::new(source), Default::default());
        Ok((registry, steps))
    };
    let result = async {
        put_plugin(
            &c,
            &name,
            json!({"module": {"image": image}, "kinds": ["nodeset-pod"]}),
        )
        .await?;
        let (open, steps) = steps_with(true)?;
        builder_plugin::load_once(&c.client, &steps).await?;
        let parent = kube::api::ObjectMeta {
            namespace: Some(ns.clone()),
            ..Default::default()
        };
        ensure!(
            open.pipeline(BuilderKind::NodesetPod, &parent)
                .label()
                .contains("gpu-nodeset-pod"),
            "the unsigned module did not load where it was allowed"
        );
        // Its spec now refused; its status relabelled by a status writer.
        patch_spec(
            &c,
            &name,
            json!({"module": {"image": format!("{}/site/gpu@sha256:{}", registry.addr, "0".repeat(64))}}),
        )
        .await?;
        let relabelled = json!({"status": {"serving": {"digest": digest, "spec": {
            "module": {"configMap": {"namespace": ns, "name": "anything"}, "digest": digest},
            "kinds": ["nodeset-pod"]}}}});
        Api::<BuilderPlugin>::all(c.client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&relabelled))
            .await?;
        let (closed, steps) = steps_with(false)?;
        builder_plugin::load_once(&c.client, &steps).await?;
        let label = closed
            .pipeline(BuilderKind::NodesetPod, &parent)
            .label()
            .to_string();
        ensure!(
            !label.contains("gpu-nodeset-pod"),
            "a relabelled status restored {label}"
        );
        Ok(())
    }
    .await;
    let _ = Api::<BuilderPlugin>::all(c.client.clone())
        .delete(&name, &Default::default())
        .await;
    result
}
