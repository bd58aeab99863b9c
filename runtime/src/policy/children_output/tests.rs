use super::{objects::forbidden_hint, *};

#[test]
fn forbidden_kinds_say_why() {
    assert!(forbidden_hint("v1", "Secret").contains("never see or make Secrets"));
    assert!(forbidden_hint("v1", "Namespace").contains("cluster-scoped"));
    assert_eq!(forbidden_hint("v1", "Pod"), "");
}

fn controller(external: bool) -> Controller {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
        "metadata": {"name": "slurm", "namespace": "slurm"},
        "spec": {"external": external, "externalConfig": {"host": "ctld", "port": 6817}},
    }))
    .unwrap_or_else(|e| panic!("the test Controller: {e}"))
}

fn statefulset(name: &str) -> Child {
    Child {
        kind: ChildKind::StatefulSet,
        ownership: Ownership::Controlled,
        object: serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "slurm"}}),
    }
}

fn restapi_child_of(kind: ChildKind, name: &str, selector: serde_json::Value) -> Child {
    let (api_version, spec) = match kind {
        ChildKind::Deployment => (
            "apps/v1",
            serde_json::json!({"selector": {"matchLabels": selector}}),
        ),
        _ => ("v1", serde_json::json!({"selector": selector})),
    };
    Child {
        kind,
        ownership: Ownership::Controlled,
        object: serde_json::json!({"apiVersion": api_version, "kind": kind.kind(),
            "metadata": {"name": name, "namespace": "slurm"}, "spec": spec}),
    }
}

/// A RestApi's children are its one Deployment and one Service, selecting its slurmrestd
/// pods only: not a name the Controller's builders use, not a wider or foreign selector.
#[test]
fn a_restapi_has_one_deployment_and_one_service_selecting_its_pods() {
    let ours =
        serde_json::json!({"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm"});
    let selector: Labels = serde_json::from_value(ours.clone()).unwrap_or_default();
    for kind in [ChildKind::Deployment, ChildKind::Service] {
        assert_eq!(
            restapi_child(
                &restapi_child_of(kind, "slurm-restapi", ours.clone()),
                "slurm-restapi",
                &selector
            ),
            Ok(())
        );
        let e = restapi_child(
            &restapi_child_of(kind, "slurm-controller", ours.clone()),
            "slurm-restapi",
            &selector,
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("is named \"slurm-restapi\""), "{kind}: {e}");
        for bad in [
            serde_json::json!({"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": "slurm"}),
            serde_json::json!({"app.kubernetes.io/name": "slurmrestd"}),
            serde_json::json!({"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "other"}),
        ] {
            let e = restapi_child(
                &restapi_child_of(kind, "slurm-restapi", bad.clone()),
                "slurm-restapi",
                &selector,
            )
            .err()
            .unwrap_or_default();
            assert!(e.contains("slurmrestd selector"), "{kind} {bad}: {e}");
        }
    }
    let two = [
        restapi_child_of(ChildKind::Deployment, "slurm-restapi", ours.clone()),
        restapi_child_of(ChildKind::Deployment, "slurm-restapi", ours),
    ];
    assert!(no_duplicates(&two).is_err_and(|e| e.contains("listed twice")));
}

/// slurmctld's StatefulSet is `<controller>-controller`, and only it: a renamed or second
/// one would get an empty state save claim; an external Controller has none.
#[test]
fn a_controller_has_one_statefulset_named_for_it() {
    let ours = controller(false);
    assert_eq!(
        controller_statefulset(&statefulset("slurm-controller"), &ours),
        Ok(())
    );
    for name in ["slurm-controller-2", "slurm-ctld", "slurm-controller-internal"] {
        let e = controller_statefulset(&statefulset(name), &ours)
            .err()
            .unwrap_or_default();
        assert!(
            e.contains(&format!("StatefulSet {name}"))
                && e.contains("named \"slurm-controller\"")
                && e.contains("empty state save claim"),
            "{name}: {e}"
        );
    }
    let e = controller_statefulset(&statefulset("slurm-controller"), &controller(true))
        .err()
        .unwrap_or_default();
    assert!(e.contains("is external") && e.contains("no StatefulSet"), "{e}");
    // Two of the right name are listed twice.
    let two = [statefulset("slurm-controller"), statefulset("slurm-controller")];
    assert!(no_duplicates(&two).is_err_and(|e| e.contains("listed twice")));
}
