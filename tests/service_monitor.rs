//! A Controller's Prometheus Operator ServiceMonitor (`spec.metrics.serviceMonitor`): built field
//! by field as Slinky's `BuildControllerServiceMonitor` builds it (through the bundled plugin and
//! the host's output policy, as `render` builds it), and end to end on the embedded API server
//! (or the cluster of `SLINKY_TEST_KUBECONFIG`): without the Prometheus Operator's CRD the
//! Controller says so (a `ChildFailure` naming the CRD, a `FailedCreate` Event) while its other
//! children are made; once the CRD is installed the ServiceMonitor is created on the next retry;
//! an edit reaches it; switched off, it is deleted.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use slinky_api::{Controller, conditions};
use slinky_host::{cmd::render, plugins::ChildKind};
use slinky_tests::{
    eventually, example,
    host::{Host, apply, child, cluster, condition_of, events},
};

const CRD_NAME: &str = "servicemonitors.monitoring.coreos.com";
/// The label that marks the CRD as this test's (a cluster's own Prometheus Operator CRD is
/// never deleted).
const TEST_LABEL: &str = "slinky.slurm.net/test-crd";

/// The example Controller with metrics on, a slurmctld that serves them (25.11) and `sm` as its
/// ServiceMonitor settings.
fn with_metrics(v: &mut Value, sm: &Value) {
    if v["kind"] == "Controller" {
        v["spec"]["slurmctld"]["image"] = "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04".into();
        v["spec"]["metrics"] = json!({"enabled": true, "serviceMonitor": sm});
    }
}

/// Every child `render` builds for the example cluster (edited by `edit`), by `Kind/name`.
fn build(edit: impl Fn(&mut Value)) -> Result<BTreeMap<String, Value>> {
    let text = std::fs::read_to_string(example("slurm-cluster.yaml"))?;
    let dir = tempfile::tempdir()?;
    let mut docs = Vec::new();
    for doc in render::yaml_documents(&text) {
        let mut v: Value = serde_saphyr::from_str(doc)?;
        if v.is_null() {
            continue;
        }
        edit(&mut v);
        docs.push(serde_json::to_string(&v)?);
    }
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, docs.join("\n---\n"))?;
    slinky_tests::render_children(&[file], |_| {})
}

#[test]
fn the_service_monitor_matches_slinky_field_by_field() -> Result<()> {
    let objects = build(|v| {
        with_metrics(
            v,
            &json!({"enabled": true, "labels": {"release": "prometheus"},
                    "annotations": {"team": "hpc"}, "interval": "30s", "scrapeTimeout": "10s"}),
        )
    })?;
    let sm = objects
        .get("ServiceMonitor/slurm-controller")
        .with_context(|| format!("no ServiceMonitor: {:?}", objects.keys()))?;
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["namespace"], "slurm");
    assert_eq!(
        sm["metadata"]["ownerReferences"],
        json!([{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller", "name": "slurm",
                "uid": "uid-slurm", "controller": true, "blockOwnerDeletion": true}])
    );
    let labels = &sm["metadata"]["labels"];
    assert_eq!(labels["release"], "prometheus");
    assert_eq!(labels["app.kubernetes.io/name"], "slurmctld");
    assert_eq!(labels["app.kubernetes.io/instance"], "slurm");
    assert_eq!(sm["metadata"]["annotations"]["team"], "hpc");
    let spec = &sm["spec"];
    assert_eq!(
        spec["selector"],
        json!({"matchLabels": {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": "slurm"}})
    );
    // The selector matches the slurmctld Service the Controller builds, and its port name.
    let svc = objects
        .get("Service/slurm-controller")
        .context("no slurmctld Service")?;
    for (k, v) in spec["selector"]["matchLabels"]
        .as_object()
        .context("matchLabels")?
    {
        ensure!(
            svc["metadata"]["labels"][k] == *v,
            "the Service has no {k}={v}: {svc}"
        );
    }
    ensure!(
        svc["spec"]["ports"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["name"] == "slurmctld")),
        "no slurmctld port: {svc}"
    );
    assert_eq!(spec["namespaceSelector"], json!({"matchNames": ["slurm"]}));
    let endpoint = |path: &str| json!({"path": path, "port": "slurmctld", "scheme": "http", "interval": "30s", "scrapeTimeout": "10s"});
    assert_eq!(
        spec["endpoints"],
        json!([
            endpoint("/metrics/jobs"),
            endpoint("/metrics/nodes"),
            endpoint("/metrics/partitions"),
            endpoint("/metrics/scheduler")
        ])
    );

    // Endpoints of its own: each its interval, or the ServiceMonitor's.
    let objects = build(|v| {
        with_metrics(
            v,
            &json!({"enabled": true, "interval": "1m",
                    "endpoints": [{"path": "/metrics/jobs", "interval": "15s"}, {"path": "/metrics/nodes"}]}),
        )
    })?;
    assert_eq!(
        objects["ServiceMonitor/slurm-controller"]["spec"]["endpoints"],
        json!([{"path": "/metrics/jobs", "port": "slurmctld", "scheme": "http", "interval": "15s"},
               {"path": "/metrics/nodes", "port": "slurmctld", "scheme": "http", "interval": "1m"}])
    );

    // Off without metrics, or without its own switch.
    for sm in [json!({"enabled": false}), json!(null)] {
        let objects = build(|v| with_metrics(v, &sm))?;
        ensure!(
            !objects.keys().any(|k| k.starts_with("ServiceMonitor/")),
            "built with {sm}"
        );
    }
    Ok(())
}

/// A minimal ServiceMonitor CRD (the Prometheus Operator's group, kind and names; its spec kept
/// as written), labelled as this test's.
fn service_monitor_crd() -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {TEST_LABEL: "true"}},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": "servicemonitors", "singular": "servicemonitor",
                      "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
        }
    }))?)
}

