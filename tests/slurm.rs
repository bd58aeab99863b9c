//! A real Slurm judges what the host builds (issue 23, items 1 and 8): the host reconciles a
//! manifest on the embedded API server, and `slinky-slurm-local` runs its slurmctld and slurmd
//! pods as real daemons of a local Slurm 25.05 build, each in its own network, mount and UTS
//! namespace. The generated `slurm.conf`, `cgroup.conf`, scripts, keys and slurmd arguments
//! must load: every slurmctld answers `scontrol ping`, and every worker pod's node registers in
//! the partition its NodeSet's line of `slurm.conf` gives it, with its features; `srun` runs on
//! every node.
//!
//! Needs root and a Slurm build (`../shared/tools/realslurm/setup.sh`, found through
//! `$REALSLURM_DIR`, `~/.cache/realslurm` or `~/realslurm`); without them each test skips
//! (listed in `$SLINKY_TEST_SKIPS`), and fails instead when `SLINKY_TEST_REQUIRE` has `slurm`.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::{
    Api, ResourceExt as _,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use slinky_slurm_local::SlurmLocal;
use slinky_tests::{
    TestCluster,
    host::{Host, apply, cluster_with_statefulsets},
};

/// The documents of a YAML file.
fn documents(path: &std::path::Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for doc in slinky_host::cmd::render::yaml_documents(&text) {
        let v: Value =
            serde_saphyr::from_str(doc).with_context(|| format!("{}: not YAML", path.display()))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Random bytes (from the kernel), for key Secrets a fixture only references.
fn random_bytes(n: usize) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let mut buf = vec![0; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// Create the key Secrets a Controller references and the manifest does not hold (random keys:
/// a 1024-byte Slurm key, a 32-byte JWT key), as a user of the chart would.
async fn ensure_key_secrets(c: &TestCluster, ns: &str, controller: &Value) -> Result<()> {
    let api = Api::<Secret>::namespaced(c.client.clone(), ns);
    for (field, len) in [("slurmKeyRef", 1024), ("jwtKeyRef", 32)] {
        let Some(r) = controller["spec"].get(field) else {
            continue;
        };
        let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str()) else {
            continue;
        };
        if api.get_opt(name).await?.is_some() {
            continue;
        }
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {key: k8s_openapi::ByteString(random_bytes(len)?)},
        }))?;
        api.create(&PostParams::default(), &s).await?;
    }
    Ok(())
}

/// What a case expects of Slurm: the slurmctld pods, and per worker pod (hostname) the
/// partition and feature the generated files give it.
#[derive(Debug, Default)]
struct Expected {
    controllers: usize,
    workers: BTreeMap<String, (String, String)>,
}

