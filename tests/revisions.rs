//! A NodeSet's revision history end to end, on the embedded API server (or the cluster of
//! `SLINKY_TEST_KUBECONFIG`): one ControllerRevision per pod revision, numbered, found by the
//! NodeSet's selector labels; a rollback (the old revision's `data` merged back with kubectl)
//! renumbers the old revision and rolls the pods back to its hash; `revisionHistoryLimit` keeps
//! that many old revisions; a steady state writes nothing and a restart renumbers nothing; a name
//! held by another object, or a refused write, is a condition and an Event until it is resolved,
//! and never holds the pods back.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::{
    apps::v1::ControllerRevision,
    core::v1::{ConfigMap, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use slinky_api::NodeSet;
use slinky_apiserver::{FaultError, Times};
use slinky_tests::{
    TestCluster, eventually,
    host::{Host, NS_NAME, apply_example_with, cluster, events, nodeset_condition, settled_without_writes},
    inject_fault,
};

/// A revision as the test sees it: its number and UID.
type Revisions = BTreeMap<String, (i64, String)>;

/// The NodeSet's revisions, as `kubectl get controllerrevisions -l
/// app.kubernetes.io/instance=<nodeset>` lists them.
async fn revisions(c: &TestCluster, ns: &str) -> Result<Revisions> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={NS_NAME}"));
    Ok(Api::<ControllerRevision>::namespaced(c.client.clone(), ns)
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(|r| {
            (
                r.name_any(),
                (r.revision.unwrap_or(0), r.uid().unwrap_or_default()),
            )
        })
        .collect())
}

/// Wait until the NodeSet's status and every one of its `replicas` pods show one revision of the
/// current generation; returns that revision's hash.
async fn rolled(c: &TestCluster, ns: &str, replicas: usize) -> Result<String> {
    let api = Api::<NodeSet>::namespaced(c.client.clone(), ns);
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns);
    let done = eventually(90, || async {
        let n = api.get(NS_NAME).await.ok()?;
        let st = n.status?;
        let hash = st.node_set_hash?;
        let list = pods.list(&ListParams::default()).await.ok()?;
        let all = list.items.len() == replicas
            && list.items.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.labels().get("controller-revision-hash") == Some(&hash)
            });
        (all && st.observed_generation == n.metadata.generation && st.updated_replicas == replicas as i32)
            .then_some(hash)
    })
    .await;
    match done {
        Some(hash) => Ok(hash),
        None => bail!("the NodeSet did not roll: {:?}", api.get(NS_NAME).await?.status),
    }
}

/// Wait until the NodeSet's revisions are `want` (name → number).
async fn history_is(c: &TestCluster, ns: &str, want: &[(&str, i64)]) -> Result<Revisions> {
    let want: BTreeMap<String, i64> = want.iter().map(|(h, n)| (format!("{NS_NAME}-{h}"), *n)).collect();
    let got = eventually(60, || async {
        let have = revisions(c, ns).await.ok()?;
        let numbers: BTreeMap<String, i64> = have.iter().map(|(k, (n, _))| (k.clone(), *n)).collect();
        (numbers == want).then_some(have)
    })
    .await;
    match got {
        Some(have) => Ok(have),
        None => bail!("expected revisions {want:?}, have {:?}", revisions(c, ns).await?),
    }
}

