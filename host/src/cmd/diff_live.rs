//! `slinky-host plugin diff` without a plugin: what the builders serving now (the bundled ones
//! and the cluster's BuilderPlugins) would change in the live cluster. It is the check to run
//! before taking over a cluster another operator made (docs/migrating-from-slinky.md). Each pod
//! is compared, as the host compares a pod of another revision scheme, with what the API server
//! would store of the builders' pod (a dry-run create): labels, annotations and spec, but for
//! the revision label and provenance. Each other child is compared with what the host's apply
//! would leave (a dry-run server-side apply by the host's field manager); a workload whose pod
//! template would change says its pods would restart. It writes nothing.

use std::sync::Arc;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::Value;

use super::{
    check::diff_lines,
    diff::{
        Changes, DiffArgs, cluster_steps, connect, live_object, live_parents, live_references, namespace,
        project, strip, yaml,
    },
    render::{self, Child},
};
use crate::{
    plugins::{BuildContext, EngineHandle, PluginRegistry},
    reconcile::core::{
        apply::{statefulset_recreate, with_live_immutables},
        compare::contains,
        writer::FIELD_MANAGER,
    },
};

/// What the API server would store of the builders' pod: a dry-run create under a generated
/// name (the pod's own is taken).
async fn stored_pod(client: &Client, pod: &Pod, ns: &str) -> anyhow::Result<Value> {
    let mut probe = pod.clone();
    probe.metadata.generate_name = probe.metadata.name.take().map(|n| format!("{n}-"));
    let pp = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let stored = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&pp, &probe)
        .await
        .with_context(|| format!("a dry-run create of pod {:?} failed", pod.metadata.name))?;
    Ok(serde_json::to_value(stored)?)
}

/// What the host's apply would leave of `child`'s live object: a dry-run server-side apply, forced,
/// by the host's field manager. A StatefulSet whose immutable fields differ keeps the live ones
/// (as the host keeps them, without `--recreate-statefulsets`): their names are returned too.
async fn applied(
    client: &Client,
    child: &Child,
    ns: &str,
    live: &Value,
) -> anyhow::Result<(Value, Option<String>)> {
    let mut desired = child.to_json();
    let kept = matches!(child, Child::Object(o) if o.kind == slinky_runtime::ChildKind::StatefulSet)
        .then(|| statefulset_recreate(live, &desired))
        .flatten();
    if kept.is_some() {
        desired = with_live_immutables(live, &desired);
    }
    let name = desired["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ar = match child {
        Child::Object(o) => o.kind.api_resource(),
        _ => kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force().dry_run();
    let result = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .patch(&name, &pp, &Patch::Apply(&desired))
        .await
        .with_context(|| format!("a dry-run apply of {} failed", child.describe()))?;
    Ok((serde_json::to_value(result)?, kept))
}

/// The part of an object an apply can change that matters: labels, annotations (but the host's
/// own bookkeeping) and everything outside metadata and status.
fn object_part(v: &Value) -> Value {
    let mut out = v.clone();
    if let Some(o) = out.as_object_mut() {
        o.remove("status");
        let meta = serde_json::json!({"labels": v["metadata"]["labels"], "annotations": v["metadata"]["annotations"]});
        o.insert("metadata".into(), meta);
    }
    if let Some(a) = out
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(slinky_api::keys::ANNOTATION_APPLIED_HASH);
    }
    let mut out = strip(out);
    // No annotations and none left after the host's bookkeeping are the same.
    if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        m.retain(|_, v| !(v.is_null() || v.as_object().is_some_and(serde_json::Map::is_empty)));
    }
    out
}

/// The part of `v` a pod is judged on: labels, annotations and spec.
fn pod_part(v: &Value) -> Value {
    serde_json::json!({
        "metadata": {"labels": v["metadata"]["labels"], "annotations": v["metadata"]["annotations"]},
        "spec": v["spec"],
    })
}

/// `plugin diff` without a plugin.
///
/// # Errors
/// The cluster cannot be read, or a build fails.
pub(super) fn execute(engine: &Arc<EngineHandle>, args: &DiffArgs) -> anyhow::Result<()> {
    let text = super::diff::runtime()?.block_on(against_live(engine, args))?;
    super::print(&text)
}

