//! The Controller's and NodeSet's children other than pods, end to end on the embedded API server
//! (or the cluster of `SLINKY_TEST_KUBECONFIG`): every kind applied and a steady state without
//! writes, two NodeSets racing for their shared objects, `slurm.conf` following the NodeSets
//! (and slurmctld rolling only when the config hash is in its template), 0.1.0 and 0.2.0 plugins
//! serving next to 0.3.0 ones, refused outputs, missing Secrets, ownership and pruning, hot reload.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use slinky_api::{Controller, NodeSet, conditions, keys};
use slinky_host::{
    PluginRegistry,
    plugins::{Allow, BuilderKind, ChildKind, Contract},
};
use slinky_tests::{
    TestCluster, default_engine, engine_allowing, eventually,
    host::{Host, apply, apply_controller, apply_file, cluster, cluster_with_statefulsets, events},
    test_plugin,
};

/// The live object, as JSON.
async fn object(c: &TestCluster, ns: &str, kind: ChildKind, name: &str) -> Option<Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), ns, &kind.api_resource());
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|o| serde_json::to_value(o).ok())
}

/// A condition of a Controller or NodeSet (`kind`), if set.
async fn condition(c: &TestCluster, ns: &str, kind: &str, name: &str, type_: &str) -> Option<Value> {
    let ar = kube::discovery::ApiResource {
        group: "slinky.slurm.net".into(),
        version: "v1beta1".into(),
        api_version: "slinky.slurm.net/v1beta1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), ns, &ar);
    let o = serde_json::to_value(api.get(name).await.ok()?).ok()?;
    o.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// Passes of `kind` (`controller`, `nodeset`) the host made so far, whatever their result.
fn passes_of(host: &Host, kind: &str) -> u64 {
    host.handles
        .metrics
        .snapshot()
        .iter()
        .filter(|((k, _), _)| k == kind)
        .map(|(_, n)| n)
        .sum()
}

/// Wait until the host has made `n` more passes of `kind` (at most 60 s): a parent that fails
/// retries with its backoff, not at the resync, so other parents' passes do not count for it.
async fn passes_of_later(host: &Host, kind: &str, n: u64) -> Result<()> {
    let start = passes_of(host, kind);
    eventually(60, || async {
        (passes_of(host, kind) >= start + n).then_some(())
    })
    .await
    .with_context(|| {
        format!(
            "the host made {} of {n} {kind} passes",
            passes_of(host, kind) - start
        )
    })
}

fn owner_names(o: &Value) -> Vec<String> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect()
}

fn text<'a>(o: &'a Value, pointer: &str) -> &'a str {
    o.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// A NodeSet of the example cluster named `name` (hostname prefix `<short>-`, a partition), as
