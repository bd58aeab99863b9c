//! Golden tests: every object the bundled children builders make for `examples/slurm-cluster.yaml`
//! and `examples/hpc-cluster.yaml` (HA, an accounting reference, metrics, extra configuration,
//! ConfigMap references, two NodeSets with partitions and SSH), field by field against the Slinky
//! facts (`shared/spec/slinky.md` sections 2 and 3), `slurm.conf` line by line; through the real
//! plugins and the host's output policy, as the reconciler builds them.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::ByteString;
use serde_json::{Value, json};
use slinky_api::keys;
use slinky_host::cmd::render::{self, Parent};
use slinky_tests::example;

/// Every child of the example `file`, its parents given UIDs `uid-<name>` (so owner references are
/// set as on a cluster), edited by `edit` first; by `Kind/name`.
fn build(file: &str, edit: impl Fn(&mut Parent)) -> Result<BTreeMap<String, Value>> {
    slinky_tests::render_children(&[example(file)], edit)
}

fn get<'a>(objects: &'a BTreeMap<String, Value>, key: &str) -> Result<&'a Value> {
    objects
        .get(key)
        .with_context(|| format!("no {key} among {:?}", objects.keys().collect::<Vec<_>>()))
}

/// sha256 (hex) of the values of the example's Secret `name`, in key order: Slinky's key hash.
fn secret_hash(file: &str, name: &str) -> Result<String> {
    let references = render::read_references(&[example(file)])?;
    let secret = references
        .secrets
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .with_context(|| format!("no Secret {name}"))?;
    let data = secret.data.clone().unwrap_or_default();
    let bytes: Vec<u8> = data.values().flat_map(|ByteString(v)| v.clone()).collect();
    Ok(slinky_guest_sdk::helpers::sha256_hex(&bytes))
}

/// The controller owner reference the host sets on a Controller's children.
fn controller_owner(name: &str) -> Value {
    json!([{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller", "name": name,
        "uid": format!("uid-{name}"), "controller": true, "blockOwnerDeletion": true}])
}

fn builder_annotations(o: &Value, plugin: &str) -> Result<()> {
    let a = &o["metadata"]["annotations"];
    ensure!(
        a[keys::ANNOTATION_BUILDER].as_str() == Some(&format!("{plugin}@0.1.0")),
        "{a}"
    );
    ensure!(
        a[keys::ANNOTATION_BUILDER_DIGEST]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:") && d.len() == 71),
        "{a}"
    );
    Ok(())
}

/// The lines of `slurm.conf` for the example cluster, in Slinky's order.
const SLURM_CONF: &[&str] = &[
    "#",
    "### GENERAL ###",
    "ClusterName=slurm",
    "SlurmUser=slurm",
    "SlurmctldHost=slurm-controller-0(slurm-controller-0.slurm-controller-internal.slurm)",
    "SlurmctldPort=6817",
    "SlurmctldAddr=slurm-controller.slurm",
    "StateSaveLocation=/var/spool/slurmctld/slurm",
    "SlurmdUser=root",
    "SlurmdPort=6818",
    "SlurmdSpoolDir=/var/spool/slurmd",
    "MaxNodeCount=1024",
    "#",
    "### LOGGING ###",
    "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
    "SlurmSchedLogFile=/var/log/slurm/slurmctld.log",
    "SlurmdLogFile=/var/log/slurm/slurmd.log",
    "#",
    "### PLUGINS & PARAMETERS ###",
    "AuthType=auth/slurm",
    "CredType=cred/slurm",
    "AuthAltTypes=auth/jwt",
    "AuthAltParameters=jwt_key=/etc/slurm/jwt.key",
    "AuthInfo=use_client_ids",
    "SlurmctldParameters=enable_configless,reconfig_on_restart",
    "#",
    "### ACCOUNTING ###",
    "AccountingStorageType=accounting_storage/none",
    "#",
    "### NODESET & PARTITION ###",
    "NodeSet=slinky Feature=slinky",
    "PartitionName=slinky Nodes=slinky State=UP MaxTime=INFINITE",
    "",
];

