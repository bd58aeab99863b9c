//! A NodeSet's per-pod volume claims (`spec.volumeClaimTemplates`) end to end, on the embedded
//! API server (or the cluster of `SLINKY_TEST_KUBECONFIG`): each claim is made before its pod and
//! mounted by it, survives a scale-in and comes back with its ordinal under the default
//! retention (Retain), and goes with the scale-in and with the NodeSet under `Delete`.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams},
};
use serde_json::{Value, json};
use slinky_api::NodeSet;
use slinky_tests::{
    TestCluster, eventually,
    host::{
        Host, NS_NAME, apply_example_with, cluster, converge_current, events, names, nodeset_condition, scale,
    },
};

fn scratch_template() -> Value {
    json!({"metadata": {"name": "scratch", "labels": {"tier": "fast"}},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
}

/// The claims of `ns` by name (terminating ones left out).
async fn claims(c: &TestCluster, ns: &str) -> Result<BTreeMap<String, PersistentVolumeClaim>> {
    Ok(Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| (c.name_any(), c))
        .collect())
}

fn claim_name(ordinal: u32) -> String {
    format!("scratch-{NS_NAME}-{ordinal}")
}

/// The claim pod `ordinal` mounts as its `scratch` volume.
async fn mounted(c: &TestCluster, ns: &str, ordinal: u32) -> Option<String> {
    let pod = Api::<Pod>::namespaced(c.client.clone(), ns)
        .get(&format!("{NS_NAME}-{ordinal}"))
        .await
        .ok()?;
    pod.spec?
        .volumes?
        .into_iter()
        .find(|v| v.name == "scratch")?
        .persistent_volume_claim
        .map(|p| p.claim_name)
}

/// The UIDs of the claims' owners.
fn owner_kinds(claim: &PersistentVolumeClaim) -> Vec<String> {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|r| {
            ensure_plain(r);
            r.kind.clone()
        })
        .collect()
}

