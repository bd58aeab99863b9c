//! kube-controller-manager's side of the scale benchmark (with a real API server only): the
//! [`Kcm`] process running the StatefulSet controller, [`kcm_run`] scaling StatefulSets to the
//! host's pods, and the deletion of a round's namespace (finalizers dropped, as no host runs).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use slinky_api::{Controller, NodeSet};

use super::{
    Scenario, create_namespace,
    measure::{PodCount, cpu_note, cpu_now, pprof, servers_quiet},
};

/// Runs kube-controller-manager's StatefulSet controller, unthrottled, until dropped.
struct Kcm(std::process::Child);

impl Kcm {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(dir.join("kcm-bench.log"))?;
        let child = std::process::Command::new(dir.join("kube-controller-manager"))
            .args([
                "--kubeconfig",
                &dir.join("kubeconfig").display().to_string(),
                "--controllers",
                "statefulset",
                "--kube-api-qps",
                "100000",
                "--kube-api-burst",
                "100000",
                "--leader-elect=false",
                "--secure-port",
                "0",
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start kube-controller-manager")?;
        Ok(Self(child))
    }
}

impl Drop for Kcm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// kube-controller-manager's StatefulSet controller making the same pods: one StatefulSet per
/// NodeSet (Parallel), `pod` as their template. Returns the seconds until every pod exists.
pub(crate) async fn kcm_run(client: &Client, dir: &Path, s: &Scenario, pod: &Value) -> anyhow::Result<f64> {
    create_namespace(client, &s.namespace).await?;
    let kcm = Kcm::start(dir)?;
    // Its informers synced: give it a moment (the StatefulSet is created after).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut spec = pod["spec"].clone();
    for field in ["nodeName", "hostname", "subdomain"] {
        if let Some(o) = spec.as_object_mut() {
            o.remove(field);
        }
    }
    // The host's pod's labels and annotations too: their managed fields and validation are part
    // of each create's cost. Its per-pod labels are left out: kcm adds its own (pod name, index,
    // revision hash).
    let per_pod = [
        "controller-revision-hash",
        "nodeset.slinky.slurm.net/pod-index",
        "nodeset.slinky.slurm.net/pod-name",
        "nodeset.slinky.slurm.net/pod-hostname",
    ];
    let mut labels = pod["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    labels.retain(|k, _| !per_pod.contains(&k.as_str()));
    let annotations = pod["metadata"]["annotations"].clone();
    let count = PodCount::start(&dir.join("kubeconfig"), &s.namespace).await?;
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &s.namespace);
    let kcm_pid = kcm.0.id().to_string();
    let quiet = servers_quiet().await;
    let cpu_before = cpu_now(&kcm_pid);
    let profile = pprof(client, &s.namespace);
    let t = Instant::now();
    futures::stream::iter(s.nodeset_names())
        .map(|name| {
            let mut labels = labels.clone();
            labels.insert("bench".into(), name.clone().into());
            let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name},
                "spec": {"replicas": s.pods, "podManagementPolicy": "Parallel", "serviceName": "bench",
                    "selector": {"matchLabels": {"bench": name}},
                    "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}}});
            let api = api.clone();
            async move {
                let sts: StatefulSet = serde_json::from_value(sts)?;
                api.create(&PostParams::default(), &sts).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    count.wait(s.total()).await;
    let seconds = t.elapsed().as_secs_f64();
    println!(
        "  kube-controller-manager (StatefulSet controller, Parallel, --kube-api-qps 100000): {} pods in {seconds:.2} s; {}{}",
        s.total(),
        cpu_note(&kcm_pid, "kcm's", cpu_before),
        quiet.map(|q| format!(" ({q} before it)")).unwrap_or_default()
    );
    if let Some(p) = profile {
        let _ = p.await;
    }
    Ok(seconds)
}

/// Deletes namespace `ns` of a real API server and waits until it is gone, so the next side
/// starts on an API server without it. Its pods are deleted here, 32 at a time, before the
/// namespace: the namespace controller deletes them one by one (kube-apiserver's single
/// delete-collection worker), which took minutes for 10,000, and rounds ran beside it. No
/// controller is left to replace them (the host child has ended, kcm was stopped). The
/// finalizers of its NodeSets, Controllers and claims are dropped while it goes (no host runs
/// any more).
pub(crate) async fn delete_namespace(client: &Client, ns: &str) {
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = match pods.list_metadata(&Default::default()).await {
        Ok(list) => list.items.iter().map(ResourceExt::name_any).collect(),
        Err(e) => {
            println!("  (cannot list the pods of {ns}: {e}; the namespace controller deletes them)");
            Vec::new()
        }
    };
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    futures::stream::iter(names)
        .map(|name| {
            let (pods, now) = (pods.clone(), now.clone());
            async move { pods.delete(&name, &now).await.err().map(|e| (name, e)) }
        })
        .buffer_unordered(32)
        .filter_map(futures::future::ready)
        .for_each(|(name, e)| {
            if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                println!("  (cannot delete pod {name}: {e})");
            }
            futures::future::ready(())
        })
        .await;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    let limit = Duration::from_secs(600);
    while t.elapsed() < limit {
        // Again each time: a StatefulSet's claim may appear after the delete.
        drop_finalizers::<NodeSet>(client, ns).await;
        drop_finalizers::<Controller>(client, ns).await;
        // A claim's pvc-protection finalizer: dropped rather than waited for (a realkube
        // started without that controller never removes it).
        drop_finalizers::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(client, ns).await;
        if let Ok(None) = namespaces.get_opt(ns).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  (namespace {ns} is still there after {} s: the next round runs beside it)",
        limit.as_secs()
    );
}

/// Drops the finalizers of every `K` in namespace `ns`.
async fn drop_finalizers<K>(client: &Client, ns: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let merge = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for o in api
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if o.meta().finalizers.as_ref().is_some_and(|f| !f.is_empty())
            && let Err(e) = api.patch(&o.name_any(), &PatchParams::default(), &merge).await
        {
            println!("  (cannot drop the finalizers of {}: {e})", o.name_any());
        }
    }
}
