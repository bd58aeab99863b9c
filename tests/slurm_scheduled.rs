//! `updateStrategy.type: ScheduledUpdate`, judged by a real Slurm: the host keeps the NodeSet's
//! maintenance reservation through slurmrestd (`scontrol` shows its flags, nodes and times),
//! replaces old pods only inside its window, through the drain gate (a job keeps its pod until
//! it ends), and deletes the reservation when the strategy changes away, when the NodeSet scales
//! to 0, and before a deleted NodeSet's finalizer goes.
//!
//! Needs root and a Slurm build (`../shared/tools/realslurm/setup.sh`); without them each test
//! skips (listed in `$SLINKY_TEST_SKIPS`), and fails instead when `SLINKY_TEST_REQUIRE` has
//! `slurm`. The tests take turns (each runs a whole Slurm).

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    ResourceExt,
    api::{Api, DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use slinky_api::{NodeSet, keys};
use slinky_slurm_local::SlurmLocal;
use slinky_tests::{
    TestCluster, eventually,
    host::{NS_NAME, cluster_with_statefulsets, nodeset_condition, scale},
    slurm::{end_job, field, job_state, nodes_idle, run_open_job_limited, show, start},
};

/// The example NodeSet's reservation.
const RESERVATION: &str = "SlurmOperatorMaint-slurm-worker-slinky";
/// A slurmd image other than the example's: a new pod revision.
const NEW_IMAGE: &str = "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04-v2";

/// The reservation as `scontrol --json show reservation` reports it, `None` when Slurm has none.
async fn reservation(h: &SlurmLocal) -> Result<Option<Value>> {
    let out = h
        .exec(&["scontrol", "--json", "show", "reservation", RESERVATION])
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) if !out.status.success() => return Ok(None),
        Err(e) => bail!("scontrol's JSON: {e}: {text}"),
    };
    Ok(v["reservations"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == RESERVATION))
        .cloned())
}

/// `scontrol show reservation -o`: one line, for messages (and the report).
async fn show_reservation(h: &SlurmLocal) -> String {
    match h
        .exec(&["scontrol", "show", "reservation", RESERVATION, "-o"])
        .await
    {
        Ok(out) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => e.to_string(),
    }
}

/// A Slurm "number with flags".
fn number(v: &Value) -> Option<i64> {
    v["number"].as_i64()
}

fn flags(r: &Value) -> Vec<String> {
    r["flags"]
        .as_array()
        .map(|f| f.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// Switch the example NodeSet to `ScheduledUpdate` with a window of `duration` from `start`.
async fn schedule(c: &TestCluster, ns: &str, start: Timestamp, duration: &str) -> Result<()> {
    Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updateStrategy": {
                "type": "ScheduledUpdate",
                "scheduledUpdate": {"startTime": start.to_string(), "duration": duration}
            }}})),
        )
        .await?;
    Ok(())
}