fn ensure_plain(r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference) {
    assert_ne!(
        r.controller,
        Some(true),
        "claim owners are plain references: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_are_made_before_their_pods_and_come_back_with_their_ordinal() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("claims").await;
    apply_example_with(&c, &ns, 2, |v| {
        v["spec"]["volumeClaimTemplates"] = json!([scratch_template()]);
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let ready = c.server.is_some();
    converge_current(&c, &ns, &names(&[0, 1]), ready).await?;
    let made = claims(&c, &ns).await?;
    for o in [0, 1] {
        let claim = made
            .get(&claim_name(o))
            .with_context(|| format!("claim {} missing: {:?}", claim_name(o), made.keys()))?;
        let labels = claim.labels();
        ensure!(
            labels.get("tier").map(String::as_str) == Some("fast"),
            "{labels:?}"
        );
        ensure!(
            labels.get("app.kubernetes.io/instance").map(String::as_str) == Some(NS_NAME)
                && labels.get("app.kubernetes.io/name").map(String::as_str) == Some("slurmd"),
            "the claim carries the NodeSet's selector labels: {labels:?}"
        );
        ensure!(
            owner_kinds(claim).is_empty(),
            "Retain/Retain: no owner references"
        );
        ensure!(
            mounted(&c, &ns, o).await == Some(claim_name(o)),
            "pod {o} does not mount its claim"
        );
        // Not made after its pod (creation times are whole seconds; that a pod is never made
        // before its claim is shown by the held-claim test below).
        let pod = Api::<Pod>::namespaced(c.client.clone(), &ns)
            .get(&format!("{NS_NAME}-{o}"))
            .await?;
        ensure!(
            claim.metadata.creation_timestamp <= pod.metadata.creation_timestamp,
            "claim {} was made after pod {o}",
            claim_name(o)
        );
    }
    let uid = made[&claim_name(1)].uid();

    // Scale in: pod 1 goes, its claim stays.
    scale(&c, &ns, 1).await?;
    converge_current(&c, &ns, &names(&[0]), ready).await?;
    let after = claims(&c, &ns).await?;
    ensure!(
        after.get(&claim_name(1)).map(ResourceExt::uid) == Some(uid.clone()),
        "the claim of the scaled-in pod was not retained: {:?}",
        after.keys()
    );

    // Scale out: pod 1 comes back on the same claim (not a new one).
    scale(&c, &ns, 2).await?;
    converge_current(&c, &ns, &names(&[0, 1]), ready).await?;
    ensure!(mounted(&c, &ns, 1).await == Some(claim_name(1)));
    let again = claims(&c, &ns).await?;
    ensure!(
        again.get(&claim_name(1)).map(ResourceExt::uid) == Some(uid),
        "pod 1 did not get its old claim back"
    );
    let notes = events(&c, &ns, NS_NAME).await?;
    ensure!(
        notes.iter().any(|(reason, note)| reason == "SuccessfulCreate"
            && note.contains(&claim_name(0))
            && note.starts_with("Created claims")),
        "no Event for the claims made: {notes:?}"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_go_with_the_scale_in_and_the_nodeset_when_the_policy_says_delete() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("claims-delete").await;
    apply_example_with(&c, &ns, 2, |v| {
        v["spec"]["volumeClaimTemplates"] = json!([scratch_template()]);
        v["spec"]["persistentVolumeClaimRetentionPolicy"] =
            json!({"whenDeleted": "Delete", "whenScaled": "Delete"});
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let ready = c.server.is_some();
    converge_current(&c, &ns, &names(&[0, 1]), ready).await?;
    let made = claims(&c, &ns).await?;
    for o in [0, 1] {
        let claim = made.get(&claim_name(o)).context("claim missing")?;
        ensure!(
            owner_kinds(claim) == ["NodeSet"],
            "whenDeleted=Delete: the NodeSet owns the claim: {:?}",
            claim.metadata.owner_references
        );
    }
    let old = made[&claim_name(1)].uid();

    // Scale in: the claim of pod 1 goes with it (owned by the pod, then collected).
    scale(&c, &ns, 1).await?;
    converge_current(&c, &ns, &names(&[0]), ready).await?;
    let gone = eventually(60, || async {
        let now = claims(&c, &ns).await.ok()?;
        (!now.contains_key(&claim_name(1)) && now.contains_key(&claim_name(0))).then_some(())
    })
    .await;
    ensure!(
        gone.is_some(),
        "whenScaled=Delete: the scaled-in pod's claim was not deleted: {:?}",
        claims(&c, &ns).await?.keys()
    );

    // Scale out: a new claim for ordinal 1.
    scale(&c, &ns, 2).await?;
    converge_current(&c, &ns, &names(&[0, 1]), ready).await?;
    let fresh = claims(&c, &ns).await?;
    ensure!(
        fresh
            .get(&claim_name(1))
            .is_some_and(|c| c.uid() != Some(old.clone().unwrap_or_default())),
        "no new claim for ordinal 1: {:?}",
        fresh.keys()
    );

    // The NodeSet deleted: its claims go with it.
    Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .delete(NS_NAME, &DeleteParams::default())
        .await?;
    let all_gone = eventually(90, || async {
        claims(&c, &ns).await.ok()?.is_empty().then_some(())
    })
    .await;
    ensure!(
        all_gone.is_some(),
        "whenDeleted=Delete: claims outlived their NodeSet: {:?}",
        claims(&c, &ns).await?.keys()
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_claim_template_is_an_invalid_spec_naming_it() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("claims-bad").await;
    apply_example_with(&c, &ns, 1, |v| {
        v["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "Scratch_1"}}]);
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let cond = eventually(30, || async {
        nodeset_condition(&c, &ns, slinky_api::conditions::INVALID_SPEC)
            .await
            .ok()?
            .filter(|c| c.status == "True")
    })
    .await
    .context("no InvalidSpec condition")?;
    ensure!(
        cond.message
            .contains("spec.volumeClaimTemplates[0].metadata.name"),
        "{}",
        cond.message
    );
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    ensure!(pods.items.is_empty(), "no pod is made for an invalid spec");
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_waits_for_its_claim_being_deleted_and_says_so() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("claims-held").await;
    // A claim of ordinal 0 left from before, held by a finalizer and being deleted.
    let api = Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), &ns);
    let mut held = scratch_template();
    held["metadata"] = json!({"name": claim_name(0), "finalizers": ["example.com/hold"]});
    api.create(&Default::default(), &serde_json::from_value(held)?)
        .await?;
    api.delete(&claim_name(0), &DeleteParams::default()).await?;
    apply_example_with(&c, &ns, 2, |v| {
        v["spec"]["volumeClaimTemplates"] = json!([scratch_template()]);
    })
    .await?;
    let host = Host::start(&c, &ns)?;
    let failure = eventually(30, || async {
        nodeset_condition(&c, &ns, slinky_api::conditions::REPLICA_FAILURE)
            .await
            .ok()?
            .filter(|c| c.status == "True")
    })
    .await
    .context("no ReplicaFailure while the claim is being deleted")?;
    ensure!(
        failure.message.contains(&format!(
            "claim {} of pod {NS_NAME}-0 is being deleted",
            claim_name(0)
        )),
        "{}",
        failure.message
    );
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    // Only that pod waits: the other ordinal is created.
    let other = eventually(30, || async { pods.get_opt(&format!("{NS_NAME}-1")).await.ok()? }).await;
    ensure!(other.is_some(), "pod 1 waited for the claim of pod 0");
    ensure!(
        pods.get_opt(&format!("{NS_NAME}-0")).await?.is_none(),
        "the pod was created on a claim being deleted"
    );
    // The finalizer released: the claim goes, a new one is made, then the pod.
    api.patch(
        &claim_name(0),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    converge_current(&c, &ns, &names(&[0, 1]), false).await?;
    ensure!(mounted(&c, &ns, 0).await == Some(claim_name(0)));
    ensure!(
        claims(&c, &ns).await?.contains_key(&claim_name(0)),
        "no new claim"
    );
    host.stop().await;
    Ok(())
}
