//! No job is lost to a scale-in, a rolling update or a slurmrestd outage, judged by a real Slurm
//! (issue 23): the host reconciles the example cluster on the embedded API server while
//! `slinky-slurm-local` runs its slurmctld, slurmd and slurmrestd as real daemons; jobs run
//! there with `sbatch`, and `scontrol` says what became of them and of the nodes.
//!
//! Needs root and a Slurm build (`../shared/tools/realslurm/setup.sh`); without them each test
//! skips (listed in `$SLINKY_TEST_SKIPS`), and fails instead when `SLINKY_TEST_REQUIRE` has
//! `slurm`. The tests take turns (each runs a whole Slurm).

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
    host::{NS_NAME, apply_file, cluster_with_statefulsets, events, nodeset_condition, pod_names, scale},
    slurm::{
        end_job, field, host_for, job_state, nodes_idle, run_open_job, run_open_job_limited, show, start,
    },
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

/// A NodeSet of 3 runs a long job on its highest ordinal, `-2`; scaled to 2, the idle `-1` goes
/// within seconds and the busy `-2` is neither drained nor deleted. With a second job on `-0`
/// (which an admin then drains) and a scale to 1, both nodes are busy: `-2` is drained and
/// protected, and deleted only once its job completed; the admin's drain survives.
#[tokio::test]
async fn a_scale_in_takes_an_idle_node_and_waits_for_the_job_on_a_busy_one() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "scale-in", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    // What Slurm says of each worker is on its pod: `SlurmNodeStateIdle`, written over the
    // conditions the kubelet wrote as a kubelet writes them (`lastProbeTime: null`: before, the
    // patch tested those as read, never matched, and was refused at every pass).
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    eventually(60, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let idle = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "SlurmNodeStateIdle" && c.status == "True")
                })
        };
        (list.items.iter().filter(|p| idle(p)).count() == 3).then_some(())
    })
    .await
    .context("the workers' pods never got SlurmNodeStateIdle")?;
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
    let job = run_open_job(&h, "slinky-2").await?;
    // Idle first: -1 goes, the busy highest ordinal stays undrained.
    scale(&c, &ns, 2).await?;
    let idle_gone = eventually(20, || async {
        let pods = pod_names(&c, &ns).await.ok()?;
        (!pods.contains(&format!("{NS_NAME}-1")) && pods.contains(&format!("{NS_NAME}-2"))).then_some(())
    })
    .await;
    ensure!(
        idle_gone.is_some(),
        "the idle pod did not go first: pods {:?}, node {}",
        pod_names(&c, &ns).await?,
        show(&h, "node", "slinky-2").await?
    );
    let busy = show(&h, "node", "slinky-2").await?;
    ensure!(
        !field(&busy, "State").is_some_and(|s| s.contains("DRAIN")),
        "the busy node was drained while an idle one could go: {busy}"
    );
    ensure!(job_state(&h, &job).await? == "RUNNING", "the job no longer runs");

    // Both remaining nodes busy: the highest ordinal is drained and waits for its job.
    let other = run_open_job(&h, "slinky-0").await?;
    h.exec_ok(&[
        "scontrol",
        "update",
        "nodename=slinky-0",
        "state=drain",
        "reason=bad dimm",
    ])
    .await?;
    scale(&c, &ns, 1).await?;
    let drained = eventually(20, || async {
        let node = show(&h, "node", "slinky-2").await.ok()?;
        let labels = pod_labels(&c, &ns, &format!("{NS_NAME}-2")).await?;
        (field(&node, "State").is_some_and(|s| s.contains("DRAIN"))
            && node.contains("Reason=slurm-operator:")
            && labels.get(keys::LABEL_POD_PROTECT).map(String::as_str) == Some("true"))
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
    end_job(&h, &other).await?;
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
    let kept = events(&c, &ns, NS_NAME).await?;
    ensure!(
        kept.iter().any(|(reason, note)| reason == "DrainKept"
            && note.contains("slinky-2")
            && note.contains("bad dimm")),
        "no DrainKept Event for slinky-2: {kept:?}"
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
    // Every state of the slurmctld pods the API server shows through the move has one active
    // pod at least (the label is added to the new one before it is taken from the old).
    let none_active = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = tokio::spawn(watch_active(c.client.clone(), ns.clone(), none_active.clone()));
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
    watch.abort();
    ensure!(
        !none_active.load(std::sync::atomic::Ordering::SeqCst),
        "a state with no active slurmctld pod was seen during the move (the label was taken before it was added)"
    );
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// Watch the slurmctld pods of `ns` and set `none_active` when a state has none carrying the
/// active label (after the watch's initial list, which had one).
async fn watch_active(
    client: kube::Client,
    ns: String,
    none_active: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use futures::StreamExt as _;
    use kube::runtime::watcher;
    let api = Api::<Pod>::namespaced(client, &ns);
    let config = watcher::Config::default().labels("app.kubernetes.io/name=slurmctld");
    let mut active = std::collections::BTreeMap::<String, bool>::new();
    let mut listed = false;
    let mut events = std::pin::pin!(watcher(api, config));
    while let Some(Ok(event)) = events.next().await {
        let is_active = |p: &Pod| {
            p.labels()
                .get(keys::LABEL_CONTROLLER_ACTIVE)
                .is_some_and(|v| v == "true")
        };
        match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                active.insert(
                    p.name_any(),
                    is_active(&p) && p.metadata.deletion_timestamp.is_none(),
                );
            }
            watcher::Event::Delete(p) => {
                active.remove(&p.name_any());
            }
            watcher::Event::InitDone => listed = true,
            watcher::Event::Init => {}
        }
        if listed && !active.values().any(|a| *a) {
            none_active.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// `pod-protect` is on exactly the pods whose node runs a job, and goes when the job ends.
#[tokio::test]
async fn pod_protect_is_on_exactly_the_busy_pods_and_goes_with_their_jobs() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "protect", 2).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1"]).await?;
    // A host that resyncs every 10 minutes, on a NodeSet it cannot sync (InvalidSpec): no
    // other pass than the protection's own comes in time.
    host.stop().await;
    let host = slinky_tests::slurm::host_with_resync(&c, &ns, &h, std::time::Duration::from_secs(600))?;
    Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"revisionHistoryLimit": -1}})),
        )
        .await?;
    let invalid = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "InvalidSpec").await.ok()??;
        (cond.status == "True").then_some(())
    })
    .await;
    ensure!(invalid.is_some(), "the NodeSet did not turn InvalidSpec");
    let protected = |c: &TestCluster| {
        let c = c.client.clone();
        let ns = ns.clone();
        async move {
            let pods = Api::<Pod>::namespaced(c, &ns)
                .list(&ListParams::default().labels(&format!("{}=true", keys::LABEL_POD_PROTECT)))
                .await
                .ok()?;
            let mut names: Vec<String> = pods.items.iter().map(ResourceExt::name_any).collect();
            names.sort();
            Some(names)
        }
    };
    let result = async {
        let job = run_open_job(&h, "slinky-1").await?;
        let started = std::time::Instant::now();
        let busy = vec![format!("{NS_NAME}-1")];
        // Within 30 s of the job starting (Slinky's refresh), whatever the NodeSet waits on.
        let on = eventually(30, || async { (protected(&c).await? == busy).then_some(()) }).await;
        eprintln!(
            "pod-protect set {:.1} s after the job started",
            started.elapsed().as_secs_f64()
        );
        ensure!(
            on.is_some(),
            "protected pods {:?}, want {busy:?}",
            protected(&c).await
        );
        // Still exactly that one over the next passes (one every 15 s here).
        host.passes_later(2).await?;
        ensure!(
            protected(&c).await == Some(busy.clone()),
            "protected pods {:?}",
            protected(&c).await
        );
        end_job(&h, &job).await?;
        let off = eventually(30, || async { protected(&c).await?.is_empty().then_some(()) }).await;
        ensure!(
            off.is_some(),
            "protected pods {:?} after the job",
            protected(&c).await
        );
        ensure!(
            job_state(&h, &job).await? == "COMPLETED",
            "the job did not complete"
        );
        Ok(())
    }
    .await;
    host.stop().await;
    h.shutdown().await;
    result
}