/// Read the expectations from the API: the Controller's ConfigMap's `NodeSet=… Feature=…` and
/// `PartitionName=… Nodes=…` lines, and each worker pod's `--conf 'Features=<first>,…'`.
async fn expected(c: &TestCluster, ns: &str, controller: &str) -> Result<Expected> {
    let cm = Api::<ConfigMap>::namespaced(c.client.clone(), ns)
        .get(&format!("{controller}-config"))
        .await
        .context("the Controller's ConfigMap")?;
    let conf = cm
        .data
        .as_ref()
        .and_then(|d| d.get("slurm.conf"))
        .cloned()
        .unwrap_or_default();
    let mut nodeset_of_feature = BTreeMap::new();
    let mut partition_of_nodeset = BTreeMap::new();
    for line in conf.lines() {
        let items: BTreeMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|i| i.split_once('='))
            .collect();
        if let (Some(n), Some(f)) = (items.get("NodeSet"), items.get("Feature")) {
            nodeset_of_feature.insert(f.to_string(), n.to_string());
        }
        if let (Some(p), Some(n)) = (items.get("PartitionName"), items.get("Nodes")) {
            partition_of_nodeset.insert(n.to_string(), p.to_string());
        }
    }
    let ha_hosts = conf.lines().filter(|l| l.starts_with("SlurmctldHost=")).count();
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let mut e = Expected {
        controllers: ha_hosts,
        ..Default::default()
    };
    for p in pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let labels = p.labels();
        if labels.get("app.kubernetes.io/name").map(String::as_str) != Some("slurmd")
            || labels.get("slinky.slurm.net/cluster").map(String::as_str) != Some(controller)
        {
            continue;
        }
        let spec = p.spec.as_ref().context("a pod without spec")?;
        let hostname = spec.hostname.clone().unwrap_or_else(|| p.name_any());
        let args = spec
            .containers
            .iter()
            .find(|c| c.name == "slurmd")
            .and_then(|c| c.args.clone())
            .unwrap_or_default();
        let conf_arg = args
            .iter()
            .skip_while(|a| *a != "--conf")
            .nth(1)
            .cloned()
            .unwrap_or_default();
        // The node's features, sorted as Slinky sorts them: the one a NodeSet line selects.
        let features: Vec<String> = conf_arg
            .split("Features=")
            .nth(1)
            .and_then(|r| r.split([' ', '\'']).next())
            .with_context(|| format!("{}: no Features= in --conf {conf_arg:?}", p.name_any()))?
            .split(',')
            .map(String::from)
            .collect();
        let (feature, nodeset) = features
            .iter()
            .find_map(|f| nodeset_of_feature.get(f).map(|n| (f.clone(), n)))
            .with_context(|| {
                format!(
                    "{}: no NodeSet line has a Feature of {features:?}:\n{conf}",
                    p.name_any()
                )
            })?;
        let partition = partition_of_nodeset
            .get(nodeset)
            .with_context(|| format!("no partition of NodeSet {nodeset}:\n{conf}"))?;
        e.workers.insert(hostname, (partition.clone(), feature));
    }
    Ok(e)
}

