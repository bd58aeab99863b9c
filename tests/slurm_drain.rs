//! No job is lost to a scale-in, a rolling update or a slurmrestd outage, judged by a real Slurm
//! (issue 23): the host reconciles the example cluster on the embedded API server while
//! `slinky-slurm-local` runs its slurmctld, slurmd and slurmrestd as real daemons; jobs run
//! there with `sbatch`, and `scontrol` says what became of them and of the nodes.
//!
//! Needs root and a Slurm build (`../shared/tools/realslurm/setup.sh`); without them each test
//! prints `skipping: <why>` and passes. The tests take turns (each runs a whole Slurm).

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    ResourceExt,
    api::{Api, ListParams, Patch, PatchParams},
};
use serde_json::json;
use slinky_api::{NodeSet, keys};
use slinky_slurm_local::SlurmLocal;
use slinky_tests::{
    TestCluster, eventually,
    host::{NS_NAME, apply_file, cluster_with_statefulsets, nodeset_condition, pod_names, scale},
    slurm::{end_job, field, host_for, job_state, nodes_idle, run_open_job, show, start},
};

/// A node state (`IDLE+DYNAMIC_NORM`) is IDLE with no DRAIN, DOWN or other flag that matters.
fn idle(state: Option<&str>) -> bool {
    state.is_some_and(|s| s.split('+').all(|f| f == "IDLE" || f.starts_with("DYNAMIC")))
}

/// The names of the NodeSet's live pods.
async fn workers(c: &TestCluster, ns: &str) -> Result<Vec<String>> {
    Ok(pod_names(c, ns)
        .await?
        .into_iter()
        .filter(|p| p.starts_with(NS_NAME))
        .collect())
}

async fn pod_labels(
    c: &TestCluster,
    ns: &str,
    pod: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .get_opt(pod)
        .await
        .ok()?
        .map(|p| p.labels().clone())
}