/// JSON for `ns`.
fn nodeset(ns: &str, name: &str, short: &str, replicas: i32) -> Value {
    json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"controllerRef": {"name": "slurm"}, "replicas": replicas,
            "slurmd": {"image": "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04"},
            "partition": {"enabled": true, "config": "MaxTime=1:00:00"},
            "template": {"spec": {"hostname": format!("{short}-")}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_child_of_the_ha_cluster_is_applied_and_a_steady_state_makes_no_writes() -> Result<()> {
    let c = cluster_with_statefulsets().await;
    let ns = c.namespace("children").await;
    apply_file(&c, &ns, "hpc-cluster.yaml", |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    let want = [
        (ChildKind::Service, "hpc-controller"),
        (ChildKind::Service, "hpc-controller-internal"),
        (ChildKind::Service, "slurm-workers-hpc"),
        (ChildKind::ConfigMap, "hpc-config"),
        (ChildKind::ConfigMap, "hpc-worker-cpu-ssh-config"),
        (ChildKind::StatefulSet, "hpc-controller"),
        (ChildKind::PodDisruptionBudget, "slurm-workers-pdb-hpc"),
        // Its Accounting's (slurmdbd).
        (ChildKind::Service, "hpc-accounting"),
        (ChildKind::StatefulSet, "hpc-accounting"),
    ];
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let ready = eventually(60, || async {
        for (kind, name) in want {
            object(&c, &ns, kind, name).await?;
        }
        let workers = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=slurmd"))
            .await
            .ok()?;
        let ready = condition(&c, &ns, "Controller", "hpc", conditions::READY).await?;
        (workers.items.len() == 3 && ready["status"] == "True").then_some(())
    })
    .await;
    ensure!(
        ready.is_some(),
        "not every child appeared: {:?}",
        condition(&c, &ns, "Controller", "hpc", conditions::READY).await
    );
    for (kind, name) in want {
        let o = object(&c, &ns, kind, name).await.context("gone")?;
        ensure!(
            o.pointer("/metadata/annotations/slinky.slurm.net~1applied-hash")
                .is_some()
                && o.pointer("/metadata/annotations/slinky.slurm.net~1builder-digest")
                    .is_some(),
            "{kind} {name}: {o}"
        );
        let managers: Vec<&str> = o
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m["manager"].as_str())
            .collect();
        ensure!(managers.contains(&"slinky-host"), "{kind} {name}: {managers:?}");
    }
    let shared = object(&c, &ns, ChildKind::Service, "slurm-workers-hpc")
        .await
        .context("workers' Service")?;
    assert_eq!(owner_names(&shared), ["hpc-worker-cpu", "hpc-worker-gpu"]);
    let sts = object(&c, &ns, ChildKind::StatefulSet, "hpc-controller")
        .await
        .context("StatefulSet")?;
    assert_eq!(owner_names(&sts), ["hpc"]);
    if c.embedded("slurmctld pods (the simulated StatefulSet controller)")
        .is_some()
    {
        let slurmctld = eventually(60, || async {
            let l = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=slurmctld"))
                .await
                .ok()?;
            let names: BTreeSet<String> = l.items.iter().map(ResourceExt::name_any).collect();
            let st = object(&c, &ns, ChildKind::StatefulSet, "hpc-controller").await?;
            (names == BTreeSet::from(["hpc-controller-0".into(), "hpc-controller-1".into()])
                && st.pointer("/status/readyReplicas") == Some(&json!(2)))
            .then_some(())
        })
        .await;
        ensure!(slurmctld.is_some(), "the slurmctld pods did not come up");
    }
    // Every pod ready, every status written: then several resyncs make no write. (Settled: no
    // write across 6 passes, a resync and a half of the four parents.)
    let settled = eventually(90, || async {
        let before = host.handles.writes.total();
        host.passes_later(6).await.ok()?;
        (host.handles.writes.total() == before).then_some(())
    })
    .await;
    ensure!(
        settled.is_some(),
        "writes never stopped: {:?}",
        host.handles.writes.snapshot()
    );
    let before = host.handles.writes.total();
    let reconciles = (
        host.handles.metrics.count("Controller", "ok"),
        host.handles.metrics.count("NodeSet", "ok"),
    );
    // Four 1 s resyncs of the four parents (Accounting, Controller, two NodeSets).
    host.passes_later(16).await?;
    ensure!(
        host.handles.metrics.count("Controller", "ok") >= reconciles.0 + 2
            && host.handles.metrics.count("NodeSet", "ok") >= reconciles.1 + 2,
        "resyncs happened"
    );
    assert_eq!(
        host.handles.writes.total(),
        before,
        "a steady state makes zero writes: {:?}",
        host.handles.writes.snapshot()
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodesets_reconciling_at_once_share_one_service_and_pdb() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("race").await;
    apply_controller(&c, &ns).await?;
    if let Some(server) = &c.server {
        // Both NodeSets' reconciles see no shared object in their (lagging) caches.
        server.faults().set_watch_delay(Duration::from_millis(300));
    }
    let host = Host::start(&c, &ns)?;
    let (a, b) = (
        nodeset(&ns, "workers-a", "a", 0),
        nodeset(&ns, "workers-b", "b", 0),
    );
    let (ra, rb) = tokio::join!(apply(&c, &ns, &a), apply(&c, &ns, &b));
    ra?;
    rb?;
    let both = ["workers-a", "workers-b"];
    let uids = eventually(60, || async {
        let svc = object(&c, &ns, ChildKind::Service, "slurm-workers-slurm").await?;
        let pdb = object(&c, &ns, ChildKind::PodDisruptionBudget, "slurm-workers-pdb-slurm").await?;
        (owner_names(&svc) == both && owner_names(&pdb) == both).then(|| {
            (
                text(&svc, "/metadata/uid").to_string(),
                text(&pdb, "/metadata/uid").to_string(),
            )
        })
    })
    .await;
    let Some(uids) = uids else {
        bail!(
            "the shared objects are not owned by both NodeSets: Service {:?}, PDB {:?}, events {:?} {:?}",
            object(&c, &ns, ChildKind::Service, "slurm-workers-slurm").await,
            object(&c, &ns, ChildKind::PodDisruptionBudget, "slurm-workers-pdb-slurm").await,
            events(&c, &ns, "workers-a").await?,
            events(&c, &ns, "workers-b").await?,
        );
    };
    // Two resyncs of the three parents (the Controller, both NodeSets): no failure, no recreate.
    host.passes_later(6).await?;
    for name in both {
        let evs = events(&c, &ns, name).await?;
        ensure!(
            !evs.iter()
                .any(|(r, _)| r == "FailedApply" || r == "NotOwned" || r == "BuilderFailed"),
            "{name}: {evs:?}"
        );
        ensure!(
            condition(&c, &ns, "NodeSet", name, conditions::CHILD_FAILURE)
                .await
                .is_none(),
            "{name} has a ChildFailure"
        );
    }
    let svc = object(&c, &ns, ChildKind::Service, "slurm-workers-slurm")
        .await
        .context("svc")?;
    assert_eq!(text(&svc, "/metadata/uid"), uids.0, "created once");
    let refs = svc["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        refs.iter()
            .all(|r| r.get("controller").is_none_or(|c| c == false) && r["blockOwnerDeletion"] == true),
        "plain owners: {refs:?}"
    );
    // The slurm.conf of the Controller has both NodeSets.
    let conf = eventually(30, || async {
        let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await?;
        let conf = text(&cm, "/data/slurm.conf").to_string();
        (conf.contains("NodeSet=a Feature=a") && conf.contains("NodeSet=b Feature=b")).then_some(conf)
    })
    .await;
    ensure!(conf.is_some(), "slurm.conf does not list both NodeSets");

    // One goes: the other keeps the shared objects; the last takes them with it.
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    api.delete("workers-a", &DeleteParams::default()).await?;
    eventually(60, || async {
        let svc = object(&c, &ns, ChildKind::Service, "slurm-workers-slurm").await?;
        let pdb = object(&c, &ns, ChildKind::PodDisruptionBudget, "slurm-workers-pdb-slurm").await?;
        (owner_names(&svc) == ["workers-b"] && owner_names(&pdb) == ["workers-b"]).then_some(())
    })
    .await
    .context("the remaining NodeSet did not keep the shared objects alone")?;
    api.delete("workers-b", &DeleteParams::default()).await?;
    eventually(60, || async {
        (object(&c, &ns, ChildKind::Service, "slurm-workers-slurm")
            .await
            .is_none()
            && object(&c, &ns, ChildKind::PodDisruptionBudget, "slurm-workers-pdb-slurm")
                .await
                .is_none())
        .then_some(())
    })
    .await
    .context("the shared objects outlived their last NodeSet")?;
    host.stop().await;
    Ok(())
}

/// The NodeSet's children builder calls so far.
fn children_builds(host: &Host) -> u64 {
    host.handles
        .metrics
        .plugin_results()
        .iter()
        .filter(|((kind, _), _)| kind == "nodeset-children")
        .map(|(_, n)| n)
        .sum()
}

/// Label every pod of `ns` with `touch=<value>` (a pod event each) and wait for the NodeSet pass
/// they make (passes counted from before the labels, so a quick pass is not missed).
async fn touch_pods(c: &TestCluster, host: &Host, ns: &str, value: &str) -> Result<()> {
    let before = passes_of(host, "nodeset");
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns);
    for p in pods.list(&ListParams::default()).await? {
        let patch = json!({"metadata": {"labels": {"touch": value}}});
        pods.patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    eventually(60, || async {
        (passes_of(host, "nodeset") > before).then_some(())
    })
    .await
    .with_context(|| format!("no NodeSet pass after the pods were labelled touch={value}"))
}

/// A NodeSet's passes build its Service, PodDisruptionBudget and ConfigMap only when something
/// they come from changed: the passes its pods' events make build none (with 100 NodeSets
/// sharing the Service and the PDB, each such pass built both with 100 owners), while an object
/// left to prune is pruned and a child deleted by someone made again at once, not at the resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_events_build_no_children_and_what_changed_is_pruned_or_made_again_at_once() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("memo").await;
    apply_controller(&c, &ns).await?;
    // No resync in the test's time: what is built again is built for a change, not a timer.
    let host = Host::start_resync(&c, &ns, Duration::from_secs(3600))?;
    apply(&c, &ns, &nodeset(&ns, "workers", "w", 2)).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    eventually(60, || async {
        object(&c, &ns, ChildKind::PodDisruptionBudget, "slurm-workers-pdb-slurm").await?;
        (pods.list(&ListParams::default()).await.ok()?.items.len() == 2).then_some(())
    })
    .await
    .context("no PodDisruptionBudget or not 2 pods")?;
    // Once the NodeSet's status has settled (a status write is a change of the NodeSet), a pass
    // for a pod event builds nothing.
    let mut n = 0;
    let (cr, nsr, hr) = (&c, ns.as_str(), &host);
    let settled = eventually(60, || {
        n += 1;
        let touch = n;
        async move {
            let before = children_builds(hr);
            touch_pods(cr, hr, nsr, &format!("settle-{touch}")).await.ok()?;
            (children_builds(hr) == before).then_some(())
        }
    })
    .await;
    ensure!(
        settled.is_some(),
        "every pass built the NodeSet's children again ({} builds)",
        children_builds(&host)
    );
    let before = children_builds(&host);
    for touch in 100..105 {
        touch_pods(&c, &host, &ns, &format!("after-{touch}")).await?;
    }
    assert_eq!(
        children_builds(&host),
        before,
        "passes for pod events built the children"
    );

    // An object the NodeSet controls and the host built that its builder does not return (as
    // one it stopped building, seen late by the watch) is pruned at once.
    let nodeset_uid = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get("workers")
        .await?
        .uid()
        .context("uid")?;
    let stale: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "workers-left-over",
            "annotations": {keys::ANNOTATION_BUILDER: "nodeset-children"},
            "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "name": "workers", "uid": nodeset_uid, "controller": true}]}}))?;
    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), &ns);
    cms.create(&PostParams::default(), &stale).await?;
    let pruned = eventually(30, || async {
        cms.get_opt("workers-left-over")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    ensure!(
        pruned.is_some(),
        "a ConfigMap the NodeSet controls and its builder does not return was not pruned within 30 s"
    );

    let pdbs = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(c.client.clone(), &ns);
    let old = pdbs.get("slurm-workers-pdb-slurm").await?.uid();
    pdbs.delete("slurm-workers-pdb-slurm", &DeleteParams::default())
        .await?;
    let again = eventually(30, || async {
        let pdb = pdbs.get_opt("slurm-workers-pdb-slurm").await.ok()??;
        (pdb.uid() != old).then_some(())
    })
    .await;
    ensure!(
        again.is_some(),
        "the deleted PodDisruptionBudget was not made again within 30 s (resync 1 h)"
    );
    ensure!(children_builds(&host) > before, "made again without a build");
    host.stop().await;
    Ok(())
}

/// A slurmctld pod that never started (Pending: an image that cannot be pulled, an init
/// container that never ends) on a revision its StatefulSet has left is replaced: the StatefulSet
/// controller rolls a pod only once every pod is Ready, so it would wait for this one forever
/// (kubernetes/kubernetes#67250) and the fixed spec would never reach it. Found on the real node,
/// where the slurmctld pod hung in `Init` (Kubernetes 1.28 dropped its sidecar's restartPolicy)
/// and stayed after the Controller was fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unstarted_slurmctld_pod_of_a_left_revision_is_replaced() -> Result<()> {
    let c = cluster_with_statefulsets().await;
    let Some(server) =
        c.embedded("a slurmctld pod held Pending (the simulated kubelet and StatefulSet controller)")
    else {
        return Ok(());
    };
    let ns = c.namespace("stuck").await;
    server
        .lifecycle()
        .context("no simulated kubelet")?
        .hold_pending(&ns, "slurm-controller-0");
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 0.into();
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let revision = |p: &Pod| p.labels().get("controller-revision-hash").cloned();
    let first = eventually(60, || async { pods.get_opt("slurm-controller-0").await.ok()? })
        .await
        .context("no slurmctld pod")?;
    // The Controller's spec changes (as a fix of the image would): a new template.
    Api::<Controller>::namespaced(c.client.clone(), &ns)
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"slurmctld": {"image": "ghcr.io/slinkyproject/slurmctld:25.05-fixed"}}}),
            ),
        )
        .await?;
    let replaced = eventually(60, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        let update = sts.pointer("/status/updateRevision")?.as_str()?.to_string();
        let pod = pods.get_opt("slurm-controller-0").await.ok()??;
        (pod.uid() != first.uid() && revision(&pod).as_deref() == Some(update.as_str())).then_some(pod)
    })
    .await
    .context("the unstarted slurmctld pod of the old revision was never replaced")?;
    ensure!(
        revision(&replaced) != revision(&first),
        "{:?}",
        revision(&replaced)
    );
    let evs = events(&c, &ns, "slurm").await?;
    ensure!(
        evs.iter()
            .any(|(r, n)| r == "ReplacedUnstartedPod" && n.contains("slurm-controller-0")),
        "{evs:?}"
    );
    host.stop().await;
    Ok(())
}

