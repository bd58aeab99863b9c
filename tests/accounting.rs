//! The Accounting kind (slurmdbd): its StatefulSet, Service and `slurmdbd.conf` Secret field by
//! field against Slinky's `BuildAccounting`/`BuildAccountingService`/`BuildAccountingConfig`
//! (through the bundled 0.3.0 plugin and the host's output policy, as `render` builds them), the
//! Controller's `AccountingStorage*` lines, and end to end on the embedded API server (or the
//! cluster of `SLINKY_TEST_KUBECONFIG`): the password written by the host (never seen by the
//! builder), a changed password rolling slurmdbd, a missing Accounting reported on its
//! Controller, a password that cannot be one line refused.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use slinky_api::{Accounting, Controller, conditions};
use slinky_host::{cmd::render::Parent, plugins::ChildKind};
use slinky_tests::{
    eventually, example,
    host::{Host, apply_file, child, cluster, condition_of, events, settled_without_writes},
};

const KEY: &str = "slurm-accounting";

/// Every child `render` builds for the example cluster and its Accounting (edited by `edit`),
/// by `Kind/name`.
fn build(edit: impl Fn(&mut Parent)) -> Result<BTreeMap<String, Value>> {
    slinky_tests::render_children(&[example("slurm-cluster.yaml"), example("accounting.yaml")], edit)
}

fn get<'a>(objects: &'a BTreeMap<String, Value>, key: &str) -> Result<&'a Value> {
    objects
        .get(key)
        .with_context(|| format!("{key} not built: {:?}", objects.keys()))
}

/// slurmdbd 25.11, whose pod Slinky builds without a copy step.
const IMAGE_25_11: &str = "ghcr.io/slinkyproject/slurmdbd:25.11-ubuntu24.04";

fn with_image(image: &'static str) -> impl Fn(&mut Parent) {
    move |p| {
        if let Parent::Accounting(a) = p {
            a.spec.slurmdbd.0["image"] = image.into();
        }
    }
}

#[test]
fn slurmdbds_statefulset_service_and_conf_match_slinky_field_by_field() -> Result<()> {
    let objects = build(with_image(IMAGE_25_11))?;
    let selector = json!({"app.kubernetes.io/name": "slurmdbd", "app.kubernetes.io/instance": "slurm"});
    let labels = json!({"app.kubernetes.io/name": "slurmdbd", "app.kubernetes.io/instance": "slurm",
        "app.kubernetes.io/component": "accounting", "app.kubernetes.io/part-of": "slurm"});
    let owner = json!([{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Accounting", "name": "slurm",
        "uid": "uid-slurm", "controller": true, "blockOwnerDeletion": true}]);

    let sts = get(&objects, &format!("StatefulSet/{KEY}"))?;
    assert_eq!(sts["metadata"]["labels"], labels);
    assert_eq!(sts["metadata"]["ownerReferences"], owner);
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["podManagementPolicy"], "Parallel");
    assert_eq!(spec["revisionHistoryLimit"], 0);
    assert_eq!(spec["serviceName"], KEY);
    assert_eq!(spec["selector"], json!({"matchLabels": selector}));
    let annotations = &spec["template"]["metadata"]["annotations"];
    assert_eq!(annotations["kubectl.kubernetes.io/default-container"], "slurmdbd");
    for hash in ["slurm-key-hash", "jwt-key-hash"] {
        ensure!(
            annotations[format!("slinky.slurm.net/{hash}")]
                .as_str()
                .is_some_and(|h| h.len() == 64),
            "{hash} of the input's Secret: {annotations}"
        );
    }
    assert_eq!(
        annotations["slinky.slurm.net/slurmdbd-conf-hash"], "",
        "no slurmdbd.conf stored yet: Slinky's hash of nothing"
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401, "fsGroup": 401})
    );
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "slurm-etc", "projected": {"defaultMode": 384, "sources": [
                {"secret": {"name": KEY, "items": [{"key": "slurmdbd.conf", "path": "slurmdbd.conf"}]}},
                {"secret": {"name": "slurm-auth-slurm", "items": [{"key": "slurm.key", "path": "slurm.key"}]}},
                {"secret": {"name": "slurm-auth-jwths256", "items": [{"key": "jwt_hs256.key", "path": "jwt.key"}]}}]}},
            {"name": "run", "emptyDir": {"medium": "Memory"}}])
    );
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "slurmdbd");
    assert_eq!(c["image"], IMAGE_25_11);
    assert_eq!(pod["initContainers"], Value::Null, "no copy step from 25.11");
    assert_eq!(
        c["ports"],
        json!([{"name": "slurmdbd", "containerPort": 6819, "protocol": "TCP"}])
    );
    assert_eq!(c["readinessProbe"], json!({"tcpSocket": {"port": 6819}}));
    assert_eq!(
        c["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401})
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": "slurm-etc", "mountPath": "/etc/slurm", "readOnly": true},
               {"name": "run", "mountPath": "/run"}])
    );

    let s = get(&objects, &format!("Service/{KEY}"))?;
    assert_eq!(s["metadata"]["ownerReferences"], owner);
    assert_eq!(s["spec"]["selector"], selector);
    assert_eq!(
        s["spec"]["ports"],
        json!([{"name": "slurmdbd", "port": 6819, "targetPort": "slurmdbd", "protocol": "TCP"}])
    );

    let secret = get(&objects, &format!("Secret/{KEY}"))?;
    assert_eq!(secret["metadata"]["ownerReferences"], owner);
    assert_eq!(secret["immutable"], false);
    let conf = secret["stringData"]["slurmdbd.conf"]
        .as_str()
        .context("slurmdbd.conf")?;
    ensure!(
        conf.contains("DbdHost=slurm-accounting-0\nDbdPort=6819\nSlurmUser=slurm\n"),
        "{conf}"
    );
    ensure!(
        conf.contains(
            "StorageType=accounting_storage/mysql\nStorageHost=mariadb\nStoragePort=3306\n\
             StorageUser=slurm\nStorageLoc=slurm_acct_db\n\
             StoragePass=${secretKeyRef:mariadb-password/password|slurm}\n"
        ),
        "render leaves the password to the host: {conf}"
    );
    ensure!(
        !conf.contains("change-me"),
        "the password reached a builder's output: {conf}"
    );
    Ok(())
}