/// Wait (60 s at most) until `slinky-0` is drained for its NodeSet's deletion.
async fn drained_for_deletion(h: &SlurmLocal) -> Result<()> {
    let drained = eventually(60, || async {
        let node = show(h, "node", "slinky-0").await.ok()?;
        (field(&node, "State").is_some_and(|s| s.contains("DRAIN")) && node.contains("is being deleted"))
            .then_some(())
    })
    .await;
    ensure!(drained.is_some(), "node {}", show(h, "node", "slinky-0").await?);
    Ok(())
}

/// Wait (60 s at most) until the example NodeSet carries the host's `slurm-nodes` finalizer.
async fn finalized(nodesets: &Api<NodeSet>) -> Result<()> {
    eventually(60, || async {
        let n = nodesets.get(NS_NAME).await.ok()?;
        n.finalizers()
            .iter()
            .any(|f| f == keys::FINALIZER_SLURM_NODES)
            .then_some(())
    })
    .await
    .context("the NodeSet never got the host's finalizer")
}

/// A deleted NodeSet stays (its finalizer), its node drained, while a job runs there; once the
/// job ends it goes, [`RELEASE_SETTLE`](slinky_host::reconcile::nodeset::RELEASE_SETTLE) after
/// its node was seen idle.
#[tokio::test]
async fn a_deleted_nodeset_stays_while_a_job_runs_on_it() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "deleted", 1).await?;
    nodes_idle(&h, &["slinky-0"]).await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let result = async {
        finalized(&nodesets).await?;
        let job = run_open_job(&h, "slinky-0").await?;
        nodesets.delete(NS_NAME, &Default::default()).await?;
        drained_for_deletion(&h).await?;
        // Held over several passes while the job runs.
        host.passes_later(6).await?;
        ensure!(job_state(&h, &job).await? == "RUNNING", "the job no longer runs");
        let held = nodesets.get_opt(NS_NAME).await?;
        ensure!(
            held.as_ref()
                .is_some_and(|n| n.metadata.deletion_timestamp.is_some()),
            "the NodeSet went while its job ran"
        );
        end_job(&h, &job).await?;
        let ended = std::time::Instant::now();
        let gone = eventually(90, || async {
            nodesets.get_opt(NS_NAME).await.ok()?.is_none().then_some(())
        })
        .await;
        ensure!(gone.is_some(), "the NodeSet never went after its job");
        // Not before its node was seen idle for RELEASE_SETTLE: the finalizer's removal restarts
        // slurmctld (slurm.conf), which must have saved the job's end first.
        let settle = slinky_host::reconcile::nodeset::RELEASE_SETTLE;
        ensure!(
            ended.elapsed() >= settle,
            "the NodeSet went {:?} after its job's end, before {settle:?}",
            ended.elapsed()
        );
        ensure!(
            job_state(&h, &job).await? == "COMPLETED",
            "the job did not complete"
        );
        Ok(())
    }
    .await;
    host.stop().await;
    h.shutdown().await;
    result
}