/// The StatefulSet's template config hash and generation.
async fn slurmctld_template(c: &TestCluster, ns: &str) -> Option<(Option<String>, i64)> {
    let sts = object(c, ns, ChildKind::StatefulSet, "slurm-controller").await?;
    let hash = sts
        .pointer("/spec/template/metadata/annotations/slinky.slurm.net~1slurm-config-hash")
        .and_then(Value::as_str)
        .map(str::to_string);
    Some((hash, sts.pointer("/metadata/generation")?.as_i64()?))
}

/// The uid of the slurmctld pod, once it is ready and of the StatefulSet's current template.
async fn slurmctld_pod(c: &TestCluster, ns: &str) -> Option<String> {
    let pod = Api::<Pod>::namespaced(c.client.clone(), ns)
        .get_opt("slurm-controller-0")
        .await
        .ok()??;
    let sts = object(c, ns, ChildKind::StatefulSet, "slurm-controller").await?;
    let current = sts.pointer("/status/updateRevision")?.as_str()?;
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    (ready
        && pod.metadata.deletion_timestamp.is_none()
        && pod.labels().get("controller-revision-hash").map(String::as_str) == Some(current)
        && sts.pointer("/status/observedGeneration") == sts.pointer("/metadata/generation"))
    .then(|| pod.uid().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nodeset_added_rewrites_slurm_conf_and_rolls_slurmctld_only_with_the_config_hash() -> Result<()> {
    let c = cluster_with_statefulsets().await;
    let sim = c
        .embedded("slurmctld pods rolling (the simulated StatefulSet controller)")
        .is_some();
    let ns = c.namespace("conf").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 0.into();
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let (h1, g1) = eventually(60, || async {
        let (h, g) = slurmctld_template(&c, &ns).await?;
        h.map(|h| (h, g))
    })
    .await
    .context("no StatefulSet with a config hash")?;
    let pod1 = if sim {
        Some(
            eventually(60, || slurmctld_pod(&c, &ns))
                .await
                .context("no slurmctld pod")?,
        )
    } else {
        None
    };

    // A NodeSet is added: slurm.conf gets its lines, the config hash changes, slurmctld rolls.
    apply(&c, &ns, &nodeset(&ns, "slurm-worker-extra", "extra", 0)).await?;
    let cm = eventually(60, || async {
        let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await?;
        text(&cm, "/data/slurm.conf")
            .contains("NodeSet=extra Feature=extra\nPartitionName=extra Nodes=extra MaxTime=1:00:00")
            .then_some(cm)
    })
    .await
    .context("slurm.conf does not list the new NodeSet")?;
    let hash = slinky_guest_sdk::helpers::sha256_hex(
        format!(
            "{}{}",
            text(&cm, "/data/cgroup.conf"),
            text(&cm, "/data/slurm.conf")
        )
        .as_bytes(),
    );
    let g2 = eventually(60, || async {
        let (h, g) = slurmctld_template(&c, &ns).await?;
        (h.as_deref() == Some(hash.as_str())).then_some(g)
    })
    .await
    .context("the StatefulSet's config hash does not follow slurm.conf")?;
    ensure!(hash != h1 && g2 > g1, "the template changed: {g1} -> {g2}");
    if let Some(before) = &pod1 {
        let after = eventually(60, || async {
            slurmctld_pod(&c, &ns).await.filter(|u| u != before)
        })
        .await;
        ensure!(after.is_some(), "slurmctld did not roll");
    }

    // In-place reconfigure: the hash leaves the template (one roll, for the sidecar) ...
    Api::<Controller>::namespaced(c.client.clone(), &ns)
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"inplaceReconfigure": true, "reconfigure": {"image": "ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04"}}})),
        )
        .await?;
    let g3 = eventually(60, || async {
        let (h, g) = slurmctld_template(&c, &ns).await?;
        h.is_none().then_some(g)
    })
    .await
    .context("the config hash stayed in the template")?;
    let pod3 = if sim {
        Some(
            eventually(60, || slurmctld_pod(&c, &ns))
                .await
                .context("no slurmctld pod")?,
        )
    } else {
        None
    };
    // ... and a NodeSet removed rewrites slurm.conf without rolling slurmctld.
    Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .delete("slurm-worker-extra", &DeleteParams::default())
        .await?;
    eventually(60, || async {
        let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await?;
        let conf = text(&cm, "/data/slurm.conf");
        (!conf.contains("NodeSet=extra") && conf.contains("NodeSet=slinky")).then_some(())
    })
    .await
    .context("slurm.conf still lists the removed NodeSet")?;
    // Two resyncs of the Controller and the NodeSet left (and more): slurmctld is not rolled.
    host.passes_later(6).await?;
    let (h4, g4) = slurmctld_template(&c, &ns).await.context("StatefulSet")?;
    ensure!(
        h4.is_none() && g4 == g3,
        "the template did not change: {g3} -> {g4}"
    );
    if let Some(before) = pod3 {
        assert_eq!(
            slurmctld_pod(&c, &ns).await,
            Some(before),
            "slurmctld was not restarted"
        );
    }
    host.stop().await;
    Ok(())
}