/// slurmdbd before 25.11 refuses a `slurmdbd.conf` that is not mode 0600 and owned by SlurmUser,
/// which a kubelet's Secret volume never is (root-owned, group fsGroup): its files are copied into
/// memory by `initconf` first (as Slinky did before 25.11), and slurmdbd reads the copies. A tag
/// that names no release gets the copy too (harmless to a newer slurmdbd).
#[test]
fn slurmdbd_before_25_11_reads_private_copies_of_its_files() -> Result<()> {
    for image in [
        "ghcr.io/slinkyproject/slurmdbd:25.05-ubuntu24.04",
        "registry.example/slurmdbd:latest",
    ] {
        let objects = build(with_image(image))?;
        let pod = &get(&objects, &format!("StatefulSet/{KEY}"))?["spec"]["template"]["spec"];
        assert_eq!(
            pod["initContainers"],
            json!([{"name": "initconf", "image": image,
                "command": ["sh", "-c", "install -m 0600 /mnt/slurm/* /etc/slurm/"],
                "securityContext": {"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401},
                "volumeMounts": [{"name": "slurm-etc", "mountPath": "/mnt/slurm", "readOnly": true},
                                 {"name": "slurm-etc-private", "mountPath": "/etc/slurm"}]}]),
            "{image}"
        );
        assert_eq!(
            pod["containers"][0]["volumeMounts"],
            json!([{"name": "slurm-etc-private", "mountPath": "/etc/slurm", "readOnly": true},
                   {"name": "run", "mountPath": "/run"}]),
            "{image}"
        );
        assert_eq!(
            pod["volumes"][2],
            json!({"name": "slurm-etc-private", "emptyDir": {"medium": "Memory"}}),
            "{image}"
        );
    }
    Ok(())
}

/// The Controller's accounting lines follow its Accounting: its Service and port, or its
/// external address (Slinky writes `<accounting>-accounting:6819` whatever it says).
#[test]
fn the_controllers_accounting_lines_follow_its_accounting() -> Result<()> {
    let slurm_conf = |objects: &BTreeMap<String, Value>| -> Result<String> {
        Ok(get(objects, "ConfigMap/slurm-config")?["data"]["slurm.conf"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    };
    let referenced = |p: &mut Parent| {
        if let Parent::Controller(c) = p {
            c.spec.accounting_ref =
                Some(k8s_openapi::api::core::v1::LocalObjectReference { name: "slurm".into() });
        }
    };
    let conf = slurm_conf(&build(referenced)?)?;
    ensure!(
        conf.contains(
            "### ACCOUNTING ###\nAccountingStorageType=accounting_storage/slurmdbd\n\
             AccountingStorageHost=slurm-accounting\nAccountingStoragePort=6819\n"
        ),
        "{conf}"
    );
    let conf = slurm_conf(&build(|p| {
        referenced(p);
        if let Parent::Accounting(a) = p {
            a.spec.service.port = Some(16819);
        }
    })?)?;
    ensure!(conf.contains("AccountingStoragePort=16819\n"), "{conf}");
    let objects = build(|p| {
        referenced(p);
        if let Parent::Accounting(a) = p {
            a.spec.external = true;
            a.spec.external_config = Some(slinky_api::ExternalConfig {
                host: "dbd.example.org".into(),
                port: 7031,
            });
        }
    })?;
    let conf = slurm_conf(&objects)?;
    ensure!(
        conf.contains("AccountingStorageHost=dbd.example.org\nAccountingStoragePort=7031\n"),
        "{conf}"
    );
    ensure!(
        !objects.keys().any(|k| k.ends_with(KEY)),
        "an external Accounting has no children: {:?}",
        objects.keys()
    );
    let conf = slurm_conf(&build(|_| {})?)?;
    ensure!(
        conf.contains("AccountingStorageType=accounting_storage/none\n"),
        "{conf}"
    );
    Ok(())
}

fn stored_conf(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("slurmdbd.conf"))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_host_writes_the_password_and_a_new_one_rolls_slurmdbd() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("accounting").await;
    // The Controller names an Accounting that does not exist yet.
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 0.into();
        }
        if v["kind"] == "Controller" {
            v["spec"]["accountingRef"] = json!({"name": "slurm"});
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let configs: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let missing = eventually(60, || async {
        let cond = condition_of::<Controller>(&c, &ns, "slurm", conditions::REFERENCE_NOT_FOUND).await?;
        configs.get_opt("slurm-config").await.ok()??;
        (cond["reason"] == "AccountingNotFound").then_some(cond)
    })
    .await
    .context("no AccountingNotFound on the Controller (or no slurm.conf built meanwhile)")?;
    ensure!(
        missing["message"].as_str().is_some_and(|m| m.contains(&format!(
            "Accounting {ns}/slurm (spec.accountingRef) does not exist"
        ))),
        "{missing}"
    );
    ensure!(
        events(&c, &ns, "slurm")
            .await?
            .iter()
            .any(|(r, _)| r == "AccountingNotFound"),
        "no AccountingNotFound Event"
    );
    let conf = configs.get("slurm-config").await?.data.unwrap_or_default()["slurm.conf"].clone();
    ensure!(
        conf.contains("AccountingStorageHost=slurm-accounting\nAccountingStoragePort=6819\n"),
        "slurmctld keeps its records for the default address meanwhile: {conf}"
    );

    apply_file(&c, &ns, "accounting.yaml", |_| {}).await?;
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), &ns);
    let ready = eventually(60, || async {
        let sts = child(&c, &ns, ChildKind::StatefulSet, KEY).await?;
        child(&c, &ns, ChildKind::Service, KEY).await?;
        let secret = secrets.get_opt(KEY).await.ok()??;
        let ready = condition_of::<Accounting>(&c, &ns, "slurm", conditions::READY).await?;
        let hash =
            sts["spec"]["template"]["metadata"]["annotations"]["slinky.slurm.net/slurmdbd-conf-hash"].clone();
        (ready["status"] == "True" && hash == json!(slinky_api::contract::secret_hash(&secret)))
            .then_some((sts, secret))
    })
    .await
    .context(
        "the children, Ready=True and the stored conf's hash on slurmdbd's template did not all appear",
    )?;
    let (sts, secret) = ready;
    let conf = stored_conf(&secret);
    ensure!(
        conf.contains("\nStoragePass=change-me-example-only\n") && !conf.contains("secretKeyRef"),
        "the host writes the password in place of the placeholder: {conf}"
    );
    let owner = secret.metadata.owner_references.clone().unwrap_or_default();
    ensure!(owner.len() == 1 && owner[0].kind == "Accounting", "{owner:?}");
    let gone = eventually(60, || async {
        condition_of::<Controller>(&c, &ns, "slurm", conditions::REFERENCE_NOT_FOUND)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    ensure!(
        gone.is_some(),
        "AccountingNotFound stayed once the Accounting exists"
    );

    settled_without_writes(&host).await?;

    // A new password: slurmdbd.conf follows (within a Secret poll), and its new hash rolls slurmdbd.
    secrets
        .patch(
            "mariadb-password",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "s3cond#pass"}})),
        )
        .await?;
    let old_hash =
        sts["spec"]["template"]["metadata"]["annotations"]["slinky.slurm.net/slurmdbd-conf-hash"].clone();
    let rolled = eventually(90, || async {
        let secret = secrets.get(KEY).await.ok()?;
        let sts = child(&c, &ns, ChildKind::StatefulSet, KEY).await?;
        let hash = &sts["spec"]["template"]["metadata"]["annotations"]["slinky.slurm.net/slurmdbd-conf-hash"];
        (stored_conf(&secret).contains("\nStoragePass=s3cond\\#pass\n") && *hash != old_hash).then_some(())
    })
    .await;
    ensure!(
        rolled.is_some(),
        "a new password did not reach slurmdbd.conf and slurmdbd's template"
    );

    // A password with a line break would add lines to slurmdbd.conf: refused, nothing written.
    secrets
        .patch(
            "mariadb-password",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "x\nStorageHost=evil"}})),
        )
        .await?;
    let refused = eventually(90, || async {
        let cond = condition_of::<Accounting>(&c, &ns, "slurm", conditions::INVALID_SPEC).await?;
        (cond["status"] == "True").then_some(cond)
    })
    .await
    .context("no InvalidSpec for a password with a line break")?;
    ensure!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("line break")),
        "{refused}"
    );
    ensure!(
        !stored_conf(&secrets.get(KEY).await?).contains("evil"),
        "the injected line reached slurmdbd.conf"
    );
    host.stop().await;
    Ok(())
}
