//! API-semantics conformance: run against the embedded API server, or against the cluster named by
//! `SLINKY_TEST_KUBECONFIG` with the same assertions (tests that need fault injection skip
//! themselves there). A real cluster is the judge: where they disagree, the embedded server is
//! wrong.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, ResourceExt,
    api::{
        DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
        WatchEvent, WatchParams,
    },
};
use serde_json::json;
use slinky_api::NodeSet;
use slinky_apiserver::testing::{TestCluster, eventually};

/// The Slinky CRDs (the API server's own tests need some CRDs with schemas, scale and status).
fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![slinky_api::Controller::crd(), NodeSet::crd()]
}

fn crds_yaml() -> Result<String> {
    let docs = crds()
        .iter()
        .map(serde_saphyr::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

/// A file under the workspace's `examples/`.
fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

fn cm(name: &str, data: &[(&str, &str)], labels: &[(&str, &str)]) -> ConfigMap {
    let to_map = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let mut c = ConfigMap {
        data: Some(to_map(data)),
        ..Default::default()
    };
    c.metadata.name = Some(name.into());
    c.metadata.labels = Some(to_map(labels));
    c
}

fn api_error(e: &kube::Error) -> Option<(u16, String)> {
    match e {
        kube::Error::Api(s) => Some((s.code, s.reason.clone())),
        _ => None,
    }
}

fn nodeset(name: &str, replicas: i32) -> Result<NodeSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": name},
        "spec": {"controllerRef": {"name": "slurm"}, "replicas": replicas, "slurmd": {"image": "slurmd:1"}}
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_updates_conflict_and_unconditional_updates_win() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("conflict").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let created = api
        .create(&PostParams::default(), &cm("a", &[("k", "1")], &[]))
        .await?;
    let mut first = created.clone();
    first.data = Some(BTreeMap::from([("k".into(), "2".into())]));
    let updated = api.replace("a", &PostParams::default(), &first).await?;
    assert_ne!(updated.resource_version(), created.resource_version());
    // The same (now stale) resourceVersion again: 409 Conflict with the standard Status.
    let mut stale = created.clone();
    stale.data = Some(BTreeMap::from([("k".into(), "3".into())]));
    let err = api
        .replace("a", &PostParams::default(), &stale)
        .await
        .err()
        .context("a stale update must fail")?;
    let kube::Error::Api(status) = &err else {
        bail!("expected an API error, got {err}")
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("the object has been modified"),
        "{}",
        status.message
    );
    // No resourceVersion: last write wins.
    let mut blind = created.clone();
    blind.metadata.resource_version = None;
    blind.data = Some(BTreeMap::from([("k".into(), "4".into())]));
    let won = api.replace("a", &PostParams::default(), &blind).await?;
    assert_eq!(won.data.and_then(|d| d.get("k").cloned()).as_deref(), Some("4"));
    // Creating it again: 409 AlreadyExists. In a missing namespace: 404.
    let again = api
        .create(&PostParams::default(), &cm("a", &[], &[]))
        .await
        .err()
        .context("duplicate")?;
    assert_eq!(api_error(&again), Some((409, "AlreadyExists".into())));
    let nowhere: Api<ConfigMap> = Api::namespaced(c.client.clone(), "no-such-namespace-xyz");
    let missing = nowhere
        .create(&PostParams::default(), &cm("a", &[], &[]))
        .await
        .err()
        .context("missing ns")?;
    assert_eq!(api_error(&missing).map(|(code, _)| code), Some(404));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_and_the_status_spec_split() -> Result<()> {
    let c = TestCluster::start().await;
    c.install_crds(&crds()).await;
    let ns = c.namespace("generation").await;
    let api: Api<NodeSet> = Api::namespaced(c.client.clone(), &ns);
    let created = api.create(&PostParams::default(), &nodeset("w", 1)?).await?;
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.status.is_none());

    // A spec change bumps generation; a metadata-only change does not.
    let p = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    assert_eq!(p.metadata.generation, Some(2));
    let p = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await?;
    assert_eq!(p.metadata.generation, Some(2));

    // A main-resource update ignores status.
    let p = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 9}})),
        )
        .await?;
    assert!(
        p.status.as_ref().is_none_or(|s| s.replicas == 0),
        "status must be ignored: {:?}",
        p.status
    );
    // A status update ignores spec, and does not bump generation.
    let s = api
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 7}, "status": {"replicas": 2}})),
        )
        .await?;
    assert_eq!(s.status.as_ref().map(|s| s.replicas), Some(2));
    assert_eq!(s.spec.replicas, Some(3));
    assert_eq!(s.metadata.generation, Some(2));

    // The scale subresource reads spec/status replicas and writes spec.replicas.
    let scale = api.get_scale("w").await?;
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    assert_eq!(scale.status.map(|s| s.replicas), Some(2));
    api.patch_scale(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await?;
    let after = api.get("w").await?;
    assert_eq!(after.spec.replicas, Some(5));
    assert_eq!(after.metadata.generation, Some(3));
    Ok(())
}

/// A StatefulSet gets its spec defaults (so a writer that leaves them out and one that sends them
/// agree), and its generation moves with its spec only; a Deployment's moves with its
/// annotations too (kube-apiserver's `PrepareForUpdate`: the Deployment controller copies them
/// to its ReplicaSets). The host's adoption of a cluster another operator made depends on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_defaults_and_what_moves_their_generation() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("workloads").await;
    let template = json!({"metadata": {"labels": {"app": "x"}},
                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let sets = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c.client.clone(), &ns);
    let set: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "s", "template": template}
    }))?;
    let set = serde_json::to_value(sets.create(&PostParams::default(), &set).await?)?;
    assert_eq!(set["spec"]["replicas"], 1);
    assert_eq!(set["spec"]["podManagementPolicy"], "OrderedReady");
    assert_eq!(set["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(
        set["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    );
    assert_eq!(
        set["spec"]["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {"a": "b"}}}));
    let set = sets.patch("s", &PatchParams::default(), &annotate).await?;
    assert_eq!(
        set.metadata.generation,
        Some(1),
        "a StatefulSet's annotations are no spec"
    );
    let retain =
        Patch::Merge(json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain"}}}));
    let set = sets.patch("s", &PatchParams::default(), &retain).await?;
    assert_eq!(
        set.metadata.generation,
        Some(1),
        "a default sent as it is changes nothing"
    );

    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.client.clone(), &ns);
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}
    }))?;
    deployments.create(&PostParams::default(), &deployment).await?;
    let d = deployments.patch("d", &PatchParams::default(), &annotate).await?;
    assert_eq!(d.metadata.generation, Some(2), "a Deployment's annotations count");
    let label = Patch::Merge(json!({"metadata": {"labels": {"l": "m"}}}));
    let d = deployments.patch("d", &PatchParams::default(), &label).await?;
    assert_eq!(d.metadata.generation, Some(2), "its labels do not");
    Ok(())
}

/// A pod that does not tolerate a node's being not ready or unreachable tolerates it for 300 s
/// (the `DefaultTolerationSeconds` admission); a running pod's tolerations take additions and
/// other `tolerationSeconds` (the DaemonSet rule: forever), nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_tolerate_a_lost_node_for_300_s_and_take_only_added_tolerations() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("tolerations").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let pod = |name: &str, tolerations: serde_json::Value| -> Result<Pod> {
        Ok(serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "tolerations": tolerations}}))?)
    };
    let plain = pods
        .create(&PostParams::default(), &pod("plain", json!([]))?)
        .await?;
    let five_minutes = |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300});
    assert_eq!(
        serde_json::to_value(plain.spec.and_then(|s| s.tolerations))?,
        json!([
            five_minutes("node.kubernetes.io/not-ready"),
            five_minutes("node.kubernetes.io/unreachable")
        ])
    );
    let all = pods
        .create(
            &PostParams::default(),
            &pod("all", json!([{"operator": "Exists"}]))?,
        )
        .await?;
    assert_eq!(
        serde_json::to_value(all.spec.and_then(|s| s.tolerations))?,
        json!([{"operator": "Exists"}]),
        "a pod tolerating every taint gets none"
    );
    let forever = |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute"});
    let daemon = json!([forever("node.kubernetes.io/not-ready"), forever("node.kubernetes.io/unreachable"),
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]);
    let patched = pods
        .patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tolerations": daemon}})),
        )
        .await?;
    assert_eq!(
        serde_json::to_value(patched.spec.and_then(|s| s.tolerations))?,
        daemon
    );
    let fewer = Patch::Merge(json!({"spec": {"tolerations": [forever("node.kubernetes.io/not-ready")]}}));
    match pods.patch("plain", &PatchParams::default(), &fewer).await {
        Err(kube::Error::Api(s)) if s.code == 422 => ensure!(
            s.message
                .contains("existing toleration can not be modified except its tolerationSeconds"),
            "{}",
            s.message
        ),
        other => bail!("removing a toleration: {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_custom_resources_are_refused_and_defaults_applied() -> Result<()> {
    let c = TestCluster::start().await;
    c.install_crds(&crds()).await;
    let ns = c.namespace("schema").await;
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<NodeSet>(&()),
    );
    let bad_type = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "bad"},
                          "spec": {"controllerRef": {"name": "slurm"}, "replicas": "three"}});
    let err = api
        .create(&PostParams::default(), &serde_json::from_value(bad_type)?)
        .await
        .err()
        .context("wrong type")?;
    assert_eq!(api_error(&err), Some((422, "Invalid".into())), "{err}");
    let missing = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "bad2"}, "spec": {}});
    let err = api
        .create(&PostParams::default(), &serde_json::from_value(missing)?)
        .await
        .err()
        .context("missing required")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(422));
    assert!(err.to_string().contains("controllerRef"), "{err}");
    let bad_enum = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "bad3"},
                          "spec": {"controllerRef": {"name": "slurm"}, "scalingMode": "Sometimes"}});
    let err = api
        .create(&PostParams::default(), &serde_json::from_value(bad_enum)?)
        .await
        .err()
        .context("enum")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(422));
    // Unknown fields are pruned, like a structural schema does.
    let extra = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "ok"},
                       "spec": {"controllerRef": {"name": "slurm"}, "noSuchField": 1}});
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(extra)?)
        .await?;
    assert!(
        created.data.pointer("/spec/noSuchField").is_none(),
        "{:?}",
        created.data
    );
    Ok(())
}

