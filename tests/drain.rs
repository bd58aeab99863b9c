//! What the host does with Slurm that needs no Slurm to check: a Controller's `active` label
//! without a slurmrestd (pod 0, as Slinky; without HA too, for a Service Slinky made), and fail-closed deletes when the configured
//! slurmrestd cannot be asked. (With a real Slurm: `tests/slurm.rs`.)

use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    ResourceExt,
    api::{Api, ListParams, Patch, PatchParams},
};
use serde_json::json;
use slinky_api::{NodeSet, keys};
use slinky_host::{PluginRegistry, reconcile::RunConfig};
use slinky_tests::{
    default_engine, eventually,
    host::{
        Host, NS_NAME, apply_example, apply_file, cluster, cluster_with_statefulsets, converge_current,
        events, names, nodeset_condition, pod_names, scale,
    },
};

async fn active_pods(c: &slinky_tests::TestCluster, ns: &str) -> Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{}=true", keys::LABEL_CONTROLLER_ACTIVE)))
        .await?;
    Ok(pods.items.iter().map(ResourceExt::name_any).collect())
}

#[tokio::test]
async fn an_ha_controller_without_slurm_has_exactly_one_active_slurmctld_pod() -> Result<()> {
    let c = cluster_with_statefulsets().await;
    let ns = c.namespace("ha-active").await;
    apply_file(&c, &ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            v["spec"]["ha"] = json!({"enabled": true, "backups": 1});
            v["spec"]["persistence"] = json!({"enabled": true, "existingClaim": "slurm-state"});
        }
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    // The Service selects the active label: pod 0 gets it (nothing to ask), pod 1 does not.
    let active = eventually(30, || async {
        let pods = pod_names(&c, &ns).await.ok()?;
        let active = active_pods(&c, &ns).await.ok()?;
        (pods.contains("slurm-controller-1") && active == ["slurm-controller-0"]).then_some(active)
    })
    .await;
    ensure!(
        active.is_some(),
        "active pods {:?}, pods {:?}",
        active_pods(&c, &ns).await?,
        pod_names(&c, &ns).await?
    );
    // The active pod goes: the label moves to the live one, and stays there when pod 0 is back
    // (a label on a live pod stays; only Slurm moves it), never on two pods.
    let api = Api::<Pod>::namespaced(c.client.clone(), &ns);
    api.delete("slurm-controller-0", &Default::default()).await?;
    let moved = eventually(30, || async {
        let active = active_pods(&c, &ns).await.ok()?;
        let pods = pod_names(&c, &ns).await.ok()?;
        (active == ["slurm-controller-1"] && pods.contains("slurm-controller-0")).then_some(())
    })
    .await;
    ensure!(
        moved.is_some(),
        "active pods {:?}, pods {:?}",
        active_pods(&c, &ns).await?,
        pod_names(&c, &ns).await?
    );
    // Pod 0 back and Ready (a candidate the label could wrongly move to) ...
    let back = eventually(60, || async {
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let p = pods.get_opt("slurm-controller-0").await.ok()??;
        slinky_tests::host::pod_ready(&p).then_some(())
    })
    .await;
    ensure!(back.is_some(), "pod 0 did not come back ready");
    // ... and the label stays on pod 1: looked at every 300 ms until the host made 6 more passes
    // (three resyncs of the Controller and the NodeSet).
    {
        let resyncs = host.passes_later(6);
        tokio::pin!(resyncs);
        let mut resynced = false;
        loop {
            let active = active_pods(&c, &ns).await?;
            ensure!(active == ["slurm-controller-1"], "active pods {active:?}");
            if resynced {
                break;
            }
            tokio::select! {
                done = &mut resyncs => {
                    done?;
                    resynced = true;
                }
                () = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
        }
    }
    host.stop().await;
    Ok(())
}

/// Without HA the one slurmctld pod carries the `active` label, as Slinky's operator labels it: a
/// Service that operator made selects `active=true` (from v1.2.2, with or without HA), and the
/// host's apply cannot drop a selector key another manager owns, so without the label a replaced
/// slurmctld pod would be no endpoint of it (slurmctld unreachable, Slinky's #257).
#[tokio::test]
async fn without_ha_the_slurmctld_pod_is_active_for_a_service_slinky_made() -> Result<()> {
    let c = cluster_with_statefulsets().await;
    let ns = c.namespace("no-ha-active").await;
    // The Service as Slinky's operator leaves it: its selector, its field manager.
    let mut selector = slinky_api::labels::CONTROLLER.selector_labels("slurm");
    selector.insert(keys::LABEL_CONTROLLER_ACTIVE.to_string(), "true".to_string());
    let slinky_made: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "slurm-controller", "namespace": ns},
        "spec": {"selector": selector, "clusterIP": "None",
                 "ports": [{"name": "slurmctld", "port": 6817, "targetPort": "slurmctld"}]}
    }))?;
    let services = Api::<Service>::namespaced(c.client.clone(), &ns);
    services
        .patch(
            "slurm-controller",
            &PatchParams::apply("manager").force(),
            &Patch::Apply(&slinky_made),
        )
        .await?;
    apply_file(&c, &ns, "slurm-cluster.yaml", |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    // The Service selects the slurmctld pod: every key of its selector is one of the pod's labels.
    let selected = |uid: Option<String>| {
        let (pods, services) = (pods.clone(), services.clone());
        async move {
            let svc = services.get("slurm-controller").await.ok()?;
            let pod = pods.get_opt("slurm-controller-0").await.ok()??;
            let selector = svc.spec?.selector?;
            let fresh = uid.is_none_or(|u| pod.metadata.uid.as_ref() != Some(&u));
            (fresh && selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v)))
                .then_some(pod.metadata.uid)
        }
    };
    let first = eventually(60, || selected(None)).await;
    let uid = first.context("slurmctld pod 0 is never selected by the Service Slinky made")?;
    ensure!(
        active_pods(&c, &ns).await? == ["slurm-controller-0"],
        "active pods {:?}",
        active_pods(&c, &ns).await?
    );
    // A new slurmctld pod (a node lost, an upgrade): labelled again.
    pods.delete("slurm-controller-0", &Default::default()).await?;
    let again = eventually(60, || selected(uid.clone())).await;
    ensure!(
        again.is_some(),
        "the replaced slurmctld pod is no endpoint: active pods {:?}",
        active_pods(&c, &ns).await?
    );
    host.stop().await;
    Ok(())
}