/// Delete this test's CRD (never another one) and wait until the kind is no longer served.
async fn remove_test_crd(crds: &Api<CustomResourceDefinition>) -> Result<()> {
    let Some(crd) = crds.get_opt(CRD_NAME).await? else {
        return Ok(());
    };
    if !crd.metadata.labels.unwrap_or_default().contains_key(TEST_LABEL) {
        return Ok(());
    }
    crds.delete(CRD_NAME, &DeleteParams::default()).await?;
    eventually(60, || async {
        crds.get_opt(CRD_NAME).await.ok()?.is_none().then_some(())
    })
    .await
    .context("the test's ServiceMonitor CRD was not deleted")
}

#[tokio::test]
async fn the_service_monitor_waits_for_its_crd_follows_edits_and_goes_when_switched_off() -> Result<()> {
    let c = cluster(false).await;
    let crds = Api::<CustomResourceDefinition>::all(c.client.clone());
    remove_test_crd(&crds).await?;
    // A cluster with the Prometheus Operator's own CRD: the missing-CRD half cannot be seen.
    let foreign = crds.get_opt(CRD_NAME).await?.is_some();
    let ns = c.namespace("smon").await;
    let text = std::fs::read_to_string(example("slurm-cluster.yaml"))?;
    let sm = json!({"enabled": true, "labels": {"release": "prometheus"}, "interval": "30s"});
    for doc in render::yaml_documents(&text) {
        let mut v: Value = serde_saphyr::from_str(doc)?;
        if v.is_null() || v["kind"] == "NodeSet" {
            continue;
        }
        v["metadata"]["namespace"] = ns.clone().into();
        with_metrics(&mut v, &sm);
        apply(&c, &ns, &v).await?;
    }
    let host = Host::start(&c, &ns)?;
    let result = async {
        if foreign {
            eprintln!("the cluster has its own {CRD_NAME}: the missing-CRD case is skipped");
        } else {
            // Without the CRD: the Controller says what is missing and how to fix it; its
            // other children are made all the same.
            let failure = eventually(60, || async {
                let cond = condition_of::<Controller>(&c, &ns, "slurm", conditions::CHILD_FAILURE).await?;
                let msg = cond["message"].as_str()?.to_string();
                (cond["status"] == "True" && msg.contains("ServiceMonitor")).then_some(msg)
            })
            .await
            .context("no ChildFailure about the missing ServiceMonitor CRD")?;
            for part in [
                "monitoring.coreos.com/v1 ServiceMonitor",
                "CRD is not installed",
                "install the Prometheus Operator's CRDs",
                "spec.metrics.serviceMonitor.enabled",
            ] {
                ensure!(failure.contains(part), "{part:?} not in {failure}");
            }
            ensure!(
                child(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
                    .await
                    .is_some(),
                "slurmctld's StatefulSet waited for the ServiceMonitor"
            );
            let evs = events(&c, &ns, "slurm").await?;
            ensure!(
                evs.iter()
                    .any(|(r, n)| r == "FailedCreate" && n.contains("ServiceMonitor")),
                "no FailedCreate Event: {evs:?}"
            );
            crds.create(&PostParams::default(), &service_monitor_crd()?)
                .await?;
        }

        // With the CRD: created on a retry (no watch of it needed), the failure cleared.
        let made = eventually(90, || async {
            child(&c, &ns, ChildKind::ServiceMonitor, "slurm-controller").await
        })
        .await
        .context("the ServiceMonitor was not created once its CRD was installed")?;
        assert_eq!(made["metadata"]["labels"]["release"], "prometheus");
        assert_eq!(made["spec"]["endpoints"][0]["interval"], "30s");
        assert_eq!(
            made["spec"]["namespaceSelector"],
            json!({"matchNames": [ns.clone()]})
        );
        eventually(60, || async {
            let cond = condition_of::<Controller>(&c, &ns, "slurm", conditions::CHILD_FAILURE).await;
            cond.is_none_or(|c| c["status"] != "True").then_some(())
        })
        .await
        .context("the ChildFailure stayed after the ServiceMonitor was made")?;

        // An edit reaches it.
        let controllers = Api::<Controller>::namespaced(c.client.clone(), &ns);
        let pp = PatchParams::default();
        controllers
            .patch(
                "slurm",
                &pp,
                &Patch::Merge(json!({"spec": {"metrics": {"serviceMonitor": {"interval": "1m"}}}})),
            )
            .await?;
        eventually(60, || async {
            let sm = child(&c, &ns, ChildKind::ServiceMonitor, "slurm-controller").await?;
            (sm["spec"]["endpoints"][3]["interval"] == "1m").then_some(())
        })
        .await
        .context("the new interval did not reach the ServiceMonitor")?;

        // An invalid duration: refused with where and how, the ServiceMonitor kept.
        controllers
            .patch(
                "slurm",
                &pp,
                &Patch::Merge(json!({"spec": {"metrics": {"serviceMonitor": {"interval": "every minute"}}}})),
            )
            .await?;
        let refused = eventually(60, || async {
            let cond = condition_of::<Controller>(&c, &ns, "slurm", conditions::INVALID_SPEC).await?;
            let msg = cond["message"].as_str()?.to_string();
            (cond["status"] == "True" && msg.contains("spec.metrics.serviceMonitor.interval")).then_some(msg)
        })
        .await
        .context("the invalid interval was not reported on the Controller")?;
        ensure!(refused.contains("Prometheus duration"), "{refused}");
        ensure!(
            child(&c, &ns, ChildKind::ServiceMonitor, "slurm-controller")
                .await
                .is_some(),
            "the ServiceMonitor went with a bad edit"
        );

        // Switched off: deleted, with an Event.
        controllers
            .patch(
                "slurm",
                &pp,
                &Patch::Merge(
                    json!({"spec": {"metrics": {"serviceMonitor": {"enabled": false, "interval": null}}}}),
                ),
            )
            .await?;
        eventually(60, || async {
            child(&c, &ns, ChildKind::ServiceMonitor, "slurm-controller")
                .await
                .is_none()
                .then_some(())
        })
        .await
        .context("the ServiceMonitor stayed after it was switched off")?;
        let evs = events(&c, &ns, "slurm").await?;
        ensure!(
            evs.iter()
                .any(|(r, n)| r == "SuccessfulDelete" && n.contains("ServiceMonitor slurm-controller")),
            "no SuccessfulDelete Event: {evs:?}"
        );
        anyhow::Ok(())
    }
    .await;
    host.stop().await;
    if !foreign {
        remove_test_crd(&crds).await?;
    }
    result
}
