//! Ordinals are stable, like a StatefulSet's, and only the NodeSet's own pods use them: a stranger
//! holding `<nodeset>-N` is skipped (and named in an Event), a name taken while the cache lagged
//! skips that ordinal without stopping the batch, a terminating or failed pod's ordinal is waited
//! for and recreated (one terminating above `replicas` holds back nothing), `w-07` is not ordinal
//! 7 of an unpadded NodeSet, a NodeSet recreated under its name waits for its predecessor's pods,
//! the revision changes only with what changes a pod, and pods Slinky labelled are adopted without
//! a roll when they equal ours (and compared once per change when they differ).

use slinky_host::plugins::Builder as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use slinky_api::{Controller, NodeSet, keys};
use slinky_host::{BuildContext, PluginRegistry, PodIdentity, plugins::BuilderKind};
use slinky_tests::{
    TestCluster, default_engine, eventually,
    host::{
        Host, NS_NAME, apply_example, apply_example_with, cluster, converge, converge_current, events, names,
        pod_names, pod_ready, scale, start_example,
    },
};

/// Ordinals of the pods the example NodeSet controls now (not terminating).
async fn owned(c: &TestCluster, ns: &str) -> Result<BTreeSet<String>> {
    let uid = Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .get(NS_NAME)
        .await?
        .uid()
        .unwrap_or_default();
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.owner_references()
                .iter()
                .any(|o| o.uid == uid && o.controller == Some(true))
        })
        .map(ResourceExt::name_any)
        .collect())
}

async fn wait_owned(c: &TestCluster, ns: &str, want: &BTreeSet<String>) -> Result<()> {
    let ok = eventually(60, || async { (owned(c, ns).await.ok()? == *want).then_some(()) }).await;
    ensure!(
        ok.is_some(),
        "the NodeSet never owned exactly {want:?}: it owns {:?}",
        owned(c, ns).await?
    );
    Ok(())
}

/// A pod that is not the NodeSet's: `name`, labels `app=web`, no owner.
async fn stranger(c: &TestCluster, ns: &str, name: &str, labels: serde_json::Value) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}}))?;
    Ok(Api::<Pod>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?)
}

fn web() -> serde_json::Value {
    json!({"app": "web"})
}