async fn patch_nodeset(c: &TestCluster, ns: &str, patch: Value) -> Result<()> {
    Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .patch(NS_NAME, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Wait until the reservation exists with these nodes and satisfies `times` (its start and end).
async fn reserved(h: &SlurmLocal, nodes: &str, times: impl Fn(i64, i64) -> bool) -> Result<Value> {
    let found = eventually(60, || async {
        let r = reservation(h).await.ok()??;
        let (start, end) = (number(&r["start_time"])?, number(&r["end_time"])?);
        (r["node_list"] == nodes && times(start, end)).then_some(r)
    })
    .await;
    match found {
        Some(r) => Ok(r),
        None => bail!(
            "no reservation over {nodes} as wanted: {}",
            show_reservation(h).await
        ),
    }
}

/// Wait until Slurm has no reservation of the NodeSet.
async fn unreserved(h: &SlurmLocal) -> Result<()> {
    let gone = eventually(60, || async {
        reservation(h).await.ok()?.is_none().then_some(())
    })
    .await;
    ensure!(
        gone.is_some(),
        "the reservation stays: {}",
        show_reservation(h).await
    );
    Ok(())
}

async fn finalizers(c: &TestCluster, ns: &str) -> Result<Option<Vec<String>>> {
    Ok(Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .get_opt(NS_NAME)
        .await?
        .map(|n| n.finalizers().to_vec()))
}

/// The UIDs of the NodeSet's pods by name (terminating ones left out).
async fn pod_uids(c: &TestCluster, ns: &str) -> Result<std::collections::BTreeMap<String, String>> {
    Ok(Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && p.name_any().starts_with(NS_NAME))
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

/// A window an hour away: the reservation holds the NodeSet's nodes with MAINT at the spec's
/// times, and a new revision rolls nothing; a scale-in takes its node out; scaled to 0 the
/// reservation goes, and comes back with the pods; switched to RollingUpdate it goes for good
/// (with the finalizer and the condition) and the pods roll.
#[tokio::test]
async fn a_future_window_reserves_the_nodes_and_rolls_nothing() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "sched-future", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    let start = Timestamp::from_second(Timestamp::now().as_second() + 3600)?;
    schedule(&c, &ns, start, "45m").await?;
    let r = reserved(&h, "slinky-[0-2]", |s, e| {
        s == start.as_second() && e == start.as_second() + 45 * 60
    })
    .await?;
    eprintln!("scontrol: {}", show_reservation(&h).await);
    let f = flags(&r);
    ensure!(
        f.iter().any(|f| f == "MAINT") && f.iter().any(|f| f == "IGNORE_JOBS"),
        "{f:?}"
    );
    ensure!(r["users"] == "slurm", "{r}");
    let line = show_reservation(&h).await;
    ensure!(
        field(&line, "Nodes") == Some("slinky-[0-2]") && line.contains("State=INACTIVE"),
        "{line}"
    );
    let cond = eventually(30, || async {
        let c = nodeset_condition(&c, &ns, "ReservationCreated").await.ok()??;
        (c.status == "True" && c.reason == "Scheduled").then_some(c)
    })
    .await
    .context("ReservationCreated is not True/Scheduled")?;
    ensure!(cond.message.contains(RESERVATION), "{}", cond.message);
    ensure!(
        finalizers(&c, &ns)
            .await?
            .is_some_and(|f| f.iter().any(|f| f == keys::FINALIZER_RESERVATION)),
        "no finalizer {}",
        keys::FINALIZER_RESERVATION
    );

    // A new revision: nothing rolls before the window.
    let before = pod_uids(&c, &ns).await?;
    patch_nodeset(&c, &ns, json!({"spec": {"slurmd": {"image": NEW_IMAGE}}})).await?;
    host.passes_later(8).await?;
    ensure!(
        pod_uids(&c, &ns).await? == before,
        "pods rolled outside the window"
    );
    let status = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get(NS_NAME)
        .await?
        .status
        .unwrap_or_default();
    ensure!(status.updated_replicas == 0, "{status:?}");

    // Scale-in: the reservation follows the NodeSet's nodes.
    scale(&c, &ns, 2).await?;
    reserved(&h, "slinky-[0-1]", |s, _| s == start.as_second()).await?;
    // To 0: no pod to update, no reservation.
    scale(&c, &ns, 0).await?;
    unreserved(&h).await?;
    let no_replicas = eventually(30, || async {
        let c = nodeset_condition(&c, &ns, "ReservationCreated").await.ok()??;
        (c.status == "False" && c.reason == "NoReplicas").then_some(())
    })
    .await;
    ensure!(
        no_replicas.is_some(),
        "ReservationCreated is not False/NoReplicas"
    );
    // Back to 2: made again.
    scale(&c, &ns, 2).await?;
    reserved(&h, "slinky-[0-1]", |s, _| s == start.as_second()).await?;

    // RollingUpdate: the reservation, its finalizer and its condition go; the pods roll.
    patch_nodeset(
        &c,
        &ns,
        json!({"spec": {"updateStrategy": {"type": "RollingUpdate"}}}),
    )
    .await?;
    unreserved(&h).await?;
    let clean = eventually(30, || async {
        let f = finalizers(&c, &ns).await.ok()??;
        let cond = nodeset_condition(&c, &ns, "ReservationCreated").await.ok()?;
        (!f.iter().any(|f| f == keys::FINALIZER_RESERVATION) && cond.is_none()).then_some(())
    })
    .await;
    ensure!(clean.is_some(), "finalizers {:?}", finalizers(&c, &ns).await?);
    let rolled = eventually(90, || async {
        let st = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
            .get(NS_NAME)
            .await
            .ok()?
            .status?;
        (st.updated_replicas == 2 && st.ready_replicas == 2).then_some(())
    })
    .await;
    ensure!(rolled.is_some(), "the rolling update did not finish");
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// A window moved to now: the reservation starts now, the idle old pods are replaced at once, the
/// one whose node runs a job keeps its pod until the job ends; then the NodeSet is deleted and
/// the reservation goes before its finalizer does.
#[tokio::test]
async fn a_begun_window_rolls_the_pods_and_a_job_keeps_its_pod() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "sched-now", 3).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1", "slinky-2"]).await?;
    let later = Timestamp::from_second(Timestamp::now().as_second() + 3600)?;
    schedule(&c, &ns, later, "30m").await?;
    reserved(&h, "slinky-[0-2]", |s, _| s == later.as_second()).await?;
    // A job that ends before the window may start (Slurm keeps reserved nodes for the window).
    let job = run_open_job_limited(&h, "slinky-1", Some(5)).await?;
    let before = pod_uids(&c, &ns).await?;
    patch_nodeset(&c, &ns, json!({"spec": {"slurmd": {"image": NEW_IMAGE}}})).await?;
    let now = Timestamp::now();
    schedule(&c, &ns, now, "30m").await?;
    reserved(&h, "slinky-[0-2]", |s, e| {
        s >= now.as_second() && s <= Timestamp::now().as_second() && e == now.as_second() + 1800
    })
    .await?;
    eprintln!("scontrol: {}", show_reservation(&h).await);
    // The idle ones are replaced; the busy one is drained and waits for its job.
    let replaced = eventually(60, || async {
        let uids = pod_uids(&c, &ns).await.ok()?;
        let node = show(&h, "node", "slinky-1").await.ok()?;
        let new = |p: &str| {
            let name = format!("{NS_NAME}-{p}");
            uids.get(&name).is_some_and(|u| Some(u) != before.get(&name))
        };
        (new("0")
            && new("2")
            && uids.get(&format!("{NS_NAME}-1")) == before.get(&format!("{NS_NAME}-1"))
            && node.contains("Reason=slurm-operator:"))
        .then_some(node)
    })
    .await;
    let Some(node) = replaced else {
        bail!(
            "pods {:?} (before {before:?}); node {}; reservation {}",
            pod_uids(&c, &ns).await?,
            show(&h, "node", "slinky-1").await?,
            show_reservation(&h).await
        );
    };
    ensure!(node.contains("maintenance window"), "{node}");
    ensure!(job_state(&h, &job).await? == "RUNNING", "the job no longer runs");
    let active = eventually(30, || async {
        let c = nodeset_condition(&c, &ns, "ReservationCreated").await.ok()??;
        (c.status == "True" && c.reason == "Active").then_some(())
    })
    .await;
    ensure!(active.is_some(), "ReservationCreated is not True/Active");
    // The busy pod stays over several passes while its job runs; then the job ends.
    host.passes_later(6).await?;
    let uids = pod_uids(&c, &ns).await?;
    let busy = format!("{NS_NAME}-1");
    ensure!(
        uids.get(&busy) == before.get(&busy),
        "the busy pod was replaced while its job ran"
    );
    end_job(&h, &job).await?;
    // After the job, -1 is replaced too.
    let done = eventually(90, || async {
        let uids = pod_uids(&c, &ns).await.ok()?;
        let name = format!("{NS_NAME}-1");
        uids.get(&name)
            .is_some_and(|u| Some(u) != before.get(&name))
            .then_some(())
    })
    .await;
    ensure!(done.is_some(), "node -1: {}", show(&h, "node", "slinky-1").await?);
    let line = show(&h, "job", &job).await?;
    ensure!(field(&line, "JobState") == Some("COMPLETED"), "{line}");
    let st = eventually(60, || async {
        let st = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
            .get(NS_NAME)
            .await
            .ok()?
            .status?;
        (st.updated_replicas == 3 && st.ready_replicas == 3).then_some(st)
    })
    .await;
    if st.is_none() {
        let pods: Vec<(String, Option<String>, Value)> = Api::<Pod>::namespaced(c.client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| {
                (
                    p.name_any(),
                    p.labels().get(keys::LABEL_REVISION_HASH).cloned(),
                    serde_json::to_value(&p.status).unwrap_or_default(),
                )
            })
            .collect();
        bail!(
            "not all pods updated: status {:?}; pods {pods:?}; nodes {:?}",
            Api::<NodeSet>::namespaced(c.client.clone(), &ns)
                .get(NS_NAME)
                .await?
                .status,
            h.nodes(None).await?
        );
    }

    // Deleted: the reservation goes first, then the finalizer, then the NodeSet.
    Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .delete(NS_NAME, &DeleteParams::default())
        .await?;
    // Every look: while the reservation exists, so does the finalizer.
    let mut seen_held = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let f = finalizers(&c, &ns).await?;
        let r = reservation(&h).await?;
        let held = f
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == keys::FINALIZER_RESERVATION));
        seen_held |= held;
        ensure!(
            held || r.is_none(),
            "the finalizer went while the reservation exists: {}",
            show_reservation(&h).await
        );
        if f.is_none() {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the NodeSet stays: finalizers {f:?}, reservation {}; nodes {:?}",
            show_reservation(&h).await,
            h.nodes(None).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(seen_held, "the finalizer was never seen holding the NodeSet");
    unreserved(&h).await?;
    host.stop().await;
    h.shutdown().await;
    Ok(())
}