/// Merge-patch `patch` into the example NodeSet.
async fn edit(c: &TestCluster, ns: &str, patch: Value) -> Result<()> {
    Api::<NodeSet>::namespaced(c.client.clone(), ns)
        .patch(NS_NAME, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Roll back as a user would: `kubectl patch nodeset <n> --type merge -p "$(kubectl get
/// controllerrevision <rev> -o jsonpath='{.data}')"`.
fn kubectl_rollback(c: &TestCluster, ns: &str, revision: &str) -> Result<()> {
    let kc = c.kubeconfig.display().to_string();
    let script = format!(
        "kubectl --kubeconfig '{kc}' -n '{ns}' patch nodeset {NS_NAME} --type merge -p \
         \"$(kubectl --kubeconfig '{kc}' -n '{ns}' get controllerrevision {revision} -o jsonpath='{{.data}}')\""
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .context("sh")?;
    ensure!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollback_renumbers_the_old_revision_and_the_history_keeps_its_limit() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("history").await;
    apply_example_with(&c, &ns, 2, |v| {
        v["spec"]["revisionHistoryLimit"] = json!(1);
    })
    .await?;
    let host = Host::start(&c, &ns)?;

    // Template A: revision 1, named after the pods' hash, found by the selector labels.
    let a = rolled(&c, &ns, 2).await?;
    let first = history_is(&c, &ns, &[(&a, 1)]).await?;
    let rev_a = format!("{NS_NAME}-{a}");
    let obj = Api::<ControllerRevision>::namespaced(c.client.clone(), &ns)
        .get(&rev_a)
        .await?;
    let labels = obj.labels();
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("slurmd")
    );
    assert_eq!(labels.get("controller-revision-hash"), Some(&a));
    let owner = obj
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .context("a controller")?;
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("NodeSet", NS_NAME));
    let data = obj.data.0.clone();
    assert_eq!(
        data["spec"]["ssh"],
        Value::Null,
        "absent fields are explicit nulls: {data}"
    );
    assert_eq!(data["spec"]["extraConf"], "Features=gpu,ib Weight=10");

    // Template B: revision 2; A is kept (limit 1). B changes values inside A's fields, removes
    // one A has and adds one A has not.
    edit(
        &c,
        &ns,
        json!({"spec": {"template": {"metadata": {"labels": {"example.com/pool": "gpu"}}},
            "slurmd": {"image": "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04"},
            "extraConf": null, "ssh": {"enabled": false, "extraSshdConfig": "LogLevel DEBUG"}}}),
    )
    .await?;
    let b = rolled(&c, &ns, 2).await?;
    ensure!(b != a, "B is a new revision");
    history_is(&c, &ns, &[(&a, 1), (&b, 2)]).await?;

    // Back to A with A's data: A's own revision is numbered 3 (not a copy) and its pods are
    // current again.
    kubectl_rollback(&c, &ns, &rev_a)?;
    let back = rolled(&c, &ns, 2).await?;
    assert_eq!(back, a, "the pods are back at A's hash");
    let after = history_is(&c, &ns, &[(&a, 3), (&b, 2)]).await?;
    assert_eq!(after[&rev_a].1, first[&rev_a].1, "the same object, renumbered");
    let spec = Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .get(NS_NAME)
        .await?
        .spec;
    assert!(
        spec.ssh.is_none(),
        "the field A did not have is gone: {:?}",
        spec.ssh
    );
    assert_eq!(spec.extra_conf.as_deref(), Some("Features=gpu,ib Weight=10"));

    // Template C: revision 4; of A and B only the later-numbered A stays (limit 1).
    edit(
        &c,
        &ns,
        json!({"spec": {"template": {"metadata": {"labels": {"example.com/pool": "c"}}}}}),
    )
    .await?;
    let cc = rolled(&c, &ns, 2).await?;
    history_is(&c, &ns, &[(&a, 3), (&cc, 4)]).await?;

    // A steady state writes nothing; a restarted host renumbers nothing.
    settled_without_writes(&host).await?;
    let before = revisions(&c, &ns).await?;
    host.stop().await;
    let host = Host::start(&c, &ns)?;
    host.wait_ready().await?;
    settled_without_writes(&host).await?;
    assert_eq!(
        revisions(&c, &ns).await?,
        before,
        "same revisions, numbers and UIDs"
    );
    for verb in ["create_revision", "patch_revision", "delete_revision"] {
        assert_eq!(host.handles.writes.ok(verb), 0, "{verb} after the restart");
    }

    // The limit back to Slinky's default, 0: only the revision the pods run stays.
    edit(&c, &ns, json!({"spec": {"revisionHistoryLimit": null}})).await?;
    history_is(&c, &ns, &[(&cc, 4)]).await?;
    // (The deletion may be seen before the host has counted its answer.)
    let deleted = eventually(10, || async {
        (host.handles.writes.ok("delete_revision") == 1).then_some(())
    })
    .await;
    ensure!(
        deleted.is_some(),
        "one revision deleted: {:?}",
        host.handles.writes.snapshot()
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revision_name_held_by_another_object_is_a_condition_until_it_is_gone() -> Result<()> {
    let c = cluster(true).await;
    let ns = c.namespace("held").await;
    apply_example_with(&c, &ns, 1, |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    let a = rolled(&c, &ns, 1).await?;
    history_is(&c, &ns, &[(&a, 1)]).await?;
    host.stop().await;

    // While no host runs, the revision is replaced by one a ConfigMap controls.
    let name = format!("{NS_NAME}-{a}");
    let revs = Api::<ControllerRevision>::namespaced(c.client.clone(), &ns);
    revs.delete(&name, &Default::default()).await?;
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "stranger"}}))?;
    let cm = Api::<ConfigMap>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await?;
    let foreign: ControllerRevision = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "slurmd"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "stranger",
                "uid": cm.uid(), "controller": true}]},
        "data": {}, "revision": 7}))?;
    eventually(30, || async {
        revs.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await
    .context("the revision was not deleted")?;
    revs.create(&PostParams::default(), &foreign).await?;

    let host = Host::start(&c, &ns)?;
    let cond = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "ChildFailure").await.ok()??;
        (cond.status == "True").then_some(cond)
    })
    .await
    .context("no ChildFailure condition")?;
    assert_eq!(cond.reason, "NotOwned");
    ensure!(
        cond.message.contains(&name) && cond.message.contains("ConfigMap stranger"),
        "{}",
        cond.message
    );
    let noted = events(&c, &ns, NS_NAME).await?;
    ensure!(
        noted.iter().filter(|(r, _)| r == "NotOwned").count() == 1,
        "one NotOwned Event while it stands: {noted:?}"
    );
    let kept = revs.get(&name).await?;
    assert_eq!(kept.revision, Some(7), "another's revision is left alone");

    // Gone: the NodeSet records its revision and the condition clears.
    revs.delete(&name, &Default::default()).await?;
    let cleared = eventually(60, || async {
        let cond = nodeset_condition(&c, &ns, "ChildFailure").await.ok()?;
        cond.is_none_or(|c| c.status == "False").then_some(())
    })
    .await;
    ensure!(cleared.is_some(), "ChildFailure stayed");
    let mine = history_is(&c, &ns, &[(&a, 1)]).await?;
    ensure!(
        mine[&name].1 != kept.uid().unwrap_or_default(),
        "a new revision of the NodeSet's"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_revision_write_is_a_condition_and_an_event_and_is_retried() -> Result<()> {
    let c = cluster(true).await;
    let Some(server) = c.embedded("fault injection") else {
        return Ok(());
    };
    let ns = c.namespace("refused").await;
    apply_example_with(&c, &ns, 2, |_| {}).await?;
    inject_fault(
        server,
        "create",
        "controllerrevisions",
        FaultError::Internal,
        Times::Count(u32::MAX),
    );
    let host = Host::start(&c, &ns)?;
    // The pods roll all the same: the history records them, it does not drive them.
    let a = rolled(&c, &ns, 2).await?;
    let name = format!("{NS_NAME}-{a}");
    let cond = eventually(30, || async {
        let cond = nodeset_condition(&c, &ns, "ChildFailure").await.ok()??;
        (cond.status == "True").then_some(cond)
    })
    .await
    .context("no ChildFailure condition")?;
    assert_eq!(cond.reason, "FailedCreate");
    ensure!(
        cond.message
            .contains(&format!("Error creating ControllerRevision {name}")),
        "{}",
        cond.message
    );
    let noted = events(&c, &ns, NS_NAME).await?;
    ensure!(
        noted
            .iter()
            .any(|(r, n)| r == "FailedCreate" && n.contains(&name)),
        "an Event: {noted:?}"
    );
    ensure!(revisions(&c, &ns).await?.is_empty());
    let refused = server.faults().fired().len();
    ensure!(refused >= 1, "the create was refused");

    // The API server takes it again: the retry records the revision and clears the condition.
    server.faults().clear();
    history_is(&c, &ns, &[(&a, 1)]).await?;
    let cleared = eventually(60, || async {
        let cond = nodeset_condition(&c, &ns, "ChildFailure").await.ok()?;
        cond.is_none_or(|c| c.status == "False").then_some(())
    })
    .await;
    ensure!(cleared.is_some(), "ChildFailure stayed");
    host.stop().await;
    Ok(())
}

/// Every pod of the namespace: name → UID.
async fn pod_uids(c: &TestCluster, ns: &str) -> Result<BTreeMap<String, String>> {
    Ok(Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

/// The worker pods, once there are `n` and each carries a revision of this host's scheme (12 hex
/// digits) and a builder digest other than `not`: name → revision label.
async fn workers_of_this_scheme(
    c: &TestCluster,
    ns: &str,
    n: usize,
    not: &str,
) -> Option<BTreeMap<String, String>> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={NS_NAME}"));
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&lp)
        .await
        .ok()?;
    let out: BTreeMap<String, String> = pods
        .items
        .iter()
        .filter(|p| {
            p.annotations()
                .get("slinky.slurm.net/builder-digest")
                .is_some_and(|d| d != not)
        })
        .filter_map(|p| {
            let rev = p.labels().get("controller-revision-hash")?;
            (rev.len() == 12 && rev.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| (p.name_any(), rev.clone()))
        })
        .collect();
    (pods.items.len() == n && out.len() == n).then_some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrading_from_a_host_before_output_revisions_restarts_nothing() -> Result<()> {
    let c = slinky_tests::host::cluster_with_statefulsets().await;
    let ns = c.namespace("upgrade").await;
    apply_example_with(&c, &ns, 2, |_| {}).await?;
    let host = Host::start(&c, &ns)?;
    let revs = eventually(90, || workers_of_this_scheme(&c, &ns, 2, ""))
        .await
        .context("the workers did not come up")?;
    let sts = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c.client.clone(), &ns);
    eventually(60, || async { sts.get_opt("slurm-controller").await.ok()? })
        .await
        .context("no slurmctld StatefulSet")?;
    host.stop().await;

    // As an earlier host left them: an input-hash revision on the pods, the builder annotations
    // on slurmctld's pod template, another builder digest everywhere.
    let old = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    for name in revs.keys() {
        let patch = json!({"metadata": {"labels": {"controller-revision-hash": "0123456789"},
            "annotations": {"slinky.slurm.net/builder-digest": old}}});
        pods.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let provenance = json!({"slinky.slurm.net/builder": "controller-children@0.1.0",
        "slinky.slurm.net/builder-digest": old});
    // Applied by the host's field manager, as that host applied it (so the new host's apply
    // would remove what it no longer builds).
    let mut old_apply = serde_json::to_value(sts.get("slurm-controller").await?)?;
    if let Some(o) = old_apply.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = old_apply["metadata"].as_object_mut() {
        for k in [
            "managedFields",
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
        ] {
            m.remove(k);
        }
    }
    old_apply["metadata"]["annotations"]["slinky.slurm.net/builder-digest"] = old.into();
    old_apply["metadata"]["annotations"]["slinky.slurm.net/applied-hash"] = "0000000000000000".into();
    old_apply["spec"]["template"]["metadata"]["annotations"]
        .as_object_mut()
        .context("template annotations")?
        .extend(provenance.as_object().cloned().unwrap_or_default());
    let set = sts
        .patch(
            "slurm-controller",
            &PatchParams::apply("slinky-host").force(),
            &Patch::Apply(&old_apply),
        )
        .await?;
    let generation = set.metadata.generation;
    // slurmctld's pod of that template (the simulated StatefulSet controller's).
    let sim = c
        .embedded("slurmctld's pod (the simulated StatefulSet controller)")
        .is_some();
    if sim {
        eventually(90, || async {
            let s = sts.get("slurm-controller").await.ok()?;
            let current = s.status.as_ref()?.update_revision.clone()?;
            let pod = pods.get_opt("slurm-controller-0").await.ok()??;
            (pod.metadata.deletion_timestamp.is_none()
                && pod.labels().get("controller-revision-hash") == Some(&current)
                && s.status.as_ref()?.observed_generation == generation)
                .then_some(())
        })
        .await
        .context("slurmctld's pod of the old template did not come up")?;
    }
    let before = pod_uids(&c, &ns).await?;
    ensure!(!sim || before.contains_key("slurm-controller-0"), "{before:?}");

    // The new host: the workers are compared and relabelled, the StatefulSet's own metadata
    // is applied, its template keeps what it has.
    let host = Host::start(&c, &ns)?;
    let relabelled = eventually(90, || workers_of_this_scheme(&c, &ns, 2, old))
        .await
        .with_context(|| "the workers were not relabelled")?;
    assert_eq!(
        relabelled, revs,
        "the same revision as before, now on the old pods"
    );
    let applied = eventually(60, || async {
        let s = sts.get("slurm-controller").await.ok()?;
        (s.annotations()
            .get("slinky.slurm.net/builder-digest")
            .map(String::as_str)
            != Some(old))
        .then_some(s)
    })
    .await
    .context("the StatefulSet was not applied")?;
    assert_eq!(
        applied.metadata.generation, generation,
        "slurmctld's template is unchanged: no restart"
    );
    assert_eq!(
        serde_json::to_value(&applied)?
            .pointer("/spec/template/metadata/annotations/slinky.slurm.net~1builder-digest")
            .and_then(Value::as_str),
        Some(old),
        "the old template's provenance is kept"
    );
    assert_eq!(pod_uids(&c, &ns).await?, before, "no pod was replaced");
    host.stop().await;
    Ok(())
}

/// The UID of the custom resource `kind`/`name` in `ns`.
async fn uid_of(c: &TestCluster, ns: &str, kind: &str, name: &str) -> Result<String> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("slinky.slurm.net", "v1beta1", kind));
    let o = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
        .get(name)
        .await?;
    o.uid().with_context(|| format!("{kind} {name} has no UID"))
}