fn selector_labels() -> serde_json::Value {
    json!({"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": NS_NAME})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stranger_holding_an_ordinal_name_is_skipped_and_named_in_an_event() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("stranger").await;
    apply_example(&c, &ns, 0).await?;
    stranger(&c, &ns, &format!("{NS_NAME}-1"), web()).await?;
    let host = Host::start(&c, &ns)?;
    scale(&c, &ns, 3).await?;
    wait_owned(&c, &ns, &names(&[0, 2, 3])).await?;
    let evs = events(&c, &ns, NS_NAME).await?;
    ensure!(
        evs.iter()
            .any(|(r, n)| r == "PodNameTaken" && n.contains(&format!("pod {NS_NAME}-1"))),
        "an Event names the blocking pod: {evs:?}"
    );
    // A pod released by a label edit keeps its name: its ordinal stays used, a new one is made.
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    pods.patch(
        &format!("{NS_NAME}-0"),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/instance": "elsewhere"}}})),
    )
    .await?;
    wait_owned(&c, &ns, &names(&[2, 3, 4])).await?;
    let released = pods.get(&format!("{NS_NAME}-0")).await?;
    ensure!(released.owner_references().is_empty(), "the pod was released");
    assert_eq!(
        host.handles
            .writes
            .snapshot()
            .get(&("create".to_string(), "conflict".to_string())),
        None,
        "no create hit a taken name"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_name_taken_while_the_cache_lagged_skips_that_ordinal_not_the_batch() -> Result<()> {
    let c = cluster(false).await;
    let Some(server) = c.embedded("name taken") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "taken", 0).await?;
    host.wait_ready().await?;
    // The host's pod cache is held back (its watch delivers nothing) while a stranger takes
    // ordinal 1 and the NodeSet scales up: its first pass creates 0, 1, 2, 3 from a cache without
    // the stranger, and 1 is refused as AlreadyExists. Released, the cache shows the stranger and
    // the host makes 4. No guessed delays: the order is the test's, not the scheduler's.
    server.faults().hold_watch("pods");
    stranger(&c, &ns, &format!("{NS_NAME}-1"), web()).await?;
    scale(&c, &ns, 4).await?;
    let tried = eventually(60, || async {
        let w = host.handles.writes.snapshot();
        let n = |o: &str| {
            w.get(&("create".to_string(), o.to_string()))
                .copied()
                .unwrap_or(0)
        };
        (n("ok") + n("conflict") >= 4).then_some(())
    })
    .await;
    server.faults().release_watch("pods");
    ensure!(
        tried.is_some(),
        "the host never tried ordinals 0-3: {:?}",
        host.handles.writes.snapshot()
    );
    wait_owned(&c, &ns, &names(&[0, 2, 3, 4])).await?;
    let writes = host.handles.writes.snapshot();
    let count = |outcome: &str| {
        writes
            .get(&("create".to_string(), outcome.to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(count("conflict"), 1, "one AlreadyExists, not retried: {writes:?}");
    assert_eq!(
        count("ok"),
        4,
        "0, 2, 3 in the first pass, 4 once the stranger was seen: {writes:?}"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminating_pod_keeps_its_ordinal_until_it_is_gone() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "terminating", 3).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), false).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let one = format!("{NS_NAME}-1");
    let before = pods.get(&one).await?.uid();
    pods.patch(
        &one,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
    )
    .await?;
    pods.delete(&one, &DeleteParams::default()).await?;
    // Several resyncs while ordinal 1 terminates (6 passes: three of the Controller and three of
    // the NodeSet): no other ordinal takes its place, looked at every 100 ms until then.
    {
        let resyncs = host.passes_later(6);
        tokio::pin!(resyncs);
        let mut resynced = false;
        loop {
            let all: BTreeSet<String> = pods
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(ResourceExt::name_any)
                .collect();
            assert_eq!(all, names(&[0, 1, 2]), "no new ordinal while {one} terminates");
            if resynced {
                break;
            }
            tokio::select! {
                done = &mut resyncs => {
                    done?;
                    resynced = true;
                }
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
    pods.patch(
        &one,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let recreated = eventually(30, || async {
        let p = pods.get_opt(&one).await.ok()??;
        (p.uid() != before && p.metadata.deletion_timestamp.is_none()).then_some(())
    })
    .await;
    ensure!(recreated.is_some(), "{one} was not recreated under its own name");
    assert_eq!(pod_names(&c, &ns).await?, names(&[0, 1, 2]));
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_pod_is_replaced_under_its_own_ordinal() -> Result<()> {
    let c = cluster(true).await;
    let Some(server) = c.embedded("failed pod") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "failed", 3).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), true).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let one = format!("{NS_NAME}-1");
    let before = pods.get(&one).await?.uid();
    server
        .lifecycle()
        .context("lifecycle")?
        .fail(&ns, &one)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut seen = BTreeSet::new();
    let replaced = eventually(30, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let p = list.items.iter().find(|p| p.name_any() == one)?;
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        (p.uid() != before && ready).then(|| list.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>())
    })
    .await
    .context("the failed pod was not replaced under its ordinal")?;
    seen.extend(replaced);
    assert_eq!(seen, names(&[0, 1, 2]), "no other ordinal was created");
    assert_eq!(host.handles.writes.ok("create"), 4, "3 pods and one replacement");
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leading_zeros_are_not_the_nodesets_ordinals() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("zeros").await;
    apply_example(&c, &ns, 0).await?;
    // An orphan with the selector labels, named with padding the NodeSet does not use.
    stranger(&c, &ns, &format!("{NS_NAME}-07"), selector_labels()).await?;
    let host = Host::start(&c, &ns)?;
    scale(&c, &ns, 8).await?;
    wait_owned(&c, &ns, &names(&[0, 1, 2, 3, 4, 5, 6, 7])).await?;
    let zero_seven = Api::<Pod>::namespaced(c.client.clone(), &ns)
        .get(&format!("{NS_NAME}-07"))
        .await?;
    ensure!(
        zero_seven.owner_references().is_empty(),
        "w-07 is not adopted as ordinal 7"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nodeset_recreated_under_its_name_waits_for_its_predecessors_pods() -> Result<()> {
    let c = cluster(false).await;
    let (ns, host) = start_example(&c, "recreate", 3).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), false).await?;
    // The old pods linger after their NodeSet is gone (a finalizer holds them).
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    for o in 0..3 {
        pods.patch(
            &format!("{NS_NAME}-{o}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await?;
    }
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let old_uid = nodesets.get(NS_NAME).await?.uid();
    nodesets.delete(NS_NAME, &DeleteParams::background()).await?;
    eventually(30, || async {
        nodesets.get_opt(NS_NAME).await.ok()?.is_none().then_some(())
    })
    .await
    .context("the NodeSet was not deleted")?;
    apply_example(&c, &ns, 2).await?;
    ensure!(nodesets.get(NS_NAME).await?.uid() != old_uid, "a new NodeSet");
    // Two resyncs of the Controller and the new NodeSet (and more).
    host.passes_later(6).await?;
    ensure!(
        owned(&c, &ns).await?.is_empty(),
        "the new NodeSet created pods while its predecessor's held their names"
    );
    for o in 0..3 {
        pods.patch(
            &format!("{NS_NAME}-{o}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    }
    wait_owned(&c, &ns, &names(&[0, 1])).await?;
    let writes = host.handles.writes.snapshot();
    assert_eq!(
        writes.get(&("create".to_string(), "conflict".to_string())),
        None,
        "no create collided with a predecessor's pod: {writes:?}"
    );
    assert_eq!(host.handles.expectations.total_pending(), 0);
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn editing_the_partition_line_restarts_no_worker() -> Result<()> {
    let c = cluster(true).await;
    let (ns, host) = start_example(&c, "partition", 3).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), c.server.is_some()).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let uids = |list: Vec<Pod>| list.iter().filter_map(ResourceExt::uid).collect::<BTreeSet<_>>();
    let before = uids(pods.list(&ListParams::default()).await?.items);
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let rev = nodesets.get(NS_NAME).await?.status.and_then(|s| s.node_set_hash);
    let g = nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"partition": {"config": "State=UP MaxTime=1-00:00:00"}}})),
        )
        .await?
        .metadata
        .generation
        .unwrap_or_default();
    converge(&c, &ns, &names(&[0, 1, 2]), g, c.server.is_some()).await?;
    // Several 1 s resyncs: three of the Controller and three of the NodeSet.
    host.passes_later(6).await?;
    assert_eq!(
        uids(pods.list(&ListParams::default()).await?.items),
        before,
        "no pod was replaced"
    );
    assert_eq!(
        nodesets.get(NS_NAME).await?.status.and_then(|s| s.node_set_hash),
        rev
    );
    assert_eq!(host.handles.writes.ok("delete"), 0);
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_labelled_by_slinky_are_adopted_without_a_roll_when_they_equal_ours() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("slinky").await;
    apply_example(&c, &ns, 3).await?;
    let nodeset = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get(NS_NAME)
        .await?;
    let controller = Api::<Controller>::namespaced(c.client.clone(), &ns)
        .get(&nodeset.spec.controller_ref.name)
        .await?;
    // What Slinky's operator left: our pod for each ordinal, labelled with its revision scheme,
    // without our builder annotations; the pod of ordinal 2 runs another image (it must roll).
    let plugins = PluginRegistry::new(&default_engine(), &[])?;
    let builder = plugins.active(BuilderKind::NodesetPod);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let slinky_rev = format!("{NS_NAME}-6d8f9b7c5");
    for o in 0..3 {
        let id = PodIdentity::for_ordinal(&nodeset, o, slinky_rev.clone());
        let mut pod = builder.build_pod(&BuildContext::default(), &nodeset, &controller, &id)?;
        pod.annotations_mut().remove(keys::ANNOTATION_BUILDER);
        pod.annotations_mut().remove(keys::ANNOTATION_BUILDER_DIGEST);
        if o == 2
            && let Some(spec) = pod.spec.as_mut()
        {
            spec.containers[0].image = Some("ghcr.io/slinkyproject/slurmd:24.11-ubuntu24.04".into());
        }
        pods.create(&PostParams::default(), &pod).await?;
    }
    let before: BTreeMap<String, Option<String>> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid()))
        .collect();
    let host = Host::start(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), c.server.is_some()).await?;
    let after: BTreeMap<String, Pod> = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    let revision = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get(NS_NAME)
        .await?
        .status
        .and_then(|s| s.node_set_hash)
        .context("revision")?;
    for o in 0..3 {
        let name = format!("{NS_NAME}-{o}");
        let p = after.get(&name).context("pod")?;
        assert_eq!(
            p.labels().get(keys::LABEL_REVISION_HASH),
            Some(&revision),
            "{name}"
        );
        assert!(p.annotations().contains_key(keys::ANNOTATION_BUILDER), "{name}");
        let kept = p.uid() == before[&name];
        assert_eq!(
            kept,
            o != 2,
            "{name}: equal pods are kept, the different one rolls"
        );
    }
    assert_eq!(host.handles.writes.ok("delete"), 1);
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_with_a_grace_period_keep_their_ordinals_while_they_terminate() -> Result<()> {
    let c = cluster(true).await;
    if c.embedded("grace period (needs the simulated kubelet)").is_none() {
        return Ok(());
    }
    let ns = c.namespace("grace").await;
    // 300 s of grace, 3 s with the test cluster's simulated kubelet (0.01 of real time).
    apply_example_with(&c, &ns, 3, |v| {
        v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 300.into();
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), true).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    // Every pod name ever seen: no other ordinal may appear while pods terminate.
    let all_names = || async {
        pods.list(&ListParams::default())
            .await
            .map(|l| l.items.iter().map(ResourceExt::name_any).collect::<BTreeSet<_>>())
    };
    // A user deletes pod 1: it terminates for its grace period, then comes back as itself.
    let one = format!("{NS_NAME}-1");
    let before = pods.get(&one).await?.uid();
    pods.delete(&one, &DeleteParams::default()).await?;
    let terminating = pods.get(&one).await?;
    ensure!(
        terminating.metadata.deletion_timestamp.is_some()
            && terminating.metadata.deletion_grace_period_seconds == Some(300),
        "the API server keeps the pod terminating: {:?}",
        terminating.metadata
    );
    // Scale down to 1 and straight back up to 3 while pods terminate.
    scale(&c, &ns, 1).await?;
    // The scale-down under way: pod 2 terminates (or is gone) before the scale back up.
    let two = format!("{NS_NAME}-2");
    eventually(30, || async {
        pods.get_opt(&two)
            .await
            .ok()?
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await
    .context("the scale-down to 1 did not delete pod 2")?;
    let g = scale(&c, &ns, 3).await?;
    let seen = std::sync::Mutex::new(BTreeSet::new());
    let done = eventually(60, || async {
        let now = all_names().await.ok()?;
        if let Ok(mut s) = seen.lock() {
            s.extend(now.iter().cloned());
        }
        let fresh = pods.get(&one).await.ok()?;
        let live = pod_names(&c, &ns).await.ok()?;
        (live == names(&[0, 1, 2]) && fresh.uid() != before && fresh.metadata.deletion_timestamp.is_none())
            .then_some(())
    })
    .await;
    ensure!(
        done.is_some(),
        "pods did not come back under their ordinals: {:?}",
        all_names().await?
    );
    let seen = seen.into_inner().unwrap_or_default();
    assert_eq!(
        seen,
        names(&[0, 1, 2]),
        "no other ordinal was created while pods terminated"
    );
    converge(&c, &ns, &names(&[0, 1, 2]), g, true).await?;
    assert_eq!(host.handles.expectations.total_pending(), 0);
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_terminating_above_replicas_does_not_hold_back_a_missing_ordinal() -> Result<()> {
    let c = cluster(true).await;
    let Some(server) = c.embedded("terminating above replicas (needs the simulated kubelet)") else {
        return Ok(());
    };
    let (ns, host) = start_example(&c, "above", 6).await?;
    converge_current(&c, &ns, &names(&[0, 1, 2, 3, 4, 5]), true).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    // Pod 5 is on a dead node: a finalizer stands in for the kubelet that never confirms.
    let five = format!("{NS_NAME}-5");
    let hold = |held: bool| {
        let finalizers = if held {
            json!(["example.com/hold"])
        } else {
            json!(null)
        };
        Patch::Merge(json!({"metadata": {"finalizers": finalizers}}))
    };
    pods.patch(&five, &PatchParams::default(), &hold(true)).await?;
    let g = scale(&c, &ns, 2).await?;
    converge(&c, &ns, &names(&[0, 1]), g, true).await?;
    let terminating = || async {
        let p = pods.get(&five).await?;
        ensure!(
            p.metadata.deletion_timestamp.is_some(),
            "{five} is still terminating"
        );
        anyhow::Ok(())
    };
    terminating().await?;
    let all_names = || async {
        pods.list(&ListParams::default())
            .await
            .map(|l| l.items.iter().map(ResourceExt::name_any).collect::<BTreeSet<_>>())
    };
    eventually(30, || async {
        (all_names().await.ok()? == names(&[0, 1, 5])).then_some(())
    })
    .await
    .context("pods 2-4 did not finish terminating")?;
    // Every pod name seen from here on: no ordinal but 0, 1 (and the terminating 5) may appear.
    let seen = std::sync::Mutex::new(BTreeSet::new());
    let look = || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        if let Ok(mut s) = seen.lock() {
            s.extend(list.items.iter().map(ResourceExt::name_any));
        }
        Some(list)
    };
    // Pod 1 fails, then pod 0 is deleted: each comes back under its ordinal while 5 terminates.
    for (o, how) in [(1, "fails"), (0, "is deleted")] {
        let name = format!("{NS_NAME}-{o}");
        let before = pods.get(&name).await?.uid();
        if o == 1 {
            server
                .lifecycle()
                .context("lifecycle")?
                .fail(&ns, &name)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        } else {
            pods.delete(&name, &DeleteParams::default()).await?;
        }
        let back = eventually(20, || async {
            let list = look().await?;
            let p = list.items.iter().find(|p| p.name_any() == name)?;
            (p.uid() != before && p.metadata.deletion_timestamp.is_none() && pod_ready(p)).then_some(())
        })
        .await;
        ensure!(
            back.is_some(),
            "{name} {how} and was not recreated while {five} terminates: pods {:?}",
            look()
                .await
                .map(|l| l.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>())
        );
        terminating().await?;
    }
    let seen_now = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(seen_now, names(&[0, 1, 5]), "no other ordinal was created");
    // Once 5 is gone, it does not come back: it is above replicas.
    pods.patch(&five, &PatchParams::default(), &hold(false)).await?;
    eventually(30, || async {
        pods.get_opt(&five).await.ok()?.is_none().then_some(())
    })
    .await
    .context("pod 5 was not removed")?;
    // Two resyncs of the Controller and the NodeSet (and more): 5 stays gone.
    host.passes_later(6).await?;
    converge(&c, &ns, &names(&[0, 1]), g, true).await?;
    assert_eq!(host.handles.writes.ok("create"), 8, "6 pods and 2 replacements");
    assert_eq!(host.handles.expectations.total_pending(), 0);
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_labelled_by_slinky_that_differ_are_compared_once_per_change() -> Result<()> {
    // No simulated kubelet: a pod changes only when this test changes it.
    let c = cluster(false).await;
    if c.embedded("pods compared once (a real kubelet changes pods)")
        .is_none()
    {
        return Ok(());
    }
    let ns = c.namespace("compare").await;
    apply_example_with(&c, &ns, 3, |v| {
        v["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
    })
    .await?;
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let nodeset = nodesets.get(NS_NAME).await?;
    let controller = Api::<Controller>::namespaced(c.client.clone(), &ns)
        .get(&nodeset.spec.controller_ref.name)
        .await?;
    // Slinky's pods, each running another image than ours: under OnDelete they stay as they are.
    let plugins = PluginRegistry::new(&default_engine(), &[])?;
    let builder = plugins.active(BuilderKind::NodesetPod);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let slinky_rev = format!("{NS_NAME}-6d8f9b7c5");
    for o in 0..3 {
        let id = PodIdentity::for_ordinal(&nodeset, o, slinky_rev.clone());
        let mut pod = builder.build_pod(&BuildContext::default(), &nodeset, &controller, &id)?;
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers[0].image = Some("ghcr.io/slinkyproject/slurmd:24.11-ubuntu24.04".into());
        }
        pods.create(&PostParams::default(), &pod).await?;
    }
    let host = Host::start(&c, &ns)?;
    wait_owned(&c, &ns, &names(&[0, 1, 2])).await?;
    let writes = &host.handles.writes;
    let dry_runs = || {
        writes
            .snapshot()
            .get(&("dry_run".to_string(), "ok".to_string()))
            .copied()
            .unwrap_or(0)
    };
    // Several passes (resync 1 s) per step: each pod is dry-run once per change, not per pass.
    let h = &host;
    let settle = |want: u64| async move {
        let reached = eventually(30, || async { (dry_runs() >= want).then_some(()) }).await;
        ensure!(reached.is_some(), "fewer than {want} dry runs: {}", dry_runs());
        // Four resyncs of the Controller and the NodeSet.
        h.passes_later(8).await?;
        ensure!(
            dry_runs() == want,
            "{} dry runs over 8 passes, not {want}: {:?}",
            dry_runs(),
            writes.snapshot()
        );
        anyhow::Ok(())
    };
    settle(3).await.context("the first comparison of each pod")?;
    // One pod changes: it alone is compared again.
    pods.patch(
        &format!("{NS_NAME}-1"),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"example.com/touched": "yes"}}})),
    )
    .await?;
    settle(4).await.context("a changed pod")?;
    // A NodeSet label (which the builder copies onto pods) changes what they are compared with.
    nodesets
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/site": "a"}}})),
        )
        .await?;
    settle(7).await.context("a relabelled NodeSet")?;
    for o in 0..3 {
        let p = pods.get(&format!("{NS_NAME}-{o}")).await?;
        assert_eq!(
            p.labels().get(keys::LABEL_REVISION_HASH),
            Some(&slinky_rev),
            "a differing pod is neither relabelled nor replaced under OnDelete"
        );
    }
    assert_eq!(host.handles.writes.ok("delete"), 0);
    assert_eq!(host.handles.writes.ok("create"), 0);
    host.stop().await;
    Ok(())
}

