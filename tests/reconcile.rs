//! The reconciliation host end to end, on the embedded API server over HTTP: scaling, cache lag,
//! failed and timed-out creates, conflict storms, restarts, steady state, rolling updates, and the
//! Controller's Service.

use std::{collections::BTreeSet, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams},
};
use serde_json::json;
use slinky_api::{Controller, NodeSet};
use slinky_host::embedded::{FaultError, FaultRule, Times};
use slinky_tests::{
    eventually,
    host::{
        Host, NS_NAME, apply_example, cluster, converge, converge_current, events, names, pod_names,
        pod_ready, scale, start_example,
    },
    inject_fault,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scale_0_5_2_7_0_keeps_the_right_ordinals_and_status() -> Result<()> {
    let c = cluster(true).await;
    let (ns, host) = start_example(&c, "scale", 0).await?;
    converge_current(&c, &ns, &names(&[]), c.server.is_some()).await?;
    for (replicas, ordinals) in [
        (5, vec![0, 1, 2, 3, 4]),
        (2, vec![0, 1]),
        (7, vec![0, 1, 2, 3, 4, 5, 6]),
        (0, vec![]),
    ] {
        let g = scale(&c, &ns, replicas).await?;
        converge(&c, &ns, &names(&ordinals), g, c.server.is_some())
            .await
            .with_context(|| format!("scaling to {replicas}"))?;
    }
    let st = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get(NS_NAME)
        .await?
        .status
        .context("status")?;
    assert_eq!(
        st.selector.as_deref(),
        Some("app.kubernetes.io/instance=slurm-worker-slinky,app.kubernetes.io/name=slurmd")
    );
    assert_eq!(host.handles.expectations.total_pending(), 0);
    // The Controller's Service exists and the Controller is Ready.
    let svc = Api::<Service>::namespaced(c.client.clone(), &ns)
        .get("slurm-controller")
        .await?;
    assert_eq!(
        svc.owner_references().first().map(|o| o.kind.as_str()),
        Some("Controller")
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lagging_caches_never_cause_duplicate_or_extra_creates() -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let c = cluster(false).await;
    let Some(server) = c.embedded("fault injection") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "lag", 0).await?;
    host.wait_ready().await?;
    server.faults().set_watch_delay(Duration::from_millis(150));
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    scale(&c, &ns, 6).await?;
    // A burst of reconciles while the caches lag.
    for i in 0..30 {
        api.patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"poke": i.to_string()}}})),
        )
        .await?;
    }
    let ok = eventually(60, || async {
        (pod_names(&c, &ns).await.ok()?.len() == 6).then_some(())
    })
    .await;
    ensure!(ok.is_some(), "did not reach 6 pods");
    // Two resyncs of the Controller and the NodeSet (and the burst's last passes): no 7th create.
    host.passes_later(6).await?;
    assert_eq!(pod_names(&c, &ns).await?, names(&[0, 1, 2, 3, 4, 5]));
    let creates = host.handles.writes.snapshot();
    let attempted: u64 = creates
        .iter()
        .filter(|((v, _), _)| v == "create")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(attempted, 6, "every create attempt made a new pod: {creates:?}");
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_and_timed_out_creates_release_expectations_and_converge() -> Result<()> {
    let c = cluster(true).await;
    let Some(server) = c.embedded("fault injection") else {
        return Ok(());
    };
    let ns = c.namespace("failing").await;
    apply_example(&c, &ns, 0).await?;
    inject_fault(
        server,
        "create",
        "pods",
        FaultError::Internal,
        Times::Probability(0.5),
    );
    server
        .faults()
        .add(FaultRule::new("create", "pods", FaultError::Timeout, Times::Count(2)).after());
    let host = Host::start(&c, &ns)?;
    let g = scale(&c, &ns, 8).await?;
    converge(&c, &ns, &names(&[0, 1, 2, 3, 4, 5, 6, 7]), g, true).await?;
    let fired = server.faults().fired().len();
    ensure!(fired >= 3, "faults fired: {fired}");
    assert_eq!(
        host.handles.expectations.total_pending(),
        0,
        "no expectation left raised"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conflict_storm_on_status_converges_without_lost_updates() -> Result<()> {
    let c = cluster(true).await;
    let Some(server) = c.embedded("fault injection") else {
        return Ok(());
    };
    let ns = c.namespace("storm").await;
    apply_example(&c, &ns, 3).await?;
    inject_fault(
        server,
        "patch",
        "nodesets/status",
        FaultError::Conflict,
        Times::Probability(0.6),
    );
    // The host's caches lag 100 ms: its status writes start from objects older than the other
    // writer's latest condition.
    server.faults().set_watch_delay(Duration::from_millis(100));
    let host = Host::start(&c, &ns)?;
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    // Every 10 ms, the other writer's condition as the API serves it: a status write that loses
    // it shows here even when a later write puts it back.
    let (stop_watching, watching) = tokio::sync::watch::channel(false);
    let seen = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut seen: Vec<Option<String>> = Vec::new();
            while !*watching.borrow() {
                if let Ok(o) = api.get_status(NS_NAME).await {
                    let m = o
                        .status
                        .iter()
                        .flat_map(|s| s.conditions.iter())
                        .find(|c| c.type_ == "SiteCheck")
                        .map(|c| c.message.clone());
                    if seen.last() != Some(&m) {
                        seen.push(m);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            seen
        })
    };
    // Another writer keeps setting a condition of its own on the NodeSet's status while the host
    // writes its own (pods being created and becoming ready), both through the 60% conflicts.
    let other = {
        let api = api.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                set_other_condition(&api, &format!("storm-{i}")).await?;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            anyhow::Ok(())
        })
    };
    converge_current(&c, &ns, &names(&[0, 1, 2]), true).await?;
    other.await??;
    // The host writes again after the storm (a label poke is a pass; the pods' readiness and the
    // scale below are status changes): two resyncs of the Controller and the NodeSet, and more.
    host.passes_later(6).await?;
    let site = |o: &NodeSet| {
        o.status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == "SiteCheck")
            .map(|c| c.message.clone())
    };
    assert_eq!(
        site(&api.get(NS_NAME).await?).as_deref(),
        Some("storm-39"),
        "a host status write put back an older condition of the other writer's"
    );
    // Another writer sets a condition of its own on status between the scale the host sees and
    // the host's status write (the host's cache lags 300 ms): the host's write hits a real 409,
    // and its retry, computed from the fresh object, keeps the other writer's condition. (A write
    // without a resourceVersion, or a retry that ignores what it re-read, loses it.)
    server.faults().set_watch_delay(Duration::from_millis(300));
    let g = scale(&c, &ns, 4).await?;
    set_other_condition(&api, "after-scale").await?;
    converge(&c, &ns, &names(&[0, 1, 2, 3]), g, true).await?;
    server.faults().set_watch_delay(Duration::ZERO);
    // Resyncs, more status writes: two of the Controller and the NodeSet, and more.
    host.passes_later(6).await?;
    let conds = api
        .get(NS_NAME)
        .await?
        .status
        .map(|s| s.conditions)
        .unwrap_or_default();
    ensure!(
        conds
            .iter()
            .any(|c| c.type_ == "SiteCheck" && c.message == "after-scale"),
        "another writer's condition was lost: {conds:?}"
    );
    ensure!(
        conds.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conds:?}"
    );
    ensure!(
        host.handles.writes.conflict_retries.get() > 0,
        "conflicts were retried"
    );
    let _ = stop_watching.send(true);
    let seen = seen.await?;
    // Once set, the condition only ever moves forward: storm-0 … storm-39, then after-scale.
    let rank = |m: &Option<String>| match m.as_deref() {
        None => -1,
        Some("after-scale") => 1000,
        Some(s) => s
            .strip_prefix("storm-")
            .and_then(|n| n.parse::<i32>().ok())
            .unwrap_or(-2),
    };
    let first_set = seen.iter().position(|m| m.is_some()).unwrap_or(seen.len());
    ensure!(
        seen[first_set..].windows(2).all(|w| rank(&w[1]) > rank(&w[0])),
        "a status write put back an older condition of the other writer's, or dropped it: {seen:?}"
    );
    host.stop().await;
    Ok(())
}