/// Slinky's objects for `ns` and its owners' UIDs ([`slinky_tests::slinky_made`]), written as
/// its manager writes them (created by the field manager `manager`). Returns them by `Kind/name`.
async fn write_slinky_made(c: &TestCluster, ns: &str, ha: bool) -> Result<BTreeMap<String, Value>> {
    write_slinky_made_with(c, ns, ha, |_| {}).await
}

/// [`write_slinky_made`], each object changed by `edit` first.
async fn write_slinky_made_with(
    c: &TestCluster,
    ns: &str,
    ha: bool,
    edit: impl Fn(&mut Value),
) -> Result<BTreeMap<String, Value>> {
    let mut uids = BTreeMap::new();
    for (placeholder, kind, name) in slinky_tests::SLINKY_MADE_OWNERS {
        // The HA cluster has no RestApi, LoginSet nor Accounting: nothing of it names them.
        let uid = match uid_of(c, ns, kind, name).await {
            Err(_) if ha => "absent".to_string(),
            uid => uid?,
        };
        uids.insert(placeholder, uid);
    }
    let docs = if ha {
        slinky_tests::slinky_made_ha(ns, &uids)?
    } else {
        slinky_tests::slinky_made(ns, &uids)?
    };
    let mut out = BTreeMap::new();
    for mut doc in docs {
        edit(&mut doc);
        let (api_version, kind) = (
            doc["apiVersion"].as_str().unwrap_or_default(),
            doc["kind"].as_str().unwrap_or_default(),
        );
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let object: DynamicObject = serde_json::from_value(doc.clone())?;
        let pp = PostParams {
            field_manager: Some("manager".into()),
            ..Default::default()
        };
        Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
            .create(&pp, &object)
            .await
            .with_context(|| format!("creating Slinky's {kind} {}", object.name_any()))?;
        out.insert(format!("{kind}/{}", object.name_any()), doc);
    }
    Ok(out)
}

