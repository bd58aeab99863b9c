//! The RestApi kind (slurmrestd): its Deployment and Service field by field against Slinky's
//! `BuildRestapi`/`BuildRestapiService` (through the bundled 0.3.0 plugin and the host's output
//! policy, as `render` builds them), and end to end on the embedded API server (or the cluster of
//! `SLINKY_TEST_KUBECONFIG`): applied and owned, a steady state without writes, a deleted child
//! re-made, a missing Controller reported.

use anyhow::{Context, Result, ensure};
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, Patch, PatchParams},
};
use serde_json::{Value, json};
use slinky_api::{RestApi, conditions};
use slinky_host::{cmd::render::Parent, plugins::ChildKind};
use slinky_tests::{
    TestCluster, eventually, example,
    host::{Host, apply, apply_file, cluster, events, settled_without_writes},
};

/// The children `render` builds for the example cluster and its RestApi (edited by `edit`), by
/// `Kind/name`.
fn build(edit: impl Fn(&mut Parent)) -> Result<std::collections::BTreeMap<String, Value>> {
    let files = [example("slurm-cluster.yaml"), example("restapi.yaml")];
    let mut all = slinky_tests::render_children(&files, |p| {
        edit(p);
        if let Parent::RestApi(r) = p {
            r.metadata.uid = Some("uid-restapi".into());
        }
    })?;
    all.retain(|_, v| v["kind"] == "Deployment" || v["metadata"]["name"] == "slurm-restapi");
    Ok(all)
}

fn get<'a>(objects: &'a std::collections::BTreeMap<String, Value>, key: &str) -> Result<&'a Value> {
    objects
        .get(key)
        .with_context(|| format!("{key} not built: {:?}", objects.keys()))
}

fn tcp_probe(six: bool) -> Value {
    let mut p = json!({"tcpSocket": {"port": 6820}});
    if six {
        p["failureThreshold"] = 6.into();
        p["periodSeconds"] = 10.into();
    }
    p
}

#[test]
fn the_restapis_deployment_and_service_match_slinky_field_by_field() -> Result<()> {
    let objects = build(|_| {})?;
    assert_eq!(
        objects.keys().collect::<Vec<_>>(),
        ["Deployment/slurm-restapi", "Service/slurm-restapi"]
    );
    let selector = json!({"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm"});
    let labels = json!({"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm",
        "app.kubernetes.io/component": "restapi"});
    let owner = json!([{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "RestApi", "name": "slurm",
        "uid": "uid-restapi", "controller": true, "blockOwnerDeletion": true}]);

    let d = get(&objects, "Deployment/slurm-restapi")?;
    assert_eq!(d["apiVersion"], "apps/v1");
    assert_eq!(d["metadata"]["namespace"], "slurm");
    assert_eq!(d["metadata"]["labels"], labels);
    assert_eq!(d["metadata"]["ownerReferences"], owner);
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["revisionHistoryLimit"], 0);
    assert_eq!(d["spec"]["selector"], json!({"matchLabels": selector}));
    let template = &d["spec"]["template"];
    assert_eq!(template["metadata"]["labels"], labels);
    assert_eq!(
        template["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
        "slurmrestd"
    );
    ensure!(
        template["metadata"]["annotations"]
            .get("slinky.slurm.net/builder")
            .is_none(),
        "the builder annotation is on the pod template (a new builder of the same template would roll slurmrestd): {template}"
    );
    let pod = &template["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534})
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "slurm-etc", "projected": {"defaultMode": 384, "sources": [
            {"configMap": {"name": "slurm-config", "items": [{"key": "slurm.conf", "path": "slurm.conf"}]}},
            {"secret": {"name": "slurm-auth-slurm", "items": [{"key": "slurm.key", "path": "slurm.key"}]}}]}}])
    );
    let containers = pod["containers"].as_array().context("containers")?;
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["name"], "slurmrestd");
    assert_eq!(c["image"], "ghcr.io/slinkyproject/slurmrestd:25.05-ubuntu24.04");
    assert_eq!(c["args"], json!(["-s", "openapi/slurmctld", "0.0.0.0:6820"]));
    assert_eq!(
        c["env"],
        json!([{"name": "SLURM_JWT", "value": "daemon"},
               {"name": "SLURMRESTD_SECURITY", "value": "disable_unshare_files,disable_unshare_sysv"}])
    );
    assert_eq!(
        c["ports"],
        json!([{"name": "slurmrestd", "containerPort": 6820, "protocol": "TCP"}])
    );
    assert_eq!(c["startupProbe"], tcp_probe(true));
    assert_eq!(c["livenessProbe"], tcp_probe(true));
    assert_eq!(c["readinessProbe"], tcp_probe(false));
    assert_eq!(
        c["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534})
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": "slurm-etc", "mountPath": "/etc/slurm", "readOnly": true}])
    );
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}})
    );

    let s = get(&objects, "Service/slurm-restapi")?;
    assert_eq!(s["metadata"]["labels"], labels);
    assert_eq!(s["metadata"]["ownerReferences"], owner);
    assert_eq!(s["spec"]["selector"], selector);
    assert_eq!(
        s["spec"]["ports"],
        json!([{"name": "slurmrestd", "port": 6820, "targetPort": "slurmrestd", "protocol": "TCP"}])
    );
    Ok(())
}

