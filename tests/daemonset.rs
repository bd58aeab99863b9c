//! DaemonSet mode (`scalingMode: DaemonSet`): one worker pod per eligible Kubernetes node, on
//! the embedded API server with its simulated nodes (or the cluster of `SLINKY_TEST_KUBECONFIG`,
//! whose Node objects the test makes itself: no kubelet runs them there). The NodeSet follows
//! nodes joining, leaving, being cordoned, tainted and relabelled; a failed pod is replaced.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use slinky_api::{NodeSet, keys, placement::target_node};
use slinky_tests::{
    TestCluster, eventually,
    host::{Host, NS_NAME, apply_example_with, cluster, settled_without_writes},
};

/// The label the test's nodes carry (the NodeSet's `nodeSelector`), so only they are eligible.
const LABEL: &str = "slinky-test/daemon";

/// The test's node names: the simulated ones on the embedded server (its kubelet runs their
/// pods), the test's own elsewhere.
fn names(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn node_name(c: &TestCluster, ns: &str, i: usize) -> String {
    if c.embedded("daemon nodes").is_some() {
        format!("sim-node-{i}")
    } else {
        format!("{ns}-node-{i}")
    }
}

/// Make node `name` carry the test's label (created when it does not exist).
async fn label_node(c: &TestCluster, ns: &str, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    if nodes.get_opt(name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"kubernetes.io/os": "linux", LABEL: ns}}}))?;
        nodes.create(&PostParams::default(), &node).await?;
        // kube-apiserver taints a new node not-ready (NoSchedule) until its kubelet reports;
        // no kubelet runs here: the node is made ready by hand, as its kubelet would.
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await?;
    } else {
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {LABEL: ns}}})),
            )
            .await?;
    }
    Ok(())
}

/// The NodeSet's live (not terminating) pods by their target node.
async fn pods_by_node(c: &TestCluster, ns: &str) -> Result<BTreeMap<String, Pod>> {
    let list = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NS_NAME}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((target_node(&p)?, p)))
        .collect())
}

async fn desired(c: &TestCluster, ns: &str) -> Option<i32> {
    Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .get(NS_NAME)
        .await
        .ok()?
        .status
        .map(|s| s.desired)
}