/// What restarts the pods of the workload `kind`/`name` when it changes: its pod template as
/// stored, and a StatefulSet's `metadata.generation` (raised by a spec change only; a
/// Deployment's is raised by its annotations too, which restarts nothing).
async fn restart_inputs(c: &TestCluster, ns: &str, kind: &str, name: &str) -> Result<(Value, Option<i64>)> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", kind));
    let o = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
        .get(name)
        .await?;
    let generation = (kind == "StatefulSet").then_some(o.metadata.generation).flatten();
    Ok((o.data["spec"]["template"].clone(), generation))
}

/// Slinky's objects `made` are in `ns` with `pods` pods: `plugin diff` finds nothing to roll, then
/// the host takes them over: the workers relabelled, every child applied, a steady state, no pod
/// replaced and no template of `workloads` (nor a StatefulSet's generation) changed. Returns the
/// running host.
async fn taken_over_without_a_restart(
    c: &TestCluster,
    ns: &str,
    made: &BTreeMap<String, Value>,
    pods: usize,
    workloads: &[(&str, &str)],
) -> Result<Host> {
    let before = pod_uids(c, ns).await?;
    ensure!(before.len() == pods, "Slinky's pods: {before:?}");
    let mut templates = Vec::new();
    for (kind, name) in workloads {
        templates.push(restart_inputs(c, ns, kind, name).await?);
    }
    // The check before a takeover (docs/migrating-from-slinky.md): nothing would roll.
    let (kubeconfig, namespace) = (c.kubeconfig.display().to_string(), ns.to_string());
    let out = tokio::task::spawn_blocking(move || {
        slinky_tests::run(&["plugin", "diff", "--kubeconfig", &kubeconfig, "-n", &namespace])
    })
    .await?;
    let report = String::from_utf8_lossy(&out.stdout);
    // (On kube-apiserver the apply replaces the slurmctld Service's selector, an atomic map, and
    // drops `active` without HA: a change, no restart, the pod keeps matching.)
    ensure!(
        out.status.success()
            && report.contains(" 0 pod(s) would roll")
            && !report.contains("its pods restart"),
        "plugin diff before the takeover:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let host = Host::start(c, ns)?;
    let pods_api = Api::<Pod>::namespaced(c.client.clone(), ns);
    // The workers are compared with what the builders make, found equal and relabelled.
    let relabelled = eventually(90, || workers_of_this_scheme(c, ns, 3, "")).await;
    ensure!(
        relabelled.is_some(),
        "Slinky's workers were not taken as the builders' pods: {:?}",
        pods_api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| (p.name_any(), p.labels().get("controller-revision-hash").cloned()))
            .collect::<Vec<_>>()
    );
    // Every child applied by the host (the StatefulSet only once the Controller, with
    // `jwtHs256KeyRef`, builds).
    // (The ssh host keys Secret is the host's to make only when missing: it keeps Slinky's.)
    let applied = |k: &&String| {
        !k.starts_with("Pod/")
            && !k.starts_with("ControllerRevision/")
            && k.as_str() != "Secret/slurm-login-slinky-ssh-host-keys"
    };
    for key in made.keys().filter(applied) {
        let (kind, name) = key.split_once('/').unwrap_or_default();
        let doc = &made[key];
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar);
        eventually(60, || async {
            let o = api.get(name).await.ok()?;
            o.annotations()
                .contains_key("slinky.slurm.net/applied-hash")
                .then_some(())
        })
        .await
        .with_context(|| format!("the host never applied {key}"))?;
    }
    settled_without_writes(&host).await?;
    assert_eq!(pod_uids(c, ns).await?, before, "no pod was replaced");
    for ((kind, name), before) in workloads.iter().zip(templates) {
        assert_eq!(
            restart_inputs(c, ns, kind, name).await?,
            before,
            "{kind} {name}: the template is Slinky's, no restart"
        );
    }
    Ok(host)
}

