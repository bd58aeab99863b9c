//! The output policy's allowances: each class refused by default, naming the field and the flag,
//! and passed when the parent's spec (or Slinky's design) grants it or the host allows it.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{PodSpec, ServiceSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::json;
use slinky_api::{Controller, NodeSet, PodSpecWrapper, labels::Labels};

use super::*;

/// A pod spec; `automountServiceAccountToken: false` (as Slinky's builders set it) unless `v`
/// sets it (`null` leaves it out).
fn spec(mut v: serde_json::Value) -> PodSpec {
    if let Some(o) = v.as_object_mut() {
        o.entry("automountServiceAccountToken").or_insert(json!(false));
    }
    serde_json::from_value(v).unwrap_or_default()
}

fn nodeset(mut spec: serde_json::Value) -> NodeSet {
    spec["controllerRef"] = json!({"name": "slurm"});
    serde_json::from_value(json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": "w", "namespace": "slurm"},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("the test NodeSet: {e}"))
}

fn controller(spec: serde_json::Value) -> Controller {
    serde_json::from_value(json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
        "metadata": {"name": "slurm", "namespace": "slurm"},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("the test Controller: {e}"))
}

fn only(class: Allow) -> Allowances {
    [class].into_iter().collect()
}

/// `check` refuses by default, naming `field` and the flag, and passes with the class allowed.
fn refused_unless_allowed(check: impl Fn(&Allowances) -> Result<(), String>, field: &str, class: Allow) {
    let e = check(&Allowances::default()).err().unwrap_or_default();
    assert!(e.contains(field), "{field}: {e}");
    assert!(e.contains(&format!("--allow {class}")), "{class}: {e}");
    assert_eq!(check(&only(class)), Ok(()), "{class}");
    let others: Allowances = Allow::ALL.into_iter().filter(|a| *a != class).collect();
    assert!(check(&others).is_err(), "{class}: another class allowed it");
}

fn slurmd_pod(extra: serde_json::Value) -> PodSpec {
    let mut pod = json!({"containers": [{"name": "slurmd", "image": "slurmd",
        "securityContext": {"privileged": true,
            "capabilities": {"add": ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE"]}}}],
        "initContainers": [{"name": "logfile", "image": "alpine", "restartPolicy": "Always"}]});
    if let (Some(p), Some(e)) = (pod.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    spec(pod)
}

#[test]
fn a_pod_within_slinkys_design_passes() {
    let grants = PodGrants::of_nodeset(&nodeset(json!({})));
    assert_eq!(
        pod_spec(&slurmd_pod(json!({})), &grants, &Allowances::default()),
        Ok(())
    );
    // `CAP_` prefixes and case do not matter.
    let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x",
        "securityContext": {"capabilities": {"add": ["cap_sys_admin"]}}}]}));
    assert_eq!(pod_spec(&pod, &grants, &Allowances::default()), Ok(()));
}

#[test]
fn host_namespaces_are_refused_unless_the_parent_asks() {
    let grants = PodGrants::of_nodeset(&nodeset(json!({})));
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        let pod = slurmd_pod(json!({field: true}));
        refused_unless_allowed(
            |a| pod_spec(&pod, &grants, a),
            &format!("spec.{field} is true"),
            Allow::HostNamespaces,
        );
        let asked = PodGrants::of_nodeset(&nodeset(json!({"template": {"spec": {field: true}}})));
        assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()), "{field}");
    }
}

#[test]
fn host_paths_are_refused_unless_the_parent_has_that_volume() {
    let pod = slurmd_pod(json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}));
    let grants = PodGrants::of_nodeset(&nodeset(json!({})));
    refused_unless_allowed(
        |a| pod_spec(&pod, &grants, a),
        "spec.volumes[name=root].hostPath is \"/\"",
        Allow::HostPath,
    );
    let asked = |path: &str| {
        PodGrants::of_nodeset(&nodeset(json!({"template": {"spec": {"volumes": [
            {"name": "root", "hostPath": {"path": path}}]}}})))
    };
    assert_eq!(pod_spec(&pod, &asked("/"), &Allowances::default()), Ok(()));
    // The same volume name pointing elsewhere is not what the NodeSet asked for.
    assert!(pod_spec(&pod, &asked("/scratch"), &Allowances::default()).is_err());
}