/// A schema's `minimum` and `maximum` are enforced with kube-apiserver's message: a
/// BuilderPlugin's `order` out of range is refused at the door (kube-apiserver does not enforce
/// `format: int32` on custom resources, so the bounds are the schema's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_bounds_are_enforced_with_kube_apiservers_message() -> Result<()> {
    use kube::CustomResourceExt;
    let c = TestCluster::start().await;
    c.install_crds(&[slinky_api::BuilderPlugin::crd()]).await;
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        c.client.clone(),
        &kube::discovery::ApiResource::erase::<slinky_api::BuilderPlugin>(&()),
    );
    let name = format!("bounds-{}", std::process::id());
    let bp = |order: i64| -> Result<kube::api::DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "plugins.slinky.slurm.net/v1alpha1", "kind": "BuilderPlugin",
            "metadata": {"name": name},
            "spec": {"module": {"image": "registry.example/p@sha256:00"}, "kinds": ["nodeset-pod"], "order": order}
        }))?)
    };
    for (order, answer) in [
        (
            2_147_483_648_i64,
            "spec.order: Invalid value: 2147483648: spec.order in body should be less than or equal to 2147483647",
        ),
        (
            -2_147_483_649,
            "spec.order: Invalid value: -2147483649: spec.order in body should be greater than or equal to -2147483648",
        ),
    ] {
        match api.create(&PostParams::default(), &bp(order)?).await {
            Ok(_) => bail!("order {order} was accepted"),
            Err(kube::Error::Api(s)) if s.code == 422 => ensure!(
                s.message
                    == format!("BuilderPlugin.plugins.slinky.slurm.net \"{name}\" is invalid: {answer}"),
                "{}",
                s.message
            ),
            Err(other) => bail!("order {order} refused otherwise: {other}"),
        }
    }
    api.create(&PostParams::default(), &bp(2_147_483_647)?).await?;
    api.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

/// A merge patch of `spec` with `change` is refused `422 Invalid` with a message starting `answer`.
async fn refused(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    change: serde_json::Value,
    answer: &str,
) -> Result<()> {
    let patch = Patch::Merge(json!({"spec": change}));
    match api.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => bail!("{change} was accepted"),
        Err(kube::Error::Api(s)) if s.code == 422 => {
            ensure!(s.message.starts_with(answer), "{change}: {}", s.message);
            Ok(())
        }
        Err(other) => bail!("{change} refused otherwise: {other}"),
    }
}

/// The fields whose change destroys a cluster's state are refused by the API server (the CRDs'
/// transition rules), with the same answer on both servers; other changes pass, and Slinky's
/// `jwtHs256KeyRef` is kept, not pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_fields_are_refused_with_kube_apiservers_answer() -> Result<()> {
    let c = TestCluster::start().await;
    c.install_crds(&crds()).await;
    let ns = c.namespace("immutable").await;
    let controllers: Api<kube::api::DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<slinky_api::Controller>(&()),
    );
    let nodesets: Api<kube::api::DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<NodeSet>(&()),
    );
    let controller = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller", "metadata": {"name": "slurm"},
        "spec": {"clusterName": "alpha", "slurmKeyRef": {"name": "slurm-key", "key": "slurm.key"},
                 "jwtHs256KeyRef": {"name": "jwt-key", "key": "jwt.key"},
                 "persistence": {"enabled": true, "existingClaim": "state", "storageClassName": "fast"}}});
    let created = controllers
        .create(&PostParams::default(), &serde_json::from_value(controller)?)
        .await?;
    ensure!(
        created.data.pointer("/spec/jwtHs256KeyRef/name") == Some(&json!("jwt-key")),
        "jwtHs256KeyRef was pruned: {:?}",
        created.data.get("spec")
    );
    let patch = |spec: serde_json::Value| Patch::Merge(json!({"spec": spec}));
    let is = "Controller.slinky.slurm.net \"slurm\" is invalid: ";
    let cases = [
        (
            json!({"clusterName": "beta"}),
            "spec.clusterName: Invalid value: \"object\": clusterName is immutable: slurmctld keeps its state (every job) under the cluster's name, and a new name starts it empty; create a new Controller for a new cluster",
        ),
        (
            json!({"clusterName": null}),
            "spec.clusterName: Invalid value: \"object\": clusterName is immutable",
        ),
        (
            json!({"slurmKeyRef": {"name": "other-key"}}),
            "spec.slurmKeyRef: Invalid value: \"object\": slurmKeyRef is immutable once set",
        ),
        (
            json!({"jwtHs256KeyRef": {"name": "other-jwt"}}),
            "spec.jwtKeyRef: Invalid value: \"object\": jwtKeyRef is immutable once set",
        ),
        (
            json!({"jwtKeyRef": {"name": "jwt-key", "key": "jwt.key"}}),
            "spec.jwtHs256KeyRef: Invalid value: \"object\": set jwtKeyRef or its older name jwtHs256KeyRef, not both",
        ),
        (
            json!({"persistence": {"enabled": false}}),
            "spec.persistence.enabled: Invalid value: \"object\": persistence.enabled is immutable",
        ),
        (
            json!({"persistence": {"existingClaim": "other"}}),
            "spec.persistence.existingClaim: Invalid value: \"object\": persistence.existingClaim is immutable while persistence is enabled",
        ),
    ];
    for (change, answer) in cases {
        refused(&controllers, "slurm", change, &format!("{is}{answer}")).await?;
    }
    // What does not destroy state passes: another setting, the JWT key under its newer name,
    // the rest of the claim spec.
    controllers
        .patch(
            "slurm",
            &PatchParams::default(),
            &patch(json!({"extraConf": "MaxJobCount=1000", "jwtHs256KeyRef": null,
                          "jwtKeyRef": {"name": "jwt-key", "key": "jwt.key"},
                          "persistence": {"storageClassName": "slow"}})),
        )
        .await?;
    // A reference may be set where it was empty (the host's advice for a missing one), and a
    // null one (YAML `slurmKeyRef:` with no value) counts as unset.
    let bare = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller", "metadata": {"name": "bare"},
        "spec": {"slurmKeyRef": null}});
    controllers
        .create(&PostParams::default(), &serde_json::from_value(bare)?)
        .await?;
    controllers
        .patch(
            "bare",
            &PatchParams::default(),
            &patch(json!({"slurmKeyRef": {"name": "slurm-key", "key": "slurm.key"},
                          "jwtKeyRef": {"name": "jwt-key", "key": "jwt.key"}})),
        )
        .await?;
    refused(
        &controllers,
        "bare",
        json!({"slurmKeyRef": {"name": "other-key"}}),
        "Controller.slinky.slurm.net \"bare\" is invalid: spec.slurmKeyRef: Invalid value: \"object\": slurmKeyRef is immutable once set",
    )
    .await?;
    if slinky_apiserver::testing::on_path("kubectl") {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .args(["-n", &ns, "patch", "controller", "slurm", "--type=merge", "-p"])
            .arg(r#"{"spec":{"clusterName":"beta"}}"#)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains("clusterName is immutable"),
            "kubectl patch of clusterName: {stderr}"
        );
    } else {
        slinky_apiserver::testing::skip(
            "immutable_fields_are_refused_with_kube_apiservers_answer (its kubectl step)",
            "kubectl",
            "kubectl is not on PATH",
        );
    }
    nodesets
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::to_value(nodeset("workers", 1)?)?)?,
        )
        .await?;
    let ns_is = "NodeSet.slinky.slurm.net \"workers\" is invalid: ";
    for (change, answer) in [
        (
            json!({"controllerRef": {"name": "other"}}),
            "spec.controllerRef: Invalid value: \"object\": controllerRef is immutable once set",
        ),
        (
            json!({"volumeClaimTemplates": [{"metadata": {"name": "scratch"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}),
            "spec.volumeClaimTemplates: Invalid value: \"object\": volumeClaimTemplates is immutable",
        ),
    ] {
        refused(&nodesets, "workers", change, &format!("{ns_is}{answer}")).await?;
    }
    nodesets
        .patch("workers", &PatchParams::default(), &patch(json!({"replicas": 3})))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_delivers_changes_in_order_and_410_past_the_window() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("watch").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let list = api.list(&ListParams::default()).await?;
    let from = list.metadata.resource_version.unwrap_or_default();
    api.create(&PostParams::default(), &cm("w", &[("v", "1")], &[]))
        .await?;
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await?;
    api.delete("w", &DeleteParams::default()).await?;
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &from)
        .await?
        .boxed();
    let mut seen = Vec::new();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await?? {
        match ev {
            WatchEvent::Added(o) => seen.push(("ADDED", o.data.and_then(|d| d.get("v").cloned()))),
            WatchEvent::Modified(o) => seen.push(("MODIFIED", o.data.and_then(|d| d.get("v").cloned()))),
            WatchEvent::Deleted(o) => seen.push(("DELETED", o.data.and_then(|d| d.get("v").cloned()))),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => bail!("watch error {e:?}"),
        }
        if seen.len() == 3 {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", Some("1".into())),
            ("MODIFIED", Some("2".into())),
            ("DELETED", Some("2".into()))
        ]
    );

    // 410 Gone past the retained window (the window is set small on the embedded server).
    let Some(server) = c.embedded("watch 410") else {
        return Ok(());
    };
    server.store().set_window(3);
    for i in 0..10 {
        api.create(&PostParams::default(), &cm(&format!("x{i}"), &[], &[]))
            .await?;
    }
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &from)
        .await?
        .boxed();
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await?? {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => bail!("expected 410 Expired, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_bookmarks_and_label_filtered_watches() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("bookmarks").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let from = api
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    api.create(&PostParams::default(), &cm("in", &[], &[("sel", "yes")]))
        .await?;
    api.create(&PostParams::default(), &cm("out", &[], &[("sel", "no")]))
        .await?;
    // Moving out of the selection is a DELETED for a filtered watch.
    api.patch(
        "in",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"sel": "no"}}})),
    )
    .await?;
    let mut wp = WatchParams::default().labels("sel=yes").timeout(8);
    wp.bookmarks = true;
    let mut stream = api.watch(&wp, &from).await?.boxed();
    let mut kinds = Vec::new();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(15), stream.try_next()).await?? {
        match ev {
            WatchEvent::Added(o) => kinds.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Modified(o) => kinds.push(format!("MODIFIED {}", o.name_any())),
            WatchEvent::Deleted(o) => kinds.push(format!("DELETED {}", o.name_any())),
            WatchEvent::Bookmark(b) => {
                ensure!(
                    !b.metadata.resource_version.is_empty(),
                    "a bookmark carries a resourceVersion"
                );
                kinds.push("BOOKMARK".into());
                break;
            }
            WatchEvent::Error(e) => bail!("{e:?}"),
        }
    }
    assert_eq!(
        kinds[..2],
        ["ADDED in".to_string(), "DELETED in".to_string()],
        "{kinds:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_conflicts_between_managers_unless_forced() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("ssa").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let mine = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s", "labels": {"owner": "a"}}, "data": {"k": "a"}});
    api.patch("s", &PatchParams::apply("manager-a"), &Patch::Apply(&mine))
        .await?;
    // Another manager setting the same field to another value conflicts…
    let theirs =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "data": {"k": "b"}});
    let err = api
        .patch("s", &PatchParams::apply("manager-b"), &Patch::Apply(&theirs))
        .await
        .err()
        .context("conflict")?;
    assert_eq!(api_error(&err), Some((409, "Conflict".into())), "{err}");
    assert!(
        err.to_string().contains("manager-a") && err.to_string().contains(".data.k"),
        "{err}"
    );
    // …adding a field nobody owns does not…
    let label =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s", "labels": {"extra": "b"}}});
    let merged = api
        .patch("s", &PatchParams::apply("manager-c"), &Patch::Apply(&label))
        .await?;
    assert_eq!(merged.labels().get("owner").map(String::as_str), Some("a"));
    assert_eq!(merged.labels().get("extra").map(String::as_str), Some("b"));
    // …and forcing takes the field over, so the first manager now conflicts.
    let forced = api
        .patch(
            "s",
            &PatchParams::apply("manager-b").force(),
            &Patch::Apply(&theirs),
        )
        .await?;
    assert_eq!(
        forced.data.and_then(|d| d.get("k").cloned()).as_deref(),
        Some("b")
    );
    let err = api
        .patch("s", &PatchParams::apply("manager-a"), &Patch::Apply(&mine))
        .await
        .err()
        .context("now a conflicts")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(409));
    // A manager that stops applying a field it alone owned removes it.
    let less = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}});
    let after = api
        .patch("s", &PatchParams::apply("manager-c"), &Patch::Apply(&less))
        .await?;
    assert!(!after.labels().contains_key("extra"), "{:?}", after.labels());
    let managers: Vec<String> = after
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"manager-a".to_string()) && managers.contains(&"manager-b".to_string()),
        "{managers:?}"
    );
    Ok(())
}