/// The lines of `slurm.conf` for the HA cluster.
const HPC_SLURM_CONF: &[&str] = &[
    "#",
    "### GENERAL ###",
    "ClusterName=hpc",
    "SlurmUser=slurm",
    "SlurmctldHost=hpc-controller-0(hpc-controller-0.hpc-controller-internal.hpc)",
    "SlurmctldHost=hpc-controller-1(hpc-controller-1.hpc-controller-internal.hpc)",
    "SlurmctldPort=6817",
    "SlurmctldAddr=hpc-controller.hpc",
    "StateSaveLocation=/var/spool/slurmctld/hpc",
    "SlurmdUser=root",
    "SlurmdPort=6818",
    "SlurmdSpoolDir=/var/spool/slurmd",
    "MaxNodeCount=1024",
    "#",
    "### LOGGING ###",
    "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
    "SlurmSchedLogFile=/var/log/slurm/slurmctld.log",
    "SlurmdLogFile=/var/log/slurm/slurmd.log",
    "#",
    "### PLUGINS & PARAMETERS ###",
    "AuthType=auth/slurm",
    "CredType=cred/slurm",
    "AuthAltTypes=auth/jwt",
    "AuthAltParameters=jwt_key=/etc/slurm/jwt.key",
    "AuthInfo=use_client_ids",
    "SlurmctldParameters=enable_configless,reconfig_on_restart",
    "MetricsType=metrics/openmetrics",
    "#",
    "### ACCOUNTING ###",
    "AccountingStorageType=accounting_storage/slurmdbd",
    "AccountingStorageHost=hpc-accounting",
    "AccountingStoragePort=6819",
    "#",
    "### PROLOG & EPILOG ###",
    "Prolog=00-prolog.sh",
    "#",
    "### NODESET & PARTITION ###",
    "NodeSet=cpu Feature=cpu",
    "PartitionName=cpu Nodes=cpu Default=YES MaxTime=UNLIMITED State=UP",
    "NodeSet=gpu Feature=gpu",
    "PartitionName=gpu Nodes=gpu MaxTime=24:00:00 State=UP",
    "#",
    "### EXTRA CONFIG ###",
    "SchedulerParameters=bf_continue",
    "SlurmctldParameters=enable_stepmgr",
    "PrologFlags=Contain",
    "",
    "#",
    "### MERGED CONFIG ###",
    "SlurmctldParameters=enable_configless,enable_stepmgr,reconfig_on_restart",
    "",
];

fn assert_lines(text: &str, want: &[&str]) {
    let have: Vec<&str> = text.split('\n').collect();
    for (i, (h, w)) in have.iter().zip(want).enumerate() {
        assert_eq!(h, w, "line {} of\n{text}", i + 1);
    }
    assert_eq!(have.len(), want.len(), "line count of\n{text}");
}

