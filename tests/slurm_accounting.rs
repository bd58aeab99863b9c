//! The Accounting kind judged by a real Slurm and a real MariaDB (the acceptance: slurmdbd
//! starts on the generated `slurmdbd.conf` and `sacct` lists a finished job). The host reconciles
//! `examples/slurm-cluster.yaml` (its Controller naming the Accounting in `spec.accountingRef`),
//! `examples/accounting.yaml` and `examples/restapi.yaml` on the embedded API server;
//! `slinky-slurm-local` runs slurmctld, slurmd, slurmrestd and the Accounting's slurmdbd pod as
//! real daemons of a local Slurm 25.05 build, and a private `mariadbd` (Debian's
//! `mariadb-server`) on the harness's bridge stands in for the Accounting's
//! `storageConfig.host`. The database password holds a `#` and a space: slurmdbd reads it whole
//! only if the host escaped and quoted it for Slurm's parser. The harness mounts the pod's
//! volumes as a kubelet does and runs its init containers: the example's slurmdbd 25.05 starts
//! only because the builder's `initconf` init container copies its files (0600, owned by
//! `slurm`) out of the Secret's mount, which slurmdbd 25.05 refuses as it is.
//!
//! Needs root, a Slurm build with slurmdbd's MySQL plugin (`../shared/tools/realslurm/setup.sh`
//! with `libmariadb-dev` installed) and `mariadb-server`; without them each test skips (listed in
//! `$SLINKY_TEST_SKIPS`), and fails instead when `SLINKY_TEST_REQUIRE` has `slurmdbd`. The tests
//! take turns (each runs a whole Slurm).

use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use slinky_host::{PluginRegistry, reconcile::RunConfig};
use slinky_slurm_local::{MariaDb, Role, SlurmLocal};
use slinky_tests::{
    TestCluster, default_engine, eventually,
    host::{Host, apply_file, cluster_with_statefulsets},
};
use tokio::sync::Mutex;

/// One Slurm at a time: each test runs slurmctld, slurmd, slurmrestd, slurmdbd and MariaDB.
static TURN: Mutex<()> = Mutex::const_new(());

/// The database password: a `#` (a comment to Slurm's parser unless escaped) and a space (a
/// value's end unless quoted).
const PASSWORD: &str = "acct #1 pass";
/// The password after the change of the second half of the acceptance test.
const NEW_PASSWORD: &str = "n3w #2 pass";
/// The example Accounting's `storageConfig` (its user and database).
const DB_USER: &str = "slurm";
const DB_NAME: &str = "slurm_acct_db";
/// The example Accounting's slurmdbd pod.
const SLURMDBD_POD: &str = "slurm-accounting-0";

/// A running case: the cluster, its namespace, the harness (with MariaDB) and the host.
struct Case {
    c: TestCluster,
    ns: String,
    slurm: SlurmLocal,
    db: Arc<MariaDb>,
    host: Host,
}