/// Poll `f` every second for `secs`; the last error when it never succeeds.
async fn poll<T, F, Fut>(secs: u64, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Every slurmctld answers `scontrol ping` (the primary first), and every worker pod's node is
/// in its partition with its feature, idle.
async fn slurm_agrees(h: &SlurmLocal, want: &Expected) -> Result<String> {
    let ping = h.exec_ok(&["scontrol", "ping"]).await?;
    let up = ping.lines().filter(|l| l.ends_with("is UP")).count();
    ensure!(
        ping.lines()
            .next()
            .is_some_and(|l| l.starts_with("Slurmctld(primary)") && l.ends_with("is UP")),
        "the primary is not UP: {ping}"
    );
    ensure!(
        up == want.controllers,
        "{up} of {} slurmctld UP: {ping}",
        want.controllers
    );
    let partitions: BTreeSet<&String> = want.workers.values().map(|(p, _)| p).collect();
    for partition in partitions {
        let nodes = h.nodes(Some(partition)).await?;
        let have: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let expect: BTreeSet<&str> = want
            .workers
            .iter()
            .filter(|(_, (p, _))| p == partition)
            .map(|(n, _)| n.as_str())
            .collect();
        ensure!(
            have == expect,
            "partition {partition}: sinfo lists {have:?}, the pods are {expect:?}"
        );
        for n in &nodes {
            let feature = want
                .workers
                .get(&n.name)
                .map(|(_, f)| f.as_str())
                .unwrap_or_default();
            ensure!(
                n.features.iter().any(|f| f == feature),
                "{} lacks feature {feature}: {n:?}",
                n.name
            );
            ensure!(n.state == "idle", "{} is {}", n.name, n.state);
        }
    }
    Ok(ping)
}

/// A running case: the cluster, its namespace, the host and the harness.
struct Case {
    c: TestCluster,
    ns: String,
    controller: String,
    host: Host,
    slurm: SlurmLocal,
}

impl Case {
    /// Apply `docs` (namespaces replaced) into a fresh namespace, with the key Secrets the
    /// Controller references, and start the host and the harness.
    async fn start(slurm: &std::path::Path, prefix: &str, docs: &[Value]) -> Result<Self> {
        let c = cluster_with_statefulsets().await;
        let ns = c.namespace(prefix).await;
        let controller = docs
            .iter()
            .find(|d| d["kind"] == "Controller")
            .context("no Controller in the manifest")?
            .clone();
        for d in docs {
            let mut d = d.clone();
            d["metadata"]["namespace"] = ns.clone().into();
            apply(&c, &ns, &d).await?;
        }
        ensure_key_secrets(&c, &ns, &controller).await?;
        let name = controller["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let host = Host::start(&c, &ns)?;
        let slurm = SlurmLocal::start(c.client.clone(), slurm, &ns, &name).await?;
        Ok(Case {
            c,
            ns,
            controller: name,
            host,
            slurm,
        })
    }

    /// With HA, the Controller's Service selects `controller.slinky.slurm.net/active=true`: the
    /// host must put it on exactly one slurmctld pod (pod 0 without a Slurm client, as Slinky).
    /// Checked, never set here.
    async fn check_active(&self) -> Result<()> {
        let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(self.c.client.clone(), &self.ns)
            .get(&format!("{}-controller", self.controller))
            .await?;
        let active = slinky_api::keys::LABEL_CONTROLLER_ACTIVE;
        let selects_active = svc
            .spec
            .and_then(|s| s.selector)
            .is_some_and(|sel| sel.contains_key(active));
        if !selects_active {
            return Ok(());
        }
        let api = Api::<Pod>::namespaced(self.c.client.clone(), &self.ns);
        let selector = format!(
            "app.kubernetes.io/name=slurmctld,app.kubernetes.io/instance={}",
            self.controller
        );
        let pods = api.list(&ListParams::default().labels(&selector)).await?;
        let labelled: Vec<String> = pods
            .items
            .iter()
            .filter(|p| p.labels().get(active).is_some_and(|v| v == "true"))
            .map(|p| p.name_any())
            .collect();
        ensure!(
            labelled.len() == 1,
            "the Service selects {active}=true, and the host labelled {labelled:?} (exactly one slurmctld \
             pod must carry it)"
        );
        Ok(())
    }

    /// Wait (120 s at most) until Slurm agrees with the generated files; the logs of every
    /// pod when it does not.
    async fn judge(&self) -> Result<Expected> {
        let result = poll(120, || async {
            self.check_active().await?;
            let want = expected(&self.c, &self.ns, &self.controller).await?;
            ensure!(!want.workers.is_empty(), "no worker pods yet");
            slurm_agrees(&self.slurm, &want).await?;
            Ok(want)
        })
        .await;
        match result {
            Ok(w) => Ok(w),
            Err(e) => bail!("{e:#}\n{}", self.logs().await),
        }
    }

    /// Every pod's logs, for a failure message.
    async fn logs(&self) -> String {
        let mut out = String::new();
        for p in self.slurm.pods().await {
            out.push_str(&format!(
                "--- {p:?}\n{}\n",
                self.slurm.logs(&p.name).unwrap_or_default()
            ));
        }
        out
    }

    async fn stop(self) {
        self.slurm.shutdown().await;
        self.host.stop().await;
    }
}

/// A case: `docs` must load and agree.
async fn loads_and_agrees(prefix: &str, docs: Vec<Value>) -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let case = Case::start(&slurm, prefix, &docs).await?;
    let result = case.judge().await;
    case.stop().await;
    result.map(|_| ())
}

/// The example cluster loads and agrees, and `srun -N3 hostname` answers from every node
/// (item 1's smoke test: each node runs its step in its own sandbox, under its own hostname).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_cluster_loads_and_srun_answers_from_every_node() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let docs = documents(&slinky_tests::example("slurm-cluster.yaml"))?;
    let case = Case::start(&slurm, "slurm-example", &docs).await?;
    let result = async {
        let want = case.judge().await?;
        ensure!(want.workers.len() == 3, "3 workers expected: {want:?}");
        let names = case.slurm.srun_hostname("slinky", 3).await?;
        let expect: Vec<String> = want.workers.keys().cloned().collect();
        ensure!(
            names == expect,
            "srun -N3 hostname answered {names:?}, the nodes are {expect:?}"
        );
        Ok(())
    }
    .await;
    let result = match result {
        Ok(()) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("{e:#}\n{}", case.logs().await)),
    };
    case.stop().await;
    result
}