/// A deleted NodeSet whose node is idle goes within seconds: the pass that drains the node asks
/// again soon, and the next one (draining nothing) removes the finalizer. Before, the release
/// waited for the next resync (5 minutes by default; found on the real node). The host here
/// resyncs every 10 minutes, so only the prompt recheck can release it.
#[tokio::test]
async fn a_deleted_idle_nodeset_goes_without_waiting_for_a_resync() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "deleted-idle", 1).await?;
    nodes_idle(&h, &["slinky-0"]).await?;
    host.stop().await;
    let host = slinky_tests::slurm::host_with_resync(&c, &ns, &h, std::time::Duration::from_secs(600))?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let result = async {
        finalized(&nodesets).await?;
        nodesets.delete(NS_NAME, &Default::default()).await?;
        let gone = eventually(60, || async {
            nodesets.get_opt(NS_NAME).await.ok()?.is_none().then_some(())
        })
        .await;
        ensure!(
            gone.is_some(),
            "the idle NodeSet was still there a minute after its deletion: {:?}",
            events(&c, &ns, NS_NAME).await?
        );
        Ok(())
    }
    .await;
    host.stop().await;
    h.shutdown().await;
    result
}

/// `sbatch --exclusive` a job that waits for SIGUSR1, in the partition `slinky` (on `node` when
/// given): its id.
async fn submit_exclusive(h: &SlurmLocal, node: Option<&str>) -> Result<String> {
    let mut args = vec!["sbatch", "--parsable", "--exclusive", "-p", "slinky"];
    if let Some(node) = node {
        args.extend(["-w", node]);
    }
    args.extend(["--wrap", "trap 'exit 0' USR1; while :; do sleep 1; done"]);
    let out = h.exec_ok(&args).await?;
    Ok(out.trim().split(';').next().unwrap_or_default().to_string())
}