/// Plugins of every contract version serve side by side: a 0.1.0 plugin (`raw`: the Service and
/// pods), a 0.2.0 one (`raw-v2`: the NodeSet's children) and the bundled 0.3.0 builders (the
/// Controller's and the RestApi's children).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plugins_of_contracts_0_1_0_and_0_2_0_keep_serving_next_to_0_3_0_builders() -> Result<()> {
    let registry = Arc::new(PluginRegistry::new(
        &default_engine(),
        &[test_plugin("raw"), test_plugin("raw_v2")],
    )?);
    for (kind, contract, name) in [
        (BuilderKind::ControllerService, Contract::V0_1, "raw"),
        (BuilderKind::NodesetPod, Contract::V0_1, "raw"),
        (
            BuilderKind::ControllerChildren,
            Contract::V0_3,
            "controller-children",
        ),
        (BuilderKind::NodesetChildren, Contract::V0_2, "raw-v2"),
        (BuilderKind::RestapiChildren, Contract::V0_3, "restapi-children"),
    ] {
        let p = registry.active(kind);
        assert_eq!((p.contract(), p.info().name.as_str()), (contract, name), "{kind}");
    }
    let c = cluster(false).await;
    let ns = c.namespace("contract").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] != "Secret" {
            v["metadata"]["annotations"] = json!({"raw.test/build": "minimal"});
        }
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 2.into();
        }
    })
    .await?;
    apply_file(&c, &ns, "restapi.yaml", |_| {}).await?;
    let host = Host::start_with(&c, &ns, registry);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    eventually(60, || async {
        let l = pods
            .list(&ListParams::default().labels("raw.test/built=true"))
            .await
            .ok()?;
        let svc = object(&c, &ns, ChildKind::Service, "slurm-controller").await?;
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        let workers = object(&c, &ns, ChildKind::Service, "slurm-workers-slurm").await?;
        let restd = object(&c, &ns, ChildKind::Deployment, "slurm-restapi").await?;
        (l.items.len() == 2
            && text(&svc, "/metadata/labels/raw.test~1built") == "true"
            && text(&svc, "/metadata/annotations/slinky.slurm.net~1builder") == "raw@0.0.1"
            && text(&sts, "/metadata/annotations/slinky.slurm.net~1builder") == "controller-children@0.1.0"
            && text(&workers, "/metadata/labels/raw.test~1contract") == "0.2.0"
            && text(&workers, "/metadata/annotations/slinky.slurm.net~1builder") == "raw-v2@0.0.2"
            && text(&restd, "/metadata/annotations/slinky.slurm.net~1builder") == "restapi-children@0.1.0"
            && l.items.iter().all(|p| {
                p.annotations().get(keys::ANNOTATION_BUILDER).map(String::as_str) == Some("raw@0.0.1")
            }))
        .then_some(())
    })
    .await
    .context(
        "the 0.1.0 plugin's pods and Service, the 0.2.0 plugin's workers' Service and the 0.3.0 \
         children did not all appear",
    )?;
    host.stop().await;
    Ok(())
}

#[test]
fn children_builders_may_not_return_secrets_other_namespaces_or_foreign_objects() -> Result<()> {
    let registry = PluginRegistry::new(&default_engine(), &[test_plugin("hostile_children")])?;
    let path = slinky_tests::example("slurm-cluster.yaml");
    let references = slinky_host::cmd::render::read_references(std::slice::from_ref(&path))?;
    for (parent, behaviour, expect) in [
        ("Controller", "secret", "apiVersion v1 kind Secret is not allowed"),
        ("Controller", "secret", "never see or make Secrets"),
        ("NodeSet", "secret", "apiVersion v1 kind Secret is not allowed"),
        ("Controller", "other-namespace", "is in namespace \"kube-system\""),
        ("NodeSet", "other-namespace", "is in namespace \"kube-system\""),
        ("Controller", "cluster-scoped", "never cluster-scoped objects"),
        ("Controller", "foreign-name", "must be named `slurm-…`"),
        ("NodeSet", "foreign-name", "must be named `slurm-worker-slinky-…`"),
        ("Controller", "twice", "is listed twice"),
        // One StatefulSet, slurmctld's, named for the Controller: another name would be created
        // next to the kept one with an empty state save claim.
        (
            "Controller",
            "rename-statefulset",
            "StatefulSet slurm-slurmctld: a Controller has one StatefulSet",
        ),
        (
            "Controller",
            "second-statefulset",
            "StatefulSet slurm-controller-b: a Controller has one StatefulSet",
        ),
    ] {
        let mut manifests = slinky_host::cmd::render::read_manifests(std::slice::from_ref(&path))?;
        for m in &mut manifests {
            let meta = match &mut m.parent {
                slinky_host::cmd::render::Parent::Controller(c) if parent == "Controller" => &mut c.metadata,
                slinky_host::cmd::render::Parent::NodeSet(n) if parent == "NodeSet" => &mut n.metadata,
                _ => continue,
            };
            meta.annotations
                .get_or_insert_default()
                .insert("hostile.test/behaviour".into(), behaviour.into());
        }
        let err = match slinky_host::cmd::render::render_with(
            &manifests,
            &references,
            &registry,
            &Default::default(),
        ) {
            Ok(_) => bail!("{parent} {behaviour}: the output was not refused"),
            Err(e) => format!("{e:#}"),
        };
        ensure!(
            err.contains(expect) && err.contains("output refused"),
            "{parent} {behaviour}: `{err}` does not say `{expect}`"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_secret_is_a_condition_and_never_reaches_the_cluster() -> Result<()> {
    let registry = Arc::new(PluginRegistry::new(
        &default_engine(),
        &[test_plugin("hostile_children")],
    )?);
    let c = cluster(false).await;
    let ns = c.namespace("refused").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["metadata"]["annotations"] = json!({"hostile.test/behaviour": "secret"});
        }
    })
    .await?;
    let host = Host::start_with(&c, &ns, registry);
    let cond = eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::BUILDER_FAILED)
            .await
            .filter(|c| c["status"] == "True")
    })
    .await
    .context("no BuilderFailed condition")?;
    ensure!(
        text(&cond, "/message").contains("kind Secret is not allowed"),
        "{cond}"
    );
    ensure!(
        events(&c, &ns, "slurm")
            .await?
            .iter()
            .any(|(r, n)| r == "BuilderFailed" && n.contains("Secret")),
        "a BuilderFailed Event"
    );
    // The Service (another builder) is applied; nothing of the refused output is.
    eventually(30, || async {
        object(&c, &ns, ChildKind::Service, "slurm-controller").await
    })
    .await
    .context("the Service was not applied")?;
    ensure!(
        Api::<Secret>::namespaced(c.client.clone(), &ns)
            .get_opt("slurm-stolen")
            .await?
            .is_none()
    );
    ensure!(
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
            .await
            .is_none()
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_secret_is_a_condition_and_the_statefulset_waits_for_it() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("nosecret").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let secrets = Api::<Secret>::namespaced(c.client.clone(), &ns);
    let jwt = secrets.get("slurm-auth-jwths256").await?;
    secrets
        .delete("slurm-auth-jwths256", &DeleteParams::default())
        .await?;
    let host = Host::start(&c, &ns)?;
    let cond = eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::REFERENCE_NOT_FOUND)
            .await
            .filter(|c| c["status"] == "True")
    })
    .await
    .context("no ReferenceNotFound condition")?;
    assert_eq!(cond["reason"], "SecretNotFound");
    ensure!(text(&cond, "/message").contains("slurm-auth-jwths256"), "{cond}");
    let ready = condition(&c, &ns, "Controller", "slurm", conditions::READY).await;
    ensure!(ready.is_some_and(|r| r["status"] == "False"), "not Ready");
    ensure!(
        events(&c, &ns, "slurm")
            .await?
            .iter()
            .any(|(r, _)| r == "SecretNotFound"),
        "a SecretNotFound Event"
    );
    eventually(30, || async {
        object(&c, &ns, ChildKind::Service, "slurm-controller").await
    })
    .await
    .context("the Service waits for nothing")?;
    ensure!(
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
            .await
            .is_none()
    );
    ensure!(
        object(&c, &ns, ChildKind::ConfigMap, "slurm-config")
            .await
            .is_none()
    );
    // The Secret appears: retried with backoff (the host does not watch Secrets).
    let mut again = Secret {
        data: jwt.data.clone(),
        ..Default::default()
    };
    again.metadata.name = Some("slurm-auth-jwths256".into());
    secrets.create(&PostParams::default(), &again).await?;
    eventually(60, || async {
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        condition(&c, &ns, "Controller", "slurm", conditions::REFERENCE_NOT_FOUND)
            .await
            .is_none()
            .then_some(())
    })
    .await
    .context("the StatefulSet did not follow its Secret")?;
    host.stop().await;
    Ok(())
}

