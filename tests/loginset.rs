//! The LoginSet kind (login nodes): its Deployment, Service and `sshd_config` ConfigMap field by
//! field against Slinky's `BuildLogin`/`BuildLoginService`/`BuildLoginSshConfig` (through the
//! bundled 0.3.0 plugin and the host's output policy, as `render` builds them), and end to end on
//! the embedded API server (or the cluster of `SLINKY_TEST_KUBECONFIG`): the host keys Secret made
//! once by the host, the children applied and owned, a steady state without writes, `sssd.conf`
//! waited for and followed, a foreign Secret left alone.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use slinky_api::{LoginSet, SSH_HOST_KEY_FILES, conditions};
use slinky_host::{cmd::render::Parent, plugins::ChildKind};
use slinky_tests::{
    eventually, example,
    host::{Host, apply, apply_file, child, cluster, condition_of, events, settled_without_writes},
};

const NAME: &str = "slurm-login-slinky";

/// The children `render` builds for the example cluster and its LoginSet (edited by `edit`), by
/// `Kind/name`.
fn build(edit: impl Fn(&mut Parent)) -> Result<BTreeMap<String, Value>> {
    let files = [example("slurm-cluster.yaml"), example("loginset.yaml")];
    let mut all = slinky_tests::render_children(&files, |p| {
        edit(p);
        if let Parent::LoginSet(l) = p {
            l.metadata.uid = Some("uid-login".into());
        }
    })?;
    all.retain(|_, v| {
        v["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(NAME))
    });
    Ok(all)
}

fn get<'a>(objects: &'a BTreeMap<String, Value>, key: &str) -> Result<&'a Value> {
    objects
        .get(key)
        .with_context(|| format!("{key} not built: {:?}", objects.keys()))
}