/// A deleted NodeSet closes its partition first (no job is queued there any more), lets the job
/// queued there before run on its node (not drained while it waits), then drains the node and
/// goes once both jobs ended: no job lost, none new accepted.
#[tokio::test]
async fn a_deleted_nodesets_partition_takes_no_new_job_and_its_queued_job_still_runs() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "partition-closed", 1).await?;
    nodes_idle(&h, &["slinky-0"]).await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let result = async {
        finalized(&nodesets).await?;
        let running = submit_exclusive(&h, Some("slinky-0")).await?;
        eventually(30, || async {
            (job_state(&h, &running).await.ok()? == "RUNNING").then_some(())
        })
        .await
        .context("the first job never ran")?;
        let queued = submit_exclusive(&h, None).await?;
        ensure!(
            job_state(&h, &queued).await? == "PENDING",
            "the second job is not queued"
        );
        nodesets.delete(NS_NAME, &Default::default()).await?;
        // slurmctld reads the new slurm.conf (its pod rolls for the config hash).
        let closed = eventually(180, || async {
            let p = show(&h, "partition", "slinky").await.ok()?;
            field(&p, "State").is_some_and(|s| s == "DRAIN").then_some(())
        })
        .await;
        ensure!(
            closed.is_some(),
            "the partition was not closed: {}",
            show(&h, "partition", "slinky").await.unwrap_or_default()
        );
        let refused = h
            .exec(&["sbatch", "--parsable", "-p", "slinky", "--wrap", "true"])
            .await?;
        ensure!(
            !refused.status.success(),
            "a job was accepted into the closed partition: {}",
            String::from_utf8_lossy(&refused.stdout)
        );
        // The node is where the queued job will run: not drained while it waits.
        host.passes_later(3).await?;
        let node = show(&h, "node", "slinky-0").await?;
        ensure!(
            !field(&node, "State").is_some_and(|s| s.contains("DRAIN")),
            "the node was drained while a job waited for it: {node}"
        );
        // slurmctld restarts when its pod rolls for the new slurm.conf: asked until it answers.
        let still = eventually(60, || async { job_state(&h, &running).await.ok() }).await;
        ensure!(
            still.as_deref() == Some("RUNNING"),
            "the first job no longer runs: {still:?}"
        );
        end_job(&h, &running).await?;
        eventually(60, || async {
            (job_state(&h, &queued).await.ok()? == "RUNNING").then_some(())
        })
        .await
        .context("the queued job never ran")?;
        drained_for_deletion(&h).await?;
        ensure!(
            nodesets.get_opt(NS_NAME).await?.is_some(),
            "the NodeSet went while its queued job ran"
        );
        end_job(&h, &queued).await?;
        let gone = eventually(90, || async {
            nodesets.get_opt(NS_NAME).await.ok()?.is_none().then_some(())
        })
        .await;
        ensure!(gone.is_some(), "the NodeSet never went after its jobs");
        // The NodeSet's removal rewrites slurm.conf and restarts slurmctld: scontrol may not
        // reach it for a few seconds (CI saw "slurm_get_port: Address family '0'").
        for job in [&running, &queued] {
            let completed = eventually(60, || async {
                (job_state(&h, job).await.ok()? == "COMPLETED").then_some(())
            })
            .await;
            ensure!(
                completed.is_some(),
                "job {job} did not complete: {}",
                job_state(&h, job).await.unwrap_or_else(|e| e.to_string())
            );
        }
        Ok(())
    }
    .await;
    host.stop().await;
    h.shutdown().await;
    result
}