/// Quantities a Controller spells otherwise than the API server stores them (`1024Mi` is stored
/// `1Gi`, `1000m` is stored `1`): no apply when the StatefulSet's status changes, no false
/// `FieldsDropped` Warning. On Kubernetes 1.28, whose API server drops the native sidecar's
/// `restartPolicy`, a status change is no apply either: the fields dropped at the last apply are
/// remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quantities_stored_in_canonical_form_are_no_change() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("quantities").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["spec"]["slurmctld"]["resources"] =
                json!({"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"memory": "2048Mi"}});
            v["spec"]["persistence"]["resources"]["requests"]["storage"] = "4096Mi".into();
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let sts = eventually(60, || async {
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await
    })
    .await
    .context("no StatefulSet")?;
    let stored = sts
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["name"] == "slurmctld"))
        .map(|c| c["resources"].clone())
        .context("no slurmctld container")?;
    assert_eq!(
        stored,
        json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}),
        "the API server stores quantities in canonical form"
    );
    let applies = || host.handles.writes.ok("apply");
    // The first passes' applies done: none across 4 passes (two resyncs of the Controller and the
    // NodeSet).
    let settled = eventually(90, || async {
        let before = applies();
        host.passes_later(4).await.ok()?;
        (applies() == before).then_some(())
    })
    .await;
    ensure!(
        settled.is_some(),
        "applies never stopped: {:?}",
        host.handles.writes.snapshot()
    );
    let before = applies();
    // Another writer changes the StatefulSet's status: each change is an event for the host.
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &ns, &ChildKind::StatefulSet.api_resource());
    let cached = kube::runtime::reflector::ObjectRef::new("slurm-controller").within(&ns);
    for i in 0..5 {
        api.patch_status(
            "slurm-controller",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 0, "observedGeneration": i + 1}})),
        )
        .await?;
        // Each change seen on its own: in the host's cache, then by a Controller pass that began
        // after it (the second to end from then).
        let seen = eventually(60, || async {
            let sts = host.handles.statefulsets.get(&cached)?;
            (sts.status.as_ref()?.observed_generation == Some(i64::from(i + 1))).then_some(())
        })
        .await;
        ensure!(seen.is_some(), "the host's cache never showed status change {i}");
        passes_of_later(&host, "controller", 2)
            .await
            .with_context(|| format!("after status change {i}"))?;
    }
    // Two resyncs of the Controller and the NodeSet (and more) after the last change.
    host.passes_later(6).await?;
    assert_eq!(applies(), before, "status changes re-applied the StatefulSet");
    let evs = events(&c, &ns, "slurm").await?;
    // (On Kubernetes 1.28 a true one names the native sidecar's restartPolicy: not a quantity.)
    ensure!(
        !evs.iter()
            .any(|(r, n)| r == "FieldsDropped"
                && (n.contains("resources") || n.contains("volumeClaimTemplates"))),
        "a false FieldsDropped Warning: {evs:?}"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_made_between_the_hosts_read_and_its_create_is_not_merged_into() -> Result<()> {
    use slinky_apiserver::{FaultError, FaultRule, Times};
    let c = cluster(false).await;
    let Some(server) = c.embedded("a read racing a create (fault injection)") else {
        return Ok(());
    };
    let ns = c.namespace("race-create").await;
    // The host's caches are synced, then someone makes the ConfigMap the host will build, while
    // the host's ConfigMap watch is held (its cache lags) and its read of it says 404 (the read
    // came first): the host's pass believes the name is free. Their ConfigMap has none of the
    // host's keys, so nothing conflicts: an apply would merge into it without a word.
    let host = Host::start(&c, &ns)?;
    host.wait_ready().await?;
    server.faults().hold_watch("configmaps");
    let theirs: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "slurm-config"}, "data": {"notes": "theirs"}}))?;
    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), &ns);
    cms.create(&PostParams::default(), &theirs).await?;
    server.faults().add(FaultRule::new(
        "get",
        "configmaps",
        FaultError::NotFound,
        Times::Count(1),
    ));
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let cond = eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::CHILD_FAILURE)
            .await
            .filter(|c| c["status"] == "True")
    })
    .await;
    server.faults().release_watch("configmaps");
    let fired = server.faults().fired();
    ensure!(
        fired.iter().any(|(v, r, _)| v == "get" && r == "configmaps"),
        "the host never read the ConfigMap from the API: the race was not run ({fired:?})"
    );
    let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config")
        .await
        .context("their ConfigMap is gone")?;
    assert_eq!(text(&cm, "/data/notes"), "theirs");
    assert_eq!(cm.pointer("/data/slurm.conf"), None, "merged into: {cm}");
    assert_eq!(
        cm.pointer("/metadata/ownerReferences"),
        None,
        "the host took their ConfigMap: {cm}"
    );
    let cond = cond.context("no ChildFailure condition")?;
    assert_eq!(cond["reason"], "NotOwned", "{cond}");
    // Once the name is free the host creates its own, and owns its fields as an applier alone
    // (the create's Update entry dropped), so a key it stops building would be removed.
    cms.delete("slurm-config", &DeleteParams::default()).await?;
    // (Its create is an Update entry until the next apply drops it: wait for that.)
    let applier_alone = [("slinky-host".to_string(), "Apply".to_string())];
    let mut last = None;
    let managers = eventually(60, || async {
        let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await?;
        let built = text(&cm, "/data/slurm.conf").contains("ClusterName=slurm");
        let managers = managers_of(&cm);
        (built && managers == applier_alone).then_some(managers)
    })
    .await;
    if managers.is_none() {
        last = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await;
    }
    ensure!(
        managers.is_some(),
        "the host did not build its ConfigMap once the name was free, owning it as an applier alone: {last:?}"
    );
    host.stop().await;
    Ok(())
}

/// The `(manager, operation)` of each managedFields entry of `obj`.
fn managers_of(obj: &Value) -> Vec<(String, String)> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| (text(e, "/manager").to_string(), text(e, "/operation").to_string()))
        .collect()
}

/// Two names the host builds held by strangers: each is announced by one `NotOwned` Event, not
/// one per pass (the condition names only the first, the Events both, once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_foreign_object_is_announced_once_however_many_there_are() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("announce").await;
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "slurm-config"}, "data": {"x": "theirs"}}))?;
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await?;
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(
        json!({"metadata": {"name": "slurm-controller"}, "spec": {"ports": [{"port": 80}]}}),
    )?;
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await?;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::CHILD_FAILURE)
            .await
            .filter(|c| c["status"] == "True")
    })
    .await
    .context("no ChildFailure condition")?;
    // Several passes: five 1 s resyncs of the Controller and the NodeSet, and at least three of
    // the Controller's own (it retries with its backoff).
    host.passes_later(10).await?;
    passes_of_later(&host, "controller", 3).await?;
    let list = Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    let mut counts: std::collections::BTreeMap<String, i32> = Default::default();
    for e in list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("NotOwned"))
    {
        let what = ["ConfigMap slurm-config", "Service slurm-controller"]
            .into_iter()
            .find(|w| e.note.as_deref().unwrap_or_default().contains(w))
            .unwrap_or("other");
        *counts.entry(what.to_string()).or_default() += e.series.as_ref().map_or(1, |s| s.count);
    }
    assert_eq!(
        counts,
        [
            ("ConfigMap slurm-config".to_string(), 1),
            ("Service slurm-controller".to_string(), 1)
        ]
        .into(),
        "one NotOwned Event per foreign object"
    );
    host.stop().await;
    Ok(())
}

