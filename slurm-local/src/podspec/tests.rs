use super::*;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("pod: {e}"))
}

#[test]
fn a_worker_pod_reads_as_slurmd() {
    let p = pod(serde_json::json!({
        "metadata": {"name": "w-0", "uid": "u", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "slurmd", "slinky.slurm.net/cluster": "slurm"},
            "annotations": {"topology.slinky.slurm.net/spec": "topo"}},
        "spec": {"hostname": "w0", "subdomain": "svc",
            "containers": [{"name": "logfile", "image": "a"}, {"name": "slurmd", "image": "b",
                "args": ["-Z", "--conf-server", "slurm-controller.ns:6817", "--conf", "'Features=x'"],
                "env": [{"name": "SLINKY_TOPOLOGY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['topology.slinky.slurm.net/spec']"}}}],
                "lifecycle": {"preStop": {"exec": {"command": ["/usr/bin/sh", "-c", "scontrol update"]}}},
                "volumeMounts": [{"name": "etc", "mountPath": "/etc/slurm"}, {"name": "log", "mountPath": "/var/log/slurm"}, {"name": "bad", "mountPath": "/x/../y"}]}],
            "volumes": [
                {"name": "etc", "projected": {"defaultMode": 384, "sources": [{"secret": {"name": "k", "items": [{"key": "slurm.key", "path": "slurm.key"}]}}]}},
                {"name": "log", "emptyDir": {}},
                {"name": "bad", "emptyDir": {}}]}
    }));
    assert_eq!(role_of(&p, "slurm", None), Some(Role::Slurmd));
    assert_eq!(role_of(&p, "other", Some("slurm")), None);
    let plan = Plan::new(&p, Role::Slurmd).unwrap_or_else(|| panic!("no plan"));
    assert_eq!(plan.hostname, "w0");
    assert_eq!(plan.container.name, "slurmd");
    assert_eq!(plan.conf_server, Some(("slurm-controller.ns".into(), 6817)));
    assert_eq!(plan.mounts.len(), 2, "the mount leaving its path is dropped");
    assert!(matches!(&plan.mounts[0].kind, MountKind::Files(s) if s[0].secret && s[0].default_mode == 0o600));
    assert_eq!(plan.pre_stop().map(|c| c.len()), Some(3));
    assert!(!plan.run_as_slurm);
    assert_eq!(
        field(
            &p,
            "metadata.annotations['topology.slinky.slurm.net/spec']",
            "",
            ""
        ),
        "topo"
    );
    assert_eq!(field(&p, "metadata.annotations['missing']", "", ""), "");
    assert_eq!(field(&p, "status.podIP", "10.0.0.9", ""), "10.0.0.9");
}

#[test]
fn the_slurmdbd_pod_of_the_controllers_accounting_reads_as_slurmdbd() {
    let p = pod(serde_json::json!({
        "metadata": {"name": "slurm-accounting-0", "uid": "u", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "slurmdbd", "app.kubernetes.io/instance": "slurm"}},
        "spec": {"hostname": "slurm-accounting-0", "subdomain": "slurm-accounting",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401, "fsGroup": 401},
            "containers": [{"name": "slurmdbd", "image": "i",
                "volumeMounts": [{"name": "slurm-etc", "mountPath": "/etc/slurm", "readOnly": true},
                                 {"name": "run", "mountPath": "/run"}]}],
            "volumes": [
                {"name": "slurm-etc", "projected": {"defaultMode": 384, "sources": [
                    {"secret": {"name": "slurm-accounting", "items": [{"key": "slurmdbd.conf", "path": "slurmdbd.conf"}]}}]}},
                {"name": "run", "emptyDir": {"medium": "Memory"}}]}
    }));
    assert_eq!(role_of(&p, "slurm", Some("slurm")), Some(Role::Slurmdbd));
    assert_eq!(role_of(&p, "slurm", Some("other")), None, "another Accounting's");
    assert_eq!(role_of(&p, "slurm", None), None, "no accountingRef");
    let plan = Plan::new(&p, Role::Slurmdbd).unwrap_or_else(|| panic!("no plan"));
    assert_eq!(plan.hostname, "slurm-accounting-0");
    assert!(plan.run_as_slurm && plan.fs_group);
    let paths: Vec<&str> = plan.mounts.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["/run", "/etc/slurm"], "parents first");
    assert!(matches!(&plan.mounts[1].kind, MountKind::Files(s) if s[0].default_mode == 0o600));
}