/// A node slurmctld marked DOWN "Not responding" (its slurmd died, the pod stays) is left alone:
/// the host neither resumes nor drains it, however many passes see it (an admin or Slurm decides).
#[tokio::test]
async fn a_not_responding_node_is_left_to_slurm() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let ns = c.namespace("not-responding").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            // slurmctld marks a silent slurmd DOWN after SlurmdTimeout (300 s by default).
            v["spec"]["extraConf"] = json!("SlurmdTimeout=5");
        }
        if v["kind"] == "NodeSet" {
            v["spec"]["replicas"] = json!(1);
        }
    })
    .await?;
    apply_file(&c, &ns, "restapi.yaml", |_| {}).await?;
    let h = SlurmLocal::start(c.client.clone(), &slurm, &ns, "slurm").await?;
    let host = host_for(&c, &ns, &h)?;
    let result = async {
        nodes_idle(&h, &["slinky-0"]).await?;
        h.kill_slurmd(&format!("{NS_NAME}-0")).await?;
        let down = eventually(90, || async {
            let node = show(&h, "node", "slinky-0").await.ok()?;
            (field(&node, "State").is_some_and(|s| s.contains("DOWN"))
                && node.contains("Reason=Not responding"))
            .then_some(())
        })
        .await;
        ensure!(down.is_some(), "node {}", show(&h, "node", "slinky-0").await?);
        host.passes_later(8).await?;
        let node = show(&h, "node", "slinky-0").await?;
        ensure!(
            field(&node, "State").is_some_and(|s| s.contains("DOWN"))
                && node.contains("Reason=Not responding"),
            "the host touched a node Slurm marked not responding: {node}"
        );
        ensure!(
            workers(&c, &ns).await? == [format!("{NS_NAME}-0")],
            "the pod of a not responding node went"
        );
        h.restart_slurmd(&format!("{NS_NAME}-0")).await?;
        Ok(())
    }
    .await;
    host.stop().await;
    h.shutdown().await;
    result
}