/// A Secret the parent's spec does not name is refused wherever the pod would reference it (a
/// volume, a projected source, a container's environment, an image pull secret); one the
/// template names, or the Controller's key a worker mounts, passes.
#[test]
fn secrets_are_refused_unless_the_parent_names_them() {
    let grants = PodGrants::of_worker(
        &nodeset(json!({"template": {"spec": {"volumes": [
            {"name": "site", "secret": {"secretName": "site-creds"}}]}}})),
        &controller(json!({"slurmKeyRef": {"name": "slurm-auth", "key": "slurm.key"}})),
    );
    for (extra, field) in [
        (
            json!({"volumes": [{"name": "x", "secret": {"secretName": "other-tenant"}}]}),
            "spec.volumes[name=x].secret.secretName is \"other-tenant\"",
        ),
        (
            json!({"volumes": [{"name": "x", "projected": {"sources": [{"secret": {"name": "other-tenant"}}]}}]}),
            "spec.volumes[name=x].projected.sources[0].secret.name",
        ),
        (
            json!({"containers": [{"name": "slurmd", "image": "slurmd",
                "securityContext": {"privileged": true},
                "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "other-tenant", "key": "t"}}}]}]}),
            "spec.containers[name=slurmd].env[name=T].valueFrom.secretKeyRef.name",
        ),
        (
            json!({"containers": [{"name": "slurmd", "image": "slurmd",
                "securityContext": {"privileged": true}, "envFrom": [{"secretRef": {"name": "other-tenant"}}]}]}),
            "spec.containers[name=slurmd].envFrom[0].secretRef.name",
        ),
        (
            json!({"imagePullSecrets": [{"name": "other-tenant"}]}),
            "spec.imagePullSecrets[0].name",
        ),
        (
            json!({"volumes": [{"name": "x", "csi": {"driver": "secrets-store.csi.k8s.io",
                "nodePublishSecretRef": {"name": "other-tenant"}}}]}),
            "spec.volumes[name=x].csi.nodePublishSecretRef",
        ),
    ] {
        let pod = slurmd_pod(extra);
        refused_unless_allowed(|a| pod_spec(&pod, &grants, a), field, Allow::Secrets);
    }
    let named = slurmd_pod(json!({"volumes": [
        {"name": "site", "secret": {"secretName": "site-creds"}},
        {"name": "key", "secret": {"secretName": "slurm-auth"}}]}));
    assert_eq!(pod_spec(&named, &grants, &Allowances::default()), Ok(()));
}

#[test]
fn node_names_are_refused_for_nodeset_pods_and_kept_to_the_controllers_template() {
    let pod = slurmd_pod(json!({"nodeName": "node-0"}));
    // A NodeSet's template cannot grant it: the bundled builder clears it.
    let grants = PodGrants::of_nodeset(&nodeset(json!({"template": {"spec": {"nodeName": "node-0"}}})));
    refused_unless_allowed(
        |a| pod_spec(&pod, &grants, a),
        "spec.nodeName is \"node-0\"",
        Allow::NodeName,
    );
    let asked = PodGrants::of_controller(&controller(json!({"template": {"spec": {"nodeName": "node-0"}}})));
    let sts = spec(json!({"containers": [{"name": "slurmctld", "image": "x"}], "nodeName": "node-0"}));
    assert_eq!(pod_spec(&sts, &asked, &Allowances::default()), Ok(()));
}

#[test]
fn service_accounts_are_refused_unless_the_parent_names_the_same() {
    let grants = PodGrants::of_controller(&controller(json!({})));
    for field in ["serviceAccountName", "serviceAccount"] {
        let pod = spec(json!({"containers": [{"name": "slurmctld", "image": "x"}], field: "admin"}));
        refused_unless_allowed(
            |a| pod_spec(&pod, &grants, a),
            &format!("spec.{field} is \"admin\""),
            Allow::ServiceAccount,
        );
        let asked = PodGrants::of_controller(&controller(
            json!({"template": {"spec": {"serviceAccountName": "admin"}}}),
        ));
        assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
        let other = PodGrants::of_controller(&controller(
            json!({"template": {"spec": {"serviceAccountName": "slurm"}}}),
        ));
        assert!(pod_spec(&pod, &other, &Allowances::default()).is_err());
    }
}

#[test]
fn service_account_tokens_are_refused_unless_the_parent_asks() {
    let workers = PodGrants::of_nodeset(&nodeset(json!({})));
    let slurmctld = PodGrants::of_controller(&controller(json!({})));
    for (token, has) in [(json!(null), "is not set"), (json!(true), "is true")] {
        for grants in [&workers, &slurmctld] {
            let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
                "automountServiceAccountToken": token}));
            refused_unless_allowed(
                |a| pod_spec(&pod, grants, a),
                &format!("spec.automountServiceAccountToken {has}"),
                Allow::ServiceAccount,
            );
        }
        // The template asks for the token: the bundled builder mounts it.
        let template = json!({"template": {"spec": {"automountServiceAccountToken": true}}});
        let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
            "automountServiceAccountToken": token}));
        for asked in [
            PodGrants::of_nodeset(&nodeset(template.clone())),
            PodGrants::of_controller(&controller(template.clone())),
        ] {
            assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
        }
    }
    // `false` in the template (or nothing) grants nothing more than `false`.
    let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}]}));
    assert_eq!(pod_spec(&pod, &workers, &Allowances::default()), Ok(()));
    let asked_false = PodGrants::of_nodeset(&nodeset(
        json!({"template": {"spec": {"automountServiceAccountToken": false}}}),
    ));
    let mounted = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
        "automountServiceAccountToken": true}));
    assert!(pod_spec(&mounted, &asked_false, &Allowances::default()).is_err());
}