/// Accounting loads slurmrestd's slurmdbd plugins (no `-s openapi/slurmctld`); the user's args
/// come after Slinky's and before the listen address; `spec.service` moves the port and sets a
/// node port; `spec.replicas` is the Deployment's.
#[test]
fn accounting_user_args_service_and_replicas_shape_the_restapi() -> Result<()> {
    let objects = build(|p| match p {
        Parent::Controller(c) => c.spec.accounting_ref = Some(Default::default()),
        Parent::RestApi(r) => {
            r.spec.slurmrestd.0["args"] = json!(["-vv"]);
            r.spec.service.port = Some(8080);
            r.spec.service.node_port = Some(30820);
            r.spec.service.spec.0 = json!({"type": "NodePort"});
            r.spec.replicas = Some(3);
        }
        _ => {}
    })?;
    let d = get(&objects, "Deployment/slurm-restapi")?;
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["args"],
        json!(["-vv", "0.0.0.0:6820"])
    );
    let s = get(&objects, "Service/slurm-restapi")?;
    assert_eq!(s["spec"]["type"], "NodePort");
    assert_eq!(
        s["spec"]["ports"],
        json!([{"name": "slurmrestd", "port": 8080, "targetPort": "slurmrestd", "protocol": "TCP",
                "nodePort": 30820}])
    );
    Ok(())
}

/// A RestApi's spec as the host refuses it, and a Controller without a Slurm key: each a clear
/// error naming the field.
#[test]
fn an_invalid_restapi_is_refused_naming_the_field() -> Result<()> {
    let no_controller = build(|p| {
        if let Parent::RestApi(r) = p {
            r.spec.controller_ref.name.clear();
        }
    });
    let e = format!(
        "{:#}",
        no_controller.err().context("an empty controllerRef was built")?
    );
    ensure!(e.contains("spec.controllerRef.name: Required value"), "{e}");
    let no_key = build(|p| {
        if let Parent::Controller(c) = p {
            c.spec.slurm_key_ref = None;
        }
    });
    let e = format!(
        "{:#}",
        no_key.err().context("a Controller without a key was built")?
    );
    ensure!(e.contains("spec.slurmKeyRef"), "{e}");
    Ok(())
}

async fn object(c: &TestCluster, ns: &str, kind: ChildKind, name: &str) -> Option<Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), ns, &kind.api_resource());
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|o| serde_json::to_value(o).ok())
}