#[test]
fn the_login_deployment_service_and_ssh_config_match_slinky_field_by_field() -> Result<()> {
    let objects = build(|_| {})?;
    assert_eq!(
        objects.keys().collect::<Vec<_>>(),
        [
            "ConfigMap/slurm-login-slinky-ssh-config",
            "Deployment/slurm-login-slinky",
            "Service/slurm-login-slinky"
        ]
    );
    let selector = json!({"app.kubernetes.io/name": "login", "app.kubernetes.io/instance": NAME});
    let labels = json!({"app.kubernetes.io/name": "login", "app.kubernetes.io/instance": NAME,
        "app.kubernetes.io/component": "login", "app.kubernetes.io/part-of": "slurm"});
    let owner = json!([{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "LoginSet", "name": NAME,
        "uid": "uid-login", "controller": true, "blockOwnerDeletion": true}]);

    let d = get(&objects, &format!("Deployment/{NAME}"))?;
    assert_eq!(d["metadata"]["labels"], labels);
    assert_eq!(d["metadata"]["ownerReferences"], owner);
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["revisionHistoryLimit"], 0);
    assert_eq!(d["spec"]["selector"], json!({"matchLabels": selector}));
    let template = &d["spec"]["template"];
    assert_eq!(template["metadata"]["labels"], labels);
    let annotations = &template["metadata"]["annotations"];
    assert_eq!(annotations["kubectl.kubernetes.io/default-container"], "login");
    for hash in ["ssh-host-keys-hash", "sshd-conf-hash", "sssd-conf-hash"] {
        ensure!(
            annotations.get(format!("slinky.slurm.net/{hash}")).is_some(),
            "no {hash}: {annotations}"
        );
    }
    ensure!(
        annotations["slinky.slurm.net/sssd-conf-hash"]
            .as_str()
            .is_some_and(|h| h.len() == 64),
        "the sssd.conf of the input is hashed: {annotations}"
    );
    let pod = &template["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["enableServiceLinks"], false);
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(
        pod["dnsConfig"],
        json!({"searches": ["slurm-workers-slurm.slurm.svc.cluster.local"]})
    );
    let login = &pod["containers"][0];
    assert_eq!(login["name"], "login");
    assert_eq!(login["image"], "ghcr.io/slinkyproject/login:25.05-ubuntu24.04");
    assert_eq!(
        login["env"],
        json!([{"name": "SACKD_OPTIONS", "value": "--conf-server slurm-controller.slurm:6817"}])
    );
    assert_eq!(
        login["ports"],
        json!([{"name": "login", "containerPort": 22, "protocol": "TCP"}])
    );
    assert_eq!(
        login["readinessProbe"],
        json!({"exec": {"command": ["test", "-S", "/run/slurm/sack.socket"]}})
    );
    // The example's `privileged: false` is the default: left out, as Slinky leaves it out.
    assert_eq!(login["securityContext"], Value::Null);
    let mounts = login["volumeMounts"].as_array().context("mounts")?;
    let mount_paths: Vec<&str> = mounts.iter().filter_map(|m| m["mountPath"].as_str()).collect();
    assert_eq!(
        mount_paths,
        [
            "/etc/slurm",
            "/run/slurm",
            "/etc/ssh/ssh_host_rsa_key",
            "/etc/ssh/ssh_host_rsa_key.pub",
            "/etc/ssh/ssh_host_ed25519_key",
            "/etc/ssh/ssh_host_ed25519_key.pub",
            "/etc/ssh/ssh_host_ecdsa_key",
            "/etc/ssh/ssh_host_ecdsa_key.pub",
            "/etc/ssh/sshd_config",
            "/root/.ssh/authorized_keys",
            "/etc/sssd/sssd.conf"
        ]
    );
    assert_eq!(
        mounts[2],
        json!({"name": "ssh-host-keys", "mountPath": "/etc/ssh/ssh_host_rsa_key",
            "subPath": "ssh_host_rsa_key", "readOnly": true})
    );
    let initconf = &pod["initContainers"][0];
    assert_eq!(initconf["name"], "initconf");
    assert_eq!(initconf["image"], "docker.io/library/alpine:latest");
    assert_eq!(initconf["env"], json!([{"name": "SLURM_USER", "value": "slurm"}]));
    assert_eq!(
        initconf["volumeMounts"],
        json!([{"name": "slurm-etc", "mountPath": "/mnt/etc/slurm"},
               {"name": "slurm-config", "mountPath": "/mnt/slurm", "readOnly": true}])
    );
    let volumes: BTreeMap<&str, &Value> = pod["volumes"]
        .as_array()
        .context("volumes")?
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v)))
        .collect();
    assert_eq!(
        volumes.keys().copied().collect::<Vec<_>>(),
        [
            "sackd-dir",
            "slurm-config",
            "slurm-etc",
            "ssh-config",
            "ssh-host-keys",
            "sssd-conf"
        ]
    );
    assert_eq!(volumes["slurm-etc"]["emptyDir"], json!({"medium": "Memory"}));
    assert_eq!(
        volumes["slurm-config"]["projected"],
        json!({"defaultMode": 384, "sources": [{"secret": {"name": "slurm-auth-slurm",
            "items": [{"key": "slurm.key", "path": "slurm.key"}]}}]})
    );
    let host_keys = &volumes["ssh-host-keys"]["projected"]["sources"][0]["secret"];
    assert_eq!(host_keys["name"], "slurm-login-slinky-ssh-host-keys");
    assert_eq!(
        host_keys["items"][1],
        json!({"key": "ssh_host_rsa_key.pub", "path": "ssh_host_rsa_key.pub", "mode": 420})
    );
    assert_eq!(
        volumes["sssd-conf"]["projected"]["sources"][0]["secret"],
        json!({"name": "slurm-sssd-conf", "items": [{"key": "sssd.conf", "path": "sssd.conf", "mode": 384}]})
    );

    let s = get(&objects, &format!("Service/{NAME}"))?;
    assert_eq!(s["metadata"]["labels"], labels);
    assert_eq!(s["metadata"]["ownerReferences"], owner);
    assert_eq!(s["spec"]["selector"], selector);
    assert_eq!(
        s["spec"]["ports"],
        json!([{"name": "login", "port": 22, "targetPort": "login", "protocol": "TCP"}])
    );

    let cm = get(&objects, &format!("ConfigMap/{NAME}-ssh-config"))?;
    assert_eq!(cm["immutable"], false);
    assert_eq!(
        cm["data"]["authorized_keys"],
        "#\n### SLINKY ###\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOFZqZQ9k8r1gV1b7y0m3w2ExampleExampleExample admin@example\n\n"
    );
    ensure!(
        cm["data"]["sshd_config"]
            .as_str()
            .is_some_and(|t| t.contains("UsePAM yes\nX11Forwarding yes\nSubsystem sftp internal-sftp\n")),
        "{}",
        cm["data"]["sshd_config"]
    );
    Ok(())
}