/// A rotated key Secret reaches slurmctld's StatefulSet within the Secret poll, not at the next
/// resync (5 minutes here), though the host never watches Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rotated_key_secret_rolls_slurmctld_without_waiting_for_the_resync() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("rotate").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let config = slinky_host::reconcile::RunConfig {
        namespaces: vec![ns.clone()],
        resync: Some(Duration::from_secs(300)),
        secret_poll: Some(Duration::from_millis(500)),
        ..Default::default()
    };
    let host = Host::start_config(
        c.client.clone(),
        Arc::new(PluginRegistry::new(&default_engine(), &[])?),
        config,
    );
    let annotation = format!(
        "/spec/template/metadata/annotations/{}",
        keys::ANNOTATION_JWT_KEY_HASH.replace('/', "~1")
    );
    let before = eventually(60, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        Some(text(&sts, &annotation).to_string()).filter(|h| !h.is_empty())
    })
    .await
    .context("no StatefulSet with the JWT key's hash")?;
    // Let the first passes settle, so the rotation below is seen by the poll, not a pass anyway.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let secrets = Api::<Secret>::namespaced(c.client.clone(), &ns);
    secrets
        .patch(
            "slurm-auth-jwths256",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"jwt_hs256.key": "rotated-key-0123456789abcdef"}})),
        )
        .await?;
    let after = eventually(20, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        Some(text(&sts, &annotation).to_string()).filter(|h| *h != before)
    })
    .await;
    ensure!(
        after.is_some(),
        "the StatefulSet still carries the old key's hash 20 s after the rotation"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn foreign_objects_are_left_alone_and_children_no_longer_built_are_pruned() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("prune").await;
    // A ConfigMap of the name the host builds, made by someone else.
    let theirs: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "slurm-config"}, "data": {"slurm.conf": "theirs"}}),
    )?;
    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), &ns);
    cms.create(&PostParams::default(), &theirs).await?;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    let cond = eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::CHILD_FAILURE)
            .await
            .filter(|c| c["status"] == "True")
    })
    .await
    .context("no ChildFailure condition")?;
    assert_eq!(cond["reason"], "NotOwned");
    ensure!(
        text(&cond, "/message").contains("ConfigMap slurm-config"),
        "{cond}"
    );
    // Two passes of each parent (the Controller's retries with its backoff): theirs is left alone.
    host.passes_later(4).await?;
    passes_of_later(&host, "controller", 2).await?;
    assert_eq!(
        text(
            &object(&c, &ns, ChildKind::ConfigMap, "slurm-config")
                .await
                .context("cm")?,
            "/data/slurm.conf"
        ),
        "theirs",
        "left alone"
    );
    cms.delete("slurm-config", &DeleteParams::default()).await?;
    let cm = eventually(60, || async {
        let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await?;
        let cleared = condition(&c, &ns, "Controller", "slurm", conditions::CHILD_FAILURE)
            .await
            .is_none();
        (text(&cm, "/data/slurm.conf").contains("ClusterName=slurm") && cleared).then_some(cm)
    })
    .await
    .context("the host did not build its ConfigMap once the name was free")?;
    // Created, then applied: the host's fields are its Apply entry's alone.
    assert_eq!(
        managers_of(&cm),
        [("slinky-host".to_string(), "Apply".to_string())]
    );

    // SSH on, then off: the NodeSet's ConfigMap comes and goes.
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let ssh = |on: bool| {
        Patch::Merge(
            json!({"spec": {"ssh": {"enabled": on, "sssdConfRef": {"name": "sssd", "key": "sssd.conf"}}}}),
        )
    };
    nodesets
        .patch("slurm-worker-slinky", &PatchParams::default(), &ssh(true))
        .await?;
    eventually(60, || async {
        object(&c, &ns, ChildKind::ConfigMap, "slurm-worker-slinky-ssh-config").await
    })
    .await
    .context("no SSH ConfigMap")?;
    nodesets
        .patch("slurm-worker-slinky", &PatchParams::default(), &ssh(false))
        .await?;
    eventually(60, || async {
        object(&c, &ns, ChildKind::ConfigMap, "slurm-worker-slinky-ssh-config")
            .await
            .is_none()
            .then_some(())
    })
    .await
    .context("the SSH ConfigMap was not pruned")?;

    // External: slurmctld runs elsewhere; its StatefulSet and Services go, a minimal slurm.conf stays.
    Api::<Controller>::namespaced(c.client.clone(), &ns)
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"external": true, "externalConfig": {"host": "ctld.example.com", "port": 6817}}})),
        )
        .await?;
    eventually(60, || async {
        let gone = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
            .await
            .is_none()
            && object(&c, &ns, ChildKind::Service, "slurm-controller")
                .await
                .is_none()
            && object(&c, &ns, ChildKind::Service, "slurm-controller-internal")
                .await
                .is_none();
        let cm = object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await?;
        (gone && text(&cm, "/data/slurm.conf").contains("SlurmctldHost=ctld.example.com")).then_some(())
    })
    .await
    .context("the external Controller's children were not pruned")?;
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_children_builder_hot_reloads_and_names_itself_without_restarting_slurmctld() -> Result<()> {
    use slinky_host::plugins::reload::{self, ReloadConfig};
    let c = cluster(false).await;
    let ns = c.namespace("reload-children").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let dir = tempfile::tempdir()?;
    let (_reload, _, task) = reload::start(
        plugins.clone(),
        ReloadConfig {
            dir: dir.path().to_path_buf(),
            poll: Duration::from_millis(50),
            build: Default::default(),
        },
    )
    .await?;
    let host = Host::start_with(&c, &ns, plugins.clone());
    // Provenance is the StatefulSet's, never its pod template's.
    let builder = |sts: &Value| text(sts, "/metadata/annotations/slinky.slurm.net~1builder").to_string();
    let generation = |sts: &Value| sts.pointer("/metadata/generation").and_then(Value::as_i64);
    let first = eventually(60, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        (builder(&sts) == "controller-children@0.1.0").then_some(sts)
    })
    .await
    .context("no StatefulSet from the bundled builder")?;
    ensure!(
        first
            .pointer("/spec/template/metadata/annotations/slinky.slurm.net~1builder")
            .is_none(),
        "the pod template names its builder: {first}"
    );
    std::fs::copy(test_plugin("hostile_children"), dir.path().join("children.wasm"))?;
    let digest = slinky_host::plugins::digest(&std::fs::read(test_plugin("hostile_children"))?);
    let swapped = eventually(60, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        let svc = object(&c, &ns, ChildKind::Service, "slurm-workers-slurm").await?;
        (builder(&sts) == "hostile-children@0.1.0"
            && text(&sts, "/metadata/annotations/slinky.slurm.net~1builder-digest")
                == format!("sha256:{digest}")
            && text(&svc, "/metadata/annotations/slinky.slurm.net~1builder") == "hostile-children@0.1.0")
            .then_some(sts)
    })
    .await
    .context("the children were not rebuilt by the new builder")?;
    // It builds the same template (without a `hostile.test/behaviour` annotation): slurmctld
    // keeps running.
    ensure!(
        generation(&swapped) == generation(&first),
        "slurmctld's template changed: generation {:?} -> {:?}",
        generation(&first),
        generation(&swapped)
    );
    ensure!(
        events(&c, &ns, "slurm")
            .await?
            .iter()
            .any(|(r, n)| r == "BuilderChanged"
                && n.contains("controller-children builder is now hostile-children")),
        "a BuilderChanged Event on the Controller"
    );
    assert_eq!(plugins.swaps(BuilderKind::ControllerChildren), 1);
    assert_eq!(plugins.swaps(BuilderKind::NodesetChildren), 1);
    assert_eq!(
        plugins.swaps(BuilderKind::NodesetPod),
        0,
        "the pods' builder is not swapped"
    );
    // Removing the file falls back to the bundled builder.
    std::fs::remove_file(dir.path().join("children.wasm"))?;
    eventually(60, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        (builder(&sts) == "controller-children@0.1.0").then_some(())
    })
    .await
    .context("no fallback to the bundled builder")?;
    task.abort();
    host.stop().await;
    Ok(())
}