/// Closed stays closed: a NodeSet that had a slurmrestd and has none now (here the flag is
/// dropped; a RestApi deleted is the same) deletes no pod without a drain; only its annotation
/// `delete-without-drain=true` lets the pods go undrained, and an Event says so.
#[tokio::test]
async fn a_nodeset_that_had_a_slurmrestd_deletes_nothing_undrained_once_it_is_gone() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("slurm-gone").await;
    apply_example(&c, &ns, 2).await?;
    let registry = Arc::new(PluginRegistry::new(&default_engine(), &[])?);
    let config = |urls: Vec<String>| RunConfig {
        namespaces: vec![ns.clone()],
        resync: Some(Duration::from_secs(1)),
        slurmrestd_urls: urls,
        ..Default::default()
    };
    let host = Host::start_config(
        c.client.clone(),
        registry.clone(),
        config(vec!["http://127.0.0.1:9".into()]),
    );
    converge_current(&c, &ns, &names(&[0, 1]), true).await?;
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let marked = eventually(30, || async {
        let n = api.get(NS_NAME).await.ok()?;
        n.finalizers()
            .iter()
            .any(|f| f == keys::FINALIZER_SLURM_NODES)
            .then_some(())
    })
    .await;
    ensure!(marked.is_some(), "the NodeSet never got its finalizer");
    host.stop().await;
    // The host again, with no slurmrestd for the Controller.
    let host = Host::start_config(c.client.clone(), registry, config(Vec::new()));
    scale(&c, &ns, 1).await?;
    let condition = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "SlurmFailure").await.ok()??;
        (cond.status == "True" && cond.message.contains("any more")).then_some(cond)
    })
    .await
    .context("no SlurmFailure condition saying the slurmrestd is gone")?;
    ensure!(
        condition.reason == "SlurmUnreachable"
            && condition.message.contains(keys::ANNOTATION_DELETE_WITHOUT_DRAIN),
        "{condition:?}"
    );
    host.passes_later(6).await?;
    ensure!(
        pod_names(&c, &ns).await? == names(&[0, 1]),
        "a pod went without a drain: {:?}",
        pod_names(&c, &ns).await?
    );
    // The explicit opt-out.
    api.patch(
        NS_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {keys::ANNOTATION_DELETE_WITHOUT_DRAIN: "true"}}})),
    )
    .await?;
    let gone = eventually(30, || async {
        (pod_names(&c, &ns).await.ok()? == names(&[0])).then_some(())
    })
    .await;
    ensure!(gone.is_some(), "{:?}", pod_names(&c, &ns).await?);
    let evs = events(&c, &ns, NS_NAME).await?;
    ensure!(
        evs.iter()
            .any(|(r, n)| r == "DeleteWithoutDrain" && n.contains("without a drain")),
        "{evs:?}"
    );
    host.stop().await;
    Ok(())
}