/// Three busy nodes whose jobs end in 60, 10 and 30 minutes: each pod carries its node's
/// `pod-deadline` (from Slurm's job end times, as Slinky writes it), and a scale to 2 drains the
/// node whose job ends first (`-1`), not the highest ordinal.
#[tokio::test]
async fn a_scale_in_drains_the_busy_node_whose_jobs_end_first() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "deadline", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    let result = async {
        let mut jobs = Vec::new();
        for (node, minutes) in [("slinky-0", 60), ("slinky-1", 10), ("slinky-2", 30)] {
            jobs.push(run_open_job_limited(&h, node, Some(minutes)).await?);
        }
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let deadline = |p: &Pod| {
            p.annotations()
                .get(keys::ANNOTATION_POD_DEADLINE)
                .and_then(|d| d.parse::<k8s_openapi::jiff::Timestamp>().ok())
        };
        let written = eventually(30, || async {
            let mut at = Vec::new();
            for o in 0..3 {
                at.push(deadline(&pods.get(&format!("{NS_NAME}-{o}")).await.ok()?)?);
            }
            Some(at)
        })
        .await
        .context("the pods never got their pod-deadline")?;
        ensure!(
            written[1] < written[2] && written[2] < written[0],
            "deadlines {written:?}: the 10-minute job's node first"
        );
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let minutes = (written[1].as_second() - now) as f64 / 60.0;
        ensure!(
            (8.0..=11.0).contains(&minutes),
            "-1's deadline is {minutes:.1} minutes away"
        );
        scale(&c, &ns, 2).await?;
        let drained = eventually(20, || async {
            let node = show(&h, "node", "slinky-1").await.ok()?;
            (field(&node, "State").is_some_and(|s| s.contains("DRAIN"))
                && node.contains("Reason=slurm-operator:"))
            .then_some(())
        })
        .await;
        ensure!(
            drained.is_some(),
            "slinky-1 was not drained: {}",
            show(&h, "node", "slinky-1").await?
        );
        for other in ["slinky-0", "slinky-2"] {
            let node = show(&h, "node", other).await?;
            ensure!(
                !field(&node, "State").is_some_and(|s| s.contains("DRAIN")),
                "{other} was drained too: {node}"
            );
        }
        for job in &jobs {
            end_job(&h, job).await?;
        }
        let gone = eventually(60, || async {
            let names = pod_names(&c, &ns).await.ok()?;
            (!names.contains(&format!("{NS_NAME}-1"))).then_some(())
        })
        .await;
        ensure!(
            gone.is_some(),
            "pod -1 never went: {:?}",
            pod_names(&c, &ns).await?
        );
        Ok(())
    }
    .await;
    host.stop().await;
    h.shutdown().await;
    result
}

/// `Reason=` of a `scontrol show node -o` line: up to the next ` Key=` (reasons hold spaces).
fn reason(line: &str) -> Option<&str> {
    let at = line.find("Reason=")? + "Reason=".len();
    let rest = &line[at..];
    // `Reason=why [user@time]`: the reason ends before the bracket of who set it.
    Some(rest.split(" [").next().unwrap_or(rest).trim_end())
}