/// Set condition `SiteCheck` on the example NodeSet's status as another controller would: read,
/// modify, write with the resourceVersion read, again on 409.
async fn set_other_condition(api: &Api<NodeSet>, message: &str) -> Result<()> {
    let dynamic = Api::<DynamicObject>::namespaced_with(
        api.clone().into_client(),
        api.namespace().unwrap_or_default(),
        &ApiResource::erase::<NodeSet>(&()),
    );
    set_condition_of(&dynamic, NS_NAME, message).await
}

/// Set condition `SiteCheck` on the status of `name` as another controller would: read, modify,
/// write with the resourceVersion read, again on 409 (the object's other conditions are kept).
async fn set_condition_of(api: &Api<DynamicObject>, name: &str, message: &str) -> Result<()> {
    for _ in 0..100 {
        let obj = api.get_status(name).await?;
        let mut conds = obj.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conds.retain(|c| c["type"] != "SiteCheck");
        conds.push(json!({"type": "SiteCheck", "status": "True",
            "reason": "Checked", "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}));
        let patch = json!({"metadata": {"resourceVersion": obj.resource_version()},
            "status": {"conditions": conds}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    bail!("could not set the SiteCheck condition in 100 attempts")
}

/// Passes of `kind` (`nodeset`, `controller`) the host ran, whatever their result.
fn passes(host: &Host, kind: &str) -> u64 {
    host.handles
        .metrics
        .snapshot()
        .iter()
        .filter(|((k, _), _)| k == kind)
        .map(|(_, n)| n)
        .sum()
}

/// Wait until the host has run no pass for a second (30 s at most); then the NodeSet and the
/// Controller pass counts.
async fn quiet(host: &Host) -> Result<(u64, u64)> {
    let count = || (passes(host, "nodeset"), passes(host, "controller"));
    let mut last = count();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = count();
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    bail!("the host kept reconciling: {last:?} passes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_writes_trigger_no_pass_and_a_new_generation_one() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("triggers").await;
    apply_example(&c, &ns, 2).await?;
    // No resync within the test: every pass counted was triggered by a watch event.
    let host = Host::start_resync(&c, &ns, Duration::from_secs(3600))?;
    converge_current(&c, &ns, &names(&[0, 1]), c.server.is_some()).await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let controllers = Api::<Controller>::namespaced(c.client.clone(), &ns);
    let controller_status =
        Api::<DynamicObject>::namespaced_with(c.client.clone(), &ns, &ApiResource::erase::<Controller>(&()));
    let start = quiet(&host).await?;

    // Another controller writes both parents' status: nothing a pass reads changed.
    for i in 0..3 {
        set_other_condition(&nodesets, &format!("NodeSet status {i}")).await?;
        set_condition_of(&controller_status, "slurm", &format!("Controller status {i}")).await?;
    }
    // The host's caches hold the last of them (their watch events came): a pass they would
    // trigger is due now, not after `quiet` has already looked.
    let (nodeset_ref, controller_ref) = (
        kube::runtime::reflector::ObjectRef::<NodeSet>::new(NS_NAME).within(&ns),
        kube::runtime::reflector::ObjectRef::<Controller>::new("slurm").within(&ns),
    );
    eventually(30, || async {
        let n = host.handles.nodesets.get(&nodeset_ref)?;
        let c = host.handles.controllers.get(&controller_ref)?;
        let has = |conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], m: &str| {
            conds.iter().any(|c| c.message == m)
        };
        (has(&n.status.as_ref()?.conditions, "NodeSet status 2")
            && has(&c.status.as_ref()?.conditions, "Controller status 2"))
        .then_some(())
    })
    .await
    .context("the host's caches never showed the other controller's status writes")?;
    let after_status = quiet(&host).await?;
    assert_eq!(
        after_status, start,
        "(NodeSet, Controller) passes: status-only updates trigger none"
    );

    // A new NodeSet generation that changes no pod and no slurm.conf line: one pass of the
    // NodeSet (whose own status write, observedGeneration, triggers no second one) and one of its
    // Controller (slurm.conf lists its NodeSets).
    let g = nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"workloadDisruptionProtection": true}})),
        )
        .await?
        .metadata
        .generation;
    eventually(30, || async {
        let st = nodesets.get(NS_NAME).await.ok()?.status?;
        (st.observed_generation == g).then_some(())
    })
    .await
    .context("the new generation was never observed")?;
    let after_spec = quiet(&host).await?;
    assert_eq!(
        (after_spec.0 - after_status.0, after_spec.1 - after_status.1),
        (1, 1),
        "(NodeSet, Controller) passes for a new NodeSet generation"
    );

    // A new Controller generation (a slurm.conf line): its NodeSets pass once; the Controller's
    // own status write (observedGeneration) triggers neither it nor them again.
    let cg = controllers
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"extraConf": "SchedulerParameters=triggers"}})),
        )
        .await?
        .metadata
        .generation;
    eventually(30, || async {
        let st = controllers.get("slurm").await.ok()?.status?;
        (st.observed_generation == cg).then_some(())
    })
    .await
    .context("the new Controller generation was never observed")?;
    let after_controller = quiet(&host).await?;
    assert_eq!(
        after_controller.0 - after_spec.0,
        1,
        "NodeSet passes for a new Controller generation"
    );
    ensure!(after_controller.1 > after_spec.1, "the Controller passed");

    // The NodeSet's labels reach its pods and children: a pass (at least one; the children
    // it re-applies trigger it again, as child events must).
    nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"site": "a"}}})),
        )
        .await?;
    let after_labels = quiet(&host).await?;
    ensure!(
        after_labels.0 > after_controller.0,
        "a label change triggers the NodeSet"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn observed_generation_waits_for_a_pass_that_synced() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("a held pod watch") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "observed", 1).await?;
    converge_current(&c, &ns, &names(&[0]), false).await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    // The host's pod watch shows nothing from now on: the pods it creates stay awaited.
    server.faults().hold_watch("pods");
    let g2 = scale(&c, &ns, 2).await?;
    eventually(30, || async {
        let created = pods.get_opt(&format!("{NS_NAME}-1")).await.ok()??;
        let st = nodesets.get(NS_NAME).await.ok()?.status?;
        (st.observed_generation == Some(g2)).then_some(created)
    })
    .await
    .context("generation 2's pass did not create pod 1 and say so")?;
    // A new generation while pod 1's creation is still awaited: the passes it triggers (and the
    // 500 ms retries) wait on the expectations, sync nothing, and must not claim to have
    // observed it.
    let g3 = scale(&c, &ns, 3).await?;
    eventually(30, || async {
        let st = nodesets.get(NS_NAME).await.ok()?.status?;
        (st.desired == 3).then_some(())
    })
    .await
    .context("no pass wrote the status of generation 3")?;
    // Looked at every 200 ms until the host made 6 more passes (the 500 ms retries and the
    // resyncs of the NodeSet, the Controller's resyncs).
    {
        let waited = host.passes_later(6);
        tokio::pin!(waited);
        let mut done = false;
        loop {
            let st = nodesets.get(NS_NAME).await?.status.unwrap_or_default();
            assert_eq!(
                st.observed_generation,
                Some(g2),
                "a pass that waited on its expectations observed generation {g3}"
            );
            ensure!(
                pods.get_opt(&format!("{NS_NAME}-2")).await?.is_none(),
                "no pod is created while expectations wait"
            );
            if done {
                break;
            }
            tokio::select! {
                passed = &mut waited => {
                    passed?;
                    done = true;
                }
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
    server.faults().release_watch("pods");
    converge(&c, &ns, &names(&[0, 1, 2]), g3, false).await?;
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn steady_state_makes_no_writes_and_a_restart_adopts_without_duplicates() -> Result<()> {
    let c = cluster(true).await;
    let (ns, host) = start_example(&c, "steady", 4).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2, 3]), c.server.is_some()).await?;
    // The last status writes done: no write across 4 passes (two resyncs of the Controller and
    // the NodeSet).
    let settled = eventually(90, || async {
        let before = host.handles.writes.total();
        host.passes_later(4).await.ok()?;
        (host.handles.writes.total() == before).then_some(())
    })
    .await;
    ensure!(
        settled.is_some(),
        "writes never stopped: {:?}",
        host.handles.writes.snapshot()
    );
    let before = host.handles.writes.total();
    let reconciles = host.handles.metrics.count("NodeSet", "ok");
    // Several 1 s resyncs: four of the Controller and four of the NodeSet.
    host.passes_later(8).await?;
    ensure!(
        host.handles.metrics.count("NodeSet", "ok") >= reconciles + 2,
        "resyncs happened"
    );
    assert_eq!(
        host.handles.writes.total(),
        before,
        "a steady state makes zero writes: {:?}",
        host.handles.writes.snapshot()
    );

    // Kill mid-scale; a new host picks up the existing pods and creates only the missing ones.
    scale(&c, &ns, 9).await?;
    tokio::time::sleep(Duration::from_millis(60)).await;
    host.stop().await;
    let existing = pod_names(&c, &ns).await?;
    let second = Host::start(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), c.server.is_some()).await?;
    let created = second.handles.writes.ok("create") as usize;
    assert_eq!(
        created,
        9 - existing.len(),
        "the new host created only the missing pods (had {existing:?})"
    );
    let conflicts = second
        .handles
        .writes
        .snapshot()
        .get(&("create".to_string(), "conflict".to_string()))
        .copied()
        .unwrap_or(0);
    assert_eq!(conflicts, 0, "no create collided with an existing pod");
    second.stop().await;
    Ok(())
}