impl Case {
    /// The example cluster (one worker), its Accounting (the password [`PASSWORD`], the port of
    /// a fresh MariaDB whose address the sandboxes know as the example's `mariadb`, the
    /// slurmdbd image `slurmdbd_image` when given) and its RestApi in a fresh namespace; the
    /// harness runs its pods and a host reconciles it, asking the harness's slurmrestd.
    async fn start(slurm: &std::path::Path, prefix: &str, slurmdbd_image: Option<&str>) -> Result<Self> {
        let c = cluster_with_statefulsets().await;
        let ns = c.namespace(prefix).await;
        let h = SlurmLocal::prepare(slurm, "cluster.local").await?;
        let db = h.start_mariadb().await?;
        db.create_user(DB_USER, PASSWORD, DB_NAME).await?;
        h.add_host("mariadb", *db.addr().ip()).await?;
        let port = db.addr().port();
        apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
            if v["kind"] == "Controller" {
                v["spec"]["accountingRef"] = json!({"name": "slurm"});
            }
            if v["kind"] == "NodeSet" {
                v["spec"]["replicas"] = json!(1);
            }
        })
        .await?;
        apply_file(&c, &ns, "accounting.yaml", |v| {
            if v["kind"] == "Secret" {
                v["stringData"]["password"] = json!(PASSWORD);
            }
            if v["kind"] == "Accounting" {
                assert_eq!(v["spec"]["storageConfig"]["host"], "mariadb");
                assert_eq!(v["spec"]["storageConfig"]["username"], DB_USER);
                assert_eq!(v["spec"]["storageConfig"]["database"], DB_NAME);
                v["spec"]["storageConfig"]["port"] = json!(port);
                if let Some(image) = slurmdbd_image {
                    v["spec"]["slurmdbd"]["image"] = json!(image);
                }
            }
        })
        .await?;
        apply_file(&c, &ns, "restapi.yaml", |_| {}).await?;
        h.attach(c.client.clone(), &ns, "slurm").await?;
        let config = RunConfig {
            namespaces: vec![ns.clone()],
            resync: Some(Duration::from_secs(1)),
            slurmrestd_urls: vec![h.restapi_url()],
            ..Default::default()
        };
        let host = Host::start_config(
            c.client.clone(),
            Arc::new(PluginRegistry::new(&default_engine(), &[])?),
            config,
        );
        Ok(Case {
            c,
            ns,
            slurm: h,
            db,
            host,
        })
    }

    /// Every pod's logs and MariaDB's, for a failure message.
    async fn logs(&self) -> String {
        let mut out = String::new();
        for p in self.slurm.pods().await {
            out.push_str(&format!(
                "--- {p:?}\n{}\n",
                self.slurm.logs(&p.name).unwrap_or_default()
            ));
        }
        out.push_str(&format!("--- MariaDB: {}\n", self.db.log_tail()));
        out
    }

    /// `what` failed: the error with every log.
    async fn fail(&self, what: anyhow::Error) -> anyhow::Error {
        anyhow::anyhow!("{what:#}\n{}", self.logs().await)
    }

    /// The running slurmdbd pod's UID once its slurmdbd says it started (and listens), 120 s at
    /// most; `not` is a UID it must not be (a rolled pod).
    async fn slurmdbd_started(&self, not: Option<&str>) -> Result<String> {
        let up = eventually(120, || async {
            let pod = self
                .slurm
                .pods()
                .await
                .into_iter()
                .find(|p| p.role == Role::Slurmdbd && p.pid.is_some() && !p.terminating)?;
            if Some(pod.uid.as_str()) == not {
                return None;
            }
            // The log of this pod's sandbox (a rolled pod's log starts afresh). slurmdbd says it
            // started only once it connected to the database: with a password cut short it
            // retries ("Access denied for user") for ever.
            let log = self.slurm.logs(&pod.name)?;
            (log.contains("slurmdbd version") && log.contains(" started")).then_some(pod.uid)
        })
        .await;
        up.context("slurmdbd did not start on the generated slurmdbd.conf within 120 s")
    }

    /// The slurmdbd pod's spec once the StatefulSet made it (60 s at most).
    async fn slurmdbd_pod_spec(&self) -> Result<k8s_openapi::api::core::v1::PodSpec> {
        let pods = Api::<Pod>::namespaced(self.c.client.clone(), &self.ns);
        let spec = eventually(60, || async { pods.get_opt(SLURMDBD_POD).await.ok()??.spec }).await;
        spec.with_context(|| format!("no pod {SLURMDBD_POD} within 60 s"))
    }

    /// `slurmdbd.conf` as the host stored it in the Secret `slurm-accounting`.
    async fn stored_conf(&self) -> Result<String> {
        let s = Api::<Secret>::namespaced(self.c.client.clone(), &self.ns)
            .get("slurm-accounting")
            .await?;
        let data = s.data.unwrap_or_default();
        let conf = data
            .get("slurmdbd.conf")
            .context("no slurmdbd.conf in the Secret")?;
        Ok(String::from_utf8_lossy(&conf.0).into_owned())
    }

    /// Submit `hostname` and wait (60 s) until slurmctld says it COMPLETED; returns its id.
    async fn run_job(&self) -> Result<String> {
        let out = self
            .slurm
            .exec_ok(&["sbatch", "--parsable", "-p", "slinky", "--wrap", "hostname"])
            .await?;
        let id = out.trim().split(';').next().unwrap_or_default().to_string();
        ensure!(!id.is_empty(), "sbatch gave no job id: {out:?}");
        let done = eventually(60, || async {
            let line = self
                .slurm
                .exec_ok(&["scontrol", "show", "job", &id, "-o"])
                .await
                .ok()?;
            line.contains("JobState=COMPLETED").then_some(())
        })
        .await;
        if done.is_none() {
            bail!(
                "job {id} did not complete within 60 s: {}",
                self.slurm
                    .exec_ok(&["scontrol", "show", "job", &id, "-o"])
                    .await?
            );
        }
        Ok(id)
    }

    /// Wait (60 s) until `sacct` lists job `id` as COMPLETED; returns sacct's line.
    async fn sacct_completed(&self, id: &str) -> Result<String> {
        let args = ["sacct", "-X", "-n", "-P", "-j", id, "-o", "JobID,State"];
        let want = format!("{id}|COMPLETED");
        let listed = eventually(60, || async {
            let out = self.slurm.exec_ok(&args).await.ok()?;
            out.lines()
                .any(|l| l.trim() == want)
                .then(|| out.trim().to_string())
        })
        .await;
        match listed {
            Some(line) => Ok(line),
            None => bail!(
                "sacct does not list job {id} as COMPLETED within 60 s: {:?}",
                self.slurm.exec(&args).await?
            ),
        }
    }

    async fn stop(self) {
        self.host.stop().await;
        self.slurm.shutdown().await;
    }
}

