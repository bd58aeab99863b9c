//! A real Slurm standing in for a Slinky cluster's pods.
//!
//! The embedded API server simulates kubelets: pods become Running without anything running.
//! [`SlurmLocal`] is the missing kubelet for Slurm's own pods: it watches a namespace, and for
//! each slurmctld pod of one Controller and each of its NodeSets' worker pods runs the real
//! daemon of a local Slurm build (`../shared/tools/realslurm`) in a *pod sandbox*: its own
//! network namespace on a per-harness bridge (`slinky-<id>`, a free 10.x.y.0/24), mount and UTS
//! namespaces, the pod's hostname, a tmpfs `/etc/slurm` filled from the pod's ConfigMap, Secret
//! and projected volumes as a kubelet mounts them, its emptyDirs and claims as directories, and
//! an `/etc/hosts` naming every pod (name, hostname, `hostname.subdomain.namespace…`) and
//! Service (its first running pod). It also runs one slurmrestd for the cluster, as `nobody`,
//! reachable from the root network namespace at [`SlurmLocal::restapi_url`]: with the args and
//! environment of the oldest RestApi Deployment's `slurmrestd` container in the namespace (so the
//! real slurmrestd judges what the `restapi-children` builder makes; a changed Deployment
//! restarts it), else as Slinky's RestApi runs it (`SLURM_JWT=daemon`, `rest_auth/jwt`, `-s
//! openapi/slurmctld` without accounting). And a client sandbox with `sackd` where
//! [`SlurmLocal::exec`] runs `scontrol`, `sinfo`, `sbatch`, `squeue`, `srun`.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), slinky_slurm_local::Error> {
//! let slurm = slinky_slurm_local::find_slurm().map_err(slinky_slurm_local::Error::NotReady)?;
//! let harness = slinky_slurm_local::SlurmLocal::start(client, &slurm, "slurm", "slurm").await?;
//! println!("slurmrestd: {}", harness.restapi_url());
//! let out = harness.exec(&["sinfo", "-N"]).await?;
//! harness.stop_slurmrestd().await?; // fail-closed tests
//! harness.start_slurmrestd().await?;
//! harness.kill_slurmctld("slurm-controller-0").await?; // HA fail-over tests
//! harness.shutdown().await; // also on Drop, best effort
//! # Ok(()) }
//! ```
//!
//! What a kubelet does that the harness does too: it starts a pod's daemon once the pod is
//! bound to a node, restarts it with a back-off (1 s doubling to 16 s) when it exits, runs the
//! main container's preStop exec hook inside the sandbox (with the harness's Slurm on `PATH`)
//! when the pod gets a deletion timestamp, then SIGTERM, SIGKILL after the grace period (at most
//! 10 s), and deletes the pod with grace 0 once its daemon stopped; it removes the sandbox when
//! the pod is gone. A pod re-created under the same name gets a fresh sandbox and process.
//!
//! Where it differs, on purpose:
//! - slurmctld's `slurm.conf` gets `ProctrackType=proctrack/linuxproc` and `TaskPlugin=task/none`
//!   (the generated lines commented out) and its `cgroup.conf` `CgroupPlugin=disabled`: local
//!   daemons have no cgroup of their own (logged once). slurmd fetches both from slurmctld.
//! - A non-root `runAsUser` (Slinky's slurmctld: 401, `slurm` in its images) runs as the local
//!   `slurm` user; an `fsGroup` makes volumes group-owned by the local `slurm` group (files of
//!   read-only volumes group-readable, as a kubelet does).
//! - slurmd starts once its `--conf-server` accepts connections (at most 60 s; it would
//!   otherwise retry only every 10 s); its arguments are evaluated by `sh`, as Slinky's image
//!   entrypoint does, after `slurmd -D -N <hostname>`.
//! - Volumes are filled when the sandbox is made, not refreshed (a config change rolls the
//!   slurmctld pod anyway). Only ConfigMap, Secret, projected (their ConfigMap and Secret
//!   sources), emptyDir and PersistentVolumeClaim volumes are mounted, and only at paths inside
//!   `/run`, `/var/spool`, `/etc/slurm`, at `/var/log/slurm`, or over existing directories.
//! - A Service name resolves to its first running, non-terminating selected pod by name (so a
//!   killed primary slurmctld hands `SlurmctldAddr` to the backup).
//! - slurmrestd and the client keep the `/etc/slurm` of the latest slurmctld sandbox (files
//!   rewritten, daemons not restarted).
//!
//! Needs root, `ip` (iproute2), `nsenter`, `unshare` and `setpriv` (util-linux), the users
//! `slurm` and `nobody`, and a Slurm build readable by them. Leftovers of a crashed run (its
//! bridge, namespaces and processes) are removed by the next harness that starts; set
//! `SLINKY_SLURM_LOCAL_KEEP=1` to keep a run's work directory (logs) under
//! `/var/lib/slinky-slurm-local/kept-<id>`.
mod client_commands;
mod daemon_control;
mod error;
mod harness;
mod net;
mod pod_status;
mod podspec;
mod sandbox;
mod supervisor;
mod sys;

use std::path::PathBuf;

pub use client_commands::Node;
pub use error::{Error, Result};
pub use harness::SlurmLocal;
pub use net::STATE_DIR;
pub use pod_status::PodProcess;
pub use podspec::Role;
pub use supervisor::RestdCommand;

/// Where a Slurm build is looked for: `$REALSLURM_DIR`, then `~/.cache/realslurm`, then
/// `~/realslurm` (the first holding `sbin/slurmctld`).
///
/// # Errors
/// None of them holds a build: the message says where it looked and how to build one.
pub fn find_slurm() -> std::result::Result<PathBuf, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("REALSLURM_DIR").filter(|d| !d.is_empty()) {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(h) = &home {
        candidates.push(h.join(".cache/realslurm"));
        candidates.push(h.join("realslurm"));
    }
    if let Some(found) = candidates.iter().find(|d| d.join("sbin/slurmctld").is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
    Err(format!(
        "no Slurm build in {}: run ../shared/tools/realslurm/setup.sh (REALSLURM_DIR=DIR to build elsewhere)",
        if looked.is_empty() {
            "$REALSLURM_DIR (unset, and no $HOME)".to_string()
        } else {
            looked.join(", ")
        }
    ))
}

/// The Slurm build to use ([`find_slurm`]), or why the harness cannot run here (no build, not
/// root): what a test prints when it skips.
///
/// # Errors
/// The reason, as one line.
pub fn usable() -> std::result::Result<PathBuf, String> {
    let slurm = find_slurm()?;
    let uid = sys::euid();
    if uid != 0 {
        return Err(Error::NotRoot { uid }.to_string());
    }
    Ok(slurm)
}