/// Drains that are not the host's stay, whatever their prefix, and outlive a host restart and a
/// rolling update: a health checker's `slurm-operator:`-prefixed drain on `-0`, an admin's DOWN
/// (`bad-gpu`) on `-1` and a `pod-cordon` on pod `-2` are kept in the NodeSet's
/// `status.keptDrains`; with the host stopped, a new slurmd image is set, and a new host
/// replaces all three pods and gives each node what it had (the cordoned pod's replacement is
/// annotated again). Removing the annotation, or an admin's resume, returns a node to service
/// and the record goes.
#[tokio::test]
async fn drains_that_are_not_ours_survive_a_host_restart_and_a_rolling_update() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "kept", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    let health = "slurm-operator: GPU XID 79 (health check)";
    h.exec_ok(&[
        "scontrol",
        "update",
        "nodename=slinky-0",
        "state=drain",
        &format!("reason={health}"),
    ])
    .await?;
    h.exec_ok(&[
        "scontrol",
        "update",
        "nodename=slinky-1",
        "state=down",
        "reason=bad-gpu",
    ])
    .await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let cordon_patch = |on: bool| {
        Patch::Merge(
            json!({"metadata": {"annotations": {keys::ANNOTATION_POD_CORDON: on.then_some("true")}}}),
        )
    };
    pods.patch(
        &format!("{NS_NAME}-2"),
        &PatchParams::default(),
        &cordon_patch(true),
    )
    .await?;
    let cordoned = format!("slurm-operator: Pod ({ns}/{NS_NAME}-2) was cordoned");
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let want = [
        ("slinky-0", "DRAIN", health.to_string()),
        ("slinky-1", "DOWN", "bad-gpu".to_string()),
        ("slinky-2", "DRAIN", cordoned.clone()),
    ];
    let states_are = |nodes: Vec<(&'static str, &'static str, String)>| {
        let h = &h;
        async move {
            for (node, state, why) in &nodes {
                let line = show(h, "node", node).await.ok()?;
                let has = field(&line, "State").is_some_and(|s| s.split('+').any(|f| f == *state));
                (has && reason(&line) == Some(why.as_str())).then_some(())?;
            }
            Some(())
        }
    };
    let recorded = eventually(60, || async {
        let kept = nodesets.get(NS_NAME).await.ok()?.status?.kept_drains;
        let all = want.iter().all(|(node, state, why)| {
            kept.get(*node)
                .is_some_and(|k| k.state == *state && k.reason == *why)
        });
        (all && kept.len() == 3).then_some(())?;
        states_are(want.to_vec()).await
    })
    .await;
    ensure!(
        recorded.is_some(),
        "not kept: {:?}; nodes: {:?}",
        nodesets.get(NS_NAME).await?.status.map(|s| s.kept_drains),
        h.nodes(None).await?
    );
    // Several passes later nothing was undone (the health checker's drain looks like ours by
    // its prefix alone).
    host.passes_later(4).await?;
    ensure!(
        states_are(want.to_vec()).await.is_some(),
        "a drain that is not the host's was undone: {:?}",
        h.nodes(None).await?
    );

    // The host stops; a rolling update is asked for; a new host (nothing in its memory) does it.
    host.stop().await;
    let uid = |p: &Pod| p.uid().unwrap_or_default();
    let before: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(uid)
        .collect();
    nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"slurmd": {"image": "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04-v2"}}}),
            ),
        )
        .await?;
    let host = slinky_tests::slurm::host_for(&c, &ns, &h)?;
    let replaced = eventually(240, || async {
        let now = pods.list(&ListParams::default()).await.ok()?.items;
        let workers: Vec<&Pod> = now.iter().filter(|p| p.name_any().starts_with(NS_NAME)).collect();
        let fresh = workers.len() == 3
            && workers
                .iter()
                .all(|p| !before.contains(&uid(p)) && slinky_tests::host::pod_ready(p));
        fresh.then_some(())?;
        states_are(want.to_vec()).await
    })
    .await;
    ensure!(
        replaced.is_some(),
        "after the rolling update: {:?}; pods: {:?}",
        h.nodes(None).await?,
        pod_names(&c, &ns).await?
    );
    let annotated = pods.get(&format!("{NS_NAME}-2")).await?;
    ensure!(
        annotated
            .annotations()
            .get(keys::ANNOTATION_POD_CORDON)
            .map(String::as_str)
            == Some("true"),
        "the cordoned pod's replacement is not annotated: {:?}",
        annotated.annotations()
    );
    let kept_events = events(&c, &ns, NS_NAME).await?;
    for node in ["slinky-0", "slinky-1", "slinky-2"] {
        ensure!(
            kept_events
                .iter()
                .any(|(r, note)| r == "DrainKept" && note.contains(node)),
            "no DrainKept Event for {node}: {kept_events:?}"
        );
    }

    // The annotation removed: -2 returns to service. An admin resumes -1: its record goes.
    pods.patch(
        &format!("{NS_NAME}-2"),
        &PatchParams::default(),
        &cordon_patch(false),
    )
    .await?;
    h.exec_ok(&["scontrol", "update", "nodename=slinky-1", "state=resume"])
        .await?;
    let back = eventually(60, || async {
        let two = show(&h, "node", "slinky-2").await.ok()?;
        let kept = nodesets.get(NS_NAME).await.ok()?.status?.kept_drains;
        (idle(field(&two, "State")) && kept.keys().map(String::as_str).eq(["slinky-0"])).then_some(())
    })
    .await;
    ensure!(
        back.is_some(),
        "kept: {:?}; nodes: {:?}",
        nodesets.get(NS_NAME).await?.status.map(|s| s.kept_drains),
        h.nodes(None).await?
    );
    host.stop().await;
    h.shutdown().await;
    Ok(())
}