/// A host serving `ns` whose slurmrestd nobody serves: every call fails at once (connection
/// refused).
fn host_without_slurm(c: &slinky_tests::TestCluster, ns: &str) -> Result<Host> {
    let config = RunConfig {
        namespaces: vec![ns.to_string()],
        resync: Some(Duration::from_secs(1)),
        slurmrestd_urls: vec!["http://127.0.0.1:9".into()],
        ..Default::default()
    };
    Ok(Host::start_config(
        c.client.clone(),
        Arc::new(PluginRegistry::new(&default_engine(), &[])?),
        config,
    ))
}

/// A pod that never started its slurmd (still Pending: no kubelet here, as a pod stuck in its
/// init containers or its image pull on a real node) goes at a scale-in even while Slurm cannot be
/// asked: no job can be on its node. Before, it was held with the live pods until slurmrestd
/// answered, so a broken rollout could not be replaced (found on the real node: pods stuck in
/// `Init` behind an unreachable slurmrestd that their own fix would have started).
#[tokio::test]
async fn with_slurm_unreachable_a_pod_that_never_started_still_goes() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("slurm-down-pending").await;
    apply_example(&c, &ns, 3).await?;
    let host = host_without_slurm(&c, &ns)?;
    converge_current(&c, &ns, &names(&[0, 1, 2]), false).await?;
    scale(&c, &ns, 1).await?;
    converge_current(&c, &ns, &names(&[0]), false).await?;
    host.stop().await;
    Ok(())
}

#[tokio::test]
async fn with_slurm_unreachable_a_scale_in_deletes_nothing_and_says_why() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("slurm-down").await;
    apply_example(&c, &ns, 3).await?;
    let host = host_without_slurm(&c, &ns)?;
    // Scale-up needs no Slurm: pods are created.
    converge_current(&c, &ns, &names(&[0, 1, 2]), true).await?;
    scale(&c, &ns, 1).await?;
    let condition = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "SlurmFailure").await.ok()??;
        (cond.status == "True" && cond.message.contains("nothing is deleted")).then_some(cond)
    })
    .await
    .context("no SlurmFailure condition")?;
    ensure!(condition.reason == "SlurmUnreachable", "{condition:?}");
    ensure!(
        condition.message.contains("127.0.0.1:9") && condition.message.contains("nothing is deleted"),
        "{condition:?}"
    );
    let evs = events(&c, &ns, slinky_tests::host::NS_NAME).await?;
    ensure!(
        evs.iter()
            .any(|(r, n)| r == "SlurmUnreachable" && n.contains("127.0.0.1:9")),
        "{evs:?}"
    );
    // Fail closed: a few resyncs later (three of the Controller and three of the NodeSet, whose
    // Slurm calls are retried within seconds) all three pods are still there.
    host.passes_later(6).await?;
    ensure!(
        pod_names(&c, &ns).await? == names(&[0, 1, 2]),
        "{:?}",
        pod_names(&c, &ns).await?
    );
    // The NodeSet carries the finalizer: deleted, it stays (and its partition in slurm.conf)
    // while Slurm cannot say that no job runs on its nodes.
    let api = Api::<NodeSet>::namespaced(c.client.clone(), &ns);
    let nodeset = api.get(NS_NAME).await?;
    ensure!(
        nodeset
            .finalizers()
            .iter()
            .any(|f| f == keys::FINALIZER_SLURM_NODES),
        "{:?}",
        nodeset.finalizers()
    );
    api.delete(NS_NAME, &Default::default()).await?;
    let held = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "SlurmFailure").await.ok()??;
        cond.message.contains("is being deleted").then_some(cond)
    })
    .await;
    ensure!(held.is_some(), "no SlurmFailure naming the deletion");
    // Two resyncs of the Controller and the NodeSet (and more): it is still there.
    host.passes_later(6).await?;
    let still = api.get_opt(NS_NAME).await?;
    ensure!(
        still.is_some_and(|n| n.metadata.deletion_timestamp.is_some()),
        "the NodeSet went while Slurm could not be asked"
    );
    ensure!(
        pod_names(&c, &ns).await? == names(&[0, 1, 2]),
        "{:?}",
        pod_names(&c, &ns).await?
    );
    host.stop().await;
    Ok(())
}