/// Issue 22 item 12: at scale, `Created pods: …` listing every pod was longer than the 1,024
/// bytes kube-apiserver allows an Event's note, and was refused (lost). Each Event names a few
/// pods and counts the rest; none is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_of_a_large_scale_name_a_few_pods_and_count_the_rest() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "bigevents", 0).await?;
    let all: Vec<u32> = (0..60).collect();
    let g = scale(&c, &ns, 60).await?;
    converge(&c, &ns, &names(&all), g, false).await?;
    let g = scale(&c, &ns, 0).await?;
    converge(&c, &ns, &names(&[]), g, false).await?;
    // Created from the lowest ordinal, deleted from the highest.
    let five = |ordinals: &mut dyn Iterator<Item = u32>| {
        ordinals
            .take(5)
            .map(|o| format!("{NS_NAME}-{o}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let want = [
        (
            "SuccessfulCreate",
            format!("Created pods: {} and 55 more", five(&mut (0..60))),
        ),
        (
            "SuccessfulDelete",
            format!("Deleted pods: {} and 55 more", five(&mut (0..60).rev())),
        ),
    ];
    let found = eventually(30, || async {
        let got = events(&c, &ns, NS_NAME).await.ok()?;
        want.iter()
            .all(|(reason, note)| got.iter().any(|(r, n)| r == reason && n == note))
            .then_some(got)
    })
    .await;
    let got = match found {
        Some(got) => got,
        None => bail!("expected {want:#?}\n got {:#?}", events(&c, &ns, NS_NAME).await?),
    };
    for (reason, note) in &got {
        ensure!(note.len() <= 1024, "{reason}: a {}-byte note", note.len());
    }
    let refused = host
        .handles
        .writes
        .snapshot()
        .into_iter()
        .filter(|((verb, outcome), _)| verb == "event" && outcome != "ok")
        .collect::<Vec<_>>();
    ensure!(refused.is_empty(), "Events not written: {refused:?}");
    host.stop().await;
    Ok(())
}

/// The Events about the example NodeSet of `reason`, oldest first, as `(note, series count)` (1
/// for an Event seen once).
async fn event_series(c: &slinky_tests::TestCluster, ns: &str, reason: &str) -> Result<Vec<(String, i32)>> {
    let mut items: Vec<_> = Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NS_NAME)
                && e.reason.as_deref() == Some(reason)
        })
        .collect();
    items.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(items
        .into_iter()
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            (e.note.unwrap_or_default(), count)
        })
        .collect())
}