#[test]
fn the_example_clusters_objects_match_slinky_field_by_field() -> Result<()> {
    let objects = build("slurm-cluster.yaml", |_| {})?;
    let names: Vec<&String> = objects.keys().collect();
    assert_eq!(
        names,
        [
            "ConfigMap/slurm-config",
            "Pod/slurm-worker-slinky-0",
            "Pod/slurm-worker-slinky-1",
            "Pod/slurm-worker-slinky-2",
            "PodDisruptionBudget/slurm-workers-pdb-slurm",
            "Service/slurm-controller",
            "Service/slurm-controller-internal",
            "Service/slurm-workers-slurm",
            "StatefulSet/slurm-controller",
        ]
    );
    let controller_labels = json!({"app.kubernetes.io/component": "controller", "app.kubernetes.io/instance": "slurm",
        "app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/part-of": "slurm"});
    let selector = json!({"app.kubernetes.io/instance": "slurm", "app.kubernetes.io/name": "slurmctld"});

    // The ConfigMap: slurm.conf line by line, cgroup.conf, the Controller's labels.
    let cm = get(&objects, "ConfigMap/slurm-config")?;
    assert_eq!(cm["metadata"]["namespace"], "slurm");
    assert_eq!(cm["metadata"]["labels"], controller_labels);
    assert_eq!(cm["metadata"]["ownerReferences"], controller_owner("slurm"));
    builder_annotations(cm, "controller-children")?;
    assert_eq!(cm["immutable"], false);
    let data = cm["data"].as_object().context("data")?;
    assert_eq!(data.keys().collect::<Vec<_>>(), ["cgroup.conf", "slurm.conf"]);
    assert_lines(data["slurm.conf"].as_str().unwrap_or_default(), SLURM_CONF);
    assert_eq!(data["cgroup.conf"], "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n");

    // The internal Service: headless, every slurmctld pod (no active label), port 6817.
    let internal = get(&objects, "Service/slurm-controller-internal")?;
    assert_eq!(internal["metadata"]["labels"], controller_labels);
    assert_eq!(internal["metadata"]["ownerReferences"], controller_owner("slurm"));
    assert_eq!(
        internal["spec"],
        json!({"clusterIP": "None", "publishNotReadyAddresses": true, "selector": selector,
            "ports": [{"name": "slurmctld", "port": 6817, "protocol": "TCP", "targetPort": "slurmctld"}]})
    );

    // The StatefulSet.
    let sts = get(&objects, "StatefulSet/slurm-controller")?;
    assert_eq!(sts["metadata"]["labels"], controller_labels);
    assert_eq!(sts["metadata"]["ownerReferences"], controller_owner("slurm"));
    builder_annotations(sts, "controller-children")?;
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["revisionHistoryLimit"], 0);
    assert_eq!(spec["selector"], json!({"matchLabels": selector}));
    assert_eq!(spec["serviceName"], "slurm-controller-internal");
    assert_eq!(
        spec["volumeClaimTemplates"],
        json!([{"metadata": {"name": "statesave", "namespace": "slurm"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "4Gi"}}}}]),
        "persistence on, no existing claim: a volume claim template (ReadWriteOnce unless set, as \
         Slinky's chart sets it: the API server refuses a claim without an access mode)"
    );
    let template = &spec["template"];
    assert_eq!(template["metadata"]["labels"], controller_labels);
    let ann = &template["metadata"]["annotations"];
    assert_eq!(ann["kubectl.kubernetes.io/default-container"], "slurmctld");
    assert_eq!(
        ann[keys::ANNOTATION_SLURM_KEY_HASH].as_str(),
        Some(secret_hash("slurm-cluster.yaml", "slurm-auth-slurm")?.as_str())
    );
    assert_eq!(
        ann[keys::ANNOTATION_JWT_KEY_HASH].as_str(),
        Some(secret_hash("slurm-cluster.yaml", "slurm-auth-jwths256")?.as_str())
    );
    let config_hash = slinky_guest_sdk::helpers::sha256_hex(
        format!(
            "{}{}",
            data["cgroup.conf"].as_str().unwrap_or_default(),
            data["slurm.conf"].as_str().unwrap_or_default()
        )
        .as_bytes(),
    );
    assert_eq!(
        ann[keys::ANNOTATION_SLURM_CONFIG_HASH].as_str(),
        Some(config_hash.as_str()),
        "the ConfigMap's values in key order"
    );
    // Provenance is the StatefulSet's, not its template's: a new builder of the same template
    // restarts no slurmctld.
    ensure!(
        template["metadata"]["annotations"]
            .get(keys::ANNOTATION_BUILDER)
            .is_none()
            && template["metadata"]["annotations"]
                .get(keys::ANNOTATION_BUILDER_DIGEST)
                .is_none(),
        "{}",
        template["metadata"]["annotations"]
    );
    let pod = &template["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401, "fsGroup": 401})
    );
    assert_eq!(
        pod["affinity"],
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"}]}})
    );
    let containers = pod["containers"].as_array().context("containers")?;
    assert_eq!(containers.len(), 1);
    let ctld = &containers[0];
    assert_eq!(ctld["name"], "slurmctld");
    assert_eq!(ctld["image"], "ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04");
    assert_eq!(
        ctld["ports"],
        json!([{"name": "slurmctld", "containerPort": 6817, "protocol": "TCP"}])
    );
    let probe = |path: &str, six: bool| {
        let mut p = json!({"httpGet": {"path": path, "port": "slurmctld"}});
        if six {
            p["failureThreshold"] = 6.into();
            p["periodSeconds"] = 10.into();
        }
        p
    };
    assert_eq!(ctld["startupProbe"], probe("/livez", true));
    assert_eq!(ctld["livenessProbe"], probe("/livez", true));
    assert_eq!(ctld["readinessProbe"], probe("/readyz", false));
    assert_eq!(
        ctld["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401})
    );
    assert_eq!(
        ctld["volumeMounts"],
        json!([{"name": "slurm-etc", "mountPath": "/etc/slurm", "readOnly": true},
            {"name": "run", "mountPath": "/run"},
            {"name": "statesave", "mountPath": "/var/spool/slurmctld/slurm"},
            {"name": "slurm-authsocket", "mountPath": "/run/slurmctld"},
            {"name": "slurm-logfile", "mountPath": "/var/log/slurm"}])
    );
    assert_eq!(
        ctld["resources"],
        json!({"requests": {"cpu": "1", "memory": "1Gi"}})
    );
    let init = pod["initContainers"].as_array().context("initContainers")?;
    assert_eq!(
        init.len(),
        1,
        "no reconfigure sidecar without in-place reconfigure"
    );
    assert_eq!(init[0]["name"], "logfile");
    assert_eq!(init[0]["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(
        init[0]["env"],
        json!([{"name": "SOCKET", "value": "/var/log/slurm/slurmctld.log"}])
    );
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "slurm-etc", "projected": {"defaultMode": 0o610, "sources": [
                {"configMap": {"name": "slurm-config"}},
                {"secret": {"name": "slurm-auth-slurm", "items": [{"key": "slurm.key", "path": "slurm.key"}]}},
                {"secret": {"name": "slurm-auth-jwths256", "items": [{"key": "jwt_hs256.key", "path": "jwt.key"}]}},
            ]}},
            {"name": "slurm-logfile", "emptyDir": {"medium": "Memory"}},
            {"name": "run", "emptyDir": {"medium": "Memory"}},
            {"name": "slurm-authsocket", "emptyDir": {}},
        ])
    );

    // The workers' Service and PodDisruptionBudget: shared, plain owners, no labels.
    let nodeset_owner = json!([{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "name": "slurm-worker-slinky", "uid": "uid-slurm-worker-slinky", "blockOwnerDeletion": true}]);
    let workers = get(&objects, "Service/slurm-workers-slurm")?;
    assert_eq!(workers["metadata"]["ownerReferences"], nodeset_owner);
    assert!(workers["metadata"].get("labels").is_none(), "it has no labels");
    builder_annotations(workers, "nodeset-children")?;
    assert_eq!(
        workers["spec"],
        json!({"clusterIP": "None", "publishNotReadyAddresses": true,
            "selector": {"app.kubernetes.io/name": "slurmd", "slinky.slurm.net/cluster": "slurm"},
            "ports": [{"name": "slurmd", "port": 6818, "protocol": "TCP", "targetPort": "slurmd"}]})
    );
    let pdb = get(&objects, "PodDisruptionBudget/slurm-workers-pdb-slurm")?;
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["metadata"]["ownerReferences"], nodeset_owner);
    assert_eq!(
        pdb["spec"],
        json!({"maxUnavailable": 0, "selector": {"matchLabels": {
            "nodeset.slinky.slurm.net/pod-protect": "true", "slinky.slurm.net/cluster": "slurm"}}})
    );
    // The workers find slurmctld through the Controller's Service, in the Service's subdomain.
    let worker = get(&objects, "Pod/slurm-worker-slinky-0")?;
    assert_eq!(worker["spec"]["subdomain"], "slurm-workers-slurm");
    Ok(())
}