/// `examples/hpc-cluster.yaml` loads and agrees: both slurmctld of the HA pair answer, on a
/// shared existing claim; extra lines, the `cgroup.conf` and prolog from ConfigMaps, two
/// NodeSets with hostname prefixes and partitions, one with SSH. Its metrics and accounting
/// reference are taken out: Slurm 25.05 has no `MetricsType`, and a new cluster with accounting
/// waits for its slurmdbd (see the next tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hpc_cluster_loads_and_agrees_with_both_controllers_up() -> Result<()> {
    let mut docs = documents(&slinky_tests::example("hpc-cluster.yaml"))?;
    for d in docs.iter_mut().filter(|d| d["kind"] == "Controller") {
        d["spec"]["metrics"] = json!({"enabled": false});
        if let Some(spec) = d["spec"].as_object_mut() {
            spec.remove("accountingRef");
        }
    }
    loads_and_agrees("slurm-hpc", docs).await
}

/// A Controller with `metrics.enabled` gets `MetricsType=metrics/openmetrics`, which Slurm
/// 25.11 brought (the example's images are 25.11 for it): slurmctld 25.05 refuses the file
/// (`Parsing error at unrecognized key: MetricsType`) and never starts, which is why the builder
/// refuses metrics with an image tagged older than 25.11 (`tests/golden.rs`). On a 25.11 build
/// the example (without its accounting reference) must load as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_slurm_25_11_slurmctld_25_05_refuses_metrics_type() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let mut docs = documents(&slinky_tests::example("hpc-cluster.yaml"))?;
    for d in docs.iter_mut().filter(|d| d["kind"] == "Controller") {
        if let Some(spec) = d["spec"].as_object_mut() {
            spec.remove("accountingRef");
        }
    }
    if slinky_tests::slurm::version(&slurm)? >= (25, 11) {
        return loads_and_agrees("slurm-metrics", docs).await;
    }
    let case = Case::start(&slurm, "slurm-metrics", &docs).await?;
    // slurmctld refuses the key and stops (fatal): no controller answers.
    let refused = poll(60, || async {
        let log = case.slurm.logs("hpc-controller-0").unwrap_or_default();
        ensure!(
            log.contains("unrecognized key: MetricsType") && log.contains("fatal"),
            "not refused yet:\n{log}"
        );
        Ok(())
    })
    .await;
    case.stop().await;
    refused
}

/// The shared fixture (`../shared/fixtures/slurm-cluster.yaml`: the example Controller and
/// NodeSet without their key Secrets, made here) loads and agrees. Skipped without `../shared`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_fixture_loads_and_agrees() -> Result<()> {
    let fixture = slinky_tests::workspace().join("../shared/fixtures/slurm-cluster.yaml");
    if !fixture.exists() {
        let why = format!("no {}", fixture.display());
        slinky_apiserver::testing::skip(&slinky_tests::test_name(), "shared-fixtures", &why);
        return Ok(());
    }
    loads_and_agrees("slurm-fixture", documents(&fixture)?).await
}