async fn condition(c: &TestCluster, ns: &str, name: &str, type_: &str) -> Option<Value> {
    let r = Api::<RestApi>::namespaced(c.client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let v = serde_json::to_value(r.status?.conditions).ok()?;
    v.as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restapi_gets_its_deployment_and_service_and_keeps_them() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("restapi").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 0.into();
        }
    })
    .await?;
    apply_file(&c, &ns, "restapi.yaml", |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    let ready = eventually(60, || async {
        let d = object(&c, &ns, ChildKind::Deployment, "slurm-restapi").await?;
        object(&c, &ns, ChildKind::Service, "slurm-restapi").await?;
        let ready = condition(&c, &ns, "slurm", conditions::READY).await?;
        (ready["status"] == "True" && ready["reason"] == "ChildrenApplied").then_some(d)
    })
    .await;
    let d = ready.context("the Deployment, the Service and Ready=True did not all appear")?;
    let owner = &d["metadata"]["ownerReferences"][0];
    ensure!(owner["kind"] == "RestApi" && owner["name"] == "slurm", "{owner}");

    // Settled: then resyncs make no write (no write across 6 passes, then none across 10 more:
    // three resyncs of the Controller, the NodeSet and the RestApi).
    settled_without_writes(&host).await?;

    // Someone scales the Deployment: the host applies what its builder says again.
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &ns, &ChildKind::Deployment.api_resource());
    api.patch(
        "slurm-restapi",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await?;
    let restored = eventually(30, || async {
        let d = object(&c, &ns, ChildKind::Deployment, "slurm-restapi").await?;
        (d["spec"]["replicas"] == 1).then_some(())
    })
    .await;
    ensure!(restored.is_some(), "the edited Deployment was not applied again");

    // Someone deletes the Deployment: the host makes it again, without waiting for a resync.
    let old_uid = d["metadata"]["uid"].clone();
    api.delete("slurm-restapi", &DeleteParams::default()).await?;
    let back = eventually(30, || async {
        let d = object(&c, &ns, ChildKind::Deployment, "slurm-restapi").await?;
        (d["metadata"]["uid"] != old_uid).then_some(())
    })
    .await;
    ensure!(back.is_some(), "the deleted Deployment was not made again");

    // A RestApi of a Controller that does not exist: a condition and an Event name it.
    apply(
        &c,
        &ns,
        &json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "RestApi",
            "metadata": {"name": "orphan", "namespace": ns},
            "spec": {"controllerRef": {"name": "nope"},
                "slurmrestd": {"image": "ghcr.io/slinkyproject/slurmrestd:25.05-ubuntu24.04"}}}),
    )
    .await?;
    let missing = eventually(30, || async {
        let cond = condition(&c, &ns, "orphan", conditions::CONTROLLER_NOT_FOUND).await?;
        let ev = events(&c, &ns, "orphan").await.ok()?;
        (cond["status"] == "True"
            && ev
                .iter()
                .any(|(reason, _)| reason == conditions::CONTROLLER_NOT_FOUND))
        .then_some(cond)
    })
    .await
    .context("no ControllerNotFound condition and Event on the orphan RestApi")?;
    let message = missing["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains(&format!(
            "Controller {ns}/nope (spec.controllerRef) does not exist"
        )),
        "{message}"
    );
    ensure!(
        object(&c, &ns, ChildKind::Deployment, "orphan-restapi")
            .await
            .is_none(),
        "a RestApi without its Controller got a Deployment"
    );

    // Its Controller appears: the RestApi gets its children and is Ready.
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["metadata"]["name"] = "nope".into();
        }
    })
    .await?;
    let found = eventually(30, || async {
        object(&c, &ns, ChildKind::Deployment, "orphan-restapi").await?;
        let ready = condition(&c, &ns, "orphan", conditions::READY).await?;
        let missing = condition(&c, &ns, "orphan", conditions::CONTROLLER_NOT_FOUND).await;
        (ready["status"] == "True" && missing.is_none()).then_some(())
    })
    .await;
    ensure!(
        found.is_some(),
        "the RestApi did not recover once its Controller appeared"
    );

    // The Controller goes: the RestApi says so and keeps what it has.
    Api::<slinky_api::Controller>::namespaced(c.client.clone(), &ns)
        .delete("slurm", &DeleteParams::default())
        .await?;
    let lost = eventually(30, || async {
        let cond = condition(&c, &ns, "slurm", conditions::CONTROLLER_NOT_FOUND).await?;
        (cond["status"] == "True").then_some(())
    })
    .await;
    ensure!(
        lost.is_some(),
        "no ControllerNotFound once the Controller was deleted"
    );
    ensure!(
        object(&c, &ns, ChildKind::Deployment, "slurm-restapi")
            .await
            .is_some(),
        "the RestApi's Deployment went with its Controller"
    );
    host.stop().await;
    Ok(())
}