/// A create makes an Update entry; a later apply by the same manager does not remove what that
/// entry owns, unless the entry is dropped (a patch of managedFields, which the server takes as
/// the client's): how the host creates a child without merging into a stranger's object and still
/// owns its fields as an applier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_a_create_set_are_removed_by_apply_only_once_its_update_entry_is_dropped() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("mf").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let full = |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1", "b": "2"}});
    let less = |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}});
    let pp = PostParams {
        field_manager: Some("m".into()),
        ..Default::default()
    };
    let entries = |cm: &ConfigMap| -> Vec<(String, String)> {
        cm.metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|e| {
                (
                    e.manager.clone().unwrap_or_default(),
                    e.operation.clone().unwrap_or_default(),
                )
            })
            .collect()
    };
    for (name, drop_entry) in [("kept", false), ("dropped", true)] {
        let created = api.create(&pp, &serde_json::from_value(full(name))?).await?;
        assert_eq!(entries(&created), [("m".to_string(), "Update".to_string())]);
        let mut applied_cfg = full(name);
        applied_cfg["metadata"]["resourceVersion"] = created.resource_version().into();
        let applied = api
            .patch(
                name,
                &PatchParams::apply("m").force(),
                &Patch::Apply(&applied_cfg),
            )
            .await?;
        let mut e = entries(&applied);
        e.sort();
        assert_eq!(
            e,
            [
                ("m".to_string(), "Apply".to_string()),
                ("m".to_string(), "Update".to_string())
            ]
        );
        if drop_entry {
            let kept: Vec<_> = serde_json::to_value(&applied.metadata.managed_fields)?
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e["operation"] != "Update")
                .collect();
            let patch =
                json!({"metadata": {"resourceVersion": applied.resource_version(), "managedFields": kept}});
            let patched = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            assert_eq!(entries(&patched), [("m".to_string(), "Apply".to_string())]);
            // The same patch again is a conflict: it changed the object (a new resourceVersion).
            let again = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .err()
                .context("a stale managedFields patch was accepted")?;
            assert_eq!(api_error(&again).map(|e| e.0), Some(409));
        }
        let after = api
            .patch(name, &PatchParams::apply("m"), &Patch::Apply(&less(name)))
            .await?;
        let data = after.data.unwrap_or_default();
        assert_eq!(
            data.contains_key("b"),
            !drop_entry,
            "{name}: {data:?} (the Update entry keeps b; without it the apply removes b)"
        );
    }
    // An empty list, or one empty entry, clears managedFields (kube-apiserver's
    // isResetManagedFields); a write without them keeps them.
    let kept = api
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"c": "3"}})),
        )
        .await?;
    ensure!(
        !entries(&kept).is_empty(),
        "a write without managedFields cleared them"
    );
    let cleared = api
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"managedFields": []}})),
        )
        .await?;
    assert_eq!(entries(&cleared), Vec::<(String, String)>::new());
    api.patch("kept", &PatchParams::apply("m"), &Patch::Apply(&less("kept")))
        .await?;
    let cleared = api
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"managedFields": [{}]}})),
        )
        .await?;
    assert_eq!(entries(&cleared), Vec::<(String, String)>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_follows_owner_references() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("gc").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let child_of = |owner: &ConfigMap, name: &str| {
        let mut child = cm(name, &[], &[]);
        child.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: owner.name_any(),
                uid: owner.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        child
    };
    for (owner_name, policy) in [
        ("bg", PropagationPolicy::Background),
        ("fg", PropagationPolicy::Foreground),
    ] {
        let owner = api
            .create(&PostParams::default(), &cm(owner_name, &[], &[]))
            .await?;
        api.create(
            &PostParams::default(),
            &child_of(&owner, &format!("{owner_name}-child")),
        )
        .await?;
        api.delete(
            owner_name,
            &DeleteParams {
                propagation_policy: Some(policy),
                ..Default::default()
            },
        )
        .await?;
        let gone = eventually(20, || {
            let api = api.clone();
            let name = format!("{owner_name}-child");
            async move { matches!(api.get_opt(&name).await, Ok(None)).then_some(()) }
        })
        .await;
        ensure!(gone.is_some(), "{owner_name}: the dependent was not collected");
    }
    let owner = api
        .create(&PostParams::default(), &cm("orphaner", &[], &[]))
        .await?;
    api.create(&PostParams::default(), &child_of(&owner, "orphan"))
        .await?;
    api.delete(
        "orphaner",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await?;
    let orphaned = eventually(20, || {
        let api = api.clone();
        async move {
            let o = api.get_opt("orphan").await.ok().flatten()?;
            o.metadata
                .owner_references
                .as_ref()
                .is_none_or(|r| r.is_empty())
                .then_some(o)
        }
    })
    .await;
    ensure!(
        orphaned.is_some(),
        "the orphaned dependent must stay, without its owner reference"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_deletion_and_preconditions_guard_it() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("finalizers").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let mut held = cm("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = api.create(&PostParams::default(), &held).await?;
    // A wrong UID precondition is a 409.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api.delete("held", &dp).await.err().context("precondition")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(409));
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.delete("held", &dp).await?;
    let marked = api.get("held").await?;
    assert!(
        marked.metadata.deletion_timestamp.is_some(),
        "kept with a deletionTimestamp"
    );
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let gone = eventually(10, || {
        let api = api.clone();
        async move { matches!(api.get_opt("held").await, Ok(None)).then_some(()) }
    })
    .await;
    ensure!(gone.is_some(), "removing the last finalizer deletes the object");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_and_pagination() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("select").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    for i in 0..7 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        api.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), &[], &[("tier", tier), ("app", "t")]),
        )
        .await?;
    }
    let names =
        |l: kube::core::ObjectList<ConfigMap>| l.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>();
    assert_eq!(
        names(api.list(&ListParams::default().labels("tier=odd")).await?),
        ["c1", "c3", "c5"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier in (even),app"))
                .await?
        ),
        ["c0", "c2", "c4", "c6"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier notin (even),!nope"))
                .await?
        ),
        ["c1", "c3", "c5"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=c4"))
                .await?
        ),
        ["c4"]
    );
    let err = api
        .list(&ListParams::default().fields("data.x=1"))
        .await
        .err()
        .context("unsupported field")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(400));

    let mut all = Vec::new();
    let mut lp = ListParams::default().labels("app=t").limit(3);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await?;
        pages += 1;
        let token = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        all.extend(names(page));
        match token {
            Some(t) => lp = lp.continue_token(&t),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(all, ["c0", "c1", "c2", "c3", "c4", "c5", "c6"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_deletes_its_content() -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let c = TestCluster::start().await;
    let ns = c.namespace("doomed").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    api.create(&PostParams::default(), &cm("inside", &[], &[]))
        .await?;
    Api::<Namespace>::all(c.client.clone())
        .delete(&ns, &DeleteParams::default())
        .await?;
    let gone = eventually(60, || {
        let c = c.client.clone();
        let ns = ns.clone();
        async move { matches!(Api::<Namespace>::all(c).get_opt(&ns).await, Ok(None)).then_some(()) }
    })
    .await;
    ensure!(gone.is_some(), "the namespace was not removed");
    let err = api
        .create(&PostParams::default(), &cm("late", &[], &[]))
        .await
        .err()
        .context("no namespace")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(404));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategic_merge_patches_merge_containers_by_name() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("smp").await;
    let api: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "image": "a:1", "ports": [{"containerPort": 80}]}, {"name": "b", "image": "b:1"}]}}))?;
    api.create(&PostParams::default(), &pod).await?;
    let patch = json!({"spec": {"containers": [{"name": "b", "image": "b:2"}]}});
    let p = api
        .patch("p", &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    let images: Vec<String> = p
        .spec
        .map(|s| s.containers.into_iter().filter_map(|c| c.image).collect())
        .unwrap_or_default();
    assert_eq!(images, ["a:1", "b:2"]);
    Ok(())
}