/// The node of each live pod of the example NodeSet, by name.
async fn placements(c: &TestCluster, ns: &str) -> Result<BTreeMap<String, String>> {
    Ok(Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), p.spec?.node_name?)))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pin_to_node_brings_a_replacement_back_to_its_node_while_it_is_schedulable() -> Result<()> {
    let c = cluster(true).await;
    if c.server.is_none() {
        // A cluster without a scheduler binds no pod: nothing to pin.
        return Ok(());
    }
    let ns = c.namespace("pin").await;
    apply_example_with(&c, &ns, 3, |v| v["spec"]["pinToNode"] = true.into()).await?;
    let host = Host::start(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), true).await?;
    let before = placements(&c, &ns).await?;
    ensure!(before.len() == 3, "{before:?}");
    // The status remembers where each ordinal ran.
    let nodesets = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let recorded = eventually(30, || async {
        let m = nodesets.get(NS_NAME).await.ok()?.status?.ordinal_to_node;
        (m.len() == 3).then_some(m)
    })
    .await
    .context("status.ordinalToNode never listed the 3 ordinals")?;
    for (o, node) in &recorded {
        ensure!(
            before.get(&format!("{NS_NAME}-{o}")) == Some(node),
            "{recorded:?} vs {before:?}"
        );
    }

    // Pod 1 deleted: the simulated scheduler would put the next pod on the next node in turn;
    // its pin brings it back to its own.
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let pod1 = format!("{NS_NAME}-1");
    let old_uid = pods.get(&pod1).await?.uid();
    pods.delete(&pod1, &DeleteParams::default()).await?;
    let back = eventually(60, || async {
        let p = pods.get(&pod1).await.ok()?;
        (p.uid() != old_uid).then_some(p.spec?.node_name).flatten()
    })
    .await
    .context("pod 1 was not recreated and scheduled")?;
    ensure!(
        Some(&back) == before.get(&pod1),
        "pod 1 went to {back}, it ran on {:?}",
        before.get(&pod1)
    );
    let pinned = serde_json::to_value(pods.get(&pod1).await?.spec.and_then(|s| s.affinity))?;
    ensure!(
        pinned.pointer(
            "/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0"
        ) == Some(&json!({"key": "metadata.name", "operator": "In", "values": [back]})),
        "the replacement is not pinned by its spec: {pinned}"
    );

    // Its node cordoned: pod 2's replacement is not pinned to it.
    let pod2 = format!("{NS_NAME}-2");
    let node2 = before.get(&pod2).context("pod 2 unplaced")?.clone();
    Api::<k8s_openapi::api::core::v1::Node>::all(c.client.clone())
        .patch(
            &node2,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    // Let the node watch show the cordon before the pod goes: the host's node cache is not
    // visible here, so two passes of the Controller and the NodeSet (the cordon itself triggers
    // the NodeSet of the pods on that node) stand for it.
    host.passes_later(4).await?;
    let old_uid = pods.get(&pod2).await?.uid();
    pods.delete(&pod2, &DeleteParams::default()).await?;
    let replacement = eventually(60, || async {
        let p = pods.get(&pod2).await.ok()?;
        (p.uid() != old_uid).then_some(p)
    })
    .await
    .context("pod 2 was not recreated")?;
    let affinity = serde_json::to_value(replacement.spec.and_then(|s| s.affinity))?;
    ensure!(
        affinity
            .pointer("/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution")
            .is_none(),
        "a pod is not pinned to a cordoned node: {affinity}"
    );
    host.stop().await;
    Ok(())
}