#[test]
fn persistence_off_saves_the_state_in_an_empty_dir() -> Result<()> {
    let objects = build("slurm-cluster.yaml", |p| {
        if let Parent::Controller(c) = p {
            c.spec.persistence = Some(slinky_api::Persistence {
                enabled: Some(false),
                ..Default::default()
            });
        }
    })?;
    let sts = get(&objects, "StatefulSet/slurm-controller")?;
    assert!(sts["spec"].get("volumeClaimTemplates").is_none());
    let volumes = sts["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .context("volumes")?;
    assert_eq!(
        volumes.iter().find(|v| v["name"] == "statesave"),
        Some(&json!({"name": "statesave", "emptyDir": {}}))
    );
    Ok(())
}

#[test]
fn a_claim_template_without_a_size_is_an_invalid_spec_naming_the_field() -> Result<()> {
    let out = build("slurm-cluster.yaml", |p| {
        if let Parent::Controller(c) = p {
            c.spec.persistence = Some(slinky_api::Persistence {
                enabled: Some(true),
                ..Default::default()
            });
        }
    });
    let Err(e) = out else {
        anyhow::bail!("a volume claim template without a storage request was built");
    };
    let text = format!("{e:#}");
    ensure!(
        text.contains("spec.persistence.resources.requests.storage: Required value"),
        "{text}"
    );
    Ok(())
}

/// The HA example's metrics with a 25.05 slurmctld image: slurmctld 25.05 refuses
/// `MetricsType` and never starts (`tests/slurm.rs` shows it on the real build), so the builder
/// refuses the Controller with a message naming the field, the image and the fix.
#[test]
fn metrics_with_a_slurmctld_older_than_25_11_are_an_invalid_spec() -> Result<()> {
    let old = "ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04";
    let out = build("hpc-cluster.yaml", |p| {
        if let Parent::Controller(c) = p {
            c.spec.slurmctld.0["image"] = old.into();
        }
    });
    let Err(e) = out else {
        anyhow::bail!("metrics with a 25.05 slurmctld were built");
    };
    let text = format!("{e:#}");
    for part in [
        "spec.metrics.enabled needs Slurm 25.11",
        old,
        "set spec.metrics.enabled to false",
    ] {
        ensure!(text.contains(part), "{part:?} not in {text}");
    }
    Ok(())
}

#[test]
fn in_place_reconfigure_adds_the_sidecar_and_leaves_the_config_hash_out() -> Result<()> {
    let objects = build("slurm-cluster.yaml", |p| {
        if let Parent::Controller(c) = p {
            c.spec.inplace_reconfigure = true;
            c.spec.reconfigure = slinky_api::ContainerWrapper(json!({"image": "reconfigure:1"}));
        }
    })?;
    let template = &get(&objects, "StatefulSet/slurm-controller")?["spec"]["template"];
    assert!(
        template["metadata"]["annotations"]
            .get(keys::ANNOTATION_SLURM_CONFIG_HASH)
            .is_none()
    );
    assert!(
        template["metadata"]["annotations"]
            .get(keys::ANNOTATION_SLURM_KEY_HASH)
            .is_some()
    );
    let init: Vec<&str> = template["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(init, ["reconfigure", "logfile"], "reconfigure first");
    let reconfigure = &template["spec"]["initContainers"][0];
    assert_eq!(reconfigure["restartPolicy"], "Always");
    assert_eq!(reconfigure["command"][0], "tini");
    assert!(
        reconfigure["command"][5]
            .as_str()
            .is_some_and(|s| s.contains("scontrol reconfigure")),
        "{reconfigure}"
    );
    Ok(())
}

#[test]
fn the_ha_clusters_objects_match_slinky_field_by_field() -> Result<()> {
    let objects = build("hpc-cluster.yaml", |_| {})?;
    let names: Vec<&String> = objects.keys().filter(|k| !k.starts_with("Pod/")).collect();
    assert_eq!(
        names,
        [
            "ConfigMap/hpc-config",
            "ConfigMap/hpc-worker-cpu-ssh-config",
            "PodDisruptionBudget/slurm-workers-pdb-hpc",
            "Secret/hpc-accounting",
            "Service/hpc-accounting",
            "Service/hpc-controller",
            "Service/hpc-controller-internal",
            "Service/slurm-workers-hpc",
            "StatefulSet/hpc-accounting",
            "StatefulSet/hpc-controller",
        ]
    );
    let cm = get(&objects, "ConfigMap/hpc-config")?;
    let data = cm["data"].as_object().context("data")?;
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["slurm.conf"],
        "cgroup.conf comes from a configFileRef"
    );
    assert_lines(data["slurm.conf"].as_str().unwrap_or_default(), HPC_SLURM_CONF);

    // The Service selects the active slurmctld (HA).
    let svc = get(&objects, "Service/hpc-controller")?;
    assert_eq!(
        svc["spec"]["selector"],
        json!({"app.kubernetes.io/instance": "hpc", "app.kubernetes.io/name": "slurmctld",
            "controller.slinky.slurm.net/active": "true"})
    );

    let sts = get(&objects, "StatefulSet/hpc-controller")?;
    assert_eq!(sts["spec"]["replicas"], 2, "a primary and one backup");
    assert!(sts["spec"].get("volumeClaimTemplates").is_none());
    let template = &sts["spec"]["template"];
    assert_eq!(
        template["metadata"]["annotations"]["example.com/owner"], "hpc-team",
        "the template's annotations"
    );
    assert!(sts["metadata"]["annotations"]["example.com/owner"] == "hpc-team");
    let pod = &template["spec"];
    let ctld = &pod["containers"][0];
    assert_eq!(
        ctld["readinessProbe"]["httpGet"]["path"], "/livez",
        "with replicas > 1 only the primary answers /readyz: readiness on /livez"
    );
    let volumes = pod["volumes"].as_array().context("volumes")?;
    assert_eq!(
        volumes.iter().find(|v| v["name"] == "statesave"),
        Some(&json!({"name": "statesave", "persistentVolumeClaim": {"claimName": "hpc-statesave"}}))
    );
    let sources: Vec<String> = volumes[0]["projected"]["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            s["configMap"]["name"]
                .as_str()
                .or(s["secret"]["name"].as_str())
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        sources,
        [
            "hpc-config",
            "hpc-slurm-key",
            "hpc-jwt-key",
            "hpc-cgroup",
            "hpc-prolog"
        ],
        "the extra ConfigMaps sorted by name after the keys"
    );

    // Two NodeSets share the workers' objects: both own them, sorted by name.
    let owners = |key: &str| -> Result<Vec<String>> {
        Ok(get(&objects, key)?["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                format!(
                    "{} controller={}",
                    o["name"].as_str().unwrap_or_default(),
                    o["controller"]
                )
            })
            .collect())
    };
    for key in [
        "Service/slurm-workers-hpc",
        "PodDisruptionBudget/slurm-workers-pdb-hpc",
    ] {
        assert_eq!(
            owners(key)?,
            ["hpc-worker-cpu controller=null", "hpc-worker-gpu controller=null"],
            "{key}"
        );
    }

    // SSH: the ConfigMap of the NodeSet that enables it.
    let ssh = get(&objects, "ConfigMap/hpc-worker-cpu-ssh-config")?;
    assert_eq!(
        ssh["metadata"]["labels"],
        json!({"app.kubernetes.io/component": "worker", "app.kubernetes.io/instance": "hpc-worker-cpu",
            "app.kubernetes.io/name": "slurmd", "slinky.slurm.net/cluster": "hpc"})
    );
    assert_eq!(
        ssh["metadata"]["ownerReferences"][0]["name"], "hpc-worker-cpu",
        "controlled by its NodeSet"
    );
    assert_eq!(ssh["metadata"]["ownerReferences"][0]["controller"], true);
    assert_lines(
        ssh["data"]["sshd_config"].as_str().unwrap_or_default(),
        &[
            "#",
            "### GENERAL ###",
            "Include /etc/ssh/sshd_config.d/*.conf",
            "UsePAM yes",
            "Subsystem sftp internal-sftp",
            "AuthenticationMethods publickey password",
            "#",
            "### EXTRA CONFIG ###",
            "PermitRootLogin no",
            "",
        ],
    );
    Ok(())
}