/// A cluster Slinky's operator made is taken over with no restart: its Controller written by
/// Slinky's chart (`jwtHs256KeyRef`) and reporting to an Accounting, its slurmctld StatefulSet,
/// worker pods, slurmrestd and login Deployments and slurmdbd StatefulSet exactly as its builders
/// make them. The host applies every child and relabels the workers with its own revision, and
/// replaces no pod, changes no workload template (nor a StatefulSet's generation), and the
/// slurmctld Service keeps selecting slurmctld's pod. On the embedded server (and on the cluster of `SLINKY_TEST_KUBECONFIG`, for
/// the objects: no kubelet there makes slurmctld's pod).
#[tokio::test]
async fn a_cluster_slinkys_operator_made_is_taken_over_without_a_restart() -> Result<()> {
    let c = slinky_tests::host::cluster_with_statefulsets().await;
    let ns = c.namespace("adopt").await;
    for file in [
        "slurm-cluster.yaml",
        "restapi.yaml",
        "loginset.yaml",
        "accounting.yaml",
    ] {
        slinky_tests::host::apply_file(&c, &ns, file, |v| {
            if v["kind"] == "Controller" {
                let jwt = v["spec"]
                    .as_object_mut()
                    .and_then(|s| s.remove("jwtKeyRef"))
                    .unwrap_or_default();
                v["spec"]["jwtHs256KeyRef"] = jwt;
                v["spec"]["persistence"]["accessModes"] = json!(["ReadWriteOnce"]);
                v["spec"]["accountingRef"] = json!({"name": "slurm"});
            }
            if v["kind"] == "Accounting" {
                // Slinky's chart's image: one before 25.11 gets the host's `initconf` step.
                v["spec"]["slurmdbd"]["image"] = "ghcr.io/slinkyproject/slurmdbd:26.05-ubuntu24.04".into();
            }
        })
        .await?;
    }
    let made = write_slinky_made(&c, &ns, false).await?;
    // Labelled after Slinky made its pods: what the pods would carry of it is no difference.
    Api::<NodeSet>::namespaced(c.client.clone(), &ns)
        .patch(
            NS_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/team": "hpc"}}})),
        )
        .await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let sim = c
        .embedded("slurmctld's pod (the simulated StatefulSet controller)")
        .is_some();
    if sim {
        for pod in ["slurm-controller-0", "slurm-accounting-0"] {
            eventually(60, || async { pods.get_opt(pod).await.ok()? })
                .await
                .with_context(|| format!("the simulated StatefulSet controller made no {pod}"))?;
        }
    }
    let workloads = [
        ("StatefulSet", "slurm-controller"),
        ("StatefulSet", "slurm-accounting"),
        ("Deployment", "slurm-restapi"),
        ("Deployment", "slurm-login-slinky"),
    ];
    let host = taken_over_without_a_restart(&c, &ns, &made, 3 + 2 * usize::from(sim), &workloads).await?;
    if sim {
        let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.client.clone(), &ns)
            .get("slurm-controller")
            .await?;
        let pod = pods.get("slurm-controller-0").await?;
        let selector = svc.spec.and_then(|s| s.selector).unwrap_or_default();
        ensure!(
            selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v)),
            "the slurmctld Service ({selector:?}) no longer selects its pod ({:?})",
            pod.labels()
        );
    }
    host.stop().await;
    Ok(())
}