/// `metadata.finalizers` under a strategic merge patch: a primitive list with the merge strategy
/// (the patch's values come first, then the object's others), and
/// `$deleteFromPrimitiveList/finalizers` removes values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategic_merge_patches_merge_and_delete_finalizers() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("smp-fin").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let (a, b, d) = ("example.com/a", "example.com/b", "example.com/d");
    api.create(&PostParams::default(), &cm("f", &[], &[])).await?;
    let finalizers = |m: &ConfigMap| m.metadata.finalizers.clone().unwrap_or_default();
    let step = |patch: serde_json::Value| {
        let api = api.clone();
        async move {
            api.patch("f", &PatchParams::default(), &Patch::Strategic(patch))
                .await
        }
    };
    let m = step(json!({"metadata": {"finalizers": [a, b]}})).await?;
    assert_eq!(finalizers(&m), [a, b]);
    let m = step(json!({"metadata": {"finalizers": [d]}})).await?;
    assert_eq!(
        finalizers(&m),
        [d, a, b],
        "merged (the patch's first), not replaced"
    );
    let m = step(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [a, d]}})).await?;
    assert_eq!(finalizers(&m), [b], "deleted from the list");
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_reach_the_client_and_replay_from_the_seed() -> Result<()> {
    use slinky_apiserver::{ApiServerConfig, FaultError, FaultRule, Times};
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let c = TestCluster::start_with(ApiServerConfig {
            fault_seed: 42,
            ..Default::default()
        })
        .await;
        let Some(server) = c.embedded("fault replay") else {
            return Ok(());
        };
        let ns = c.namespace("faults").await;
        let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
        server.faults().add(FaultRule::new(
            "create",
            "configmaps",
            FaultError::Internal,
            Times::Probability(0.4),
        ));
        let mut run = Vec::new();
        for i in 0..30 {
            let r = api
                .create(&PostParams::default(), &cm(&format!("f{i}"), &[], &[]))
                .await;
            run.push(r.err().and_then(|e| api_error(&e)).map(|e| e.0));
        }
        ensure!(
            run.iter().any(Option::is_some) && run.iter().any(Option::is_none),
            "{run:?}"
        );
        ensure!(run.iter().flatten().all(|code| *code == 500), "{run:?}");
        // An "after" fault: the create happened, the client saw an error.
        server.faults().clear();
        server
            .faults()
            .add(FaultRule::new("create", "configmaps", FaultError::Internal, Times::Count(1)).after());
        let err = api
            .create(&PostParams::default(), &cm("late", &[], &[]))
            .await
            .err()
            .context("after-fault")?;
        assert_eq!(api_error(&err).map(|e| e.0), Some(500));
        ensure!(
            api.get_opt("late").await?.is_some(),
            "an after-fault still writes"
        );
        // 429 carries Retry-After; kube's client retries it by itself, so the get succeeds.
        server.faults().add(FaultRule::new(
            "get",
            "configmaps",
            FaultError::TooManyRequests(1),
            Times::Count(1),
        ));
        api.get("late").await?;
        ensure!(
            server
                .faults()
                .fired()
                .iter()
                .any(|(v, r, e)| v == "get" && r == "configmaps" && *e == FaultError::TooManyRequests(1)),
            "the 429 fired"
        );
        outcomes.push(run);
    }
    assert_eq!(outcomes[0], outcomes[1], "the same seed gives the same faults");
    Ok(())
}

/// `/version` names the release the suites judge against (kube-apiserver 1.28; the real server
/// must be one too, or the recorded expectations do not apply), with the fields version-aware
/// clients read; the OpenAPI document's `info.version` names the same release; kubectl's
/// dispatcher picks a 1.28 client for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_is_kube_apiserver_1_28() -> Result<()> {
    let c = TestCluster::start().await;
    let info = c.client.apiserver_version().await?;
    ensure!(
        (info.major.as_str(), info.minor.as_str()) == ("1", "28"),
        "the server is {}.{} ({}), the suites judge against 1.28",
        info.major,
        info.minor,
        info.git_version
    );
    ensure!(info.git_version.starts_with("v1.28."), "{}", info.git_version);
    // What kubectl prints and its dispatcher reads (a source build may leave the rest empty).
    ensure!(!info.platform.is_empty(), "{info:?}");
    // Both OpenAPI documents: v2 (what kubectl 1.28 builds its validator from) and v3.
    for path in ["/openapi/v2", "/openapi/v3/api/v1"] {
        let request = http::Request::get(path).body(Vec::new())?;
        let openapi: serde_json::Value = serde_json::from_str(&c.client.request_text(request).await?)?;
        let version = openapi
            .pointer("/info/version")
            .and_then(serde_json::Value::as_str)
            .with_context(|| format!("{path} has no info.version"))?;
        ensure!(version.starts_with("v1.28."), "{path}: info.version {version}");
    }
    let kubectl = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["version", "-o", "json"])
        .output();
    match kubectl {
        Err(e) => eprintln!("version_is_kube_apiserver_1_28: kubectl not run ({e})"),
        Ok(out) => {
            ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            ensure!(
                v.pointer("/serverVersion/minor") == Some(&json!("28")),
                "kubectl sees {}",
                v["serverVersion"]
            );
            // A client within the supported skew (one minor either side).
            let client_minor = v
                .pointer("/clientVersion/minor")
                .and_then(serde_json::Value::as_str)
                .and_then(|m| m.trim_end_matches('+').parse::<i32>().ok())
                .context("kubectl's client minor")?;
            ensure!(
                (27..=29).contains(&client_minor),
                "kubectl {client_minor} talks to a 1.28 server"
            );
        }
    }
    Ok(())
}