/// A Controller that sets every field (HA with two backups on an existing claim, a JWKS,
/// extra lines, a `cgroup.conf` and another file, prolog, epilog, slurmctld prolog and epilog
/// scripts, the reconfigure and logfile sidecars, a template, the Service; `accountingRef` when
/// `accounting`; metrics off, see above), a NodeSet with a hostname prefix and one without.
fn full_cluster(accounting: bool) -> Result<Vec<Value>> {
    let jwks = std::fs::read_to_string(slinky_tests::workspace().join("tests/slurm/jwks.json"))?;
    let script = "#!/bin/sh\nexit 0\n";
    let image = |n: &str| json!({"image": format!("ghcr.io/slinkyproject/{n}:25.05-ubuntu24.04")});
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full-files"},
            "data": {"cgroup.conf": "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainCores=yes\nConstrainRAMSpace=yes\n",
                     "gres.conf": "AutoDetect=off\n"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full-jwks"}, "data": {"jwks.json": jwks}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full-prolog"}, "data": {"10-prolog.sh": script}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full-epilog"}, "data": {"10-epilog.sh": script}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full-prolog-ctld"}, "data": {"10-prolog-ctld.sh": script}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "full-epilog-ctld"}, "data": {"10-epilog-ctld.sh": script}}),
        json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
        "metadata": {"name": "full", "labels": {"app.kubernetes.io/part-of": "full"}, "annotations": {"example.com/note": "every field"}},
        "spec": {
            "clusterName": "full",
            "slurmKeyRef": {"name": "full-slurm-key", "key": "slurm.key"},
            "jwtKeyRef": {"name": "full-jwt-key", "key": "jwt_hs256.key"},
            "jwksKeyRef": {"name": "full-jwks", "key": "jwks.json"},
            "accountingRef": {"name": "full"},
            "ha": {"enabled": true, "backups": 2},
            "slurmctld": image("slurmctld"),
            "reconfigure": image("slurmctld"),
            "logfile": {"image": "docker.io/library/alpine:latest"},
            "inplaceReconfigure": false,
            "template": {"metadata": {"labels": {"example.com/tier": "control"}, "annotations": {"example.com/owner": "hpc"}},
                         "spec": {"priorityClassName": "system-cluster-critical", "nodeSelector": {"kubernetes.io/os": "linux"}}},
            "extraConf": "SchedulerParameters=bf_continue\nMaxJobCount=20000\nSlurmctldParameters=enable_stepmgr\nPrologFlags=Contain",
            "configFileRefs": [{"name": "full-files"}],
            "prologScriptRefs": [{"name": "full-prolog"}],
            "epilogScriptRefs": [{"name": "full-epilog"}],
            "prologSlurmctldScriptRefs": [{"name": "full-prolog-ctld"}],
            "epilogSlurmctldScriptRefs": [{"name": "full-epilog-ctld"}],
            "persistence": {"enabled": true, "existingClaim": "full-statesave"},
            "service": {"metadata": {"annotations": {"example.com/team": "hpc"}}, "spec": {"type": "ClusterIP"}},
            "metrics": {"enabled": false}
        }}),
        json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "full-prefixed"},
            "spec": {"controllerRef": {"name": "full"}, "replicas": 2, "slurmd": image("slurmd"),
                     "extraConf": "Weight=5", "partition": {"enabled": true, "config": "Default=YES State=UP"},
                     "template": {"spec": {"hostname": "pre-"}}}}),
        json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "full-plain"},
            "spec": {"controllerRef": {"name": "full"}, "replicas": 2, "slurmd": image("slurmd"),
                     "partition": {"enabled": true, "config": "State=UP MaxTime=1:00:00"}}}),
    ];
    let mut docs = docs;
    if !accounting {
        for d in docs.iter_mut().filter(|d| d["kind"] == "Controller") {
            if let Some(spec) = d["spec"].as_object_mut() {
                spec.remove("accountingRef");
            }
        }
    }
    Ok(docs)
}

/// The Controller setting every field but the accounting reference loads and agrees: all three
/// slurmctld answer, and both NodeSets' pods (`pre-N` and `full-plain-N`) are in their partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_setting_every_field_loads_and_agrees() -> Result<()> {
    loads_and_agrees("slurm-full", full_cluster(false)?).await
}