/// Waits up to 30 s until the `reason` Events about the example NodeSet ([`event_series`])
/// satisfy `ok`; else fails with `expected` and what there was.
async fn await_event_series(
    c: &slinky_tests::TestCluster,
    ns: &str,
    reason: &str,
    expected: &str,
    ok: impl Fn(&[(String, i32)]) -> bool,
) -> Result<()> {
    let found = eventually(30, || async {
        let got = event_series(c, ns, reason).await.ok()?;
        ok(&got).then_some(())
    })
    .await;
    if found.is_none() {
        bail!(
            "expected {expected}\n got {:#?}",
            event_series(c, ns, reason).await?
        );
    }
    Ok(())
}

/// Two Events of one reason on one object with different notes are two Events, each with its
/// own note: the second scale-up's `SuccessfulCreate` names only the pod it created (kube's
/// recorder folded it into the first, which kept the first note and counted 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_of_one_reason_with_different_notes_are_different_events() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "notes", 0).await?;
    let g = scale(&c, &ns, 2).await?;
    converge(&c, &ns, &names(&[0, 1]), g, false).await?;
    let g = scale(&c, &ns, 3).await?;
    converge(&c, &ns, &names(&[0, 1, 2]), g, false).await?;
    let want = vec![
        (format!("Created pods: {NS_NAME}-0, {NS_NAME}-1"), 1),
        (format!("Created pods: {NS_NAME}-2"), 1),
    ];
    let found = eventually(30, || async {
        let got = event_series(&c, &ns, "SuccessfulCreate").await.ok()?;
        (got == want).then_some(())
    })
    .await;
    if found.is_none() {
        bail!(
            "expected {want:#?}\n got {:#?}",
            event_series(&c, &ns, "SuccessfulCreate").await?
        );
    }
    host.stop().await;
    Ok(())
}