/// A recurring window (`DAILY`, as a NodeSet migrated from Slinky may have) is served, not
/// refused: its first occurrence was yesterday, so the host reserves today's, with the flag, and
/// replaces the old pods when it opens.
#[tokio::test]
async fn a_daily_window_reserves_todays_occurrence_and_rolls_the_pods_in_it() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "sched-daily", 2).await?;
    nodes_idle(&h, &["slinky-0", "slinky-1"]).await?;
    let before = pod_uids(&c, &ns).await?;
    let today = Timestamp::now().as_second() + 40;
    let yesterday = Timestamp::from_second(today - 86_400)?;
    patch_nodeset(
        &c,
        &ns,
        json!({"spec": {"slurmd": {"image": NEW_IMAGE}, "updateStrategy": {
            "type": "ScheduledUpdate",
            "scheduledUpdate": {"startTime": yesterday.to_string(), "duration": "10m", "flags": ["daily"]}
        }}}),
    )
    .await?;
    let r = reserved(&h, "slinky-[0-1]", |s, e| s == today && e == today + 600).await?;
    ensure!(flags(&r).iter().any(|f| f == "DAILY"), "{r}");
    ensure!(
        nodeset_condition(&c, &ns, "InvalidSpec")
            .await?
            .is_none_or(|c| c.status != "True"),
        "a DAILY window was refused"
    );
    // Nothing rolls before the occurrence opens; everything does in it.
    ensure!(
        pod_uids(&c, &ns).await? == before,
        "pods rolled before the window"
    );
    let rolled = eventually(90, || async {
        let now = pod_uids(&c, &ns).await.ok()?;
        (now.len() == 2 && now.iter().all(|(n, u)| before.get(n) != Some(u))).then_some(())
    })
    .await;
    ensure!(
        rolled.is_some(),
        "pods {:?} (before {before:?}); reservation {}",
        pod_uids(&c, &ns).await?,
        show_reservation(&h).await
    );
    let active = nodeset_condition(&c, &ns, "ReservationCreated").await?;
    ensure!(
        active.as_ref().is_some_and(|c| c.status == "True"),
        "ReservationCreated: {active:?}"
    );
    host.stop().await;
    h.shutdown().await;
    Ok(())
}