/// With `accountingRef`, slurmctld loads the generated files, then waits for the Accounting's
/// slurmdbd (`Retrying initial connection to slurmdbd`, `Still don't know my ClusterID`): a new
/// cluster with accounting needs slurmdbd before it serves, and no Accounting `full` runs one here
/// (`tests/slurm_accounting.rs` runs the example's, with a database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_accounting_reference_slurmctld_loads_then_waits_for_slurmdbd() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let case = Case::start(&slurm, "slurm-acct", &full_cluster(true)?).await?;
    let waits = poll(60, || async {
        let log = case.slurm.logs("full-controller-0").unwrap_or_default();
        ensure!(!log.contains("fatal"), "slurmctld stopped:\n{log}");
        ensure!(
            log.contains("Still don't know my ClusterID"),
            "not waiting for slurmdbd yet:\n{log}"
        );
        Ok(())
    })
    .await;
    case.stop().await;
    waits
}

/// The harness's own API, as the host's end-to-end tests use it: slurmrestd answers from the
/// root namespace and can be stopped and started; a deleted worker pod's preStop hook marks its
/// node down in Slurm (with Slinky's reason) before its slurmd stops, and its sandbox goes; a
/// killed slurmctld stays down until restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_stops_and_starts_daemons_and_runs_the_prestop_hook() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let docs = documents(&slinky_tests::example("slurm-cluster.yaml"))?;
    let case = Case::start(&slurm, "slurm-harness", &docs).await?;
    let result = async {
        case.judge().await?;
        let h = &case.slurm;
        let (status, body) = slinky_tests::slurm::restd_get(h, "/slurm/v0.0.43/ping").await?;
        ensure!(status == 200 && body.contains("\"primary\""), "{status} {body}");

        h.stop_slurmrestd().await?;
        ensure!(
            slinky_tests::slurm::restd_get(h, "/slurm/v0.0.43/ping")
                .await
                .is_err(),
            "slurmrestd still answers"
        );
        h.start_slurmrestd().await?;
        let (status, _) = slinky_tests::slurm::restd_get(h, "/slurm/v0.0.43/ping").await?;
        ensure!(status == 200, "slurmrestd answers {status} after its start");

        slinky_tests::host::scale(&case.c, &case.ns, 2).await?;
        let gone = poll(60, || async {
            let nodes = h.nodes(Some("slinky")).await?;
            let node = nodes
                .iter()
                .find(|n| n.name == "slinky-2")
                .context("slinky-2 is not listed")?;
            ensure!(node.state.starts_with("down"), "slinky-2 is {}", node.state);
            let pods = h.pods().await;
            ensure!(
                !pods.iter().any(|p| p.name.ends_with("-2")),
                "the sandbox is still there: {pods:?}"
            );
            Ok(())
        })
        .await;
        gone?;
        let reason = h.exec_ok(&["sinfo", "-h", "-n", "slinky-2", "-o", "%E"]).await?;
        ensure!(
            reason.contains("Pod is terminating"),
            "slinky-2's reason: {reason}"
        );

        // Last: slurmctld killed by SIGKILL does not save its state, so the dynamic nodes
        // registered since its last save are gone when it comes back.
        h.kill_slurmctld("slurm-controller-0").await?;
        let ping = h.exec(&["scontrol", "ping"]).await?;
        ensure!(
            !ping.status.success(),
            "scontrol ping succeeded with slurmctld killed: {ping:?}"
        );
        h.restart_slurmctld("slurm-controller-0").await?;
        poll(30, || async {
            h.exec_ok(&["scontrol", "ping"])
                .await
                .map(drop)
                .map_err(Into::into)
        })
        .await?;
        Ok(())
    }
    .await;
    let result = match result {
        Ok(()) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("{e:#}\n{}", case.logs().await)),
    };
    case.stop().await;
    result
}