/// A request for a group the server does not serve (a CRD not installed) gets kube-apiserver's
/// plain-text `404 page not found`, not a Status; an unknown version or resource of a served
/// group gets a NotFound Status. Clients must treat both as "not served" (kube-rs' `get_opt`
/// returns an error for the first, not `None`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unserved_groups_get_a_plain_404_and_unknown_resources_a_status() -> Result<()> {
    use http_body_util::BodyExt;
    let c = TestCluster::start().await;
    for (path, plain) in [
        (
            "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors/x",
            true,
        ),
        ("/apis/monitoring.coreos.com/v1", true),
        ("/apis/monitoring.coreos.com", true),
        ("/apis/apps/v9/namespaces/default/deployments/x", false),
        ("/apis/apps/v1/namespaces/default/foos/x", false),
        ("/api/v1/namespaces/default/foos/x", false),
    ] {
        let response = c
            .client
            .send(http::Request::get(path).body(kube::client::Body::empty())?)
            .await?;
        ensure!(response.status() == 404, "{path}: {}", response.status());
        let media = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = response.into_body().collect().await?.to_bytes();
        let body = String::from_utf8_lossy(&body).to_string();
        if plain {
            ensure!(media.starts_with("text/plain"), "{path}: {media}");
            ensure!(body.trim_end() == "404 page not found", "{path}: {body}");
        } else {
            ensure!(media == "application/json", "{path}: {media}");
            let status: serde_json::Value = serde_json::from_str(&body)?;
            ensure!(
                status["kind"] == "Status"
                    && status["reason"] == "NotFound"
                    && status["message"] == "the server could not find the requested resource",
                "{path}: {status}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_the_token_are_unauthorized() -> Result<()> {
    let c = TestCluster::start().await;
    let Some(server) = c.embedded("unauthorized") else {
        return Ok(());
    };
    let mut config = kube::Config::new(server.url().parse()?);
    config.root_cert = None;
    config.accept_invalid_certs = true;
    let anonymous = kube::Client::try_from(config)?;
    let err = Api::<ConfigMap>::namespaced(anonymous, "default")
        .list(&ListParams::default())
        .await
        .err()
        .context("401")?;
    assert_eq!(api_error(&err).map(|e| e.0), Some(401));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflector_survives_410s_and_closed_streams() -> Result<()> {
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let c = TestCluster::start().await;
    let Some(server) = c.embedded("reflector 410") else {
        return Ok(());
    };
    let ns = c.namespace("reflector").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    for i in 0..20 {
        api.create(&PostParams::default(), &cm(&format!("r{i}"), &[("v", "0")], &[]))
            .await?;
    }
    let (reader, writer) = reflector::store();
    // With the backoff every real watch has: a failing watch retried without one spins its
    // worker at full speed, starving the rest of the test (seen once in CI: 18 minutes).
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default()).default_backoff(),
    )
    .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await?;
    server.store().set_window(5);
    for round in 0..5 {
        for i in 5..20 {
            api.patch(
                &format!("r{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"v": round.to_string()}})),
            )
            .await?;
        }
        if round % 2 == 0 {
            server.faults().force_gone(1);
        }
        server.faults().close_watches();
        api.delete(&format!("r{round}"), &DeleteParams::default()).await?;
        api.create(
            &PostParams::default(),
            &cm(&format!("new{round}"), &[("v", "x")], &[]),
        )
        .await?;
    }
    let converged = eventually(30, || {
        let api = api.clone();
        let reader = reader.clone();
        async move {
            let fresh = api.list(&ListParams::default()).await.ok()?;
            let mut want: Vec<(String, Option<String>)> = fresh
                .items
                .iter()
                .map(|o| (o.name_any(), o.data.as_ref().and_then(|d| d.get("v").cloned())))
                .collect();
            let mut have: Vec<(String, Option<String>)> = reader
                .state()
                .iter()
                .map(|o| (o.name_any(), o.data.as_ref().and_then(|d| d.get("v").cloned())))
                .collect();
            want.sort();
            have.sort();
            (want == have).then_some(want.len())
        }
    })
    .await;
    task.abort();
    assert_eq!(
        converged,
        Some(20),
        "the reflector's store must equal a fresh list"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_the_embedded_server() -> Result<()> {
    if !slinky_apiserver::testing::on_path("kubectl") {
        slinky_apiserver::testing::skip(
            "kubectl_works_against_the_embedded_server",
            "kubectl",
            "kubectl is not on PATH",
        );
        return Ok(());
    }
    let c = TestCluster::start().await;
    let kc = c.kubeconfig.display().to_string();
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(args)
            .output();
        let out = out.map_err(|e| anyhow::anyhow!("kubectl: {e}"))?;
        ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let dir = tempfile::tempdir()?;
    let crds_file = dir.path().join("crds.yaml");
    std::fs::write(&crds_file, crds_yaml()?)?;
    kubectl(&["apply", "-f", &crds_file.display().to_string()])?;
    c.install_crds(&crds()).await;
    let ns = c.namespace("kubectl").await;
    let example = example("slurm-cluster.yaml").display().to_string();
    let text = std::fs::read_to_string(&example)?.replace("namespace: slurm", &format!("namespace: {ns}"));
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, text)?;
    let applied = kubectl(&["apply", "-f", &file.display().to_string()])?;
    assert!(
        applied.contains("nodeset.slinky.slurm.net/slurm-worker-slinky created"),
        "{applied}"
    );
    let again = kubectl(&["apply", "-f", &file.display().to_string()])?;
    assert!(again.contains("unchanged"), "{again}");

    // get -w sees a pod created through the API.
    let watcher = std::process::Command::new("kubectl")
        .args([
            "--kubeconfig",
            &kc,
            "-n",
            &ns,
            "get",
            "pods",
            "-w",
            "--request-timeout=8s",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "watched"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )?;
    pods.create(&PostParams::default(), &pod).await?;

    kubectl(&[
        "-n",
        &ns,
        "scale",
        "nodeset",
        "slurm-worker-slinky",
        "--replicas=5",
    ])?;
    let replicas = kubectl(&[
        "-n",
        &ns,
        "get",
        "nss",
        "slurm-worker-slinky",
        "-o",
        "jsonpath={.spec.replicas}",
    ])?;
    assert_eq!(replicas, "5");
    // Categories, as the CRDs and kube-apiserver's built-ins declare them.
    let slurm = kubectl(&["-n", &ns, "get", "slurm", "-o", "name"])?;
    assert!(
        slurm.contains("controller.slinky.slurm.net/slurm")
            && slurm.contains("nodeset.slinky.slurm.net/slurm-worker-slinky"),
        "kubectl get slurm: {slurm}"
    );
    let all = kubectl(&["-n", &ns, "get", "all", "-o", "name"])?;
    assert!(all.contains("pod/watched"), "kubectl get all: {all}");
    kubectl(&[
        "-n",
        &ns,
        "patch",
        "nodeset",
        "slurm-worker-slinky",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":2}}"#,
    ])?;
    let table = kubectl(&["-n", &ns, "get", "nodesets"])?;
    assert!(
        table.contains("slurm-worker-slinky") && table.contains("REPLICAS"),
        "{table}"
    );
    kubectl(&["-n", &ns, "delete", "nodeset", "slurm-worker-slinky"])?;
    let none = kubectl(&["-n", &ns, "get", "nodesets", "-o", "name"])?;
    assert_eq!(none.trim(), "");
    kubectl(&["-n", &ns, "wait", "--for=delete", "pod/watched", "--timeout=1s"]).err();
    pods.delete("watched", &DeleteParams::default()).await?;
    let out = tokio::task::spawn_blocking(move || watcher.wait_with_output()).await??;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("watched"),
        "kubectl get -w did not show the pod: {text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_dir_survives_a_restart_and_a_torn_write() -> Result<()> {
    use slinky_apiserver::{ApiServer, ApiServerConfig};
    let dir = tempfile::tempdir()?;
    let config = || ApiServerConfig {
        state_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let server = ApiServer::start(config()).await?;
    let client = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let kept = cms
        .create(&PostParams::default(), &cm("kept", &[("k", "v")], &[]))
        .await?;
    cms.create(&PostParams::default(), &cm("gone", &[], &[])).await?;
    cms.delete("gone", &DeleteParams::default()).await?;
    let crds = crds();
    let crd_api = Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(client.clone());
    for crd in &crds {
        crd_api.create(&PostParams::default(), crd).await?;
    }
    Api::<NodeSet>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &nodeset("w", 2)?)
        .await?;
    server.shutdown().await;
    // A crash in the middle of a write leaves a torn last record.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("wal.jsonl"))?
        .write_all(b"{\"rev\": 99, \"gro")?;

    let server = ApiServer::start(config()).await?;
    let client = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let again = cms.get("kept").await?;
    assert_eq!(again.uid(), kept.uid());
    assert_eq!(again.resource_version(), kept.resource_version());
    assert!(cms.get_opt("gone").await?.is_none(), "the deletion was kept too");
    let ns = Api::<NodeSet>::namespaced(client.clone(), "default")
        .get("w")
        .await?;
    assert_eq!(
        ns.spec.replicas,
        Some(2),
        "custom resources of restored CRDs are served"
    );
    let next = cms.create(&PostParams::default(), &cm("after", &[], &[])).await?;
    let (a, b): (u64, u64) = (
        next.resource_version().unwrap_or_default().parse()?,
        kept.resource_version().unwrap_or_default().parse()?,
    );
    ensure!(
        a > b,
        "resourceVersions keep increasing after a restart ({a} <= {b})"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_pod_terminates_gracefully_and_an_unbound_one_goes_at_once() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("graceful").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    // Bound to a node no kubelet serves (on either server): it stays terminating until a
    // delete with a grace period of 0.
    let bound: Pod = serde_json::from_value(json!({"metadata": {"name": "bound"},
        "spec": {"nodeName": "no-kubelet-node", "containers": [{"name": "c", "image": "x"}]}}))?;
    let created = pods.create(&PostParams::default(), &bound).await?;
    let from = created.resource_version().unwrap_or_default();
    let grace = |s: u32| DeleteParams {
        grace_period_seconds: Some(s),
        ..Default::default()
    };
    let deleted = pods.delete("bound", &grace(30)).await?;
    let terminating = deleted.left().context("a graceful delete answers the pod")?;
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    let still = pods.get("bound").await?;
    assert_eq!(
        still.metadata.deletion_grace_period_seconds,
        Some(30),
        "still there, terminating"
    );
    // A second delete may shorten the grace period, not lengthen it.
    pods.delete("bound", &grace(60)).await?;
    assert_eq!(
        pods.get("bound").await?.metadata.deletion_grace_period_seconds,
        Some(30)
    );
    pods.delete("bound", &grace(10)).await?;
    assert_eq!(
        pods.get("bound").await?.metadata.deletion_grace_period_seconds,
        Some(10)
    );
    // Grace 0: gone.
    pods.delete("bound", &grace(0)).await?;
    assert!(pods.get_opt("bound").await?.is_none(), "grace 0 deletes at once");
    // The watch (from the creation) saw it: MODIFIED (terminating, 30), MODIFIED (10), MODIFIED
    // (the grace period ended: 0), DELETED.
    let mut stream = pods
        .watch(&WatchParams::default().timeout(5), &from)
        .await?
        .boxed();
    let mut seen = Vec::new();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await?? {
        match ev {
            WatchEvent::Added(p) => seen.push(("ADDED", p.metadata.deletion_grace_period_seconds)),
            WatchEvent::Modified(p) => seen.push(("MODIFIED", p.metadata.deletion_grace_period_seconds)),
            WatchEvent::Deleted(p) => seen.push(("DELETED", p.metadata.deletion_grace_period_seconds)),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => bail!("watch error {e:?}"),
        }
        if seen.last().is_some_and(|(k, _)| *k == "DELETED") {
            break;
        }
    }
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["MODIFIED", "MODIFIED", "MODIFIED", "DELETED"], "{seen:?}");
    assert_eq!(
        seen[..3],
        [
            ("MODIFIED", Some(30)),
            ("MODIFIED", Some(10)),
            ("MODIFIED", Some(0))
        ],
        "{seen:?}"
    );

    // Unbound (no kubelet will ever run it): deleted at once, whatever the grace period.
    let unbound: Pod = serde_json::from_value(
        json!({"metadata": {"name": "unbound"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )?;
    pods.create(&PostParams::default(), &unbound).await?;
    pods.delete("unbound", &grace(30)).await?;
    assert!(
        pods.get_opt("unbound").await?.is_none(),
        "an unbound pod goes at once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_kubelet_finishes_terminating_pods_after_the_scaled_grace_period() -> Result<()> {
    let c = TestCluster::start_with(slinky_apiserver::ApiServerConfig {
        lifecycle: Some(slinky_apiserver::LifecycleConfig {
            nodes: 1,
            schedule_delay: Duration::from_millis(10),
            ready_delay: Duration::from_millis(10),
            grace_period_scale: 0.01,
        }),
        ..Default::default()
    })
    .await;
    if c.embedded("simulated kubelet").is_none() {
        return Ok(());
    }
    let ns = c.namespace("kubelet").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = eventually(20, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("p").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
    ensure!(running.is_some(), "the simulation runs the pod");
    // Default grace period (30 s), scaled by 0.01: terminating first, then gone.
    let deleted = pods.delete("p", &DeleteParams::default()).await?;
    let terminating = deleted.left().context("terminating")?;
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    assert!(
        pods.get_opt("p")
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "observable while terminating"
    );
    let gone = eventually(20, || {
        let pods = pods.clone();
        async move { matches!(pods.get_opt("p").await, Ok(None)).then_some(()) }
    })
    .await;
    ensure!(
        gone.is_some(),
        "the simulated kubelet removes the pod after its grace period"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_generators_send_protobuf_and_work() -> Result<()> {
    if !slinky_apiserver::testing::on_path("kubectl") {
        slinky_apiserver::testing::skip(
            "kubectl_generators_send_protobuf_and_work",
            "kubectl",
            "kubectl is not on PATH",
        );
        return Ok(());
    }
    let c = TestCluster::start().await;
    let kc = c.kubeconfig.display().to_string();
    let kubectl = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // A namespace of our own name (generators send protobuf bodies for built-in kinds).
    let ns = format!("gen-{}", &c.namespace("probe").await[6..]);
    kubectl(&["create", "namespace", &ns])?;
    kubectl(&[
        "-n",
        &ns,
        "create",
        "configmap",
        "cm",
        "--from-literal=a=b",
        "--from-literal=empty=",
    ])?;
    kubectl(&[
        "-n",
        &ns,
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=password=hunter2",
    ])?;
    kubectl(&[
        "-n",
        &ns,
        "create",
        "service",
        "clusterip",
        "svc",
        "--tcp=80:8080",
    ])?;
    kubectl(&[
        "-n",
        &ns,
        "create",
        "deployment",
        "d",
        "--image=nginx:1.25",
        "--replicas=2",
    ])?;
    kubectl(&[
        "-n",
        &ns,
        "run",
        "r",
        "--image=busybox:1.36",
        "--restart=Never",
        "--",
        "sleep",
        "10",
    ])?;
    kubectl(&["-n", &ns, "expose", "deployment", "d", "--port=81", "--name=dsvc"])?;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let cm = cms.get("cm").await?;
    assert_eq!(
        cm.data,
        Some(BTreeMap::from([
            ("a".into(), "b".into()),
            ("empty".into(), String::new())
        ]))
    );
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), &ns)
        .get("s")
        .await?;
    let password = secret.data.and_then(|d| d.get("password").cloned());
    assert_eq!(password.map(|b| b.0), Some(b"hunter2".to_vec()));
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.client.clone(), &ns);
    let svc = services.get("svc").await?.spec.context("spec")?;
    let port = svc.ports.and_then(|p| p.into_iter().next()).context("a port")?;
    assert_eq!(port.port, 80);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
            8080
        ))
    );
    let exposed = services.get("dsvc").await?.spec.context("spec")?;
    assert_eq!(
        exposed.selector,
        Some(BTreeMap::from([("app".into(), "d".into())]))
    );
    let deployment = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.client.clone(), &ns)
        .get("d")
        .await?;
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    let image = spec
        .template
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image);
    assert_eq!(image.as_deref(), Some("nginx:1.25"));
    let pod = Api::<Pod>::namespaced(c.client.clone(), &ns).get("r").await?;
    let container = pod
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .context("a container")?;
    assert_eq!(container.args, Some(vec!["sleep".to_string(), "10".to_string()]));
    // And back: kubectl reads them (tables in JSON).
    let table = kubectl(&["-n", &ns, "get", "configmaps,secrets,services,deployments,pods"])?;
    for name in [
        "configmap/cm",
        "secret/s",
        "service/svc",
        "deployment.apps/d",
        "pod/r",
    ] {
        assert!(
            table.contains(name.split('/').nth(1).unwrap_or_default()),
            "{name} missing from {table}"
        );
    }
    kubectl(&["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_answers_when_a_client_asks_for_them() -> Result<()> {
    let c = TestCluster::start().await;
    let ns = c.namespace("protobuf").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    api.create(&PostParams::default(), &cm("p", &[("k", "v")], &[("app", "x")]))
        .await?;
    let request = http::Request::get(format!("/api/v1/namespaces/{ns}/configmaps/p"))
        .header("Accept", "application/vnd.kubernetes.protobuf, application/json")
        .body(Vec::new())?;
    let response = c.client.send(request.map(kube::client::Body::from)).await?;
    let ctype = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_eq!(ctype, "application/vnd.kubernetes.protobuf");
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await?
        .to_bytes();
    // The magic "k8s\0", then the envelope naming the kind, then the object.
    ensure!(bytes.starts_with(b"k8s\0"), "a protobuf envelope, got {bytes:?}");
    let text = String::from_utf8_lossy(&bytes);
    ensure!(text.contains("ConfigMap") && text.contains("app"), "{text:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_through_events_k8s_io_are_core_events_too() -> Result<()> {
    use k8s_openapi::api::{core::v1::Event as CoreEvent, events::v1::Event};
    let c = TestCluster::start().await;
    let ns = c.namespace("events").await;
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "p.1"},
        "eventTime": "2026-01-02T03:04:05.000000Z",
        "regarding": {"kind": "Pod", "name": "p", "namespace": ns, "apiVersion": "v1"},
        "note": "pod p scaled", "reason": "Scaled", "type": "Normal", "action": "Scale",
        "reportingController": "slinky-host", "reportingInstance": "slinky-host-0",
    }))?;
    let written = Api::<Event>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &event)
        .await?;
    assert_eq!(written.note.as_deref(), Some("pod p scaled"));
    let core = Api::<CoreEvent>::namespaced(c.client.clone(), &ns)
        .get("p.1")
        .await?;
    assert_eq!(core.message.as_deref(), Some("pod p scaled"));
    assert_eq!(core.involved_object.name.as_deref(), Some("p"));
    assert_eq!(core.reporting_component.as_deref(), Some("slinky-host"));
    assert_eq!(core.metadata.uid, written.metadata.uid, "one object, two views");
    // A change through one API is seen through the other.
    Api::<CoreEvent>::namespaced(c.client.clone(), &ns)
        .patch(
            "p.1",
            &PatchParams::default(),
            &Patch::Merge(json!({"series": {"count": 2, "lastObservedTime": "2026-01-02T03:05:05.000000Z"}})),
        )
        .await?;
    let again = Api::<Event>::namespaced(c.client.clone(), &ns).get("p.1").await?;
    assert_eq!(again.series.map(|s| s.count), Some(2));
    let listed = Api::<CoreEvent>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    assert_eq!(listed.items.len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_over_the_api_limits_are_refused_with_kube_apiservers_message() -> Result<()> {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let c = TestCluster::start().await;
    let ns = c.namespace("eventlimits").await;
    let recorder = Recorder::new(c.client.clone(), Reporter::from("slinky-host".to_string()));
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some("p".into()),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let event = |reason: &str, note: String| Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    let limit = "Invalid value: \"\": can have at most 1024 characters";
    // As the host publishes Events (events.k8s.io/v1, created as kube's Recorder does): a note one byte
    // over the limit (Go's `len` counts bytes: 512 two-byte characters and one more byte) is
    // refused with kube-apiserver's message, which names the core field `message`.
    let err = recorder
        .publish(&event("Long", format!("{}x", "é".repeat(512))), &regarding)
        .await
        .err()
        .context("a 1025-byte note must be refused")?;
    let kube::Error::Api(status) = &err else {
        bail!("expected an API error, got {err}")
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    ensure!(
        status.message.starts_with("Event \"p.")
            && status
                .message
                .ends_with(&format!("\" is invalid: message: {limit}")),
        "{}",
        status.message
    );
    // At the limit it is written.
    recorder
        .publish(&event("Full", "é".repeat(512)), &regarding)
        .await?;
    let core: Api<CoreEvent> = Api::namespaced(c.client.clone(), &ns);
    let stored = core.list(&ListParams::default()).await?.items;
    assert_eq!(stored.len(), 1, "only the Event within the limit was stored");
    let name = stored[0].name_any();
    assert_eq!(stored[0].message.as_deref().map(str::len), Some(1024));
    // An update over the limit is refused too, through either API.
    let err = core
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"message": "m".repeat(1025)})),
        )
        .await
        .err()
        .context("a 1025-byte message update must be refused")?;
    let kube::Error::Api(status) = &err else {
        bail!("expected an API error, got {err}")
    };
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        format!("Event \"{name}\" is invalid: message: {limit}")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_prints_kube_apiservers_columns_for_workloads_claims_and_budgets() -> Result<()> {
    if !slinky_apiserver::testing::on_path("kubectl") {
        slinky_apiserver::testing::skip(
            "kubectl_get_prints_kube_apiservers_columns",
            "kubectl",
            "kubectl is not on PATH",
        );
        return Ok(());
    }
    let c = TestCluster::start().await;
    let ns = c.namespace("columns").await;
    let kc = c.kubeconfig.display().to_string();
    let labels = json!({"app": "web"});
    let template = json!({"metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let objects = [
        (
            "apps/v1",
            "StatefulSet",
            json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
            "serviceName": "web", "selector": {"matchLabels": labels}, "template": template}}),
        ),
        (
            "apps/v1",
            "Deployment",
            json!({"metadata": {"name": "api"}, "spec": {
            "selector": {"matchLabels": labels}, "template": template}}),
        ),
        (
            "apps/v1",
            "ReplicaSet",
            json!({"metadata": {"name": "rs"}, "spec": {"replicas": 2,
            "selector": {"matchLabels": labels}, "template": template}}),
        ),
        (
            "policy/v1",
            "PodDisruptionBudget",
            json!({"metadata": {"name": "guard"}, "spec": {
            "minAvailable": 1, "selector": {"matchLabels": labels}}}),
        ),
        (
            "v1",
            "PersistentVolumeClaim",
            json!({"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        ),
        (
            "v1",
            "Pod",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        ),
    ];
    for (api_version, kind, mut obj) in objects {
        obj["apiVersion"] = api_version.into();
        obj["kind"] = kind.into();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let plural = format!("{}s", kind.to_lowercase());
        let ar = kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural,
        };
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(c.client.clone(), &ns, &ar);
        api.create(&PostParams::default(), &serde_json::from_value(obj)?)
            .await
            .with_context(|| format!("creating the {kind}"))?;
    }
    // Each table as its words, the age column (with -o wide where the header has `AGE`, whose
    // columns before it are one word each; else the last) left out: what both servers must
    // print alike.
    let get = |resource: &str| -> Result<Vec<Vec<String>>> {
        let (kind, wide) = match resource.strip_suffix(" -o wide") {
            Some(kind) => (kind, true),
            None => (resource, false),
        };
        let mut args = vec!["--kubeconfig", kc.as_str(), "-n", ns.as_str(), "get", kind];
        if wide {
            args.extend(["-o", "wide"]);
        }
        let out = std::process::Command::new("kubectl").args(&args).output()?;
        ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let age = text
            .lines()
            .next()
            .and_then(|header| header.split_whitespace().position(|w| w == "AGE"))
            .context("no AGE column")?;
        Ok(text
            .lines()
            .map(|l| {
                let mut words: Vec<String> = l.split_whitespace().map(str::to_string).collect();
                if wide && words.len() > age {
                    words.remove(age);
                } else {
                    words.pop();
                }
                words
            })
            .collect())
    };
    let expect = |resource: &str, want: &[&[&str]]| -> Result<()> {
        let got = get(resource)?;
        let want: Vec<Vec<String>> = want
            .iter()
            .map(|l| l.iter().map(|w| w.to_string()).collect())
            .collect();
        ensure!(got == want, "kubectl get {resource}: {got:?}, want {want:?}");
        Ok(())
    };
    expect("statefulsets", &[&["NAME", "READY"], &["web", "0/2"]])?;
    expect(
        "statefulsets -o wide",
        &[
            &["NAME", "READY", "CONTAINERS", "IMAGES"],
            &["web", "0/2", "c", "x"],
        ],
    )?;
    expect(
        "replicasets",
        &[&["NAME", "DESIRED", "CURRENT", "READY"], &["rs", "2", "0", "0"]],
    )?;
    expect(
        "replicasets -o wide",
        &[
            &[
                "NAME",
                "DESIRED",
                "CURRENT",
                "READY",
                "CONTAINERS",
                "IMAGES",
                "SELECTOR",
            ],
            &["rs", "2", "0", "0", "c", "x", "app=web"],
        ],
    )?;
    expect(
        "deployments -o wide",
        &[
            &[
                "NAME",
                "READY",
                "UP-TO-DATE",
                "AVAILABLE",
                "CONTAINERS",
                "IMAGES",
                "SELECTOR",
            ],
            &["api", "0/1", "0", "0", "c", "x", "app=web"],
        ],
    )?;
    expect(
        "deployments",
        &[
            &["NAME", "READY", "UP-TO-DATE", "AVAILABLE"],
            &["api", "0/1", "0", "0"],
        ],
    )?;
    expect(
        "poddisruptionbudgets",
        &[
            &[
                "NAME",
                "MIN",
                "AVAILABLE",
                "MAX",
                "UNAVAILABLE",
                "ALLOWED",
                "DISRUPTIONS",
            ],
            &["guard", "1", "N/A", "0"],
        ],
    )?;
    expect(
        "persistentvolumeclaims",
        &[
            &[
                "NAME",
                "STATUS",
                "VOLUME",
                "CAPACITY",
                "ACCESS",
                "MODES",
                "STORAGECLASS",
            ],
            &["data", "Pending"],
        ],
    )?;
    expect(
        "pods",
        &[
            &["NAME", "READY", "STATUS", "RESTARTS"],
            &["p", "0/1", "Pending", "0"],
        ],
    )?;
    expect(
        "pods -o wide",
        &[
            &[
                "NAME",
                "READY",
                "STATUS",
                "RESTARTS",
                "IP",
                "NODE",
                "NOMINATED",
                "NODE",
                "READINESS",
                "GATES",
            ],
            &["p", "0/1", "Pending", "0", "<none>", "<none>", "<none>", "<none>"],
        ],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_whose_pods_are_refused_gets_failed_create_events() -> Result<()> {
    let c = TestCluster::start_with(slinky_apiserver::ApiServerConfig {
        lifecycle: Some(slinky_apiserver::LifecycleConfig {
            nodes: 1,
            schedule_delay: Duration::from_millis(10),
            ready_delay: Duration::from_millis(10),
            grace_period_scale: 0.01,
        }),
        statefulsets: true,
        ..Default::default()
    })
    .await;
    let ns = c.namespace("sts-events").await;
    let sets = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c.client.clone(), &ns);
    // A cluster whose kube-controller-manager runs no StatefulSet controller (the realkube tool
    // runs only the garbage collector, namespaces, ServiceAccounts and PVC protection) has
    // nothing to judge: a valid StatefulSet that gets no pod says so.
    let probe: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"serviceName": "probe", "selector": {"matchLabels": {"app": "probe"}},
            "template": {"metadata": {"labels": {"app": "probe"}}, "spec": {"containers": [{
                "name": "c", "image": "x"}]}}}}))?;
    sets.create(&PostParams::default(), &probe).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    if eventually(20, || async { pods.get_opt("probe-0").await.ok()? })
        .await
        .is_none()
    {
        eprintln!(
            "a_statefulset_whose_pods_are_refused_gets_failed_create_events: skipped, this cluster runs no \
             StatefulSet controller (kube-controller-manager --controllers …,statefulset)"
        );
        return Ok(());
    }
    // Valid as a StatefulSet (its pod template is not validated), refused as a pod.
    let sts: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "bad"},
        "spec": {"serviceName": "bad", "selector": {"matchLabels": {"app": "bad"}},
            "template": {"metadata": {"labels": {"app": "bad"}}, "spec": {"containers": [{
                "name": "c", "image": "x", "volumeMounts": [{"name": "missing", "mountPath": "/m"}]}]}}}}))?;
    sets.create(&PostParams::default(), &sts).await?;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(c.client.clone(), &ns);
    let event = eventually(60, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("FailedCreate") && e.involved_object.name.as_deref() == Some("bad")
        })
    })
    .await
    .context("no FailedCreate Event (is the StatefulSet controller running?)")?;
    let message = event.message.unwrap_or_default();
    ensure!(event.type_.as_deref() == Some("Warning"), "{:?}", event.type_);
    ensure!(
        message.starts_with("create Pod bad-0 in StatefulSet bad failed error: ")
            && message.contains("spec.containers[0].volumeMounts[0].name: Not found: \"missing\""),
        "{message}"
    );
    ensure!(event.involved_object.kind.as_deref() == Some("StatefulSet"));
    ensure!(
        event.source.and_then(|s| s.component).as_deref() == Some("statefulset-controller"),
        "the Event is the StatefulSet controller's"
    );
    // Repeats are folded into one Event.
    let folded = eventually(60, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let failed: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("FailedCreate")
                    && e.involved_object.name.as_deref() == Some("bad")
            })
            .collect();
        (failed.len() == 1 && failed[0].count.unwrap_or(0) > 1).then_some(())
    })
    .await;
    ensure!(
        folded.is_some(),
        "repeated failures are not one Event with a growing count"
    );
    // Stop the failing creates (the simulated controller retries every pass).
    sets.delete("bad", &DeleteParams::default()).await?;
    Ok(())
}