/// A LoginSet without `sssdConfRef` is refused naming the field; a user's `login` port moves
/// sshd and the Service's target follows the port name.
#[test]
fn an_invalid_loginset_is_refused_and_ports_follow_the_user() -> Result<()> {
    let e = build(|p| {
        if let Parent::LoginSet(l) = p {
            l.spec.sssd_conf_ref = Default::default();
        }
    })
    .err()
    .context("a LoginSet without sssdConfRef was built")?;
    ensure!(
        format!("{e:#}").contains("spec.sssdConfRef: Required value"),
        "{e:#}"
    );
    let objects = build(|p| {
        if let Parent::LoginSet(l) = p {
            l.spec.login.0["ports"] = json!([{"name": "login", "containerPort": 2222}]);
            l.spec.service.port = Some(2022);
            l.spec.replicas = Some(2);
        }
    })?;
    let d = get(&objects, &format!("Deployment/{NAME}"))?;
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["ports"],
        json!([{"name": "login", "containerPort": 2222, "protocol": "TCP"}])
    );
    let s = get(&objects, &format!("Service/{NAME}"))?;
    assert_eq!(s["spec"]["ports"][0]["port"], 2022);
    assert_eq!(s["spec"]["ports"][0]["targetPort"], "login");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_loginset_gets_host_keys_once_and_its_children_and_follows_sssd() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("loginset").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 0.into();
        }
    })
    .await?;
    // The LoginSet first, its sssd.conf Secret later: it waits for it.
    apply_file(&c, &ns, "loginset.yaml", |v| {
        if v["kind"] == "Secret" {
            v["metadata"]["name"] = "not-yet".into();
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let waiting = eventually(60, || async {
        let cond = condition_of::<LoginSet>(&c, &ns, NAME, conditions::REFERENCE_NOT_FOUND).await?;
        (cond["status"] == "True").then_some(cond)
    })
    .await
    .context("no ReferenceNotFound while sssd.conf's Secret is missing")?;
    ensure!(
        waiting["reason"] == "SecretNotFound"
            && waiting["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("Secret {ns}/slurm-sssd-conf (spec.sssdConfRef)"))),
        "{waiting}"
    );
    ensure!(
        child(&c, &ns, ChildKind::Deployment, NAME).await.is_none(),
        "the login pods were built without their sssd.conf"
    );
    ensure!(
        events(&c, &ns, NAME)
            .await?
            .iter()
            .any(|(r, _)| r == "SecretNotFound"),
        "no Event names the missing Secret"
    );

    apply_file(&c, &ns, "loginset.yaml", |_| {}).await?;
    let ready = eventually(60, || async {
        let d = child(&c, &ns, ChildKind::Deployment, NAME).await?;
        child(&c, &ns, ChildKind::Service, NAME).await?;
        child(&c, &ns, ChildKind::ConfigMap, &format!("{NAME}-ssh-config")).await?;
        let ready = condition_of::<LoginSet>(&c, &ns, NAME, conditions::READY).await?;
        (ready["status"] == "True").then_some(d)
    })
    .await
    .context("the children and Ready=True did not all appear")?;
    ensure!(
        condition_of::<LoginSet>(&c, &ns, NAME, conditions::REFERENCE_NOT_FOUND)
            .await
            .is_none(),
        "ReferenceNotFound stayed"
    );
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), &ns);
    let keys = secrets.get(&format!("{NAME}-ssh-host-keys")).await?;
    let data = keys.data.clone().unwrap_or_default();
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        SSH_HOST_KEY_FILES,
        "every file the login pods mount"
    );
    assert_eq!(keys.immutable, Some(true));
    let owner = keys.metadata.owner_references.clone().unwrap_or_default();
    ensure!(
        owner.len() == 1 && owner[0].kind == "LoginSet" && owner[0].controller == Some(true),
        "{owner:?}"
    );
    let private = String::from_utf8_lossy(&data["ssh_host_ed25519_key"].0).into_owned();
    ensure!(private.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
    let template_hash = |d: &Value, key: &str| {
        d["spec"]["template"]["metadata"]["annotations"][format!("slinky.slurm.net/{key}")].clone()
    };
    assert_eq!(
        template_hash(&ready, "ssh-host-keys-hash"),
        json!(slinky_api::contract::secret_hash(&keys)),
        "the pods carry the hash of the keys they mount"
    );
    let status = Api::<LoginSet>::namespaced(c.client.clone(), &ns)
        .get(NAME)
        .await?
        .status;
    assert_eq!(
        status.map(|s| s.selector),
        Some(format!(
            "app.kubernetes.io/instance={NAME},app.kubernetes.io/name=login"
        ))
    );

    settled_without_writes(&host).await?;
    let uid = keys.metadata.uid.clone();
    ensure!(
        secrets.get(&format!("{NAME}-ssh-host-keys")).await?.metadata.uid == uid,
        "the host keys were made again"
    );

    // A new sssd.conf rolls the login pods (its hash is on their template).
    let before = template_hash(&ready, "sssd-conf-hash");
    secrets
        .patch(
            "slurm-sssd-conf",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"sssd.conf": "[sssd]\nservices = nss\n"}})),
        )
        .await?;
    let rolled = eventually(60, || async {
        let d = child(&c, &ns, ChildKind::Deployment, NAME).await?;
        (template_hash(&d, "sssd-conf-hash") != before).then_some(())
    })
    .await;
    ensure!(rolled.is_some(), "a new sssd.conf did not reach the pod template");

    // A LoginSet whose host keys Secret is someone else's: left alone, and said so.
    apply(
        &c,
        &ns,
        &json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "other-ssh-host-keys", "namespace": ns},
            "stringData": {"ssh_host_rsa_key": "theirs"}}),
    )
    .await?;
    apply_file(&c, &ns, "loginset.yaml", |v| {
        if v["kind"] == "LoginSet" {
            v["metadata"]["name"] = "other".into();
        }
    })
    .await?;
    let refused = eventually(60, || async {
        let cond = condition_of::<LoginSet>(&c, &ns, "other", conditions::CHILD_FAILURE).await?;
        (cond["status"] == "True" && cond["reason"] == "NotOwned").then_some(cond)
    })
    .await
    .context("no NotOwned for a foreign host keys Secret")?;
    ensure!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("Secret other-ssh-host-keys exists and is not this LoginSet's")),
        "{refused}"
    );
    let theirs = secrets.get("other-ssh-host-keys").await?;
    ensure!(
        theirs.data.unwrap_or_default().len() == 1,
        "the foreign Secret was changed"
    );
    ensure!(
        child(&c, &ns, ChildKind::Deployment, "other").await.is_none(),
        "login pods were built with someone else's host keys"
    );
    secrets
        .delete("other-ssh-host-keys", &DeleteParams::default())
        .await?;
    let made = eventually(60, || async {
        child(&c, &ns, ChildKind::Deployment, "other").await?;
        let s = secrets.get("other-ssh-host-keys").await.ok()?;
        (s.data.unwrap_or_default().len() == 6).then_some(())
    })
    .await;
    ensure!(
        made.is_some(),
        "the host did not make the keys once the foreign Secret was gone"
    );
    host.stop().await;
    Ok(())
}