#[test]
fn an_external_controller_gets_only_its_minimal_configuration() -> Result<()> {
    let objects = build("slurm-cluster.yaml", |p| {
        if let Parent::Controller(c) = p {
            c.spec.external = true;
            c.spec.external_config = Some(slinky_api::ExternalConfig {
                host: "ctld.example.com".into(),
                port: 6817,
            });
        }
    })?;
    let controller_children: Vec<&String> = objects
        .keys()
        .filter(|k| k.contains("slurm-controller") || k.contains("slurm-config"))
        .collect();
    assert_eq!(controller_children, ["ConfigMap/slurm-config"]);
    assert_lines(
        get(&objects, "ConfigMap/slurm-config")?["data"]["slurm.conf"]
            .as_str()
            .unwrap_or_default(),
        &[
            "#",
            "### GENERAL ###",
            "ClusterName=slurm",
            "SlurmUser=slurm",
            "SlurmctldHost=ctld.example.com",
            "SlurmctldPort=6817",
            "#",
            "### PLUGINS & PARAMETERS ###",
            "AuthType=auth/slurm",
            "CredType=cred/slurm",
            "AuthAltTypes=auth/jwt",
            "#",
            "### ACCOUNTING ###",
            "AccountingStorageType=accounting_storage/none",
            "",
        ],
    );
    Ok(())
}

