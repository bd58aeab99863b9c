//! `run --embedded --slurm DIR`: a real local Slurm stands in for the first Controller's pods
//! ([`slinky_slurm_local`]). The bridge and slurmrestd's address are made before the host
//! starts (so `--slurmrestd-url` defaults to it); the daemons start as their pods appear. Each
//! time the set of running slurmd changes and every one is idle in Slurm, `sinfo` and an
//! `srun -p PARTITION -N<nodes> hostname` per partition are logged.

use std::{collections::BTreeMap, collections::BTreeSet, path::Path, sync::Arc, time::Duration};

use anyhow::Context as _;
use kube::{Api, Client, ResourceExt as _, api::ListParams};
use slinky_api::Controller;
use slinky_slurm_local::{Role, SlurmLocal};
use tokio::task::JoinHandle;

use super::RunArgs;

/// The local Slurm of `run --slurm`.
pub(super) struct LocalSlurm {
    harness: Arc<SlurmLocal>,
    task: JoinHandle<()>,
}

impl LocalSlurm {
    /// Prepare the harness (bridge, slurmrestd address), default `--slurmrestd-url` to it, and
    /// follow the first Controller that appears in the namespaces served.
    ///
    /// # Errors
    /// The harness cannot be prepared (not root, no build in `dir` …).
    pub(super) async fn start(args: &mut RunArgs, client: &Client, dir: &Path) -> anyhow::Result<Self> {
        let harness = SlurmLocal::prepare(dir, &args.cluster_domain)
            .await
            .with_context(|| format!("--slurm {}: cannot start the local Slurm", dir.display()))?;
        let harness = Arc::new(harness);
        if args.slurmrestd_urls.is_empty() {
            args.slurmrestd_urls.push(harness.restapi_url());
            tracing::info!(url = %harness.restapi_url(), "every Controller's Slurm is asked through the local slurmrestd");
        }
        let task = tokio::spawn(follow(harness.clone(), client.clone(), args.namespaces.clone()));
        Ok(LocalSlurm { harness, task })
    }

    /// Stop the daemons and remove the bridge and namespaces.
    pub(super) async fn shutdown(self) {
        self.task.abort();
        self.harness.shutdown().await;
    }
}

/// The oldest Controller in `namespaces` (all when empty), polled every second.
async fn first_controller(client: &Client, namespaces: &[String]) -> (String, String) {
    let api = Api::<Controller>::all(client.clone());
    loop {
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                let mut found: Vec<&Controller> = list
                    .items
                    .iter()
                    .filter(|c| !c.spec.external)
                    .filter(|c| {
                        namespaces.is_empty() || c.namespace().is_some_and(|n| namespaces.contains(&n))
                    })
                    .collect();
                found.sort_by_key(|c| c.metadata.creation_timestamp.clone());
                if let Some(c) = found.first() {
                    if found.len() > 1 {
                        tracing::warn!(
                            count = found.len(),
                            "--slurm runs the first Controller's pods only"
                        );
                    }
                    return (c.namespace().unwrap_or_default(), c.name_any());
                }
            }
            Err(e) => tracing::warn!(error = %e, "--slurm: cannot list Controllers; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Attach the harness to the first Controller, then report Slurm's view whenever the running
/// slurmd change.
async fn follow(h: Arc<SlurmLocal>, client: Client, namespaces: Vec<String>) {
    let (ns, name) = first_controller(&client, &namespaces).await;
    if let Err(e) = h.attach(client, &ns, &name).await {
        tracing::error!(error = %e, "--slurm: cannot run the Controller's pods");
        return;
    }
    let mut reported = BTreeSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let running: BTreeSet<String> = h
            .pods()
            .await
            .into_iter()
            .filter(|p| p.role == Role::Slurmd && p.pid.is_some() && !p.terminating)
            .map(|p| p.hostname)
            .collect();
        if running.is_empty() || running == reported {
            continue;
        }
        let Ok(nodes) = h.nodes(None).await else { continue };
        let idle: BTreeSet<&str> = nodes
            .iter()
            .filter(|n| n.state == "idle")
            .map(|n| n.name.as_str())
            .collect();
        if !running.iter().all(|r| idle.contains(r.as_str())) {
            continue;
        }
        match h.exec_ok(&["sinfo", "-N", "-o", "%N %P %T %f"]).await {
            Ok(table) => tracing::info!("sinfo -N (the local Slurm):\n{}", table.trim_end()),
            Err(e) => tracing::warn!(error = %e, "sinfo failed"),
        }
        let mut partitions: BTreeMap<&str, usize> = BTreeMap::new();
        for n in nodes.iter().filter(|n| running.contains(&n.name)) {
            *partitions.entry(n.partition.as_str()).or_default() += 1;
        }
        for (partition, count) in partitions {
            match h.srun_hostname(partition, count).await {
                Ok(names) => tracing::info!("srun -p {partition} -N{count} hostname: {}", names.join(" ")),
                Err(e) => tracing::warn!(error = %e, "srun -p {partition} -N{count} hostname failed"),
            }
        }
        reported = running;
    }
}