/// The acceptance: slurmdbd 25.05 (the example's image) starts on the `slurmdbd.conf`
/// the host generated, copied out of the Secret's kubelet-made mount by the pod's `initconf`
/// init container (the password with `#` and space reaching MariaDB whole), slurmctld registers
/// the cluster with it,
/// and `sacct` lists a finished job as COMPLETED (slurmrestd too, through slurmdbd's `auth/jwt`).
/// Then the database password changes (the
/// database user's, then the Secret): the host writes a new `slurmdbd.conf`, the slurmdbd pod
/// rolls, the new slurmdbd reaches MariaDB with the new password, and a second job is accounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurmdbd_runs_on_the_generated_conf_and_sacct_lists_a_finished_job() -> Result<()> {
    let Some(slurm) = slinky_tests::slurmdbd_or_skip() else {
        return Ok(());
    };
    let _turn = TURN.lock().await;
    let case = Case::start(&slurm, "slurm-acct", None).await?;
    let result = async {
        // The builder's pod for the example's 25.05 image: an initconf init container copies
        // the projected files into the in-memory /etc/slurm slurmdbd reads.
        let spec = case.slurmdbd_pod_spec().await?;
        let inits: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        ensure!(
            inits == ["initconf"],
            "the slurmdbd pod's init containers: {inits:?}"
        );
        let written = eventually(60, || async {
            let conf = case.stored_conf().await.ok()?;
            conf.contains("StoragePass=\"acct \\#1 pass\"\n").then_some(())
        })
        .await;
        ensure!(
            written.is_some(),
            "the host did not write the password escaped and quoted for Slurm's parser: {:?}",
            case.stored_conf().await
        );
        let first = case.slurmdbd_started(None).await?;
        let pod = case.slurm.pods().await.into_iter().find(|p| p.uid == first);
        ensure!(
            pod.as_ref().is_some_and(|p| p.initialized),
            "slurmdbd started before its init container completed: {pod:?}"
        );
        // slurmctld registers the cluster with slurmdbd (Slurm 25.05 adds it on the first
        // registration: no `sacctmgr add cluster`).
        let registered = eventually(120, || async {
            let out = case
                .slurm
                .exec_ok(&["sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster"])
                .await
                .ok()?;
            out.lines().any(|l| l.trim() == "slurm").then_some(())
        })
        .await;
        ensure!(
            registered.is_some(),
            "the cluster `slurm` never registered with slurmdbd: {:?}",
            case.slurm
                .exec(&["sacctmgr", "-n", "-P", "show", "cluster"])
                .await?
        );
        // slurmdbd wrote the cluster into MariaDB (with the password from slurmdbd.conf).
        let clusters = case
            .db
            .sql(&format!(
                "SELECT name FROM `{DB_NAME}`.cluster_table WHERE deleted = 0;"
            ))
            .await?;
        ensure!(
            clusters.lines().any(|l| l.trim() == "slurm"),
            "MariaDB's cluster_table: {clusters:?}"
        );
        let job = case.run_job().await?;
        let line = case.sacct_completed(&job).await?;
        eprintln!("sacct -X -n -P -j {job} -o JobID,State: {line}");
        // slurmrestd, as the RestApi's Deployment runs it (with accounting: no `-s
        // openapi/slurmctld`), asks slurmdbd with the user's JWT (slurmdbd.conf's
        // `AuthAltTypes=auth/jwt`, `jwt_key=/etc/slurm/jwt.key`).
        let path = format!("/slurmdb/v0.0.43/job/{job}");
        let answered = eventually(60, || async {
            let (status, body) = slinky_tests::slurm::restd_get(&case.slurm, &path).await.ok()?;
            // The first JSON value (slurmrestd 25.05 answers an HTTP/1.0 request with a
            // `Connection: Close` line after the body).
            let v: serde_json::Value = serde_json::Deserializer::from_str(&body)
                .into_iter()
                .next()?
                .ok()?;
            let j = v["jobs"].as_array()?.first()?;
            let completed = j["state"]["current"].as_array()?.iter().any(|s| s == "COMPLETED");
            (status == 200 && j["job_id"].as_u64()?.to_string() == job && completed).then_some(())
        })
        .await;
        ensure!(
            answered.is_some(),
            "slurmrestd's {path}: {:?}",
            slinky_tests::slurm::restd_get(&case.slurm, &path).await
        );

        // A new password: the database user's first (slurmdbd's open connection stays), then
        // the Secret the Accounting references.
        case.db.set_password(DB_USER, NEW_PASSWORD).await?;
        Api::<Secret>::namespaced(case.c.client.clone(), &case.ns)
            .patch(
                "mariadb-password",
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"password": NEW_PASSWORD}})),
            )
            .await?;
        let rewritten = eventually(60, || async {
            let conf = case.stored_conf().await.ok()?;
            conf.contains("StoragePass=\"n3w \\#2 pass\"\n").then_some(())
        })
        .await;
        ensure!(
            rewritten.is_some(),
            "the host did not write the new password into slurmdbd.conf: {}",
            case.stored_conf().await?
        );
        let second = case.slurmdbd_started(Some(&first)).await?;
        ensure!(second != first, "the slurmdbd pod did not roll");
        let job2 = case.run_job().await?;
        let line = case.sacct_completed(&job2).await?;
        eprintln!("after the password change: sacct -X -n -P -j {job2} -o JobID,State: {line}");
        Ok(())
    }
    .await;
    let result = match result {
        Ok(()) => Ok(()),
        Err(e) => Err(case.fail(e).await),
    };
    case.stop().await;
    result
}