#[test]
fn plugin_check_diffs_every_child_of_a_children_builder() -> Result<()> {
    let plugin = test_plugin("hostile_children");
    let out = slinky_tests::run(&[
        "plugin",
        "check",
        &plugin.display().to_string(),
        "-f",
        &slinky_tests::example("hpc-cluster.yaml").display().to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "kinds: controller-children, nodeset-children",
        "contract: 0.3.0 (this host: 0.3.0)",
        "ok   StatefulSet hpc-controller of Controller hpc/hpc",
        "ok   ConfigMap hpc-config of Controller hpc/hpc",
        "ok   Service hpc-controller-internal of Controller hpc/hpc",
        "ok   Service slurm-workers-hpc of NodeSet hpc/hpc-worker-cpu",
        "ok   ConfigMap hpc-worker-cpu-ssh-config of NodeSet hpc/hpc-worker-cpu",
        "ok   PodDisruptionBudget slurm-workers-pdb-hpc of NodeSet hpc/hpc-worker-gpu",
    ] {
        ensure!(text.contains(line), "`{line}` not in:\n{text}");
    }
    ensure!(
        text.contains("the same as the bundled builder's") && !text.contains("changes against"),
        "without a behaviour it builds what the bundled builders build:\n{text}"
    );
    Ok(())
}

/// Nothing a children builder returns deletes slurmctld's state: a build that leaves the
/// StatefulSet out keeps it (reported as `NotBuilt`, with an Event), a claim retention of
/// `Delete` is applied as `Retain`, and a changed claim template is reported
/// (`ImmutableFieldChanged`, naming the field), not carried out by deleting the StatefulSet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_build_deletes_slurmctlds_statefulset_or_its_claims() -> Result<()> {
    let registry = Arc::new(PluginRegistry::new(
        &default_engine(),
        &[test_plugin("hostile_children")],
    )?);
    let c = cluster(false).await;
    let ns = c.namespace("keep-state").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["metadata"]["annotations"] = json!({"hostile.test/behaviour": "retention-delete"});
        }
    })
    .await?;
    let host = Host::start_with(&c, &ns, registry);
    let controllers = Api::<Controller>::namespaced(c.client.clone(), &ns);
    let behave = |b: &str| Patch::Merge(json!({"metadata": {"annotations": {"hostile.test/behaviour": b}}}));

    // Retention `Delete` asked for, `Retain` applied.
    let sts = eventually(60, || async {
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await
    })
    .await
    .context("no StatefulSet")?;
    let retention = &sts["spec"]["persistentVolumeClaimRetentionPolicy"];
    assert_eq!(
        (&retention["whenDeleted"], &retention["whenScaled"]),
        (&json!("Retain"), &json!("Retain")),
        "{retention}"
    );
    let uid = text(&sts, "/metadata/uid").to_string();

    // A build without the StatefulSet: kept, reported.
    controllers
        .patch("slurm", &PatchParams::default(), &behave("drop-statefulset"))
        .await?;
    let cond = eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::CHILD_FAILURE)
            .await
            .filter(|c| c["status"] == "True" && c["reason"] == "NotBuilt")
    })
    .await
    .context("no NotBuilt ChildFailure condition")?;
    ensure!(
        text(&cond, "/message").contains("StatefulSet slurm-controller"),
        "{cond}"
    );
    ensure!(
        events(&c, &ns, "slurm")
            .await?
            .iter()
            .any(|(r, n)| r == "NotBuilt" && n.contains("StatefulSet slurm-controller")),
        "a NotBuilt Event"
    );
    // Two resyncs of both parents, and two more passes of the failing Controller (its backoff).
    host.passes_later(4).await?;
    passes_of_later(&host, "controller", 2).await?;
    let kept = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await;
    ensure!(
        kept.as_ref().is_some_and(|s| text(s, "/metadata/uid") == uid),
        "the StatefulSet was deleted because a build left it out"
    );

    // Back to Slinky's children, with another state save size: the claim template differs, the
    // StatefulSet stays (same UID) and the field is named.
    controllers
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"hostile.test/behaviour": "none"}},
                "spec": {"persistence": {"resources": {"requests": {"storage": "8Gi"}}}},
            })),
        )
        .await?;
    let cond = eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::CHILD_FAILURE)
            .await
            .filter(|c| c["status"] == "True" && c["reason"] == "ImmutableFieldChanged")
    })
    .await
    .context("no ImmutableFieldChanged ChildFailure condition")?;
    ensure!(
        text(&cond, "/message").contains("spec.volumeClaimTemplates")
            && text(&cond, "/message").contains("--recreate-statefulsets"),
        "{cond}"
    );
    // Two resyncs of both parents, and two more passes of the failing Controller (its backoff).
    host.passes_later(4).await?;
    passes_of_later(&host, "controller", 2).await?;
    let kept = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await;
    ensure!(
        kept.as_ref().is_some_and(|s| text(s, "/metadata/uid") == uid),
        "the StatefulSet was deleted and recreated without --recreate-statefulsets"
    );
    ensure!(
        text(&cond, "/message")
            .contains("spec.volumeClaimTemplates[name=statesave].spec.resources.requests.storage"),
        "the exact field: {cond}"
    );
    // Meanwhile the rest still reaches slurmctld: a new image is applied to the template.
    controllers
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"slurmctld": {"image": "ghcr.io/slinkyproject/slurmctld:25.05-rocky9"}}}),
            ),
        )
        .await?;
    eventually(60, || async {
        let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await?;
        let images = sts.pointer("/spec/template/spec/containers")?.as_array()?.clone();
        images
            .iter()
            .any(|c| c["image"] == "ghcr.io/slinkyproject/slurmctld:25.05-rocky9")
            .then_some(())
    })
    .await
    .context("a claim template difference froze the whole StatefulSet: the new image never came")?;
    host.stop().await;
    Ok(())
}

/// The StatefulSet and ConfigMap a refused build must leave as they were (`before`).
async fn unchanged(c: &TestCluster, ns: &str, before: &(Value, Value)) -> Result<()> {
    let (sts, config) = before;
    let kept = object(c, ns, ChildKind::StatefulSet, "slurm-controller")
        .await
        .context("the StatefulSet is gone")?;
    ensure!(
        kept["metadata"]["uid"] == sts["metadata"]["uid"]
            && kept["spec"]["template"] == sts["spec"]["template"],
        "a refused build changed the StatefulSet: {}",
        kept["spec"]["template"]
    );
    let kept = object(c, ns, ChildKind::ConfigMap, "slurm-config")
        .await
        .context("the ConfigMap is gone")?;
    ensure!(
        kept["metadata"]["uid"] == config["metadata"]["uid"]
            && kept["metadata"].get("finalizers").is_none()
            && kept["data"] == config["data"],
        "a refused build changed the ConfigMap: {kept}"
    );
    Ok(())
}