/// A NodeSet of 3 runs a job on `-2`; scaled to 1, `-1` goes at once, `-2` is drained and
/// protected, and deleted only once the job completed. An admin's drain survives.
#[tokio::test]
async fn a_scale_in_waits_for_the_job_on_the_busy_node() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "scale-in", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    // The slurmrestd the host asks runs as the RestApi's Deployment says (the real slurmrestd
    // accepts the builder's args and environment).
    let restd = eventually(60, || async {
        h.slurmrestd_command()
            .await
            .filter(|c| c.deployment.as_deref() == Some("slurm-restapi"))
    })
    .await
    .context("slurmrestd never ran with the RestApi Deployment's command")?;
    assert_eq!(restd.args, ["-s", "openapi/slurmctld", "0.0.0.0:6820"]);
    ensure!(
        host.handles.slurm.requests() > 0,
        "slurm_requests_total counts the node lists of the passes so far"
    );
    ensure!(
        restd
            .env
            .contains(&("SLURM_JWT".to_string(), "daemon".to_string())),
        "{restd:?}"
    );
    h.exec_ok(&[
        "scontrol",
        "update",
        "nodename=slinky-0",
        "state=drain",
        "reason=bad dimm",
    ])
    .await?;
    let job = run_open_job(&h, "slinky-2").await?;
    scale(&c, &ns, 1).await?;

    let drained = eventually(20, || async {
        let node = show(&h, "node", "slinky-2").await.ok()?;
        let pods = pod_names(&c, &ns).await.ok()?;
        let labels = pod_labels(&c, &ns, &format!("{NS_NAME}-2")).await?;
        (field(&node, "State").is_some_and(|s| s.contains("DRAIN"))
            && node.contains("Reason=slurm-operator:")
            && labels.get(keys::LABEL_POD_PROTECT).map(String::as_str) == Some("true")
            && !pods.contains(&format!("{NS_NAME}-1")))
        .then_some(())
    })
    .await;
    ensure!(
        drained.is_some(),
        "node {}; pods {:?}",
        show(&h, "node", "slinky-2").await?,
        pod_names(&c, &ns).await?
    );
    // While the job runs (over several passes of the host), its pod stays.
    host.passes_later(6).await?;
    ensure!(job_state(&h, &job).await? == "RUNNING", "the job no longer runs");
    ensure!(
        pod_names(&c, &ns).await?.contains(&format!("{NS_NAME}-2")),
        "the busy pod went while its job ran"
    );
    end_job(&h, &job).await?;
    let gone = eventually(60, || async {
        let pods = pod_names(&c, &ns).await.ok()?;
        (!pods.contains(&format!("{NS_NAME}-2"))).then_some(())
    })
    .await;
    ensure!(
        gone.is_some(),
        "pod -2 never deleted: {}",
        show(&h, "node", "slinky-2").await?
    );
    let line = show(&h, "job", &job).await?;
    ensure!(field(&line, "JobState") == Some("COMPLETED"), "{line}");
    let admin = show(&h, "node", "slinky-0").await?;
    ensure!(
        admin.contains("Reason=bad"),
        "the admin's drain was undone: {admin}"
    );
    ensure!(
        field(&admin, "State").is_some_and(|s| s.contains("DRAIN")),
        "{admin}"
    );
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// A rolling update (a new slurmd image) replaces the idle pods and waits for the job on the
/// busy one; the job completes.
#[tokio::test]
async fn a_rolling_update_waits_for_the_job_on_the_busy_node() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "rolling", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    h.exec_ok(&[
        "scontrol",
        "update",
        "nodename=slinky-2",
        "state=drain",
        "reason=bad dimm",
    ])
    .await?;
    let job = run_open_job(&h, "slinky-1").await?;
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let uid_of = |pods: &[Pod], n: u32| {
        pods.iter()
            .find(|p| p.name_any() == format!("{NS_NAME}-{n}"))
            .and_then(|p| p.uid())
    };
    let before = Api::<Pod>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    let busy_uid = uid_of(&before, 1).context("no pod -1")?;
    api.patch(
        NS_NAME,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"slurmd": {"image": "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04-v2"}}}),
        ),
    )
    .await?;
    // The idle pods are replaced while the busy one keeps its job.
    let replaced = eventually(120, || async {
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let node = show(&h, "node", "slinky-1").await.ok()?;
        let others_new = [0, 2]
            .iter()
            .all(|n| uid_of(&pods, *n).is_some_and(|u| Some(&u) != uid_of(&before, *n).as_ref()));
        (others_new
            && uid_of(&pods, 1).as_ref() == Some(&busy_uid)
            && node.contains("Reason=slurm-operator:"))
        .then_some(())
    })
    .await;
    ensure!(
        replaced.is_some(),
        "node -1: {}",
        show(&h, "node", "slinky-1").await?
    );
    // The busy pod stays over several passes of the host while its job runs.
    host.passes_later(6).await?;
    ensure!(job_state(&h, &job).await? == "RUNNING", "the job no longer runs");
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    ensure!(
        uid_of(&pods, 1).as_ref() == Some(&busy_uid),
        "the busy pod was replaced while its job ran"
    );
    end_job(&h, &job).await?;
    // After the job, -1 is replaced too, and returns to service.
    let done = eventually(90, || async {
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let node = show(&h, "node", "slinky-1").await.ok()?;
        (uid_of(&pods, 1).is_some_and(|u| u != busy_uid) && idle(field(&node, "State"))).then_some(())
    })
    .await;
    ensure!(done.is_some(), "node -1: {}", show(&h, "node", "slinky-1").await?);
    let line = show(&h, "job", &job).await?;
    ensure!(field(&line, "JobState") == Some("COMPLETED"), "{line}");
    // The admin's drain of -2 survived its pod's replacement.
    let admin = eventually(30, || async {
        let node = show(&h, "node", "slinky-2").await.ok()?;
        (node.contains("Reason=bad") && field(&node, "State").is_some_and(|s| s.contains("DRAIN")))
            .then_some(())
    })
    .await;
    ensure!(
        admin.is_some(),
        "the admin's drain was lost: {}",
        show(&h, "node", "slinky-2").await?
    );
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// A cordoned Kubernetes node drains the Slurm nodes of its worker pods, with the node's reason;
/// uncordoned, they return to service.
#[tokio::test]
async fn a_cordoned_kubernetes_node_drains_its_slurm_nodes() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "cordon", 1).await?;
    nodes_idle(&h, &["slinky-0"]).await?;
    let pod = Api::<Pod>::namespaced(c.client.clone(), &ns)
        .get(&format!("{NS_NAME}-0"))
        .await?;
    let k8s_node = pod
        .spec
        .and_then(|s| s.node_name)
        .context("pod -0 is not bound")?;
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(c.client.clone());
    let cordon = |on: bool| {
        json!({"metadata": {"annotations": {keys::ANNOTATION_NODE_CORDON_REASON: on.then_some("disk failing")}},
               "spec": {"unschedulable": on}})
    };
    nodes
        .patch(&k8s_node, &PatchParams::default(), &Patch::Merge(cordon(true)))
        .await?;
    let drained = eventually(30, || async {
        let node = show(&h, "node", "slinky-0").await.ok()?;
        (field(&node, "State").is_some_and(|s| s.contains("DRAIN"))
            && node.contains(&format!(
                "Reason=slurm-operator: Kubernetes node {k8s_node} is cordoned: disk failing"
            )))
        .then_some(())
    })
    .await;
    ensure!(drained.is_some(), "{}", show(&h, "node", "slinky-0").await?);
    nodes
        .patch(&k8s_node, &PatchParams::default(), &Patch::Merge(cordon(false)))
        .await?;
    let back = eventually(30, || async {
        let node = show(&h, "node", "slinky-0").await.ok()?;
        idle(field(&node, "State")).then_some(())
    })
    .await;
    ensure!(back.is_some(), "{}", show(&h, "node", "slinky-0").await?);
    let _ = ns;
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// slurmrestd stopped: a scale-in deletes nothing and says why; restarted: it completes.
#[tokio::test]
async fn a_scale_in_without_slurmrestd_waits_and_completes_when_it_is_back() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "restd-down", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    h.stop_slurmrestd().await?;
    scale(&c, &ns, 1).await?;
    let failing = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "SlurmFailure").await.ok()??;
        (cond.status == "True" && cond.reason == "SlurmUnreachable").then_some(cond)
    })
    .await;
    ensure!(failing.is_some(), "no SlurmFailure condition");
    host.passes_later(6).await?;
    let left = workers(&c, &ns).await?;
    ensure!(
        left.len() == 3,
        "pods were deleted while Slurm could not be asked: {left:?}"
    );
    h.start_slurmrestd().await?;
    let done = eventually(120, || async {
        let pods = workers(&c, &ns).await.ok()?;
        let cond = nodeset_condition(&c, &ns, "SlurmFailure").await.ok()?;
        (pods.len() == 1 && cond.is_none_or(|c| c.status == "False")).then_some(())
    })
    .await;
    ensure!(done.is_some(), "pods {:?}", pod_names(&c, &ns).await?);
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// HA with two slurmctld: the `active` label is on the primary alone; the primary killed, the
/// label moves to the one Slurm reports as primary.
#[tokio::test]
async fn the_active_label_follows_slurms_primary() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let ns = c.namespace("ha-slurm").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["spec"]["ha"] = json!({"enabled": true, "backups": 1});
            v["spec"]["persistence"] = json!({"enabled": true, "existingClaim": "slurm-state"});
            // The backup takes over after SlurmctldTimeout (120 s by default).
            v["spec"]["extraConf"] = json!("SlurmctldTimeout=5");
        }
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = json!(1);
        }
    })
    .await?;
    let h = SlurmLocal::start(c.client.clone(), &slurm, &ns, "slurm").await?;
    let host = host_for(&c, &ns, &h)?;
    let active = |c: &TestCluster| {
        let client = c.client.clone();
        let ns = ns.clone();
        async move {
            let pods = Api::<Pod>::namespaced(client, &ns)
                .list(&ListParams::default().labels(&format!("{}=true", keys::LABEL_CONTROLLER_ACTIVE)))
                .await
                .ok()?;
            Some(pods.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>())
        }
    };
    let first = eventually(90, || async {
        let ping = h.exec_ok(&["scontrol", "ping"]).await.ok()?;
        let a = active(&c).await?;
        (ping.contains("slurm-controller-0 is UP")
            && ping.contains("slurm-controller-1 is UP")
            && a == ["slurm-controller-0"])
        .then_some(())
    })
    .await;
    ensure!(
        first.is_some(),
        "ping {:?}, active {:?}",
        h.exec_ok(&["scontrol", "ping"]).await.ok(),
        active(&c).await
    );
    h.kill_slurmctld("slurm-controller-0").await?;
    let moved = eventually(120, || async {
        let a = active(&c).await?;
        (a == ["slurm-controller-1"]).then_some(())
    })
    .await;
    ensure!(
        moved.is_some(),
        "ping {:?}, active {:?}",
        h.exec_ok(&["scontrol", "ping"]).await.ok(),
        active(&c).await
    );
    host.stop().await;
    h.shutdown().await;
    Ok(())
}