/// A create refused three times with one message is one `FailedCreate` Event counted 3 (its
/// series), not three Events; refused three more times with another message, it is a second
/// Event with that message, counted 3 (kube's recorder showed the first message, counted 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeated_event_is_one_event_counted_and_a_new_note_a_new_event() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("fault injection") else {
        return Ok(());
    };
    let ns = c.namespace("series").await;
    apply_example(&c, &ns, 0).await?;
    // The resync is 5 minutes: each refusal is retried by the backoff, one pass (and one Event)
    // per refusal. The rules fire in order: three 422s, then three 500s.
    let host = Host::start_resync(&c, &ns, Duration::from_secs(300))?;
    inject_fault(server, "create", "pods", FaultError::Invalid, Times::Count(3));
    inject_fault(server, "create", "pods", FaultError::Internal, Times::Count(3));
    let g = scale(&c, &ns, 1).await?;
    converge(&c, &ns, &names(&[0]), g, false).await?;
    assert_eq!(server.faults().fired().len(), 6, "six refusals");
    let expected = "two FailedCreate Events (422, then 500), each counted 3";
    await_event_series(&c, &ns, "FailedCreate", expected, |got| {
        matches!(got,
            [(first, 3), (second, 3)]
                if first.starts_with(&format!("Error creating pod {NS_NAME}-0: "))
                    && first.contains("invalid")
                    && second.starts_with(&format!("Error creating pod {NS_NAME}-0: "))
                    && second.contains("Internal error"))
    })
    .await?;
    host.stop().await;
    Ok(())
}