/// The 25.11 shape a slurmdbd of its image gets (Slinky's, no `initconf`: the Secret's files
/// mounted at `/etc/slurm` as a kubelet mounts them, `defaultMode` 0600 with `fsGroup` 401:
/// root's, group-readable, 0640) run by a slurmdbd before 25.11: it refuses `slurmdbd.conf`,
/// which it wants 0600 and owned by its SlurmUser. What the example's pod would meet without its
/// init container's copy step. A 25.11 or later build must start on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurmdbd_25_05_refuses_the_conf_as_a_kubelet_mounts_it() -> Result<()> {
    let Some(slurm) = slinky_tests::slurmdbd_or_skip() else {
        return Ok(());
    };
    let _turn = TURN.lock().await;
    let modern = slinky_tests::slurm::version(&slurm)? >= (25, 11);
    let case = Case::start(
        &slurm,
        "slurm-acct-mount",
        Some("ghcr.io/slinkyproject/slurmdbd:25.11-ubuntu24.04"),
    )
    .await?;
    let result = async {
        let spec = case.slurmdbd_pod_spec().await?;
        ensure!(
            spec.init_containers.is_none(),
            "a 25.11 image gets Slinky's shape, without initconf: {:?}",
            spec.init_containers
        );
        let slurmdbd = spec
            .containers
            .iter()
            .find(|c| c.name == "slurmdbd")
            .context("no slurmdbd container")?;
        let etc = slurmdbd
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/etc/slurm")
            .map(|m| m.name.as_str());
        ensure!(
            etc == Some("slurm-etc"),
            "slurmdbd's /etc/slurm is the projected volume itself: {etc:?}"
        );
        if modern {
            case.slurmdbd_started(None).await?;
            return Ok(());
        }
        let refused = eventually(120, || async {
            let log = case.slurm.logs(SLURMDBD_POD)?;
            log.contains("fatal: slurmdbd.conf file /etc/slurm/slurmdbd.conf should be 600 is 640")
                .then_some(())
        })
        .await;
        ensure!(
            refused.is_some(),
            "slurmdbd did not refuse the group-readable slurmdbd.conf"
        );
        let pod = case
            .slurm
            .pods()
            .await
            .into_iter()
            .find(|p| p.role == Role::Slurmdbd)
            .context("no slurmdbd pod")?;
        ensure!(
            !case
                .slurm
                .logs(&pod.name)
                .unwrap_or_default()
                .contains("slurmdbd version"),
            "slurmdbd started anyway"
        );
        Ok(())
    }
    .await;
    let result = match result {
        Ok(()) => Ok(()),
        Err(e) => Err(case.fail(e).await),
    };
    case.stop().await;
    result
}