/// Everything of `v` a comparison with Slinky's object keeps: labels, annotations, owners and
/// `spec` (or `data`), without this host's provenance, a pod's revision label (each scheme its
/// own), empty maps and nulls (Go's `strategy: {}`, `resources: {}`), a template's name and
/// namespace (Slinky's `BuildPodTemplate` sets them; the API server ignores them) and the claim
/// retention policy the API server defaults to the same.
fn comparable(v: &Value) -> Value {
    fn prune(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.values_mut().for_each(prune);
                m.retain(|_, x| !(x.is_null() || x.as_object().is_some_and(|o| o.is_empty())));
            }
            Value::Array(items) => items.iter_mut().for_each(prune),
            _ => {}
        }
    }
    let mut meta = json!({
        "labels": v["metadata"]["labels"],
        "annotations": v["metadata"]["annotations"],
        "ownerReferences": v["metadata"]["ownerReferences"],
    });
    for key in [keys::ANNOTATION_BUILDER, keys::ANNOTATION_BUILDER_DIGEST] {
        meta["annotations"].as_object_mut().map(|a| a.remove(key));
    }
    if v["kind"] == "Pod" {
        meta["labels"]
            .as_object_mut()
            .map(|l| l.remove(keys::LABEL_REVISION_HASH));
    }
    let mut body = json!({"spec": v["spec"], "data": v["data"], "immutable": v["immutable"]});
    if let Some(t) = body["spec"]["template"]["metadata"].as_object_mut() {
        t.remove("name");
        t.remove("namespace");
        for key in [keys::ANNOTATION_BUILDER, keys::ANNOTATION_BUILDER_DIGEST] {
            t.get_mut("annotations")
                .and_then(Value::as_object_mut)
                .map(|a| a.remove(key));
        }
    }
    if body["spec"]["persistentVolumeClaimRetentionPolicy"]
        == json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    {
        body["spec"]["persistentVolumeClaimRetentionPolicy"] = Value::Null;
    }
    let mut out = json!({"metadata": meta, "body": body});
    prune(&mut out);
    out
}