/// While every create is refused (a quota, an admission webhook), a pass sends one create, not one
/// per missing pod: the slow-start batches stop after the first refused one (a batch of one).
/// Scaled to 20 with the next four creates refused, four passes each send only the first
/// ordinal's create (one Event for it, counted 4; a pass that went on would have named other
/// ordinals), and the fifth creates all 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_creates_are_refused_each_pass_sends_only_one() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("fault injection") else {
        return Ok(());
    };
    let ns = c.namespace("refused-batch").await;
    apply_example(&c, &ns, 0).await?;
    let host = Host::start_resync(&c, &ns, Duration::from_secs(300))?;
    inject_fault(server, "create", "pods", FaultError::Invalid, Times::Count(4));
    let g = scale(&c, &ns, 20).await?;
    let all: Vec<u32> = (0..20).collect();
    converge(&c, &ns, &names(&all), g, false).await?;
    assert_eq!(server.faults().fired().len(), 4, "four refusals");
    let expected = "one FailedCreate Event, for ordinal 0, counted 4";
    await_event_series(
        &c,
        &ns,
        "FailedCreate",
        expected,
        |got| matches!(got, [(only, 4)] if only.starts_with(&format!("Error creating pod {NS_NAME}-0: "))),
    )
    .await?;
    host.stop().await;
    Ok(())
}