/// The pods of `ns` made Running and Ready, over and over, by the test: on a real cluster
/// without a kubelet (the realkube tool's), so that a Deployment's rollout can proceed.
async fn stand_in_kubelet(pods: Api<Pod>) {
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if ready || p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let at = k8s_openapi::jiff::Timestamp::now()
                    .strftime("%Y-%m-%dT%H:%M:%SZ")
                    .to_string();
                let condition = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": at});
                let status = json!({"status": {"phase": "Running", "conditions": [
                    condition("PodScheduled"), condition("Initialized"),
                    condition("ContainersReady"), condition("Ready")]}});
                let _ = pods
                    .patch_status(&p.name_any(), &PatchParams::default(), &Patch::Merge(status))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a Deployment, its ReplicaSets and their pods are at one moment (pods being deleted
/// left out unless `terminating`).
struct Rollout {
    deployment: k8s_openapi::api::apps::v1::Deployment,
    sets: Vec<k8s_openapi::api::apps::v1::ReplicaSet>,
    pods: Vec<Pod>,
    terminating: usize,
}

impl Rollout {
    async fn read(c: &TestCluster, ns: &str, name: &str) -> Result<Self> {
        use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
        let deployment = Api::<Deployment>::namespaced(c.client.clone(), ns)
            .get(name)
            .await?;
        let uid = deployment.metadata.uid.clone().unwrap_or_default();
        let controlled_by =
            |refs: &Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
             uid: &str| {
                refs.iter()
                    .flatten()
                    .any(|r| r.uid == uid && r.controller == Some(true))
            };
        let mut sets: Vec<ReplicaSet> = Api::<ReplicaSet>::namespaced(c.client.clone(), ns)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|rs| controlled_by(&rs.metadata.owner_references, &uid))
            .collect();
        // By revision: ReplicaSets made within one second have equal creation timestamps.
        sets.sort_by_key(revision);
        let set_uids: Vec<String> = sets.iter().filter_map(|rs| rs.metadata.uid.clone()).collect();
        let all: Vec<Pod> = Api::<Pod>::namespaced(c.client.clone(), ns)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| {
                set_uids
                    .iter()
                    .any(|u| controlled_by(&p.metadata.owner_references, u))
            })
            .collect();
        let terminating = all
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count();
        Ok(Rollout {
            deployment,
            sets,
            pods: all
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect(),
            terminating,
        })
    }

    fn status(&self, f: impl Fn(&k8s_openapi::api::apps::v1::DeploymentStatus) -> Option<i32>) -> i32 {
        self.deployment.status.as_ref().and_then(f).unwrap_or(0)
    }

    /// Every replica of the newest template there, updated, ready and available, the
    /// generation observed, no old pod left.
    fn done(&self, replicas: i32) -> bool {
        let generation = self.deployment.metadata.generation.unwrap_or(0);
        let newest = self.sets.iter().max_by_key(|rs| revision(rs));
        self.status(|s| s.replicas) == replicas
            && self.status(|s| s.updated_replicas) == replicas
            && self.status(|s| s.ready_replicas) == replicas
            && self.status(|s| s.available_replicas) == replicas
            && self
                .deployment
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                == Some(generation)
            && self.pods.len() == replicas as usize
            && self.terminating == 0
            && newest.is_some_and(|rs| self.pods.iter().all(|p| hash(&p.metadata) == hash(&rs.metadata)))
    }

    fn condition(&self, kind: &str) -> Option<(String, String, String)> {
        self.deployment
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_.as_deref() == Some(kind))
            .map(|c| {
                (
                    c.status.clone().unwrap_or_default(),
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )
            })
    }
}