#[test]
fn a_projected_service_account_token_is_refused_unless_the_template_has_it() {
    let token_volume = json!({"name": "api", "projected": {"sources": [
        {"configMap": {"name": "ca"}},
        {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}});
    let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
        "volumes": [token_volume]}));
    let workers = PodGrants::of_nodeset(&nodeset(json!({})));
    refused_unless_allowed(
        |a| pod_spec(&pod, &workers, a),
        "spec.volumes[name=api].projected.sources[].serviceAccountToken is set",
        Allow::ServiceAccount,
    );
    // The template's own volume passes; one with another audience does not.
    let asked = PodGrants::of_nodeset(&nodeset(
        json!({"template": {"spec": {"volumes": [token_volume]}}}),
    ));
    assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
    let other = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
        "volumes": [{"name": "api", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "audience": "kubernetes"}}]}}]}));
    assert!(pod_spec(&other, &asked, &Allowances::default()).is_err());
    // A projected volume without a token is no token.
    let plain = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
        "volumes": [{"name": "etc", "projected": {"sources": [{"configMap": {"name": "ca"}}]}}]}));
    assert_eq!(pod_spec(&plain, &workers, &Allowances::default()), Ok(()));
}

#[test]
fn privileges_beyond_a_containers_grant_are_refused() {
    let workers = PodGrants::of_nodeset(&nodeset(json!({})));
    let slurmctld = PodGrants::of_controller(&controller(json!({})));
    let sc = |name: &str, list: &str, sc: serde_json::Value| {
        let mut pod = json!({"containers": [{"name": "main", "image": "x"}]});
        pod[list] = json!([{"name": name, "image": "x", "securityContext": sc}]);
        spec(pod)
    };
    for (grants, pod, field) in [
        // slurmctld and the sidecars are not privileged.
        (
            &slurmctld,
            sc("slurmctld", "containers", json!({"privileged": true})),
            "spec.containers[name=slurmctld].securityContext.privileged is true",
        ),
        (
            &workers,
            sc("logfile", "initContainers", json!({"privileged": true})),
            "spec.initContainers[name=logfile].securityContext.privileged is true",
        ),
        (
            &workers,
            sc("escape", "containers", json!({"allowPrivilegeEscalation": true})),
            "spec.containers[name=escape].securityContext.allowPrivilegeEscalation is true",
        ),
        // slurmd: Slinky's capabilities, no others.
        (
            &workers,
            sc(
                "slurmd",
                "containers",
                json!({"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE"]}}),
            ),
            "spec.containers[name=slurmd].securityContext.capabilities.add has \"SYS_PTRACE\"",
        ),
        (
            &workers,
            sc(
                "debug",
                "ephemeralContainers",
                json!({"capabilities": {"add": ["ALL"]}}),
            ),
            "spec.ephemeralContainers[name=debug].securityContext.capabilities.add has \"ALL\"",
        ),
    ] {
        refused_unless_allowed(|a| pod_spec(&pod, grants, a), field, Allow::Privileges);
    }
    // What the parent's spec asks for, its container gets.
    let asked = PodGrants::of_nodeset(&nodeset(json!({
        "slurmd": {"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}},
        "logfile": {"securityContext": {"allowPrivilegeEscalation": true}},
        "template": {"spec": {"containers": [{"name": "debug",
            "securityContext": {"privileged": true}}]}},
    })));
    for pod in [
        sc(
            "slurmd",
            "containers",
            json!({"capabilities": {"add": ["SYS_PTRACE", "BPF"]}}),
        ),
        sc(
            "logfile",
            "initContainers",
            json!({"allowPrivilegeEscalation": true}),
        ),
        sc(
            "debug",
            "containers",
            json!({"privileged": true, "allowPrivilegeEscalation": true}),
        ),
    ] {
        assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
    }
    let asked = PodGrants::of_controller(&controller(
        json!({"slurmctld": {"securityContext": {"privileged": true}}}),
    ));
    let pod = sc("slurmctld", "containers", json!({"privileged": true}));
    assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
}