#[test]
fn init_containers_run_before_the_main_one_and_share_its_mounts() {
    // The bundled Accounting builder's pod for a slurmdbd before 25.11, with a sidecar added.
    let p = pod(serde_json::json!({
        "metadata": {"name": "slurm-accounting-0", "uid": "u", "namespace": "ns"},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 401, "runAsGroup": 401, "fsGroup": 401},
            "initContainers": [
                {"name": "logfile", "image": "alpine", "restartPolicy": "Always",
                 "command": ["sh", "-c", "tail -F /var/log/slurm/x"],
                 "volumeMounts": [{"name": "log", "mountPath": "/var/log/slurm"}]},
                {"name": "initconf", "image": "i",
                 "command": ["sh", "-c", "install -m 0600 /mnt/slurm/* /etc/slurm/"], "args": ["x"],
                 "securityContext": {"runAsUser": 401, "runAsGroup": 401},
                 "volumeMounts": [{"name": "slurm-etc", "mountPath": "/mnt/slurm", "readOnly": true},
                                  {"name": "slurm-etc-private", "mountPath": "/etc/slurm"}]},
                {"name": "as-root", "image": "i", "args": ["only-args"],
                 "securityContext": {"runAsUser": 0},
                 "volumeMounts": [{"name": "run", "mountPath": "/etc/slurm"}]}],
            "containers": [{"name": "slurmdbd", "image": "i",
                "volumeMounts": [{"name": "slurm-etc-private", "mountPath": "/etc/slurm/", "readOnly": true},
                                 {"name": "run", "mountPath": "/run"}]}],
            "volumes": [
                {"name": "slurm-etc", "projected": {"defaultMode": 384, "sources": [
                    {"secret": {"name": "slurm-accounting", "items": [{"key": "slurmdbd.conf", "path": "slurmdbd.conf"}]}}]}},
                {"name": "slurm-etc-private", "emptyDir": {"medium": "Memory"}},
                {"name": "log", "emptyDir": {}},
                {"name": "run", "emptyDir": {"medium": "Memory"}}]}
    }));
    let plan = Plan::new(&p, Role::Slurmdbd).unwrap_or_else(|| panic!("no plan"));
    let inits: Vec<&str> = plan
        .init_containers
        .iter()
        .map(|i| i.container.name.as_str())
        .collect();
    assert_eq!(inits, ["initconf", "as-root"], "in order, without the sidecar");
    let initconf = &plan.init_containers[0];
    assert!(initconf.run_as_slurm);
    assert_eq!(
        initconf.command(),
        Some((
            "sh".to_string(),
            ["-c", "install -m 0600 /mnt/slurm/* /etc/slurm/", "x"]
                .map(String::from)
                .to_vec()
        )),
        "command, then args"
    );
    assert!(!plan.init_containers[1].run_as_slurm, "its own runAsUser 0");
    assert_eq!(
        plan.init_containers[1].command(),
        None,
        "args alone: the image's entrypoint"
    );
    let mounts: Vec<(&str, &str)> = plan
        .mounts
        .iter()
        .map(|m| (m.path.as_str(), m.volume.as_str()))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/run", "run"),
            ("/etc/slurm", "slurm-etc-private"),
            ("/mnt/slurm", "slurm-etc"),
            ("/var/log/slurm", "log")
        ],
        "every container's, each path once (the main container's volume first), parents first"
    );
    assert!(matches!(plan.mounts[1].kind, MountKind::EmptyDir));
    assert!(matches!(&plan.mounts[2].kind, MountKind::Files(s) if s[0].secret && s[0].default_mode == 0o600));
}

#[test]
fn item_paths_stay_inside() {
    assert!(safe_relative("slurm.key"));
    assert!(safe_relative("scripts/a.sh"));
    assert!(!safe_relative("../etc/passwd"));
    assert!(!safe_relative("/etc/passwd"));
    assert!(!safe_relative(""));
}
