use super::*;
use crate::{
    ControllerReference, NodeSetSpec, PodSpecWrapper, RollingUpdate, ScalingMode, UpdateStrategy,
    UpdateStrategyType,
};

fn nodeset(name: &str, replicas: i32) -> NodeSet {
    let mut ns = NodeSet::new(
        name,
        NodeSetSpec {
            controller_ref: ControllerReference {
                name: "slurm".into(),
                namespace: None,
            },
            replicas: Some(replicas),
            ..Default::default()
        },
    );
    ns.metadata.namespace = Some("slurm".into());
    ns
}

fn fields(p: &[SpecProblem]) -> Vec<&str> {
    p.iter().map(|p| p.field.as_str()).collect()
}

#[test]
fn long_names_and_hostnames_are_problems_naming_the_field() {
    assert!(nodeset("slurm-worker-slinky", 3).spec_problems().is_empty());
    // 60 characters: the pod name of ordinal 10 (63 characters) fits, of ordinal 100 does not.
    let long = "a".repeat(60);
    assert!(nodeset(&long, 11).spec_problems().is_empty());
    let p = nodeset(&long, 101).spec_problems();
    assert_eq!(fields(&p), ["metadata.name"], "{p:?}");
    assert!(
        p[0].message.contains("must be no more than 63 characters"),
        "{p:?}"
    );
    let p = nodeset(&"a".repeat(64), 1).spec_problems();
    assert_eq!(fields(&p), ["metadata.name"], "{p:?}");
    // Dots make a valid pod name but an invalid hostname.
    let p = nodeset("a.b", 1).spec_problems();
    assert_eq!(fields(&p), ["metadata.name"], "{p:?}");
    assert!(p[0].message.contains("must not contain dots"), "{p:?}");
    let mut ns = nodeset("w", 1);
    ns.spec.template.spec = PodSpecWrapper(serde_json::json!({"hostname": "Bad_"}));
    assert_eq!(fields(&ns.spec_problems()), ["spec.template.spec.hostname"]);
    ns.spec.template.spec = PodSpecWrapper(serde_json::json!({"hostname": "w-"}));
    ns.spec.ordinal_padding = Some(70);
    assert!(!ns.spec_problems().is_empty(), "padding past 63 characters");
    let mut ns = nodeset("w", 1);
    ns.spec.controller_ref.name = "c".repeat(50);
    assert_eq!(fields(&ns.spec_problems()), ["spec.controllerRef.name"]);
}

#[test]
fn max_unavailable_is_checked_and_resolved_without_overflow() {
    let int = |n| IntOrString::Int(n);
    let s = |v: &str| IntOrString::String(v.into());
    assert_eq!(max_unavailable(None), Ok(None));
    assert_eq!(max_unavailable(Some(&int(2))), Ok(Some(MaxUnavailable::Count(2))));
    assert_eq!(
        max_unavailable(Some(&s("50%"))),
        Ok(Some(MaxUnavailable::Percent(50)))
    );
    for bad in [
        int(0),
        int(-1),
        s("0%"),
        s("abc"),
        s("25"),
        s("%"),
        s("101%"),
        s("-5%"),
        s("+5%"),
    ] {
        assert!(max_unavailable(Some(&bad)).is_err(), "{bad:?}");
    }
    assert_eq!(MaxUnavailable::resolve(None, 10), 3);
    assert_eq!(MaxUnavailable::resolve(None, 1), 1);
    assert_eq!(MaxUnavailable::resolve(None, 0), 1);
    assert_eq!(MaxUnavailable::resolve(Some(MaxUnavailable::Percent(50)), 5), 3);
    assert_eq!(MaxUnavailable::resolve(Some(MaxUnavailable::Count(2)), 5), 2);
    assert_eq!(
        MaxUnavailable::resolve(Some(MaxUnavailable::Percent(100)), i32::MAX),
        i32::MAX
    );
    let mut ns = nodeset("w", 4);
    ns.spec.update_strategy = Some(UpdateStrategy {
        type_: UpdateStrategyType::RollingUpdate,
        rolling_update: Some(RollingUpdate {
            max_unavailable: Some(s("0%")),
        }),
        scheduled_update: None,
    });
    assert_eq!(
        fields(&ns.spec_problems()),
        ["spec.updateStrategy.rollingUpdate.maxUnavailable"]
    );
}