#[test]
fn finalizers_are_refused() {
    let meta = ObjectMeta {
        finalizers: Some(vec!["example.com/keep".into()]),
        ..Default::default()
    };
    refused_unless_allowed(
        |a| finalizers("metadata", &meta, a),
        "metadata.finalizers is [\"example.com/keep\"]",
        Allow::Finalizers,
    );
    assert_eq!(
        finalizers("metadata", &ObjectMeta::default(), &Allowances::default()),
        Ok(())
    );
}

#[test]
fn services_are_cluster_ip_unless_the_controller_asks_for_more() {
    let svc = |v: serde_json::Value| -> ServiceSpec { serde_json::from_value(v).unwrap_or_default() };
    let cluster_ip = ServiceGrants::default();
    let none = Allowances::default();
    assert_eq!(
        service_spec(Some(&svc(json!({"clusterIP": "None"}))), &cluster_ip, &none),
        Ok(())
    );
    assert_eq!(
        service_spec(Some(&svc(json!({"type": "ClusterIP"}))), &cluster_ip, &none),
        Ok(())
    );
    for (s, field) in [
        (svc(json!({"type": "LoadBalancer"})), "spec.type is LoadBalancer"),
        (svc(json!({"type": "NodePort"})), "spec.type is NodePort"),
        (
            svc(json!({"type": "ExternalName", "externalName": "x.example.com"})),
            "spec.type is ExternalName",
        ),
        (
            svc(json!({"externalIPs": ["203.0.113.7"]})),
            "spec.externalIPs is [\"203.0.113.7\"]",
        ),
        (
            svc(json!({"loadBalancerIP": "203.0.113.7"})),
            "spec.loadBalancerIP is \"203.0.113.7\"",
        ),
    ] {
        refused_unless_allowed(
            |a| service_spec(Some(&s), &cluster_ip, a),
            field,
            Allow::ServiceExposure,
        );
    }
    // The Controller's Service: what `spec.service.spec` asks for, but not external IPs
    // (the bundled builder drops them).
    let asked = ServiceGrants::of_controller_service(&controller(json!({"service": {"spec": {
        "type": "LoadBalancer", "loadBalancerIP": "203.0.113.7", "externalIPs": ["203.0.113.8"]}}})));
    let lb = svc(json!({"type": "LoadBalancer", "loadBalancerIP": "203.0.113.7"}));
    assert_eq!(service_spec(Some(&lb), &asked, &none), Ok(()));
    assert!(service_spec(Some(&svc(json!({"type": "NodePort"}))), &asked, &none).is_err());
    assert!(
        service_spec(
            Some(&svc(json!({"loadBalancerIP": "203.0.113.9"}))),
            &asked,
            &none
        )
        .is_err()
    );
    assert!(service_spec(Some(&svc(json!({"externalIPs": ["203.0.113.8"]}))), &asked, &none).is_err());
}