/// Host the hostile children builder with `allow` until the Controller's `BuilderFailed`
/// condition says `says` (and an Event too); check the children are `unchanged` after two more
/// resyncs of both parents and two more (refused) passes of the Controller.
async fn refused_with(
    c: &TestCluster,
    ns: &str,
    allow: &[Allow],
    says: [&str; 2],
    before: &(Value, Value),
) -> Result<()> {
    let registry = Arc::new(PluginRegistry::new(
        &engine_allowing(allow),
        &[test_plugin("hostile_children")],
    )?);
    let host = Host::start_with(c, ns, registry);
    let cond = eventually(60, || async {
        condition(c, ns, "Controller", "slurm", conditions::BUILDER_FAILED)
            .await
            .filter(|c| c["status"] == "True" && says.iter().all(|s| text(c, "/message").contains(s)))
    })
    .await;
    let events = events(c, ns, "slurm").await?;
    // The host keeps running meanwhile: a stopped host changes nothing whatever it would do.
    let more = if cond.is_some() {
        match host.passes_later(4).await {
            Ok(()) => passes_of_later(&host, "controller", 2).await,
            Err(e) => Err(e),
        }
    } else {
        Ok(())
    };
    host.stop().await;
    ensure!(
        cond.is_some(),
        "allowing {allow:?}: no BuilderFailed condition saying {says:?}: {:?}",
        condition(c, ns, "Controller", "slurm", conditions::BUILDER_FAILED).await
    );
    ensure!(
        events
            .iter()
            .any(|(r, n)| r == "BuilderFailed" && says.iter().all(|s| n.contains(s))),
        "allowing {allow:?}: no BuilderFailed Event saying {says:?}: {events:?}"
    );
    more.with_context(|| format!("allowing {allow:?}"))?;
    unchanged(c, ns, before).await
}

/// A children build reaching past its Controller (a finalizer on the ConfigMap, slurmctld's pods
/// mounting the node's `/`) is refused as a whole: a `BuilderFailed` condition and Event name the
/// object, the field and the flag that allows it, and the ConfigMap and StatefulSet applied before
/// stay as they were, also when the host allows only one of the two. A host allowing both
/// (`--allow finalizers,host-path`) applies the build.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_reaching_past_its_parent_changes_nothing_until_the_host_allows_it() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("reach").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let host = Host::start_with(
        &c,
        &ns,
        Arc::new(PluginRegistry::new(
            &default_engine(),
            &[test_plugin("hostile_children")],
        )?),
    );
    let sts = eventually(60, || async {
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller").await
    })
    .await
    .context("no StatefulSet")?;
    let config = eventually(60, || async {
        object(&c, &ns, ChildKind::ConfigMap, "slurm-config").await
    })
    .await
    .context("no ConfigMap")?;
    host.stop().await;
    let before = (sts, config);
    Api::<Controller>::namespaced(c.client.clone(), &ns)
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"hostile.test/behaviour": "host-path-and-finalizer"}}}),
            ),
        )
        .await?;

    refused_with(
        &c,
        &ns,
        &[],
        [
            "ConfigMap \"slurm-config\": metadata.finalizers",
            "--allow finalizers",
        ],
        &before,
    )
    .await?;
    refused_with(
        &c,
        &ns,
        &[Allow::Finalizers],
        [
            "StatefulSet \"slurm-controller\": spec.template.spec.volumes[name=node-root].hostPath",
            "--allow host-path",
        ],
        &before,
    )
    .await?;

    // A host allowing both applies the same build.
    let registry = Arc::new(PluginRegistry::new(
        &engine_allowing(&[Allow::Finalizers, Allow::HostPath]),
        &[test_plugin("hostile_children")],
    )?);
    let host = Host::start_with(&c, &ns, registry);
    let sts = eventually(60, || async {
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
            .await
            .filter(|s| {
                s["spec"]["template"]["spec"]["volumes"]
                    .to_string()
                    .contains("node-root")
            })
    })
    .await
    .context("the allowed hostPath volume was not applied")?;
    ensure!(
        sts["metadata"]["uid"] == before.0["metadata"]["uid"]
            && sts["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| v
                    .iter()
                    .any(|v| v["name"] == "node-root" && v["hostPath"]["path"] == "/")),
        "{}",
        sts["spec"]["template"]
    );
    eventually(60, || async {
        object(&c, &ns, ChildKind::ConfigMap, "slurm-config")
            .await
            .filter(|m| m["metadata"]["finalizers"] == json!(["hostile.test/keep"]))
    })
    .await
    .context("the allowed finalizer was not applied")?;
    eventually(60, || async {
        condition(&c, &ns, "Controller", "slurm", conditions::BUILDER_FAILED)
            .await
            .is_none_or(|c| c["status"] != "True")
            .then_some(())
    })
    .await
    .context("BuilderFailed stays True with the allowances")?;
    host.stop().await;
    Ok(())
}

/// High availability on an existing claim that is not ReadWriteMany (Slinky refuses it): the
/// Controller is `InvalidSpec` naming the claim and the access mode, and no StatefulSet is made;
/// once the claim is ReadWriteMany, the StatefulSet is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_availability_on_a_claim_that_is_not_read_write_many_is_an_invalid_spec() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("ha-claim").await;
    let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(c.client.clone(), &ns);
    let claim = |mode: &str| -> Result<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": "slurm-state"},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}}),
        )?)
    };
    claims
        .create(&PostParams::default(), &claim("ReadWriteOnce")?)
        .await?;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["spec"]["ha"] = json!({"enabled": true, "backups": 1});
            v["spec"]["persistence"] = json!({"enabled": true, "existingClaim": "slurm-state"});
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let invalid = eventually(30, || {
        condition(&c, &ns, "Controller", "slurm", conditions::INVALID_SPEC)
    })
    .await
    .context("no InvalidSpec for an HA claim that is ReadWriteOnce")?;
    let message = invalid["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("ReadWriteMany") && message.contains("slurm-state"),
        "{invalid}"
    );
    ensure!(
        object(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
            .await
            .is_none(),
        "a StatefulSet was made on a claim its backups cannot share"
    );
    // Access modes cannot change: the claim is made again, shared.
    claims.delete("slurm-state", &DeleteParams::default()).await?;
    eventually(60, || async {
        claims.get_opt("slurm-state").await.ok()?.is_none().then_some(())
    })
    .await
    .context("the claim was not deleted")?;
    claims
        .create(&PostParams::default(), &claim("ReadWriteMany")?)
        .await?;
    eventually(30, || object(&c, &ns, ChildKind::StatefulSet, "slurm-controller"))
        .await
        .context("no StatefulSet once the claim is ReadWriteMany")?;
    host.stop().await;
    Ok(())
}

/// On a Kubernetes 1.28 API server (its `SidecarContainers` gate off, as by default), the
/// example's logfile sidecar (`spec.logfile.image`) loses its `restartPolicy`: on a real kubelet
/// it would hold the pod in `Init` for good (found on the real node). The host says so at once,
/// in a `FieldsDropped` Warning on the Controller that names the field and what to do, and does
/// not apply again for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sidecar_the_api_server_drops_is_a_warning_that_says_what_to_do() -> Result<()> {
    let Some(c) =
        TestCluster::without_sidecars("a_sidecar_the_api_server_drops_is_a_warning_that_says_what_to_do")
            .await
    else {
        return Ok(());
    };
    c.install_crds(&slinky_host::cmd::crds::crds()).await;
    let ns = c.namespace("sidecar-dropped").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = 0.into();
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let warned = eventually(60, || async {
        let evs = events(&c, &ns, "slurm").await.ok()?;
        evs.into_iter().find(|(r, n)| {
            r == "FieldsDropped"
                && n.contains("restartPolicy")
                && n.contains("spec.logfile.image")
                && n.contains("1.29")
        })
    })
    .await;
    ensure!(
        warned.is_some(),
        "no FieldsDropped Warning naming the sidecar: {:?}",
        events(&c, &ns, "slurm").await?
    );
    let sts = object(&c, &ns, ChildKind::StatefulSet, "slurm-controller")
        .await
        .context("no StatefulSet")?;
    let inits = sts
        .pointer("/spec/template/spec/initContainers")
        .cloned()
        .unwrap_or_default();
    ensure!(
        inits
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["name"] == "logfile")
                && cs.iter().all(|c| c.get("restartPolicy").is_none())),
        "the server kept the sidecar's restartPolicy: {inits}"
    );
    // Remembered: no apply for the dropped field across the next passes.
    let applies = || host.handles.writes.ok("apply");
    host.passes_later(2).await?;
    let before = applies();
    host.passes_later(4).await?;
    assert_eq!(applies(), before, "the dropped field was applied again");
    host.stop().await;
    Ok(())
}
