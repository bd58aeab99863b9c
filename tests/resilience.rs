//! Off the happy path, every failure is visible and nothing wedges: pods the API server would
//! refuse are never built, refused writes are Events and conditions retried with backoff (not at
//! the next resync), a Service the host did not build is never taken over, relists and a leader
//! lost mid-pass or killed mid-create leave nothing behind, and Ready holds through a scale-down.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use slinky_api::{Controller, NodeSet, conditions};
use slinky_host::{
    PluginRegistry,
    embedded::{FaultError, Times},
    reconcile::{LeaderConfig, RunConfig, core::leader},
};
use slinky_tests::{
    TestCluster, default_engine, eventually,
    host::{
        Host, NS_NAME, apply_controller, apply_example, apply_example_with, cluster, converge,
        converge_current, events, names, nodeset_condition, pod_names, scale, start_example,
    },
    inject_fault,
    process::HostProcess,
};

/// The passes a `slinky-host run` process made so far: its `slinky_host_reconcile_total` samples
/// (every controller, every result).
async fn process_passes(host: &HostProcess) -> Result<f64> {
    Ok(host
        .metrics()
        .await?
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some("slinky_host_reconcile_total"))
        .map(|(_, v)| v)
        .sum())
}

/// Wait until `check` holds for the example NodeSet's condition `type_`.
async fn wait_condition(
    c: &TestCluster,
    ns: &str,
    type_: &str,
    check: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> bool,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let found = eventually(30, || async {
        nodeset_condition(c, ns, type_)
            .await
            .ok()
            .flatten()
            .filter(|x| check(x))
    })
    .await;
    found.with_context(|| format!("condition {type_} never matched on {ns}/{NS_NAME}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nodeset_without_a_logfile_image_gets_pods_the_api_server_accepts() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("nolog").await;
    apply_example_with(&c, &ns, 3, |v| {
        if let Some(spec) = v["spec"].as_object_mut() {
            spec.remove("logfile");
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), c.server.is_some()).await?;
    for p in Api::<Pod>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
    {
        let spec = p.spec.clone().context("spec")?;
        for container in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            ensure!(
                container.image.as_deref().is_some_and(|i| !i.is_empty()),
                "{}: container {} has no image",
                p.name_any(),
                container.name
            );
        }
        ensure!(
            spec.init_containers.unwrap_or_default().is_empty(),
            "no log sidecar without an image"
        );
    }
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_the_api_server_would_refuse_are_an_invalid_spec_not_a_create_loop() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "names", 0).await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    // A 64-character name: its pods' `app.kubernetes.io/instance` label would be refused.
    let long = "w".repeat(64);
    let mut v: serde_json::Value = serde_json::to_value(nodesets.get(NS_NAME).await?)?;
    v["metadata"] = json!({"name": long, "namespace": ns});
    v["spec"]["replicas"] = 2.into();
    v.as_object_mut().map(|o| o.remove("status"));
    nodesets
        .create(&PostParams::default(), &serde_json::from_value(v)?)
        .await?;
    let cond = eventually(30, || async {
        nodesets
            .get(&long)
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == conditions::INVALID_SPEC && c.status == "True")
    })
    .await
    .context("no InvalidSpec condition for the long name")?;
    ensure!(cond.message.starts_with("metadata.name:"), "{}", cond.message);
    ensure!(
        events(&c, &ns, &long)
            .await?
            .iter()
            .any(|(r, _)| r == conditions::INVALID_SPEC),
        "an Event says so"
    );
    // A hostname prefix with a dot: the field is named, and fixing it creates the pods.
    nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2, "template": {"spec": {"hostname": "slinky.a-"}}}})),
        )
        .await?;
    let cond = wait_condition(&c, &ns, conditions::INVALID_SPEC, |c| c.status == "True").await?;
    ensure!(
        cond.message.starts_with("spec.template.spec.hostname:"),
        "{}",
        cond.message
    );
    // Two resyncs of the three parents (the Controller, both NodeSets): no pod is created.
    host.passes_later(6).await?;
    assert_eq!(
        host.handles.writes.ok("create")
            + host
                .handles
                .writes
                .snapshot()
                .get(&("create".into(), "error".into()))
                .copied()
                .unwrap_or(0),
        0,
        "no create was tried"
    );
    let g = nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"hostname": "slinky-"}}}})),
        )
        .await?
        .metadata
        .generation
        .unwrap_or_default();
    converge(&c, &ns, &names(&[0, 1]), g, false).await?;
    ensure!(
        nodeset_condition(&c, &ns, conditions::INVALID_SPEC)
            .await?
            .is_none(),
        "the condition is cleared"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_creates_and_deletes_are_events_and_a_condition_retried_with_backoff() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("refused writes") else {
        return Ok(());
    };
    let ns = c.namespace("refused").await;
    apply_example(&c, &ns, 0).await?;
    // The resync is 5 minutes: anything retried sooner is retried by the backoff.
    let host = Host::start_resync(&c, &ns, Duration::from_secs(300))?;
    // One pod, refused nine times: nine passes, each waiting about twice as long as the one
    // before (5 ms doubling to 640 ms, jittered into [d/2, d]).
    inject_fault(server, "create", "pods", FaultError::Invalid, Times::Count(9));
    scale(&c, &ns, 1).await?;
    let cond = wait_condition(&c, &ns, conditions::REPLICA_FAILURE, |c| c.status == "True").await?;
    assert_eq!(cond.reason, "FailedCreate");
    ensure!(
        cond.message.contains("injected fault"),
        "the API's message: {}",
        cond.message
    );
    converge_current(&c, &ns, &names(&[0]), false).await?;
    assert_eq!(server.faults().fired().len(), 9, "nine refusals, each retried");
    let at = server.faults().fired_at();
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // The backoff grows: the last wait is at least 320 ms (640 ms jittered), several times the
    // first ones (each of which is mostly the pass itself); a constant requeue, or a count
    // reset between failures, fails this.
    let first = gaps[..3].iter().max().copied().unwrap_or_default();
    ensure!(
        gaps[7] >= Duration::from_millis(300) && gaps[7] > first * 3,
        "the retries did not back off exponentially: {gaps:?}"
    );
    let g = scale(&c, &ns, 2).await?;
    converge(&c, &ns, &names(&[0, 1]), g, false).await?;
    ensure!(
        events(&c, &ns, NS_NAME)
            .await?
            .iter()
            .any(|(r, n)| r == "FailedCreate" && n.contains("injected fault")),
        "a FailedCreate Event with the API's message"
    );
    ensure!(
        eventually(30, || async {
            nodeset_condition(&c, &ns, conditions::REPLICA_FAILURE)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .is_some(),
        "cleared once the writes succeed"
    );

    // Deletes refused until the condition shows, then allowed again.
    inject_fault(
        server,
        "delete",
        "pods",
        FaultError::Internal,
        Times::Count(10_000),
    );
    let g = scale(&c, &ns, 0).await?;
    let cond = wait_condition(&c, &ns, conditions::REPLICA_FAILURE, |c| c.status == "True").await?;
    assert_eq!(cond.reason, "FailedDelete");
    ensure!(
        events(&c, &ns, NS_NAME)
            .await?
            .iter()
            .any(|(r, _)| r == "FailedDelete"),
        "a FailedDelete Event"
    );
    server.faults().clear();
    converge(&c, &ns, &names(&[]), g, false).await?;
    ensure!(
        eventually(30, || async {
            nodeset_condition(&c, &ns, conditions::REPLICA_FAILURE)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .is_some(),
        "cleared after the deletes succeeded"
    );
    assert_eq!(host.handles.expectations.total_pending(), 0);
    host.stop().await;
    Ok(())
}

/// The Controller's condition of `type_`.
async fn controller_condition(
    c: &TestCluster,
    ns: &str,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    Api::<Controller>::namespaced(c.client.clone(), ns)
        .get("slurm")
        .await
        .ok()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_the_host_did_not_build_is_never_taken_over() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("svc-owner").await;
    let svcs = Api::<Service>::namespaced(c.client.clone(), &ns);
    let theirs: Service = serde_json::from_value(json!({"metadata": {"name": "slurm-controller"},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "http", "port": 80}]}}))?;
    svcs.create(&PostParams::default(), &theirs).await?;
    apply_example(&c, &ns, 0).await?;
    let host = Host::start(&c, &ns)?;
    let cond = eventually(30, || async {
        controller_condition(&c, &ns, conditions::CHILD_FAILURE)
            .await
            .filter(|c| c.status == "True")
    })
    .await
    .context("no ChildFailure condition")?;
    assert_eq!(cond.reason, "NotOwned");
    // Two resyncs of the Controller and the NodeSet (and the Controller's retries, with backoff).
    host.passes_later(6).await?;
    let svc = svcs.get("slurm-controller").await?;
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.selector.clone()),
        Some([("app".to_string(), "theirs".to_string())].into()),
        "the Service was left alone"
    );
    ensure!(svc.owner_references().is_empty());
    let managers: Vec<String> = svc
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    ensure!(
        !managers.iter().any(|m| m == "slinky-host"),
        "no apply over a foreign Service: {managers:?}"
    );
    // Once it is gone, the host builds its own.
    svcs.delete("slurm-controller", &DeleteParams::default()).await?;
    eventually(30, || async {
        let s = svcs.get_opt("slurm-controller").await.ok()??;
        s.owner_references()
            .iter()
            .any(|o| o.kind == "Controller")
            .then_some(())
    })
    .await
    .context("the host did not create its Service")?;
    eventually(30, || async {
        controller_condition(&c, &ns, conditions::CHILD_FAILURE)
            .await
            .is_none()
            .then_some(())
    })
    .await
    .context("ChildFailure was not cleared")?;
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_managers_port_is_kept_without_reapplying_and_an_unwanted_service_is_pruned() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "svc-prune", 0).await?;
    let svcs = Api::<Service>::namespaced(c.client.clone(), &ns);
    eventually(30, || async { svcs.get_opt("slurm-controller").await.ok()? })
        .await
        .context("no Service")?;
    let port = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "slurm-controller"},
        "spec": {"ports": [{"name": "metrics", "port": 9100, "protocol": "TCP"}]}});
    svcs.patch(
        "slurm-controller",
        &PatchParams::apply("monitoring"),
        &Patch::Apply(&port),
    )
    .await?;
    // The other manager's apply seen and answered: no apply across 4 passes (two resyncs of the
    // Controller and the NodeSet).
    let settled = eventually(90, || async {
        let before = host.handles.writes.ok("apply");
        host.passes_later(4).await.ok()?;
        (host.handles.writes.ok("apply") == before).then_some(())
    })
    .await;
    ensure!(
        settled.is_some(),
        "applies never stopped: {:?}",
        host.handles.writes.snapshot()
    );
    let applies = host.handles.writes.ok("apply");
    // Several 1 s resyncs: four of the Controller and four of the NodeSet.
    host.passes_later(8).await?;
    assert_eq!(
        host.handles.writes.ok("apply"),
        applies,
        "no re-apply for another manager's port"
    );
    let ports: BTreeSet<i32> = svcs
        .get("slurm-controller")
        .await?
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, BTreeSet::from([6817, 9100]));
    // external: true: the host no longer builds the Service, so it deletes it.
    Api::<Controller>::namespaced(c.client.clone(), &ns)
        .patch(
            "slurm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"external": true, "externalConfig": {"host": "ctld.example.com", "port": 6817}}})),
        )
        .await?;
    eventually(30, || async {
        svcs.get_opt("slurm-controller")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await
    .context("the Service was not pruned")?;
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_apply_is_an_event_and_a_condition_on_the_controller() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("refused apply") else {
        return Ok(());
    };
    let ns = c.namespace("svc-refused").await;
    // Each pass applies the Controller's two Services: four passes are refused. (No NodeSet: its
    // workers' Service would take faults too.)
    inject_fault(server, "patch", "services", FaultError::Invalid, Times::Count(8));
    apply_controller(&c, &ns).await?;
    let host = Host::start_resync(&c, &ns, Duration::from_secs(300))?;
    let cond = eventually(30, || async {
        controller_condition(&c, &ns, conditions::CHILD_FAILURE)
            .await
            .filter(|c| c.status == "True")
    })
    .await
    .context("no ChildFailure condition")?;
    assert_eq!(cond.reason, "FailedApply");
    eventually(30, || async {
        let ready = controller_condition(&c, &ns, conditions::READY).await?;
        (ready.status == "True"
            && controller_condition(&c, &ns, conditions::CHILD_FAILURE)
                .await
                .is_none())
        .then_some(())
    })
    .await
    .context("not retried with backoff before the 5-minute resync")?;
    ensure!(
        events(&c, &ns, "slurm")
            .await?
            .iter()
            .any(|(r, n)| r == "FailedApply" && n.contains("injected fault")),
        "a FailedApply Event"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relists_mid_scale_create_nothing_twice_and_release_what_they_show_gone() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("relist") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "relist", 0).await?;
    host.wait_ready().await?;
    let pending = || host.handles.expectations.total_pending();
    let count = || async { Ok::<_, anyhow::Error>(pod_names(&c, &ns).await?.len()) };
    // From here on the host's pod watch shows it nothing: only relists show it the pods it
    // created. Each scale creates a batch the host cannot see; the next scale then waits on
    // its expectations until a relist shows that batch, and creates only the new ordinals.
    server.faults().hold_watch("pods");
    let mut had = 0;
    for n in [10, 20, 30] {
        scale(&c, &ns, n).await?;
        if had > 0 {
            // Three passes (the scale's own, then resyncs of the NodeSet and the Controller):
            // the next batch waits.
            host.passes_later(3).await?;
            ensure!(
                count().await? == had && pending() == 10,
                "the unseen batch holds the next one back"
            );
            server.faults().force_relist("pods");
        }
        eventually(30, || async {
            (count().await.ok()? == n as usize && pending() == 10).then_some(())
        })
        .await
        .with_context(|| format!("pods {had}..{n} were not created after a relist showed the others"))?;
        had = n as usize;
    }
    server.faults().force_relist("pods");
    eventually(30, || async { (pending() == 0).then_some(()) })
        .await
        .context("the relist showed the batch")?;

    // A relist while creates are in flight (held by the API server): its list cannot show the
    // pods they make, so their expectations stay raised until the watch shows them. (Released,
    // the next pass would create them again: 409 AlreadyExists.) A stranger pod made meanwhile
    // tells when the host's cache holds the relist.
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let marker: Pod = serde_json::from_value(json!({"metadata": {"name": "marker"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}))?;
    pods.create(&PostParams::default(), &marker).await?;
    server.faults().hold_requests("create", "pods");
    let g = scale(&c, &ns, 40).await?;
    eventually(30, || async { (pending() == 10).then_some(()) })
        .await
        .context("the pass did not raise its expectations")?;
    server.faults().force_relist("pods");
    let marker_ref = kube::runtime::reflector::ObjectRef::<Pod>::new("marker").within(&ns);
    eventually(30, || async { host.handles.pods.get(&marker_ref).map(|_| ()) })
        .await
        .context("the relist never reached the host's cache")?;
    // Two passes after it (the NodeSet's is held by its creates: the Controller's resyncs).
    host.passes_later(2).await?;
    ensure!(
        pending() == 10,
        "creations in flight during the relist are still awaited ({} are)",
        pending()
    );
    server.faults().release_requests("create", "pods");
    pods.delete("marker", &DeleteParams::default().grace_period(0))
        .await?;
    eventually(30, || async {
        (count().await.ok()? == 40 && host.handles.writes.ok("create") == 40).then_some(())
    })
    .await
    .context("pods 30..40 were not created")?;
    // Two passes of the Controller and the NodeSet: nothing releases them but their events.
    host.passes_later(4).await?;
    ensure!(pending() > 0, "their watch events are still held");
    server.faults().release_watch("pods");
    let all: Vec<u32> = (0..40).collect();
    converge(&c, &ns, &names(&all), g, false).await?;
    let writes = host.handles.writes.snapshot();
    assert_eq!(host.handles.writes.ok("create"), 40, "{writes:?}");
    assert_eq!(
        writes.get(&("create".to_string(), "conflict".to_string())),
        None,
        "{writes:?}"
    );
    assert_eq!(host.handles.expectations.total_pending(), 0);

    // A pod created, then deleted while the pod watch was down: the relist shows it gone, so the
    // expectation of its creation is released at once (not after the 5-minute expiry).
    let refused_watches = || {
        server
            .faults()
            .fired()
            .iter()
            .filter(|(v, r, _)| v == "watch" && r == "pods")
            .count()
    };
    let refused_before = refused_watches();
    inject_fault(server, "watch", "pods", FaultError::Internal, Times::Count(1000));
    server.faults().close_watches();
    // The pod watch is down: the host tried to watch again and was refused.
    eventually(30, || async {
        (refused_watches() > refused_before).then_some(())
    })
    .await
    .context("the host's pod watch was never refused")?;
    let g = scale(&c, &ns, 41).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let last = format!("{NS_NAME}-40");
    eventually(30, || async { pods.get_opt(&last).await.ok()? })
        .await
        .context("pod 40 was not created")?;
    pods.delete(&last, &DeleteParams::default()).await?;
    ensure!(
        host.handles.expectations.total_pending() > 0,
        "its creation is awaited"
    );
    server.faults().clear();
    server.faults().force_relist("pods");
    let all: Vec<u32> = (0..41).collect();
    converge(&c, &ns, &names(&all), g, false).await?;
    assert_eq!(host.handles.expectations.total_pending(), 0);
    host.stop().await;
    Ok(())
}

/// A spec changed while a pass is creating is seen before the pass's next batch: scaled 0 → 300
/// with the first create held at the API server, then back to 3, the pass sends nothing after
/// the held pod and the next pass makes the other two (not 300 pods, then 297 deletes; a scale-up
/// is one pass of up to `CREATE_BURST` creates).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spec_changed_mid_scale_up_stops_the_creates_at_the_next_batch() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("mid-scale spec change") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "superseded", 0).await?;
    host.wait_ready().await?;
    server.faults().hold_requests("create", "pods");
    scale(&c, &ns, 300).await?;
    eventually(30, || async {
        (server.faults().waiting_requests() == 1).then_some(())
    })
    .await
    .context("the pass's first create never reached the API server")?;
    let g = scale(&c, &ns, 3).await?;
    let key = kube::runtime::reflector::ObjectRef::<NodeSet>::new(NS_NAME).within(&ns);
    eventually(30, || async {
        (host.handles.nodesets.get(&key)?.metadata.generation == Some(g)).then_some(())
    })
    .await
    .context("the host's cache never showed the scale back to 3")?;
    server.faults().release_requests("create", "pods");
    converge(&c, &ns, &names(&[0, 1, 2]), g, false).await?;
    let writes = host.handles.writes.snapshot();
    assert_eq!(host.handles.writes.ok("create"), 3, "{writes:?}");
    assert_eq!(host.handles.writes.ok("delete"), 0, "{writes:?}");
    assert_eq!(host.handles.expectations.total_pending(), 0);
    host.stop().await;
    Ok(())
}

/// The leader loses the Lease while its pass is creating pods: the create it had sent is answered,
/// and from then on the writer's and the Events' fence refuse everything the pass still tries
/// (the next batch of creates, the `FailedCreate` Event, the status). Its successor creates the
/// rest, none twice. (This test once cut the leader from the API server altogether, which stops
/// its writes with or without a fence; here its writes reach the API server, so only the fence
/// stops them: without it, the old leader creates the whole scale-up after losing the Lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_lost_mid_pass_leaves_its_successor_nothing_to_undo() -> Result<()> {
    use k8s_openapi::{
        api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
    };
    let c = cluster(false).await;
    let Some(server) = c.embedded("leader loss") else {
        return Ok(());
    };
    let ns = c.namespace("leaderloss").await;
    apply_example(&c, &ns, 0).await?;
    // grace 8 s: a write may wait 2 s (a quarter of it) for the API server, long enough for the
    // test to hand the Lease over while one is held.
    let config = |identity: &str| LeaderConfig {
        lease_name: "loss-test".into(),
        namespace: ns.clone(),
        identity: identity.into(),
        duration: Duration::from_secs(10),
        grace: Duration::from_secs(8),
    };
    let plugins = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let run = |leadership| RunConfig {
        namespaces: vec![ns.clone()],
        resync: Some(Duration::from_secs(1)),
        leadership,
        ..Default::default()
    };
    let (a, a_task) = leader::elect(c.client.clone(), config("a")).await?;
    eventually(20, || async { a.may_write().then_some(()) })
        .await
        .context("a never led")?;
    let host_a = Host::start_config(c.client.clone(), plugins.clone(), run(a.clone()));
    host_a.wait_ready().await?;

    // The leader's pass sends its first create (a batch of one), which the API server holds.
    let faults = server.faults();
    faults.hold_requests("create", "pods");
    let g = scale(&c, &ns, 30).await?;
    eventually(30, || async { (faults.waiting_requests() == 1).then_some(()) })
        .await
        .context("the leader's first create never reached the API server")?;
    // Meanwhile the Lease passes to b (as it would once a's renewals had failed): a's fence closes.
    let now = MicroTime(Timestamp::now());
    let handed = json!({"spec": {"holderIdentity": "b", "leaseDurationSeconds": 10,
        "acquireTime": now, "renewTime": now}});
    Api::<Lease>::namespaced(c.client.clone(), &ns)
        .patch("loss-test", &PatchParams::default(), &Patch::Merge(&handed))
        .await?;
    eventually(10, || async { (!a.may_write()).then_some(()) })
        .await
        .context("a's fence never closed")?;
    let ok = |w: &std::collections::BTreeMap<(String, String), u64>| {
        w.iter()
            .filter(|((_, o), _)| o == "ok")
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    // Writes counted in flight now passed the fence before it closed (the held create among
    // them): only these may still land. Read before the snapshot, so none lands unaccounted.
    let landing = host_a.handles.writes.in_flight();
    let before = host_a.handles.writes.snapshot();
    // The held create is answered; the pass goes on, and everything after is refused.
    faults.release_requests("create", "pods");
    eventually(10, || async {
        let w = host_a.handles.writes.snapshot();
        let n = |verb: &str, o: &str| w.get(&(verb.to_string(), o.to_string())).copied().unwrap_or(0);
        (n("create", "ok") == 1 && n("create", "not_leader") > 0).then_some(())
    })
    .await
    .with_context(|| {
        format!(
            "a's held create answered, its next creates refused: {:?}",
            host_a.handles.writes.snapshot()
        )
    })?;

    // b, the holder now, takes over and creates the rest.
    let (b, b_task) = leader::elect(c.client.clone(), config("b")).await?;
    let host_b = Host::start_config(c.client.clone(), plugins, run(b.clone()));
    eventually(30, || async { b.may_write().then_some(()) })
        .await
        .context("b never took over")?;
    let all: Vec<u32> = (0..30).collect();
    converge(&c, &ns, &names(&all), g, false).await?;
    ensure!(!a.may_write(), "a never writes again");
    let after = host_a.handles.writes.snapshot();
    ensure!(
        landing >= 1 && ok(&after) > ok(&before) && ok(&after) - ok(&before) <= landing,
        "after losing the Lease, a's only writes were those in flight when it lost it ({landing}, the \
         held create among them): {before:?} -> {after:?}"
    );
    let b_writes = host_b.handles.writes.snapshot();
    assert_eq!(
        b_writes.get(&("create".to_string(), "ok".to_string())),
        Some(&29),
        "{b_writes:?}"
    );
    assert_eq!(
        b_writes.get(&("create".to_string(), "conflict".to_string())),
        None,
        "the successor never created a pod that existed: {b_writes:?}"
    );
    assert_eq!(host_b.handles.expectations.total_pending(), 0);
    let published = events(&c, &ns, NS_NAME).await?;
    ensure!(
        !published.iter().any(|(_, note)| note.contains("not the leader")),
        "an Event of the old leader after it lost the Lease: {published:?}"
    );
    a_task.abort();
    b_task.abort();
    host_b.stop().await;
    host_a.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_while_creates_are_in_flight_then_a_restart_converges_without_extra_pods() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("sigkill") else {
        return Ok(());
    };
    let ns = c.namespace("sigkill").await;
    apply_example(&c, &ns, 0).await?;
    // Every pod name ever seen, to catch an extra ordinal even if it is deleted later.
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let recorder = {
        let seen = seen.clone();
        let stream = watcher(
            Api::<Pod>::namespaced(c.client.clone(), &ns),
            watcher::Config::default(),
        )
        .applied_objects()
        .default_backoff();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(Ok(p)) = stream.next().await {
                if let Ok(mut s) = seen.lock() {
                    s.insert(p.name_any());
                }
            }
        })
    };
    let mut first = HostProcess::start(&c, &ns, "first", &[])?;
    eventually(60, || async { first.ok_writes().await.gt(&0.0).then_some(()) })
        .await
        .context("the first host never wrote")?;
    server.faults().set_latency(Duration::from_millis(100));
    // Enough pods that the kill lands mid-scale-up however late it comes: at 100 ms a create,
    // the batches in flight when it lands (two, after the first) reach a few dozen, not 100.
    let g = scale(&c, &ns, 100).await?;
    eventually(30, || async {
        (pod_names(&c, &ns).await.ok()?.len() >= 3).then_some(())
    })
    .await
    .context("no pods before the kill")?;
    first.kill(); // SIGKILL: creates in flight, expectations lost with the process
    let at_kill = pod_names(&c, &ns).await?.len();
    ensure!(at_kill < 100, "the kill came too late to matter ({at_kill} pods)");
    server.faults().set_latency(Duration::ZERO);
    let second = HostProcess::start(&c, &ns, "second", &[])?;
    let all: Vec<u32> = (0..100).collect();
    converge(&c, &ns, &names(&all), g, false).await?;
    // Two more passes of the second host (a resync of the Controller and the NodeSet): no pod
    // beyond the 100 follows.
    let start = process_passes(&second).await?;
    eventually(60, || async {
        (process_passes(&second).await.ok()? >= start + 2.0).then_some(())
    })
    .await
    .context("the second host made no more passes")?;
    recorder.abort();
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(seen, names(&all), "no pod beyond the 100 ordinals ever existed");
    let pending = second
        .metrics()
        .await?
        .get("slinky_host_expectations_pending")
        .copied();
    assert_eq!(pending, Some(0.0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_stays_true_through_a_scale_down_with_enough_available_pods() -> Result<()> {
    let c = cluster(true).await;
    if c.embedded("ready (needs pods that become Ready: the simulated kubelet)")
        .is_none()
    {
        return Ok(());
    }
    let (ns, host) = start_example(&c, "ready", 5).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2, 3, 4]), true).await?;
    // Every Ready status the NodeSet goes through from here, with its resourceVersion.
    let statuses: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let recorder = {
        let statuses = statuses.clone();
        let stream = watcher(
            Api::<NodeSet>::namespaced(c.client.clone(), &ns),
            watcher::Config::default(),
        )
        .applied_objects()
        .default_backoff();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(Ok(n)) = stream.next().await {
                let ready = n
                    .status
                    .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == conditions::READY))
                    .map(|c| c.status)
                    .unwrap_or_default();
                if let Ok(mut s) = statuses.lock() {
                    s.push((n.metadata.resource_version.unwrap_or_default(), ready));
                }
            }
        })
    };
    let recorded = || statuses.lock().map(|s| s.clone()).unwrap_or_default();
    // The recorder watches: it has the NodeSet as it is now.
    eventually(30, || async { (!recorded().is_empty()).then_some(()) })
        .await
        .context("the recorder never saw the NodeSet")?;
    let g = scale(&c, &ns, 2).await?;
    converge(&c, &ns, &names(&[0, 1]), g, true).await?;
    // Two more passes of the Controller and the NodeSet (a status they would write comes), then
    // the recorder has seen the NodeSet as it is after them.
    host.passes_later(4).await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let caught_up = eventually(30, || async {
        let now = nodesets.get(NS_NAME).await.ok()?.metadata.resource_version;
        (recorded().last().map(|(rv, _)| rv) == now.as_ref()).then_some(())
    })
    .await;
    recorder.abort();
    ensure!(caught_up.is_some(), "the recorder fell behind: {:?}", recorded());
    let seen: Vec<String> = recorded().into_iter().map(|(_, ready)| ready).collect();
    ensure!(seen.len() >= 2, "statuses were recorded: {seen:?}");
    ensure!(
        seen.iter().all(|s| s == "True"),
        "Ready went False during the scale-down: {seen:?}"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_nodeset_is_reconciled_before_the_controllers_are_known() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("controller sync") else {
        return Ok(());
    };
    let ns = c.namespace("sync").await;
    apply_example(&c, &ns, 2).await?;
    // The Controllers' list fails a few times: that cache syncs a few seconds after the others.
    inject_fault(
        server,
        "list",
        "controllers",
        FaultError::Internal,
        Times::Count(3),
    );
    let host = Host::start(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1]), false).await?;
    ensure!(
        server.faults().fired().len() == 3,
        "the Controllers' list failed first"
    );
    let evs = events(&c, &ns, NS_NAME).await?;
    ensure!(
        !evs.iter().any(|(r, _)| r == conditions::CONTROLLER_NOT_FOUND),
        "a NodeSet was reconciled before the Controller cache synced: {evs:?}"
    );
    host.stop().await;
    Ok(())
}
