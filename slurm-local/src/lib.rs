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
//! [`SlurmLocal::exec`] runs `scontrol`, `sinfo`, `sbatch`, `squeue`, `srun`, `sacct`,
//! `sacctmgr`.
//!
//! Accounting: when the Controller's `spec.accountingRef` names an Accounting, the harness also
//! runs that Accounting's slurmdbd pod (`app.kubernetes.io/name=slurmdbd`,
//! `app.kubernetes.io/instance=<accounting>`): `slurmdbd -D` (Slinky's image runs `tini -g --
//! slurmdbd -D`) plus the container's args, as the local `slurm` user when its securityContext
//! runs it as non-root, in its own sandbox with the pod's `/etc/slurm` and `/run`, restarted
//! with the same back-off, and named in `/etc/hosts` by its pod name and, through the Services
//! mechanism, by its Service (`<accounting>-accounting`, slurmctld's `AccountingStorageHost`).
//! slurmctld registers the cluster itself on its first connection (Slurm 25.05 adds a cluster it
//! does not know; no `sacctmgr add cluster`). The database is the caller's:
//! [`SlurmLocal::start_mariadb`] starts a private `mariadbd` (Debian's `mariadb-server`, as
//! `mysql`, a fresh data directory) on a free port of the bridge's address, [`MariaDb::create_user`]
//! makes the Accounting's database user, and [`SlurmLocal::add_host`] names it as the
//! Accounting's `storageConfig.host` in every sandbox. [`accounting_usable`] says whether all that
//! can run here.
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
//! - slurmdbd's `/etc/slurm` is filled as Slinky's `initconf` init container filled it for Slurm
//!   before 25.11 (slurm-operator v0.4's `initconf.sh`: the projected files copied into an
//!   emptyDir, owned by `slurm`, `slurmdbd.conf` and the keys mode 0600, other `*.conf` 0644),
//!   not as a kubelet mounts the projected volume: with `defaultMode` 0600 and `fsGroup` 401 a
//!   kubelet makes `slurmdbd.conf` root's, group 401, mode 0640, and slurmdbd 25.05 refuses it
//!   (`slurmdbd.conf file … should be 600 is 640`; it also wants it owned by its `SlurmUser`).
//!   Slinky dropped `initconf` when Slurm 25.11 accepted 0640, and mounts the volume directly,
//!   as the builder here does. [`SlurmLocal::set_slurmdbd_conf`] with
//!   [`SlurmdbdConf::Kubelet`] mounts it as a kubelet does instead.
//!
//! Needs root, `ip` (iproute2), `nsenter`, `unshare` and `setpriv` (util-linux), the users
//! `slurm` and `nobody`, and a Slurm build readable by them; for accounting, a build with
//! slurmdbd's `accounting_storage/mysql` plugin (configured with `libmariadb-dev`) and Debian's
//! `mariadb-server`. MariaDB's directory is `/var/lib/slinky-slurm-local/mariadb-<id>`, removed
//! (and a `mariadbd` left running killed) with the harness's. Leftovers of a crashed run (its
//! bridge, namespaces and processes) are removed by the next harness that starts; set
//! `SLINKY_SLURM_LOCAL_KEEP=1` to keep a run's work directory (logs) under
//! `/var/lib/slinky-slurm-local/kept-<id>`.
mod client_commands;
mod daemon_control;
mod error;
mod harness;
mod mariadb;
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
pub use mariadb::{MariaDb, usable as mariadb_usable};
pub use net::STATE_DIR;
pub use pod_status::PodProcess;
pub use podspec::Role;
pub use supervisor::{RestdCommand, SlurmdbdConf};

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

/// The files of a Slurm build that accounting needs: slurmdbd, the MySQL/MariaDB storage plugin
/// and the accounting clients.
const ACCOUNTING_FILES: &[&str] = &[
    "sbin/slurmdbd",
    "bin/sacct",
    "bin/sacctmgr",
    "lib/slurm/accounting_storage_mysql.so",
];

/// Whether slurmdbd can run here on the build `slurm` ([`usable`]'s): the build has slurmdbd and
/// its MySQL plugin, and MariaDB is installed ([`mariadb_usable`]). What a test prints when it
/// skips.
///
/// # Errors
/// The reason, as one line.
pub fn accounting_usable(slurm: &std::path::Path) -> std::result::Result<(), String> {
    if let Some(missing) = ACCOUNTING_FILES.iter().find(|f| !slurm.join(f).is_file()) {
        let why = if missing.ends_with("accounting_storage_mysql.so") {
            "Slurm's configure found no MySQL/MariaDB client library: apt-get install libmariadb-dev \
             libmariadb-dev-compat, remove the build and run ../shared/tools/realslurm/setup.sh again"
        } else {
            "run ../shared/tools/realslurm/setup.sh again"
        };
        return Err(format!(
            "the Slurm build in {} has no {missing}: {why}",
            slurm.display()
        ));
    }
    mariadb_usable()
}