/// The publisher itself, on any cluster (its series patches meet a real kube-apiserver's
/// validation too): a repeat is a patch of the one Event's series, another note another Event, a
/// repeat whose Event was deleted a new Event; every one counted `event/ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_publisher_counts_repeats_and_starts_anew_when_the_event_is_gone() -> Result<()> {
    use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event};
    use kube::{
        api::{DeleteParams, PostParams},
        runtime::events::{EventType, Reporter},
    };
    use slinky_host::reconcile::{Events, Leadership, WriteMetrics};
    let c = cluster(false).await;
    let ns = c.namespace("publisher").await;
    let subject: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "subject"}}))?;
    let subject = Api::<ConfigMap>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &subject)
        .await?;
    let metrics = std::sync::Arc::new(WriteMetrics::default());
    let events = Events::new(
        c.client.clone(),
        Reporter {
            controller: "slinky-tests".into(),
            instance: None,
        },
        Leadership::always(),
        metrics.clone(),
    );
    let publish = |note: &str| {
        events.publish(
            &subject,
            None,
            EventType::Warning,
            "Tested",
            "Test",
            note.to_string(),
        )
    };
    let api = Api::<Event>::namespaced(c.client.clone(), &ns);
    // (note, series count, name) of each Event, oldest first.
    let listed = || async {
        let mut items = api.list(&ListParams::default()).await?.items;
        items.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        anyhow::Ok(
            items
                .into_iter()
                .map(|e| {
                    let count = e.series.as_ref().map_or(1, |s| s.count);
                    (
                        e.note.unwrap_or_default(),
                        count,
                        e.metadata.name.unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    let shape =
        |got: &[(String, i32, String)]| got.iter().map(|(n, c, _)| (n.clone(), *c)).collect::<Vec<_>>();
    publish("first").await;
    publish("first").await;
    publish("second").await;
    publish("first").await;
    let got = listed().await?;
    assert_eq!(
        shape(&got),
        [("first".to_string(), 3), ("second".to_string(), 1)],
        "{got:#?}"
    );
    api.delete(&got[0].2, &DeleteParams::default()).await?;
    publish("first").await;
    let now = listed().await?;
    assert_eq!(
        shape(&now),
        [("second".to_string(), 1), ("first".to_string(), 1)],
        "{now:#?}"
    );
    assert_ne!(now[1].2, got[0].2, "a new Event");
    assert_eq!(
        metrics.snapshot(),
        [(("event".to_string(), "ok".to_string()), 5)].into(),
        "every Event counted once, as written"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orphan_pods_are_adopted() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("adopt").await;
    apply_example(&c, &ns, 2).await?;
    // OnDelete: the adopted pod (built by someone else, so of another revision) is kept as it is.
    Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updateStrategy": {"type": "OnDelete"}}})),
        )
        .await?;
    // A matching pod without owner (say, left by a previous operator that was uninstalled).
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("{NS_NAME}-0"), "labels": {
        "app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": NS_NAME}},
        "spec": {"containers": [{"name": "slurmd", "image": "x"}]}}))?;
    Api::<Pod>::namespaced(c.client.clone(), &ns)
        .create(&Default::default(), &pod)
        .await?;
    let host = Host::start(&c, &ns)?;
    let adopted = eventually(30, || async {
        let p = Api::<Pod>::namespaced(c.client.clone(), &ns)
            .get(&format!("{NS_NAME}-0"))
            .await
            .ok()?;
        p.owner_references()
            .iter()
            .any(|o| o.kind == "NodeSet" && o.controller == Some(true))
            .then_some(())
    })
    .await;
    ensure!(adopted.is_some(), "the orphan was not adopted");
    let two = eventually(30, || async {
        (pod_names(&c, &ns).await.ok()? == names(&[0, 1])).then_some(())
    })
    .await;
    ensure!(two.is_some(), "expected pods 0 and 1");
    // The counter is recorded when the host has the server's answer, which can come after the
    // pod is listed: wait for it, then for any create that would follow.
    eventually(10, || async {
        (host.handles.writes.ok("create") >= 1).then_some(())
    })
    .await;
    // Two passes of the Controller and the NodeSet: no second create.
    host.passes_later(4).await?;
    assert_eq!(host.handles.writes.ok("create"), 1, "only ordinal 1 was created");
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_never_exceeds_max_unavailable() -> Result<()> {
    let c = cluster(true).await;
    if c.embedded("rolling update (needs pods that become available: the simulated kubelet)")
        .is_none()
    {
        return Ok(());
    }
    let (ns, host) = start_example(&c, "roll", 8).await?; // maxUnavailable 25% of 8 = 2
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    converge_current(&c, &ns, &names(&[0, 1, 2, 3, 4, 5, 6, 7]), true).await?;
    let old_rev = api
        .get(NS_NAME)
        .await?
        .status
        .and_then(|s| s.node_set_hash)
        .context("revision")?;
    let patch = json!({"spec": {"template": {"metadata": {"labels": {"example.com/pool": "gpu"}}}}});
    let g = api
        .patch(NS_NAME, &PatchParams::default(), &Patch::Merge(patch))
        .await?
        .metadata
        .generation
        .unwrap_or(0);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let mut worst = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let list = pods.list(&ListParams::default()).await?;
        let available = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| pod_ready(p))
            .count();
        worst = worst.max(8 - available.min(8));
        let st = api.get(NS_NAME).await?.status.context("status")?;
        let all_new = list.items.len() == 8
            && list
                .items
                .iter()
                .all(|p| p.labels().get("example.com/pool").map(String::as_str) == Some("gpu"));
        if all_new
            && st.observed_generation == Some(g)
            && st.updated_replicas == 8
            && st.available_replicas == 8
        {
            assert_ne!(
                st.node_set_hash.as_deref(),
                Some(old_rev.as_str()),
                "a new revision"
            );
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the rolling update did not finish: {st:?}");
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    assert!(
        worst <= 2,
        "at most maxUnavailable (2) pods were unavailable at once, saw {worst}"
    );
    assert!(worst >= 1, "pods were replaced");
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_controller_service_is_applied_shared_and_restored() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "svc", 0).await?;
    let svcs = Api::<Service>::namespaced(c.client.clone(), &ns);
    let applied = eventually(30, || async {
        svcs.get_opt("slurm-controller").await.ok().flatten()
    })
    .await
    .context("no Service")?;
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"slinky-host".to_string()), "{managers:?}");
    // Another field manager adds a label: it survives the host's re-applies.
    let label = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "slurm-controller", "labels": {"team": "hpc"}}});
    svcs.patch(
        "slurm-controller",
        &PatchParams::apply("someone-else"),
        &Patch::Apply(&label),
    )
    .await?;
    // Someone edits a field the host owns: it is restored.
    svcs.patch(
        "slurm-controller",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"selector": {"app.kubernetes.io/name": "hijacked"}}})),
    )
    .await?;
    let restored = eventually(30, || async {
        let s = svcs.get("slurm-controller").await.ok()?;
        let sel = s.spec.as_ref()?.selector.clone()?;
        (sel.get("app.kubernetes.io/name").map(String::as_str) == Some("slurmctld")).then_some(s)
    })
    .await
    .context("the selector was not restored")?;
    assert_eq!(
        restored.labels().get("team").map(String::as_str),
        Some("hpc"),
        "the other manager's label survives"
    );
    let ctl = Api::<Controller>::namespaced(c.client.clone(), &ns)
        .get("slurm")
        .await?;
    let st = ctl.status.context("controller status")?;
    assert_eq!(st.observed_generation, ctl.metadata.generation);
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{:?}",
        st.conditions
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_controller_is_a_condition_not_a_crash() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("orphan").await;
    let text = std::fs::read_to_string(slinky_tests::example("edge-cases.yaml"))?;
    let first = text.split("\n---\n").next().context("first document")?;
    let mut v: serde_json::Value = serde_saphyr::from_str(first)?;
    v["metadata"]["namespace"] = ns.clone().into();
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    api.patch(
        "orphan-workers",
        &PatchParams::apply("test-user"),
        &Patch::Apply(&v),
    )
    .await?;
    let host = Host::start(&c, &ns)?;
    let cond = eventually(30, || async {
        let st = api.get("orphan-workers").await.ok()?.status?;
        st.conditions
            .into_iter()
            .find(|c| c.type_ == "ControllerNotFound" && c.status == "True")
    })
    .await
    .context("no ControllerNotFound condition")?;
    assert!(cond.message.contains("no-such-controller"), "{}", cond.message);
    assert!(pod_names(&c, &ns).await?.is_empty());
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    ensure!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("ControllerNotFound")),
        "an Event was published"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_controllers_condition_applied_server_side_merges_with_the_hosts() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "listmap", 1).await?;
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    eventually(30, || async {
        let st = api.get(NS_NAME).await.ok()?.status?;
        st.conditions.iter().any(|c| c.type_ == "Ready").then_some(())
    })
    .await
    .context("no Ready condition")?;
    // `conditions` is a list map keyed by `type`: another manager's apply adds its condition
    // beside the host's instead of replacing (or conflicting over) the whole list.
    let theirs = json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": NS_NAME, "namespace": ns},
        "status": {"conditions": [{"type": "SiteCheck", "status": "True", "reason": "Checked",
            "message": "by another controller", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status(
        NS_NAME,
        &PatchParams::apply("site-checker"),
        &Patch::Apply(&theirs),
    )
    .await?;
    let conds = api
        .get(NS_NAME)
        .await?
        .status
        .map(|s| s.conditions)
        .unwrap_or_default();
    let types: BTreeSet<&str> = conds.iter().map(|c| c.type_.as_str()).collect();
    ensure!(
        types.contains("Ready") && types.contains("SiteCheck"),
        "{conds:?}"
    );
    // And the host's next status writes keep it.
    scale(&c, &ns, 2).await?;
    converge_current(&c, &ns, &names(&[0, 1]), false).await?;
    let conds = api
        .get(NS_NAME)
        .await?
        .status
        .map(|s| s.conditions)
        .unwrap_or_default();
    ensure!(conds.iter().any(|c| c.type_ == "SiteCheck"), "{conds:?}");
    host.stop().await;
    Ok(())
}

/// An `extraConf` item that is not `Key=Value`: the pods are built without extraConf, as Slinky's
/// manager builds them, and the NodeSet says so (`ExtraConfIgnored` naming the item, a Warning
/// Event) until it is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_extra_conf_item_is_a_condition_and_the_pods_are_built() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("extra-conf").await;
    slinky_tests::host::apply_example_with(&c, &ns, 1, |v| {
        v["spec"]["extraConf"] = "Weight=5 NotAKeyValue".into();
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let condition = || async {
        api.get(NS_NAME)
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == slinky_api::conditions::EXTRA_CONF_IGNORED)
    };
    let cond = eventually(30, || async { condition().await.filter(|c| c.status == "True") })
        .await
        .context("no ExtraConfIgnored condition")?;
    ensure!(cond.message.contains("\"NotAKeyValue\""), "{}", cond.message);
    let pods = eventually(30, || async {
        let p = pod_names(&c, &ns).await.ok()?;
        (!p.is_empty()).then_some(p)
    })
    .await
    .context("no pod built")?;
    ensure!(pods.len() == 1, "{pods:?}");
    let warned = eventually(30, || async {
        events(&c, &ns, NS_NAME)
            .await
            .ok()?
            .into_iter()
            .find(|(reason, _)| reason == "ExtraConfIgnored")
    })
    .await;
    ensure!(warned.is_some(), "no ExtraConfIgnored Event");
    api.patch(
        NS_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"extraConf": "Weight=5"}})),
    )
    .await?;
    let cleared = eventually(30, || async { condition().await.is_none().then_some(()) }).await;
    ensure!(cleared.is_some(), "ExtraConfIgnored stayed after the fix");
    host.stop().await;
    Ok(())
}