/// The report of `plugin diff` without a plugin.
async fn against_live(engine: &Arc<EngineHandle>, args: &DiffArgs) -> anyhow::Result<String> {
    let client = connect(args.kubeconfig.as_deref()).await?;
    let ctx = BuildContext {
        cluster_domain: args.cluster_domain.clone(),
        ..BuildContext::default()
    };
    let registry = Arc::new(PluginRegistry::new(engine, &[])?);
    let installed = cluster_steps(&client, &registry, &ctx).await?;
    let manifests = live_parents(&client, &args.namespaces).await?;
    let references = live_references(&client, &manifests).await;
    let built = render::render_with(&manifests, &references, &registry, &ctx)
        .context("the builders serving now fail")?;
    let mut out = format!(
        "the builders serving now (bundled; BuilderPlugins: {}) against the live cluster: {} parent(s)\n\n",
        if installed.is_empty() {
            "none".to_string()
        } else {
            installed.join(", ")
        },
        manifests.len()
    );
    let mut changes = Changes::default();
    for child in &built {
        // Secrets: the host fills in what builders leave to it (slurmdbd's password) and keeps
        // the ssh host keys it finds; their data is not the builders' to judge.
        if matches!(child, Child::Object(o) if o.kind == slinky_runtime::ChildKind::Secret) {
            continue;
        }
        let ns = namespace(child);
        let Some(live) = live_object(&client, child, &ns).await? else {
            changes.changed += 1;
            out.push_str(&format!("{} in {ns}: would be created\n\n", child.describe()));
            continue;
        };
        let live = strip(live);
        if let Child::Pod(pod) = child {
            let owner = pod
                .metadata
                .owner_references
                .as_ref()
                .and_then(|o| o.first())
                .map(|o| o.name.clone())
                .unwrap_or_default();
            let mut desired = pod_part(&strip(stored_pod(&client, pod, &ns).await?));
            // As the host judges a pod: what it carries from its NodeSet's own labels and
            // annotations is no difference (a pod made before `kubectl label nodeset`).
            if let Some(nodeset) = manifests
                .iter()
                .filter_map(|m| m.parent.as_nodeset())
                .find(|n| n.name_any() == owner && n.namespace().as_deref() == Some(ns.as_str()))
            {
                for (field, own) in [
                    ("labels", nodeset.labels()),
                    ("annotations", nodeset.annotations()),
                ] {
                    if let Some(m) = desired["metadata"][field].as_object_mut() {
                        m.retain(|k, v| own.get(k).map(String::as_str) != v.as_str());
                    }
                }
            }
            if contains(&pod_part(&live), &desired) {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            changes
                .rolling
                .entry(format!("NodeSet {ns}/{owner}"))
                .or_default()
                .push(name);
            let d = diff_lines(&yaml(&project(&pod_part(&live), &desired)), &yaml(&desired));
            out.push_str(&format!(
                "{} in {ns}: differs from what the builders make; would roll (- live, + built):\n{d}\n",
                child.describe()
            ));
        } else {
            let (after, kept) = match applied(&client, child, &ns, &live).await {
                Ok(a) => a,
                // Refused: reported with the others, not the end of the report.
                Err(e) => {
                    changes.changed += 1;
                    out.push_str(&format!(
                        "{} in {ns}: the host's apply would be refused: {e:#}\n\n",
                        child.describe()
                    ));
                    continue;
                }
            };
            if let Some(fields) = &kept {
                changes.changed += 1;
                out.push_str(&format!(
                    "{} in {ns}: has another {fields} than the builders make, which a StatefulSet \
                     cannot change: the host keeps it and reports ImmutableFieldChanged (or, with \
                     --recreate-statefulsets, deletes and recreates the StatefulSet, restarting its pods)\n\n",
                    child.describe()
                ));
            }
            let (before, after) = (object_part(&live), object_part(&after));
            if before == after {
                continue;
            }
            changes.changed += 1;
            let restarts = before.pointer("/spec/template") != after.pointer("/spec/template");
            let d = diff_lines(&yaml(&before), &yaml(&after));
            out.push_str(&format!(
                "{} in {ns}: would change{} (- live, + after the host's apply):\n{d}\n",
                child.describe(),
                if restarts { ", and its pods restart" } else { "" }
            ));
        }
    }
    changes.summary(&mut out);
    Ok(out)
}