/// The paths where `a` and `b` differ.
fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                differences(
                    &x.get(k).cloned().unwrap_or(Value::Null),
                    &y.get(k).cloned().unwrap_or(Value::Null),
                    &format!("{at}/{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, &format!("{at}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{at}: Slinky {a} | ours {b}")),
        _ => {}
    }
}

/// The bundled builders make what Slinky's builders make, both ways (nothing missing, nothing
/// added): every object of `tests/slinky-made` (derived from slurm-operator's source) against
/// the same object built here for the same custom resources. The adoption test
/// (`tests/revisions.rs`) shows the host takes them over; this shows they are the same objects.
#[test]
fn the_bundled_builders_make_exactly_what_slinkys_make() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut files = Vec::new();
    for (name, edits) in [
        (
            "slurm-cluster.yaml",
            vec![(
                "  persistence:\n    enabled: true\n",
                "  accountingRef:\n    name: slurm\n  persistence:\n    enabled: true\n    accessModes:\n    - ReadWriteOnce\n",
            )],
        ),
        ("restapi.yaml", vec![]),
        ("loginset.yaml", vec![]),
        (
            "accounting.yaml",
            vec![("slurmdbd:25.05-ubuntu24.04", "slurmdbd:26.05-ubuntu24.04")],
        ),
    ] {
        let mut text = std::fs::read_to_string(example(name))?;
        for (from, to) in edits {
            ensure!(text.contains(from), "{name} has no {from:?}");
            text = text.replace(from, to);
        }
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        files.push(path);
    }
    let uids: BTreeMap<&str, String> = slinky_tests::SLINKY_MADE_OWNERS
        .iter()
        .map(|(placeholder, _, name)| (*placeholder, format!("uid-{name}")))
        .collect();
    let slinky = slinky_tests::slinky_made("slurm", &uids)?;
    // The Secrets Slinky made are inputs here as on a cluster: the host keys (the login
    // template hashes them) and slurmdbd.conf as stored (the slurmdbd template hashes it).
    for secret in slinky.iter().filter(|d| d["kind"] == "Secret") {
        let name = secret["metadata"]["name"].as_str().unwrap_or_default();
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, serde_json::to_string(secret)?)?;
        files.push(path);
    }
    let ours = slinky_tests::render_children(&files, |_| {})?;
    let mut problems = differences_from(&slinky, &ours);
    // The one deliberate difference: without HA the slurmctld Service does not select
    // `active=true` (Slinky HEAD always does; v1.2 never did). The host labels the pod active
    // anyway, so either selector finds it (docs/bundled-builders.md).
    let allowed = ["Service/slurm-controller/body/spec/selector/controller.slinky.slurm.net/active:"];
    problems.retain(|p| !allowed.iter().any(|a| p.starts_with(a)));
    ensure!(
        problems.is_empty(),
        "differences from Slinky:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// The same with high availability: the HA Controller's objects of
/// `tests/slinky-made/ha-controller.yaml` and the NodeSet's, with no difference allowed.
#[test]
fn the_bundled_builders_make_exactly_what_slinkys_make_with_ha() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut text = std::fs::read_to_string(example("slurm-cluster.yaml"))?;
    for (from, to) in [
        ("  jwtKeyRef:\n", "  jwtHs256KeyRef:\n"),
        (
            "  persistence:\n    enabled: true\n",
            "  ha:\n    enabled: true\n    backups: 1\n  persistence:\n    enabled: true\n    existingClaim: slurm-statesave\n    accessModes:\n    - ReadWriteMany\n",
        ),
    ] {
        ensure!(text.contains(from), "slurm-cluster.yaml has no {from:?}");
        text = text.replace(from, to);
    }
    let path = dir.path().join("slurm-cluster.yaml");
    std::fs::write(&path, text)?;
    let uids: BTreeMap<&str, String> = slinky_tests::SLINKY_MADE_OWNERS
        .iter()
        .map(|(placeholder, _, name)| (*placeholder, format!("uid-{name}")))
        .collect();
    let slinky = slinky_tests::slinky_made_ha("slurm", &uids)?;
    let ours = slinky_tests::render_children(&[path], |_| {})?;
    let problems = differences_from(&slinky, &ours);
    ensure!(
        problems.is_empty(),
        "differences from Slinky:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// Each object of `slinky` against the one of the same kind and name in `ours` (but Slinky's
/// revision object and the Secrets the host writes or keeps): the differences, both ways.
fn differences_from(slinky: &[Value], ours: &BTreeMap<String, Value>) -> Vec<String> {
    let mut problems = Vec::new();
    for want in slinky {
        let key = format!(
            "{}/{}",
            want["kind"].as_str().unwrap_or_default(),
            want["metadata"]["name"].as_str().unwrap_or_default()
        );
        // Slinky's revision object, and Secrets the host writes or keeps (the slurmdbd.conf
        // password is the host's to fill in; the host keys are Slinky's, kept).
        if key.starts_with("ControllerRevision/") || key.starts_with("Secret/") {
            continue;
        }
        let Some(have) = ours.get(&key) else {
            problems.push(format!("{key}: not built here"));
            continue;
        };
        let mut diffs = Vec::new();
        differences(&comparable(want), &comparable(have), &key, &mut diffs);
        problems.extend(diffs);
    }
    // Nothing added: every object built here is one Slinky makes (but Secrets, as above).
    let made: std::collections::BTreeSet<String> = slinky
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    for key in ours.keys().filter(|k| !k.starts_with("Secret/")) {
        if !made.contains(key) {
            problems.push(format!("{key}: built here, not by Slinky"));
        }
    }
    problems
}