fn hash(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"))
        .cloned()
        .unwrap_or_default()
}

fn annotation(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, name: &str) -> String {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .cloned()
        .unwrap_or_default()
}

fn revision(rs: &k8s_openapi::api::apps::v1::ReplicaSet) -> i64 {
    annotation(&rs.metadata, "deployment.kubernetes.io/revision")
        .parse()
        .unwrap_or(0)
}

/// Poll the rollout every 50 ms until `done`, for at most `secs` seconds, checking `invariant`
/// of every state seen on the way (it says what is wrong, if anything).
async fn follow(
    c: &TestCluster,
    ns: &str,
    secs: u64,
    done: impl Fn(&Rollout) -> bool,
    invariant: impl Fn(&Rollout) -> Option<String>,
) -> Result<Rollout> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let now = Rollout::read(c, ns, "web").await?;
        if let Some(wrong) = invariant(&now) {
            bail!("{wrong}");
        }
        if done(&now) {
            return Ok(now);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "not done after {secs} s: status {:?}, sets {:?}, {} pods ({} terminating)",
                now.deployment.status,
                now.sets
                    .iter()
                    .map(|rs| (rs.metadata.name.clone(), rs.spec.replicas, rs.status.clone()))
                    .collect::<Vec<_>>(),
                now.pods.len(),
                now.terminating
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Deployment as kube-controller-manager runs it: a ReplicaSet `<name>-<pod-template-hash>`
/// per template revision (labels, selector, annotations, controller reference), pods
/// `<replicaset>-<5 characters>` that become ready, the status and conditions; a scale; a
/// rolling update within `maxSurge`/`maxUnavailable`; a `Recreate` that never runs two
/// templates at once; the deletion taking ReplicaSets and pods with it. On the embedded server
/// the simulated controllers and kubelet do it; a real cluster needs kube-controller-manager's
/// `deployment` and `replicaset` controllers (without a kubelet the test makes pods ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_rolls_out_through_replica_sets_and_its_pods_go_with_it() -> Result<()> {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    let c = TestCluster::start_with(slinky_apiserver::ApiServerConfig {
        lifecycle: Some(slinky_apiserver::LifecycleConfig {
            nodes: 2,
            schedule_delay: Duration::from_millis(10),
            ready_delay: Duration::from_millis(20),
            grace_period_scale: 0.01,
        }),
        deployments: true,
        ..Default::default()
    })
    .await;
    let ns = c.namespace("deploy").await;
    let deployments = Api::<Deployment>::namespaced(c.client.clone(), &ns);
    let sets = Api::<ReplicaSet>::namespaced(c.client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let kubelet = c
        .server
        .is_none()
        .then(|| tokio::spawn(stand_in_kubelet(pods.clone())));
    let result = deployment_rollout(&c, &ns, &deployments, &sets, &pods).await;
    if let Some(k) = kubelet {
        k.abort();
    }
    result
}