/// Wait until the pods are exactly on `want` (and the status says so), returning them.
async fn converge_on(
    c: &TestCluster,
    ns: &str,
    want: &[&str],
    running: bool,
) -> Result<BTreeMap<String, Pod>> {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    let got = eventually(60, || async {
        let pods = pods_by_node(c, ns).await.ok()?;
        let nodes: Vec<String> = pods.keys().cloned().collect();
        let ran = !running
            || pods
                .values()
                .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        (nodes == want && ran && desired(c, ns).await == Some(want.len() as i32)).then_some(pods)
    })
    .await;
    let now = pods_by_node(c, ns).await?;
    got.with_context(|| {
        format!(
            "pods never on exactly {want:?} (running: {running}): now on {:?}, desired {:?}",
            now.keys().collect::<Vec<_>>(),
            "see status"
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daemon_nodeset_follows_nodes_joining_leaving_cordoned_and_tainted() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("daemon").await;
    let running = c.embedded("running pods").is_some();
    let n: Vec<String> = (0..4).map(|i| node_name(&c, &ns, i)).collect();
    for name in &n[..3] {
        label_node(&c, &ns, name).await?;
    }
    apply_example_with(&c, &ns, 3, |v| {
        v["spec"]["scalingMode"] = "DaemonSet".into();
        v["spec"]["template"]["spec"]["nodeSelector"] = json!({LABEL: ns});
        // A node's name up to its first dot, when no hostname prefix is set.
        if let Some(spec) = v["spec"]["template"]["spec"].as_object_mut() {
            spec.remove("hostname");
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let pods = converge_on(&c, &ns, &names(&n[..3]), running).await?;

    // Each pod is its node's: named and hostnamed for it, bound by node affinity, no ordinal.
    for (node, p) in &pods {
        assert_eq!(p.name_any(), format!("{NS_NAME}-{node}"));
        let spec = p.spec.clone().unwrap_or_default();
        assert_eq!(spec.hostname.as_deref(), Some(node.as_str()));
        let labels = p.labels();
        assert_eq!(
            labels.get(keys::LABEL_SCALING_MODE).map(String::as_str),
            Some("DaemonSet")
        );
        assert_eq!(labels.get(keys::LABEL_POD_HOSTNAME), Some(node));
        ensure!(
            !labels.contains_key(keys::LABEL_POD_INDEX),
            "a daemon pod has no ordinal: {labels:?}"
        );
        let tolerations = spec.tolerations.unwrap_or_default();
        ensure!(
            tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some("node.kubernetes.io/unschedulable")),
            "no toleration of cordoned nodes (Slinky's #259): {tolerations:?}"
        );
    }
    settled_without_writes(&host).await?;

    // A node joins.
    label_node(&c, &ns, &n[3]).await?;
    converge_on(&c, &ns, &names(&n), running).await?;

    // Cordoned: its pod stays, and a pod deleted there is made again.
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .patch(
            &n[1],
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true,
                "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}})),
        )
        .await?;
    let pods_api = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let before = pods_by_node(&c, &ns).await?;
    let old_uid = before
        .get(&n[1])
        .and_then(|p| p.uid())
        .context("no pod on the cordoned node")?;
    pods_api
        .delete(
            &format!("{NS_NAME}-{}", n[1]),
            &DeleteParams::default().grace_period(0),
        )
        .await?;
    let back = eventually(60, || async {
        let p = pods_by_node(&c, &ns).await.ok()?.remove(&n[1])?;
        (p.uid() != Some(old_uid.clone())).then_some(())
    })
    .await;
    ensure!(
        back.is_some(),
        "a pod deleted on a cordoned node was not made again (Slinky's #259)"
    );

    // A NoSchedule taint keeps the pod there; a NoExecute one evicts it.
    nodes
        .patch(
            &n[2],
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}})),
        )
        .await?;
    // Two resyncs of the Controller and the NodeSet (and more; the taint itself triggers the
    // NodeSet): the pod stays.
    host.passes_later(6).await?;
    ensure!(
        pods_by_node(&c, &ns).await?.contains_key(&n[2]),
        "a NoSchedule taint evicted the pod"
    );
    nodes
        .patch(
            &n[2],
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}})),
        )
        .await?;
    converge_on(&c, &ns, &[&n[0], &n[1], &n[3]], false).await?;

    // A node leaves; another no longer matches the nodeSelector.
    nodes.delete(&n[3], &DeleteParams::default()).await?;
    nodes
        .patch(
            &n[0],
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL: null}}})),
        )
        .await?;
    converge_on(&c, &ns, &[&n[1]], false).await?;

    // A failed pod is replaced on its node.
    let p = pods_by_node(&c, &ns).await?.remove(&n[1]).context("no pod")?;
    let failed_uid = p.uid();
    pods_api
        .patch_status(
            &p.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await?;
    let replaced = eventually(60, || async {
        let p = pods_by_node(&c, &ns).await.ok()?.remove(&n[1])?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        (p.uid() != failed_uid && phase.as_deref() != Some("Failed")).then_some(())
    })
    .await;
    ensure!(replaced.is_some(), "the failed pod was not replaced");
    host.stop().await;
    if c.embedded("cleanup").is_none() {
        for name in &n {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// Slinky's worker pod for ordinal `i` (tests/slinky-made) as its DaemonSet mode makes it for
/// `node` (slurm-operator `NewNodeSetDaemonSetPod`): a generated name, the node's hostname, no
/// ordinal, bound to the node by one `matchFields` term, and no daemon tolerations (its #259).
fn slinky_daemon_pod(mut pod: serde_json::Value, node: &str, name: &str, ns: &str) -> serde_json::Value {
    let hostname = node.split('.').next().unwrap_or(node);
    pod["metadata"]["name"] = name.into();
    let labels = &mut pod["metadata"]["labels"];
    if let Some(l) = labels.as_object_mut() {
        l.remove(keys::LABEL_POD_INDEX);
    }
    labels[keys::LABEL_POD_NAME] = name.into();
    labels[keys::LABEL_POD_HOSTNAME] = hostname.into();
    labels[keys::LABEL_SCALING_MODE] = "DaemonSet".into();
    let spec = &mut pod["spec"];
    spec["hostname"] = hostname.into();
    spec["nodeSelector"] = json!({LABEL: ns});
    spec["affinity"]["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}});
    pod
}

/// A DaemonSet-mode NodeSet Slinky's operator made is taken over without a restart: its pods,
/// named by the API server, are compared (bound to their nodes) with what the builders make,
/// found equal, relabelled and given the daemon tolerations in place; none is replaced and no
/// second pod is made for their nodes. `plugin diff` says so before the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daemon_nodeset_slinkys_operator_made_is_taken_over_without_a_restart() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("daemon-adopt").await;
    let n: Vec<String> = (0..2).map(|i| node_name(&c, &ns, i)).collect();
    for name in &n {
        label_node(&c, &ns, name).await?;
    }
    apply_example_with(&c, &ns, 2, |v| {
        v["spec"]["scalingMode"] = "DaemonSet".into();
        v["spec"]["template"]["spec"]["nodeSelector"] = json!({LABEL: ns});
    })
    .await?;
    let nodeset = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get(NS_NAME)
        .await?;
    let mut uids = BTreeMap::new();
    for (placeholder, _, _) in slinky_tests::SLINKY_MADE_OWNERS {
        uids.insert(placeholder, "not-made-here".to_string());
    }
    uids.insert("NODESET-UID", nodeset.uid().unwrap_or_default());
    let made = slinky_tests::slinky_made(&ns, &uids)?;
    let pods_api = Api::<Pod>::namespaced(c.client.clone(), &ns);
    for (i, (node, suffix)) in n.iter().zip(["x7k2p", "q9d4w"]).enumerate() {
        let ordinal = made
            .iter()
            .find(|d| d["kind"] == "Pod" && d["metadata"]["name"] == format!("{NS_NAME}-{i}"))
            .with_context(|| format!("tests/slinky-made has no {NS_NAME}-{i}"))?;
        let pod = slinky_daemon_pod(ordinal.clone(), node, &format!("{NS_NAME}-{suffix}"), &ns);
        let pp = PostParams {
            field_manager: Some("manager".into()),
            ..Default::default()
        };
        pods_api.create(&pp, &serde_json::from_value(pod)?).await?;
    }
    let before: BTreeMap<String, (String, String)> = pods_by_node(&c, &ns)
        .await?
        .into_iter()
        .map(|(node, p)| (node, (p.name_any(), p.uid().unwrap_or_default())))
        .collect();
    ensure!(before.len() == 2, "Slinky's pods: {before:?}");

    let (kubeconfig, namespace) = (c.kubeconfig.display().to_string(), ns.clone());
    let out = tokio::task::spawn_blocking(move || {
        slinky_tests::run(&["plugin", "diff", "--kubeconfig", &kubeconfig, "-n", &namespace])
    })
    .await?;
    let report = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && report.contains(" 0 pod(s) would roll") && !report.contains("Pod "),
        "plugin diff before the takeover:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let host = Host::start(&c, &ns)?;
    let taken = eventually(90, || async {
        let pods = pods_by_node(&c, &ns).await.ok()?;
        let ours = pods.values().all(|p| {
            p.labels()
                .get(keys::LABEL_REVISION_HASH)
                .is_some_and(|r| slinky_host::revision::is_output_revision(r))
        });
        (pods.len() == 2 && ours).then_some(pods)
    })
    .await;
    let pods = taken.with_context(|| "Slinky's daemon pods were not taken as the builders' pods")?;
    settled_without_writes(&host).await?;
    let after: BTreeMap<String, (String, String)> = pods_by_node(&c, &ns)
        .await?
        .into_iter()
        .map(|(node, p)| (node, (p.name_any(), p.uid().unwrap_or_default())))
        .collect();
    assert_eq!(after, before, "no pod replaced, none added");
    for p in pods.values() {
        let tolerations = p
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        for t in slinky_api::placement::daemon_tolerations() {
            ensure!(
                tolerations.contains(&t),
                "pod {} lacks the daemon toleration {t:?}: {tolerations:?}",
                p.name_any()
            );
        }
    }
    host.stop().await;
    if c.embedded("cleanup").is_none() {
        let nodes: Api<Node> = Api::all(c.client.clone());
        for name in &n {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}