/// The example cluster with Slinky's chart's HA Controller (`jwtHs256KeyRef`, one backup, the
/// existing ReadWriteMany claim `slurm-statesave`, made here), applied into `ns`.
async fn apply_ha_cluster(c: &TestCluster, ns: &str) -> Result<()> {
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "slurm-statesave"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "4Gi"}}}
    }))?;
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &claim)
        .await?;
    slinky_tests::host::apply_file(c, ns, "slurm-cluster.yaml", |v| {
        if v["kind"] == "Controller" {
            let jwt = v["spec"]
                .as_object_mut()
                .and_then(|s| s.remove("jwtKeyRef"))
                .unwrap_or_default();
            v["spec"]["jwtHs256KeyRef"] = jwt;
            v["spec"]["ha"] = json!({"enabled": true, "backups": 1});
            v["spec"]["persistence"] = json!({"enabled": true, "existingClaim": "slurm-statesave",
                "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "4Gi"}}});
        }
    })
    .await
}

/// The same with high availability (`tests/slinky-made/ha-controller.yaml`): two slurmctld pods
/// of Slinky's StatefulSet on the existing claim, the one Slinky's operator found in control
/// labelled `active=true`. Taken over with no restart, and the Service, which selects
/// `active=true`, keeps exactly that endpoint.
#[tokio::test]
async fn an_ha_cluster_slinkys_operator_made_is_taken_over_without_a_restart() -> Result<()> {
    let c = slinky_tests::host::cluster_with_statefulsets().await;
    let ns = c.namespace("adopt-ha").await;
    apply_ha_cluster(&c, &ns).await?;
    let made = write_slinky_made(&c, &ns, true).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let sim = c
        .embedded("slurmctld's pods (the simulated StatefulSet controller)")
        .is_some();
    let active = format!("{}=true", slinky_api::keys::LABEL_CONTROLLER_ACTIVE);
    if sim {
        for pod in ["slurm-controller-0", "slurm-controller-1"] {
            eventually(60, || async { pods.get_opt(pod).await.ok()? })
                .await
                .with_context(|| format!("the simulated StatefulSet controller made no {pod}"))?;
        }
        // Slinky's operator labels the slurmctld in control (its ping said so).
        pods.patch(
            "slurm-controller-0",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {slinky_api::keys::LABEL_CONTROLLER_ACTIVE: "true"}}}),
            ),
        )
        .await?;
    }
    let host = taken_over_without_a_restart(
        &c,
        &ns,
        &made,
        3 + 2 * usize::from(sim),
        &[("StatefulSet", "slurm-controller")],
    )
    .await?;
    let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.client.clone(), &ns)
        .get("slurm-controller")
        .await?;
    let selector = svc.spec.and_then(|s| s.selector).unwrap_or_default();
    ensure!(
        selector
            .get(slinky_api::keys::LABEL_CONTROLLER_ACTIVE)
            .map(String::as_str)
            == Some("true"),
        "the HA Service no longer selects the active slurmctld: {selector:?}"
    );
    if sim {
        let endpoints: Vec<String> = pods
            .list(&ListParams::default().labels(&active))
            .await?
            .items
            .iter()
            .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
            .map(|p| p.name_any())
            .collect();
        ensure!(
            endpoints == ["slurm-controller-0"],
            "the Service's endpoints: {endpoints:?}"
        );
    }
    host.stop().await;
    Ok(())
}

/// Slinky v1.2 named slurmctld's StatefulSet's Service otherwise (`serviceName`, which cannot
/// change): `plugin diff` does not fail on the refused apply, it says the host keeps the field.
#[tokio::test]
async fn plugin_diff_reports_an_immutable_statefulset_field_the_host_keeps() -> Result<()> {
    let c = slinky_tests::host::cluster_with_statefulsets().await;
    let ns = c.namespace("adopt-v12").await;
    apply_ha_cluster(&c, &ns).await?;
    write_slinky_made_with(&c, &ns, true, |doc| {
        if doc["kind"] == "StatefulSet" {
            doc["spec"]["serviceName"] = "slurm-controller".into();
        }
    })
    .await?;
    let (kubeconfig, namespace) = (c.kubeconfig.display().to_string(), ns.clone());
    let out = tokio::task::spawn_blocking(move || {
        slinky_tests::run(&["plugin", "diff", "--kubeconfig", &kubeconfig, "-n", &namespace])
    })
    .await?;
    let report = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success()
            && report.contains("StatefulSet slurm-controller")
            && report.contains("has another spec.serviceName")
            && report.contains("ImmutableFieldChanged"),
        "plugin diff:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