async fn deployment_rollout(
    c: &TestCluster,
    ns: &str,
    deployments: &Api<k8s_openapi::api::apps::v1::Deployment>,
    sets: &Api<k8s_openapi::api::apps::v1::ReplicaSet>,
    pods: &Api<Pod>,
) -> Result<()> {
    let web: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "annotations": {"team": "hpc"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}))?;
    deployments.create(&PostParams::default(), &web).await?;
    if eventually(20, || async {
        sets.list(&ListParams::default())
            .await
            .ok()?
            .items
            .first()
            .cloned()
    })
    .await
    .is_none()
    {
        eprintln!(
            "a_deployment_rolls_out_through_replica_sets: skipped, this cluster runs no deployment \
             controller (kube-controller-manager --controllers …,deployment,replicaset)"
        );
        return Ok(());
    }

    // Three ready pods of one ReplicaSet.
    let first = follow(c, ns, 60, |r| r.done(3), |_| None).await?;
    let uid = first.deployment.metadata.uid.clone().unwrap_or_default();
    let [rs] = first.sets.as_slice() else {
        bail!("{} ReplicaSets for one template", first.sets.len());
    };
    let h = hash(&rs.metadata);
    let rs_name = format!("web-{h}");
    ensure!(
        rs.metadata.name.as_deref() == Some(rs_name.as_str()),
        "{:?}",
        rs.metadata.name
    );
    let owner = rs.metadata.owner_references.clone().unwrap_or_default();
    ensure!(
        owner.len() == 1
            && owner[0].kind == "Deployment"
            && owner[0].uid == uid
            && owner[0].controller == Some(true)
            && owner[0].block_owner_deletion == Some(true),
        "{owner:?}"
    );
    let labels = rs.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.get("app").map(String::as_str) == Some("web") && labels.len() == 2,
        "{labels:?}"
    );
    let spec = rs.spec.clone();
    ensure!(
        spec.selector.match_labels
            == Some(BTreeMap::from([
                ("app".into(), "web".into()),
                ("pod-template-hash".into(), h.clone())
            ])),
        "{:?}",
        spec.selector
    );
    ensure!(
        spec.template.and_then(|t| t.metadata).and_then(|m| m.labels) == Some(labels.clone()),
        "the template carries the ReplicaSet's labels"
    );
    for (name, want) in [
        ("deployment.kubernetes.io/revision", "1"),
        ("deployment.kubernetes.io/desired-replicas", "3"),
        ("deployment.kubernetes.io/max-replicas", "4"),
        ("team", "hpc"),
    ] {
        ensure!(
            annotation(&rs.metadata, name) == want,
            "{name}: {:?}",
            rs.metadata.annotations
        );
    }
    ensure!(annotation(&first.deployment.metadata, "deployment.kubernetes.io/revision") == "1");
    let status = rs.status.clone().context("a ReplicaSet status")?;
    ensure!(
        (
            status.replicas,
            status.ready_replicas,
            status.available_replicas,
            status.fully_labeled_replicas
        ) == (3, Some(3), Some(3), Some(3))
            && status.observed_generation == rs.metadata.generation,
        "{status:?}"
    );
    for p in &first.pods {
        let name = p.name_any();
        let suffix = name.strip_prefix(&format!("{rs_name}-")).unwrap_or_default();
        ensure!(suffix.len() == 5, "pod {name} is not {rs_name}-<5 characters>");
        let owner = p.metadata.owner_references.clone().unwrap_or_default();
        ensure!(
            owner.len() == 1 && owner[0].kind == "ReplicaSet" && owner[0].name == rs_name,
            "{owner:?}"
        );
    }
    ensure!(
        first.condition("Available")
            == Some((
                "True".into(),
                "MinimumReplicasAvailable".into(),
                "Deployment has minimum availability.".into()
            )),
        "{:?}",
        first.condition("Available")
    );
    let progressed = format!("ReplicaSet \"{rs_name}\" has successfully progressed.");
    ensure!(
        first.condition("Progressing") == Some(("True".into(), "NewReplicaSetAvailable".into(), progressed)),
        "{:?}",
        first.condition("Progressing")
    );

    // Scaled to 5: the same ReplicaSet grows, its annotations follow.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await?;
    let scaled = follow(
        c,
        ns,
        60,
        |r| r.done(5),
        |r| (r.sets.len() != 1).then(|| format!("a scale made {} ReplicaSets", r.sets.len())),
    )
    .await?;
    ensure!(
        annotation(
            &scaled.sets[0].metadata,
            "deployment.kubernetes.io/desired-replicas"
        ) == "5"
    );
    ensure!(annotation(&scaled.sets[0].metadata, "deployment.kubernetes.io/max-replicas") == "7");

    // A new image rolls: a second ReplicaSet (revision 2) takes over, never more than
    // 5 + maxSurge (2) pods, never fewer than 5 - maxUnavailable (1) available.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:2"}]}}}}),
            ),
        )
        .await?;
    let rolled = follow(
        c,
        ns,
        90,
        |r| r.sets.len() == 2 && r.done(5),
        |r| {
            let (pods, available) = (r.pods.len(), r.status(|s| s.available_replicas));
            if pods > 7 {
                Some(format!(
                    "{pods} pods during a rolling update of 5 with maxSurge 2"
                ))
            } else if available < 4 {
                Some(format!(
                    "{available} available during a rolling update of 5 with maxUnavailable 1"
                ))
            } else {
                None
            }
        },
    )
    .await?;
    let (old, new) = (&rolled.sets[0], &rolled.sets[1]);
    ensure!(old.metadata.name.as_deref() == Some(rs_name.as_str()));
    ensure!(old.spec.replicas == Some(0), "the old ReplicaSet is scaled to 0");
    ensure!((revision(old), revision(new)) == (1, 2));
    ensure!(annotation(&rolled.deployment.metadata, "deployment.kubernetes.io/revision") == "2");
    let new_name = new.metadata.name.clone().unwrap_or_default();
    ensure!(new_name == format!("web-{}", hash(&new.metadata)) && hash(&new.metadata) != h);

    // Recreate: the old pods all go before a new one is made.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null},
                "template": {"spec": {"containers": [{"name": "c", "image": "x:3"}]}}}}),
            ),
        )
        .await?;
    let recreated = follow(
        c,
        ns,
        90,
        |r| r.sets.len() == 3 && r.done(5),
        |r| {
            let hashes: std::collections::BTreeSet<String> =
                r.pods.iter().map(|p| hash(&p.metadata)).collect();
            (hashes.len() > 1 && r.sets.len() == 3)
                .then(|| format!("Recreate runs pods of {} templates at once", hashes.len()))
        },
    )
    .await?;
    ensure!(revision(&recreated.sets[2]) == 3);

    // The Deployment's and the ReplicaSets' Events, as kube-controller-manager's.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(c.client.clone(), ns);
    let scaled_up = format!("Scaled up replica set {rs_name} to 3");
    let seen = eventually(20, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let by = |reason: &str, what: &str| {
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.starts_with(what))
            })
        };
        (by("ScalingReplicaSet", &scaled_up) && by("SuccessfulCreate", &format!("Created pod: {rs_name}-")))
            .then_some(())
    })
    .await;
    ensure!(seen.is_some(), "no ScalingReplicaSet/SuccessfulCreate Events");

    // Deleted: the garbage collector takes the ReplicaSets, then the pods.
    deployments.delete("web", &DeleteParams::default()).await?;
    let gone = eventually(60, || async {
        let rs_left = sets.list(&ListParams::default()).await.ok()?.items.len();
        let pods_left = pods.list(&ListParams::default()).await.ok()?.items.len();
        (rs_left == 0 && pods_left == 0).then_some(())
    })
    .await;
    ensure!(
        gone.is_some(),
        "the ReplicaSets and pods outlive their Deployment"
    );
    Ok(())
}

/// Kubernetes 1.28 (its `SidecarContainers` gate is off by default) drops the `restartPolicy` of
/// init containers, native sidecars, from a pod and from a StatefulSet's template, at create and
/// at an update of an object that had none: the sidecar then runs as a plain init container. The
/// embedded server does the same with the gate off. Found on the real node, where the
/// slurmctld pod's logfile sidecar held it in `Init`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_sidecar_gate_init_containers_lose_their_restart_policy() -> Result<()> {
    let Some(c) =
        TestCluster::without_sidecars("without_the_sidecar_gate_init_containers_lose_their_restart_policy")
            .await
    else {
        return Ok(());
    };
    let ns = c.namespace("sidecars").await;
    let spec = json!({
        "initContainers": [{"name": "logfile", "image": "busybox:1", "restartPolicy": "Always"},
                           {"name": "initconf", "image": "busybox:1"}],
        "containers": [{"name": "main", "image": "busybox:1"}]
    });
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec}))?;
    let pod = serde_json::to_value(pods.create(&PostParams::default(), &pod).await?)?;
    assert_eq!(
        pod["spec"]["initContainers"][0].get("restartPolicy"),
        None,
        "{}",
        pod["spec"]["initContainers"]
    );
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "logfile");
    let sets = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c.client.clone(), &ns);
    let template = |spec: &serde_json::Value| json!({"metadata": {"labels": {"app": "x"}}, "spec": spec});
    let plain = json!({"containers": [{"name": "main", "image": "busybox:1"}]});
    let set: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "s", "template": template(&spec)}
    }))?;
    let set = serde_json::to_value(sets.create(&PostParams::default(), &set).await?)?;
    let inits = &set["spec"]["template"]["spec"]["initContainers"];
    assert_eq!(inits[0].get("restartPolicy"), None, "{inits}");
    // An update of an object without one drops it too.
    let other: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "t"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "t", "template": template(&plain)}
    }))?;
    sets.create(&PostParams::default(), &other).await?;
    let set = sets
        .patch(
            "t",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": spec}}})),
        )
        .await?;
    let set = serde_json::to_value(set)?;
    let inits = &set["spec"]["template"]["spec"]["initContainers"];
    assert_eq!(inits[0]["name"], "logfile", "{inits}");
    assert_eq!(inits[0].get("restartPolicy"), None, "{inits}");
    Ok(())
}