#[test]
fn ssh_needs_its_sssd_secret() {
    let mut ns = nodeset("w", 1);
    ns.spec.ssh = Some(crate::Ssh {
        enabled: true,
        ..Default::default()
    });
    assert_eq!(fields(&ns.spec_problems()), ["spec.ssh.sssdConfRef"]);
    ns.spec.ssh = Some(crate::Ssh {
        enabled: true,
        sssd_conf_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
            name: "sssd".into(),
            key: "sssd.conf".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(ns.spec_problems().is_empty());
}

#[test]
fn a_scheduled_update_needs_a_readable_window() {
    let mut ns = nodeset("w", 1);
    ns.spec.scaling_mode = ScalingMode::DaemonSet;
    assert!(ns.spec_problems().is_empty(), "DaemonSet mode is served");
    ns.spec.update_strategy = Some(UpdateStrategy {
        type_: UpdateStrategyType::ScheduledUpdate,
        ..Default::default()
    });
    assert_eq!(
        fields(&ns.spec_problems()),
        ["spec.updateStrategy.scheduledUpdate.startTime"]
    );
    ns.spec.update_strategy = Some(UpdateStrategy {
        type_: UpdateStrategyType::ScheduledUpdate,
        scheduled_update: Some(crate::ScheduledUpdate {
            start_time: Some("2025-06-01T02:00:00Z".into()),
            duration: Some("2 hours".into()),
            flags: None,
        }),
        ..Default::default()
    });
    assert_eq!(
        fields(&ns.spec_problems()),
        ["spec.updateStrategy.scheduledUpdate.duration"]
    );
    if let Some(s) = ns
        .spec
        .update_strategy
        .as_mut()
        .and_then(|s| s.scheduled_update.as_mut())
    {
        s.duration = Some("2h".into());
    }
    assert!(ns.spec_problems().is_empty());
    // Another strategy ignores a scheduledUpdate it does not use (as Slinky's CEL rule).
    if let Some(s) = ns.spec.update_strategy.as_mut() {
        s.type_ = UpdateStrategyType::RollingUpdate;
        s.scheduled_update = Some(Default::default());
    }
    assert!(ns.spec_problems().is_empty());
}

#[test]
fn a_daemon_pod_is_named_for_its_node() {
    let mut ns = nodeset("w", 1);
    ns.spec.scaling_mode = ScalingMode::DaemonSet;
    assert_eq!(ns.daemon_pod_name("gpu-1"), "w-gpu-1");
    assert!(
        ns.daemon_identity_problems("gpu-1.example.org", "gpu-1")
            .is_empty()
    );
    let p = ns.daemon_identity_problems("n", &"x".repeat(70));
    assert_eq!(fields(&p)[0], "metadata.name");
    assert!(p[0].message.contains("hostname-override"), "{p:?}");
    assert!(
        fields(&ns.daemon_identity_problems("n", "Bad_Name"))
            .iter()
            .any(|f| f.contains("hostname-override"))
    );
}

#[test]
fn fields_not_served_are_refused_not_ignored() {
    let mut ns = nodeset("w", 1);
    ns.spec.revision_history_limit = Some(0);
    ns.spec.prune_slurm_node_records = Some("Never".into());
    assert!(ns.spec_problems().is_empty(), "Slinky's defaults are served");
    // Fields of the other scaling mode would be ignored: refused, each named.
    ns.spec.prune_slurm_node_records = Some("NodeNotFound".into());
    assert_eq!(fields(&ns.spec_problems()), ["spec.pruneSlurmNodeRecords"]);
    ns.spec.scaling_mode = crate::ScalingMode::DaemonSet;
    assert!(
        ns.spec_problems().is_empty(),
        "pruning is served in DaemonSet mode"
    );
    ns.spec.pin_to_node = true;
    ns.spec.ordinal_padding = Some(2);
    assert_eq!(
        fields(&ns.spec_problems()),
        ["spec.pinToNode", "spec.ordinalPadding"]
    );
    ns.spec.ordinal_padding = Some(0);
    ns.spec.pin_to_node = false;
    ns.spec.scaling_mode = crate::ScalingMode::StatefulSet;
    ns.spec.prune_slurm_node_records = None;
    ns.spec.revision_history_limit = Some(10);
    assert!(ns.spec_problems().is_empty(), "a revision history is kept");
    ns.spec.revision_history_limit = Some(-1);
    ns.spec.prune_slurm_node_records = Some("Always".into());
    let problems = ns.spec_problems();
    assert_eq!(
        fields(&problems),
        ["spec.revisionHistoryLimit", "spec.pruneSlurmNodeRecords"]
    );
    assert_eq!(
        problems[0].to_string(),
        "spec.revisionHistoryLimit: Invalid value: -1: must be greater than or equal to 0",
        "as kube-apiserver words it for a StatefulSet"
    );
}

#[test]
fn controller_names_must_make_a_service_name() {
    let c = |n: &str| Controller::new(n, crate::ControllerSpec::default());
    assert!(c("slurm").name_problems().is_empty());
    assert!(c(&"a".repeat(CONTROLLER_NAME_MAX)).name_problems().is_empty());
    let p = c(&"a".repeat(CONTROLLER_NAME_MAX + 1)).name_problems();
    assert_eq!(p.len(), 1);
    assert!(p[0].message.contains("StatefulSet name"), "{p:?}");
    assert_eq!(c("0slurm").name_problems().len(), 1);
    // An external Controller has only its (unbuilt) Service name to keep valid.
    let mut ext = c(&"a".repeat(CONTROLLER_NAME_MAX + 1));
    ext.spec.external = true;
    assert!(ext.name_problems().is_empty());
}

#[test]
fn high_availability_needs_an_existing_claim() {
    let mut c = Controller::new("slurm", crate::ControllerSpec::default());
    c.spec.slurm_key_ref = Some(Default::default());
    c.spec.jwt_key_ref = Some(Default::default());
    assert!(c.spec_problems().is_empty());
    c.spec.ha = Some(crate::HighAvailability {
        enabled: true,
        backups: Some(2),
    });
    assert_eq!(fields(&c.spec_problems()), ["spec.ha.enabled"]);
    c.spec.persistence = Some(crate::Persistence {
        enabled: Some(false),
        existing_claim: Some("state".into()),
        ..Default::default()
    });
    assert_eq!(fields(&c.spec_problems()), ["spec.ha.enabled"], "persistence off");
    c.spec.persistence = Some(crate::Persistence {
        existing_claim: Some("state".into()),
        ..Default::default()
    });
    assert!(c.spec_problems().is_empty());
    assert_eq!(c.replicas(), 3);
    c.spec.slurm_key_ref = None;
    assert_eq!(fields(&c.spec_problems()), ["spec.slurmKeyRef"]);
}

#[test]
fn a_malformed_extra_conf_item_is_named() {
    let mut ns = nodeset("w", 1);
    ns.spec.extra_conf = Some("  Features=gpu  Weight=10 ".into());
    assert_eq!(ns.extra_conf_problem(), None, "white space is tolerated");
    ns.spec.extra_conf = Some("Features=gpu bogus Weight=10".into());
    let problem = ns.extra_conf_problem().unwrap_or_default();
    assert!(problem.contains("\"bogus\""), "{problem}");
    assert!(
        ns.spec_problems().is_empty(),
        "the pods are still built, as Slinky's manager"
    );
}