#[test]
fn a_pdb_selects_only_its_pods() {
    let want = Labels::from([
        ("app.kubernetes.io/name".to_string(), "slurmd".to_string()),
        ("app.kubernetes.io/instance".to_string(), "w".to_string()),
    ]);
    let mut have = want.clone();
    have.insert("extra".into(), "narrower".into());
    assert_eq!(
        pdb_selector(&have, &want, "NodeSet w's pods", &Allowances::default()),
        Ok(())
    );
    let wide = BTreeMap::from([("app.kubernetes.io/name".to_string(), "slurmd".to_string())]);
    refused_unless_allowed(
        |a| pdb_selector(&wide, &want, "NodeSet w's pods", a),
        "spec.selector.matchLabels lacks app.kubernetes.io/instance=w",
        Allow::WidePdb,
    );
}

#[test]
fn classes_print_as_the_flag_takes_them() {
    let all: Allowances = Allow::ALL.into_iter().collect();
    assert_eq!(
        all.to_string(),
        "finalizers,host-namespaces,host-path,node-name,service-account,privileges,service-exposure,wide-pdb,secrets"
    );
    assert_eq!(Allowances::default().to_string(), "none");
}

/// The bundled builder's own pods pass with no allowance, whatever their NodeSet asks for:
/// the grants follow `slinky_guest_sdk::slinky::build_nodeset_pod` (slurmd's capabilities
/// included).
#[test]
fn slinkys_own_pods_and_statefulset_are_within_their_grants() -> Result<(), String> {
    use slinky_api::contract::{
        BuildContext, PodIdentity, example_controller, example_inputs, example_nodeset,
    };
    use slinky_guest_sdk::slinky;
    let ctx = BuildContext::default();
    let asks = json!({"volumes": [{"name": "scratch", "hostPath": {"path": "/scratch"}}],
        "hostNetwork": true, "serviceAccountName": "slurm", "automountServiceAccountToken": true,
        "containers": [{"name": "sidecar", "image": "x", "securityContext": {"privileged": true}}]});
    let mut nodeset = example_nodeset().map_err(|e| format!("{e:?}"))?;
    let mut controller = example_controller().map_err(|e| format!("{e:?}"))?;
    for asked in [json!({}), asks] {
        nodeset.spec.template.spec = PodSpecWrapper(asked.clone());
        controller.spec.template.spec = PodSpecWrapper(asked);
        let identity = PodIdentity::for_ordinal(&nodeset, 0, "r");
        let pod = slinky::build_nodeset_pod(&ctx, &nodeset, &controller, &identity)
            .map_err(|e| format!("{e:?}"))?;
        let pod = pod.spec.ok_or("the pod has no spec")?;
        pod_spec(
            &pod,
            &PodGrants::of_worker(&nodeset, &controller),
            &Allowances::default(),
        )?;

        let inputs = example_inputs(std::slice::from_ref(&nodeset));
        let children =
            slinky::build_controller_children(&ctx, &controller, &inputs).map_err(|e| format!("{e:?}"))?;
        let sts = children
            .iter()
            .find_map(|c| c.as_stateful_set())
            .ok_or("no StatefulSet")?;
        let template = sts.spec.template.spec.as_ref().ok_or("no pod template")?;
        pod_spec(
            template,
            &PodGrants::of_controller(&controller),
            &Allowances::default(),
        )?;
    }
    Ok(())
}
