use super::*;

#[test]
fn image_tags_name_their_slurm_release() {
    let cases = [
        ("ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04", Some((25, 5))),
        ("ghcr.io/slinkyproject/slurmctld:25.11.2-rocky9", Some((25, 11))),
        ("registry:5000/slurmctld:26.05", Some((26, 5))),
        ("registry:5000/slurmctld", None),
        ("slurmctld:latest", None),
        ("slurmctld@sha256:0123", None),
        ("slurmctld:25.05@sha256:0123", Some((25, 5))),
    ];
    for (image, want) in cases {
        assert_eq!(slurm_release_of_image(image), want, "{image}");
    }
}

#[test]
fn prometheus_durations_are_checked() {
    for ok in [
        "0",
        "30s",
        "1m30s",
        "500ms",
        "1h",
        "2d12h",
        "1y2w3d4h5m6s7ms",
        "1m500ms",
    ] {
        assert!(prometheus_duration("f", Some(ok)).is_ok(), "{ok} refused");
    }
    for bad in [
        "", "30", "s", "1.5s", "30S", "1s1m", "1m1m", "-1s", "30 s", "1mss",
    ] {
        let Err(BuildError::InvalidInput(m)) = prometheus_duration("spec.x", Some(bad)) else {
            panic!("{bad:?} accepted");
        };
        assert!(m.contains("spec.x") && m.contains("Prometheus duration"), "{m}");
    }
}

#[test]
fn the_service_monitor_is_built_only_with_metrics_and_its_own_switch() {
    let controller = |metrics: serde_json::Value| -> Controller {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"slurmKeyRef": {"name": "k", "key": "slurm.key"},
                     "jwtKeyRef": {"name": "j", "key": "jwt.key"}, "metrics": metrics}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let sm = serde_json::json!({"enabled": true});
    for off in [
        serde_json::json!({"enabled": false, "serviceMonitor": sm}),
        serde_json::json!({"enabled": true}),
        serde_json::json!({"enabled": true, "serviceMonitor": {"enabled": false}}),
    ] {
        let built =
            build_controller_service_monitor(&controller(off.clone())).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(built.is_none(), "built with {off}");
    }
    let built = build_controller_service_monitor(&controller(
        serde_json::json!({"enabled": true, "serviceMonitor": {"enabled": true, "interval": "soon"}}),
    ));
    assert!(
        matches!(built, Err(BuildError::InvalidInput(m)) if m.contains("spec.metrics.serviceMonitor.interval"))
    );
    let built = build_controller_service_monitor(&controller(
        serde_json::json!({"enabled": true, "serviceMonitor": {"enabled": true, "endpoints": [{"interval": "5s"}]}}),
    ));
    assert!(matches!(built, Err(BuildError::InvalidInput(m)) if m.contains("endpoints[0].path")));
}

#[test]
fn metrics_are_refused_with_a_slurmctld_older_than_25_11() {
    let controller = |image: &str, metrics: bool| -> Controller {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"slurmKeyRef": {"name": "k", "key": "slurm.key"},
                     "jwtKeyRef": {"name": "j", "key": "jwt.key"},
                     "slurmctld": {"image": image}, "metrics": {"enabled": metrics}}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let inputs = ControllerInputs::default();
    let old = "ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04";
    let Err(BuildError::InvalidInput(message)) = build_controller_config(&controller(old, true), &inputs)
    else {
        panic!("metrics with a 25.05 slurmctld were not refused");
    };
    for part in [
        "spec.metrics.enabled",
        "25.11",
        old,
        "set spec.metrics.enabled to false",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    for (image, metrics) in [
        (old, false),
        ("ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04", true),
        ("mine:latest", true),
    ] {
        let config = build_controller_config(&controller(image, metrics), &inputs)
            .unwrap_or_else(|e| panic!("{image} {metrics}: {e:?}"));
        let conf = config
            .data
            .unwrap_or_default()
            .remove(SLURM_CONF)
            .unwrap_or_default();
        assert_eq!(
            conf.contains("MetricsType=metrics/openmetrics"),
            metrics,
            "{image}"
        );
    }
}

#[test]
fn checksums_follow_slinky() {
    let data = BTreeMap::from([("b".to_string(), b"2".to_vec()), ("a".to_string(), b"1".to_vec())]);
    assert_eq!(
        checksum_of_map(data.iter().map(|(k, v)| (k, v.as_slice()))),
        helpers::sha256_hex(b"12"),
        "values concatenated in key order"
    );
    assert_eq!(checksum_of_map(std::iter::empty()), "");
}

#[test]
fn the_state_save_volume_comes_after_the_templates_volumes_as_in_slinky() {
    let controller: Controller = serde_json::from_value(serde_json::json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"slurmKeyRef": {"name": "k", "key": "slurm.key"},
                 "jwtKeyRef": {"name": "j", "key": "jwt.key"},
                 "slurmctld": {"image": "slurmctld:25.05"}, "logfile": {"image": "alpine"},
                 "ha": {"enabled": true, "backups": 1},
                 "persistence": {"enabled": true, "existingClaim": "state"},
                 "template": {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}}}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let set = build_controller_statefulset(
        &BuildContext::default(),
        &controller,
        &ControllerInputs::default(),
        &k8s_openapi::api::core::v1::ConfigMap::default(),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let names: Vec<String> = set
        .spec
        .template
        .spec
        .and_then(|s| s.volumes)
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names.last().map(String::as_str), Some("statesave"), "{names:?}");
    let scratch = names.iter().position(|n| n == "scratch");
    assert!(scratch.is_some_and(|i| i + 1 < names.len()), "{names:?}");
}
