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
//! Service (its first running pod). It also runs one slurmrestd for the cluster (as Slinky's
//! RestApi: `SLURM_JWT=daemon`, `rest_auth/jwt`, as `nobody`), reachable from the root network
//! namespace at [`SlurmLocal::restapi_url`], and a client sandbox with `sackd` where
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

mod error;
mod net;
mod podspec;
mod sandbox;
mod supervisor;
mod sys;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Output,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

pub use error::{Error, Result};
pub use net::STATE_DIR;
pub use podspec::Role;
use sandbox::User;
use supervisor::{Attachment, Shared};

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

/// The files of a Slurm build the harness runs.
const BUILD_FILES: &[&str] = &[
    "sbin/slurmctld",
    "sbin/slurmd",
    "sbin/slurmstepd",
    "sbin/slurmrestd",
    "sbin/sackd",
    "bin/scontrol",
    "bin/sinfo",
    "bin/squeue",
    "bin/sbatch",
    "bin/srun",
];

/// A pod the harness runs, as [`SlurmLocal::pods`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProcess {
    /// The pod's name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its daemon.
    pub role: Role,
    /// Its hostname (the Slurm node name of a worker).
    pub hostname: String,
    /// Its sandbox's address.
    pub ip: Ipv4Addr,
    /// The sandbox is made.
    pub sandboxed: bool,
    /// The daemon's pid while it runs.
    pub pid: Option<u32>,
    /// How often the daemon was restarted.
    pub restarts: u32,
    /// The pod is being deleted (preStop and SIGTERM done or under way).
    pub terminating: bool,
    /// Kept down by [`SlurmLocal::kill_slurmctld`].
    pub held: bool,
}

/// A node as `sinfo -N` lists it (a node in two partitions is listed twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The node name.
    pub name: String,
    /// The partition (without the default's `*`).
    pub partition: String,
    /// The state (`idle`, `down`, `mixed` …).
    pub state: String,
    /// The available features.
    pub features: Vec<String>,
}

/// The harness: a bridge, the slurmrestd and client sandboxes, and (once attached to a
/// Controller) its pods' daemons. See the [crate] documentation.
#[derive(Debug)]
pub struct SlurmLocal {
    shared: Arc<Shared>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    down: AtomicBool,
}

impl SlurmLocal {
    /// Check the machine and the build, remove crashed runs' leftovers, make the bridge and the
    /// slurmrestd and client sandboxes: [`restapi_url`](Self::restapi_url) is fixed from here,
    /// though slurmrestd starts only once a slurmctld runs. `cluster_domain` completes pod and
    /// Service names (`cluster.local`).
    ///
    /// # Errors
    /// Not root, no build in `slurm_dir`, a missing tool or user, a build the daemons' users
    /// cannot read, or the network cannot be made.
    pub async fn prepare(slurm_dir: impl AsRef<Path>, cluster_domain: &str) -> Result<Self> {
        let slurm = slurm_dir.as_ref().to_path_buf();
        let uid = sys::euid();
        if uid != 0 {
            return Err(Error::NotRoot { uid });
        }
        if let Some(missing) = BUILD_FILES.iter().find(|f| !slurm.join(f).is_file()) {
            return Err(Error::NoSlurm {
                dir: slurm,
                missing: (*missing).to_string(),
            });
        }
        for (tool, package) in sys::TOOLS {
            if !sys::on_path(tool) {
                return Err(Error::MissingTool {
                    tool: (*tool).to_string(),
                    why: format!("install the Debian package {package}"),
                });
            }
        }
        let Some(slurm_ids) = sys::user_ids("slurm").await else {
            return Err(Error::NoUser {
                user: "slurm".into(),
                fix: "useradd -r -M -s /usr/sbin/nologin slurm (slurmctld runs as it)".into(),
            });
        };
        if sys::user_ids("nobody").await.is_none() {
            return Err(Error::NoUser {
                user: "nobody".into(),
                fix: "slurmrestd refuses root and runs as nobody:nogroup".into(),
            });
        }
        check_traversable(&slurm)?;
        // The mount points the sandboxes cover with their own tmpfs.
        for dir in ["/etc/slurm", "/var/spool", "/run"] {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("cannot create {dir}"), e))?;
        }
        let net = tokio::task::spawn_blocking(net::Network::create)
            .await
            .map_err(|e| Error::io("the network set-up task failed", std::io::Error::other(e)))??;
        tracing::info!(bridge = %net.bridge, subnet = %format!("{}/24", net.addr(0)), dir = %net.dir.display(),
            slurm = %slurm.display(), "local Slurm harness prepared");
        let (shared, rx) = match Shared::new(slurm, net.clone(), cluster_domain.to_string(), slurm_ids).await
        {
            Ok(s) => s,
            Err(e) => {
                net.destroy();
                return Err(e);
            }
        };
        let task = tokio::spawn(shared.clone().run(rx));
        Ok(SlurmLocal {
            shared,
            tasks: std::sync::Mutex::new(vec![task]),
            down: AtomicBool::new(false),
        })
    }

    /// [`prepare`](Self::prepare) (with `cluster.local`), then [`attach`](Self::attach).
    ///
    /// # Errors
    /// As both.
    pub async fn start(
        client: kube::Client,
        slurm_dir: impl AsRef<Path>,
        namespace: &str,
        controller: &str,
    ) -> Result<Self> {
        let h = Self::prepare(slurm_dir, "cluster.local").await?;
        h.attach(client, namespace, controller).await?;
        Ok(h)
    }

    /// Run the pods of the Controller `namespace/controller` from now on (watching the
    /// namespace's pods and Services through `client`).
    ///
    /// # Errors
    /// Already attached, or shut down.
    pub async fn attach(&self, client: kube::Client, namespace: &str, controller: &str) -> Result<()> {
        let a = Attachment {
            client,
            namespace: namespace.to_string(),
            controller: controller.to_string(),
        };
        {
            let mut st = self.shared.state.lock().await;
            if st.shut {
                return Err(Error::ShutDown);
            }
            if let Some(old) = &st.attached {
                return Err(Error::AlreadyAttached(format!(
                    "{}/{}",
                    old.namespace, old.controller
                )));
            }
            st.attached = Some(a.clone());
        }
        tracing::info!(controller = %format!("{namespace}/{controller}"), "the local Slurm runs this Controller's pods");
        let handles = self.shared.watch(&a);
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.extend(handles);
        }
        Ok(())
    }

    /// slurmrestd's address, reachable from the root network namespace (`10.x.y.2:6820`).
    pub fn restapi_addr(&self) -> SocketAddr {
        SocketAddr::from((self.shared.net.addr(net::RESTD_HOST), supervisor::RESTD_PORT))
    }

    /// slurmrestd's URL, e.g. `http://10.200.0.2:6820` (fixed by [`prepare`](Self::prepare)).
    pub fn restapi_url(&self) -> String {
        format!("http://{}", self.restapi_addr())
    }

    /// The bridge's name (`slinky-<id>`).
    pub fn bridge(&self) -> &str {
        &self.shared.net.bridge
    }

    /// The work directory (`/var/lib/slinky-slurm-local/<id>`: logs, claims, the hosts file).
    pub fn work_dir(&self) -> &Path {
        &self.shared.net.dir
    }

    /// The pods run now.
    pub async fn pods(&self) -> Vec<PodProcess> {
        let st = self.shared.state.lock().await;
        st.pods
            .iter()
            .map(|(uid, e)| PodProcess {
                name: e.plan.name.clone(),
                uid: uid.clone(),
                role: e.plan.role,
                hostname: e.plan.hostname.clone(),
                ip: self.shared.net.addr(e.host),
                sandboxed: e.sandbox.is_some(),
                pid: e.proc.as_ref().map(|p| p.pid),
                restarts: e.restarts,
                terminating: e.terminating,
                held: e.held,
            })
            .collect()
    }

    /// Run a Slurm client command (`scontrol`, `sinfo`, `squeue`, `sbatch`, `srun` … from the
    /// build, or any program) as root in the client sandbox, which resolves every pod's names
    /// and holds the cluster's `/etc/slurm` and a `sackd` for authentication. Killed when the
    /// returned future is dropped (wrap it in a timeout).
    ///
    /// # Errors
    /// No slurmctld has started yet (no configuration), the client's sackd is not running, or
    /// the command cannot be started. A command that fails is an `Ok` with its status.
    pub async fn exec(&self, args: &[&str]) -> Result<Output> {
        let Some((program, rest)) = args.split_first() else {
            return Err(Error::NotReady("exec: no command given".into()));
        };
        let mut cmd = {
            let st = self.shared.state.lock().await;
            if st.shut {
                return Err(Error::ShutDown);
            }
            if st.conf.is_none() {
                return Err(Error::NotReady(
                    "no slurmctld pod has started yet: no Slurm to ask".into(),
                ));
            }
            if st.client.proc.is_none() {
                return Err(Error::NotReady(
                    "the client sandbox's sackd is not running yet".into(),
                ));
            }
            let Some(sb) = &st.client.sandbox else {
                return Err(Error::ShutDown);
            };
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            sb.command(&self.shared.slurm, User::Root, program, &rest, &[])
        };
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        cmd.output()
            .await
            .map_err(|e| Error::io(format!("cannot run {program} in the client sandbox"), e))
    }

    /// [`exec`](Self::exec), then its stdout, or an error with its stderr when it failed.
    ///
    /// # Errors
    /// As `exec`, or the command's failure.
    pub async fn exec_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.exec(args).await?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(Error::Command {
            what: "a Slurm command in the client sandbox".into(),
            command: args.join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }

    /// The nodes `sinfo -N` lists (of `partition`, or all).
    ///
    /// # Errors
    /// As [`exec_ok`](Self::exec_ok).
    pub async fn nodes(&self, partition: Option<&str>) -> Result<Vec<Node>> {
        let mut args = vec!["sinfo", "-h", "-N", "-o", "%N|%P|%T|%f"];
        if let Some(p) = partition {
            args.extend(["-p", p]);
        }
        let out = self.exec_ok(&args).await?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut it = l.split('|');
                let name = it.next()?.trim().to_string();
                let partition = it.next()?.trim().trim_end_matches('*').to_string();
                let state = it.next()?.trim().to_string();
                let features = it
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty() && *f != "(null)")
                    .map(str::to_string)
                    .collect();
                Some(Node {
                    name,
                    partition,
                    state,
                    features,
                })
            })
            .collect())
    }

    /// `srun -p PARTITION -N NODES hostname` (60 s at most): the hostnames that answered,
    /// sorted.
    ///
    /// # Errors
    /// As [`exec_ok`](Self::exec_ok), or a timeout.
    pub async fn srun_hostname(&self, partition: &str, nodes: usize) -> Result<Vec<String>> {
        let n = nodes.to_string();
        let args = ["srun", "-p", partition, "-N", &n, "hostname"];
        let out = tokio::time::timeout(Duration::from_secs(60), self.exec_ok(&args))
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "srun -p {partition} -N {n} hostname did not finish within 60 s"
                ))
            })??;
        let mut names: Vec<String> = out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Stop slurmrestd (SIGTERM, SIGKILL after 5 s) and keep it stopped: the URL refuses
    /// connections until [`start_slurmrestd`](Self::start_slurmrestd).
    ///
    /// # Errors
    /// Shut down.
    pub async fn stop_slurmrestd(&self) -> Result<()> {
        let proc = {
            let mut st = self.shared.state.lock().await;
            if st.shut {
                return Err(Error::ShutDown);
            }
            st.restd.wanted = false;
            st.restd.proc.as_ref().map(|p| (p.pid, p.exited.clone()))
        };
        if let Some((pid, exited)) = proc {
            stop(pid, exited, Duration::from_secs(5)).await;
        }
        tracing::info!("slurmrestd stopped");
        Ok(())
    }

    /// Start slurmrestd again and wait (30 s at most) until it accepts connections.
    ///
    /// # Errors
    /// No slurmctld has run yet, or slurmrestd does not listen within 30 s (its last output in
    /// the message).
    pub async fn start_slurmrestd(&self) -> Result<()> {
        {
            let mut st = self.shared.state.lock().await;
            if st.shut {
                return Err(Error::ShutDown);
            }
            if st.conf.is_none() {
                return Err(Error::NotReady(
                    "no slurmctld pod has started yet: slurmrestd has no configuration".into(),
                ));
            }
            st.restd.wanted = true;
            st.restd.next_start = std::time::Instant::now();
            st.restd.backoff = Duration::from_secs(1);
        }
        let addr = self.restapi_addr();
        for _ in 0..150 {
            if supervisor::connects(addr).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = self
            .shared
            .net
            .dir
            .join(supervisor::RESTD_HOSTNAME)
            .join("slurmrestd.out");
        Err(Error::Timeout(format!(
            "slurmrestd does not listen on {addr} after 30 s: {}",
            supervisor::tail(&log)
        )))
    }

    /// SIGKILL the slurmctld of pod `pod` and keep it down (as a crashed container in
    /// back-off) until [`restart_slurmctld`](Self::restart_slurmctld); its Service names move
    /// to the next running slurmctld. Returns once it is dead.
    ///
    /// # Errors
    /// No such slurmctld pod is run.
    pub async fn kill_slurmctld(&self, pod: &str) -> Result<()> {
        let proc = {
            let mut st = self.shared.state.lock().await;
            let known = known_pods(&st, Role::Slurmctld);
            let Some(e) = st
                .pods
                .values_mut()
                .find(|e| e.plan.name == pod && e.plan.role == Role::Slurmctld && !e.terminating)
            else {
                return Err(Error::NoSuchPod {
                    role: "slurmctld".into(),
                    name: pod.into(),
                    known,
                });
            };
            e.held = true;
            e.proc.as_ref().map(|p| (p.pid, p.exited.clone()))
        };
        if let Some((pid, mut exited)) = proc {
            sys::signal(pid, rustix::process::Signal::KILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|x| *x)).await;
        }
        tracing::info!(pod, "slurmctld killed (kept down)");
        Ok(())
    }

    /// Let the slurmctld of `pod` run again after [`kill_slurmctld`](Self::kill_slurmctld)
    /// (started within a tick, 250 ms).
    ///
    /// # Errors
    /// No such slurmctld pod is run.
    pub async fn restart_slurmctld(&self, pod: &str) -> Result<()> {
        let mut st = self.shared.state.lock().await;
        let known = known_pods(&st, Role::Slurmctld);
        let Some(e) = st
            .pods
            .values_mut()
            .find(|e| e.plan.name == pod && e.plan.role == Role::Slurmctld && !e.terminating)
        else {
            return Err(Error::NoSuchPod {
                role: "slurmctld".into(),
                name: pod.into(),
                known,
            });
        };
        e.held = false;
        e.next_start = std::time::Instant::now();
        e.backoff = Duration::from_secs(1);
        Ok(())
    }

    /// What the pod `pod` logged (its latest sandbox, even when gone): the daemon's output,
    /// the preStop hook's, then the `*.log` files of its emptyDir volumes (slurmctld.log,
    /// slurmd.log). `None` when the harness never ran such a pod.
    pub fn logs(&self, pod: &str) -> Option<String> {
        let pods = self.shared.net.dir.join("pods");
        let prefix = format!("{pod}-");
        let dir = std::fs::read_dir(&pods)
            .ok()?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(&prefix))
                    .is_some_and(|rest| rest.len() == 8)
            })
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())?
            .path();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "out" || x == "err"))
            .collect();
        if let Ok(vols) = std::fs::read_dir(dir.join("volumes")) {
            for v in vols.flatten() {
                if let Ok(rd) = std::fs::read_dir(v.path()) {
                    files.extend(
                        rd.flatten()
                            .map(|e| e.path())
                            .filter(|p| p.extension().is_some_and(|x| x == "log")),
                    );
                }
            }
        }
        let mut out = String::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            if !text.is_empty() {
                out.push_str(&format!("==> {} <==\n{text}\n", f.display()));
            }
        }
        Some(out)
    }

    /// Stop everything: SIGTERM every daemon, SIGKILL what is left after 3 s, remove the
    /// namespaces, the bridge and the work directory (kept under `kept-<id>` with
    /// `SLINKY_SLURM_LOCAL_KEEP=1`). Also done, without the wait, when the harness is dropped.
    pub async fn shutdown(&self) {
        if self.down.swap(true, Ordering::SeqCst) {
            return;
        }
        let procs: Vec<(u32, tokio::sync::watch::Receiver<bool>)> = {
            let mut st = self.shared.state.lock().await;
            st.shut = true;
            st.pods
                .values()
                .filter_map(|e| e.proc.as_ref())
                .chain(st.restd.proc.as_ref())
                .chain(st.client.proc.as_ref())
                .map(|p| (p.pid, p.exited.clone()))
                .collect()
        };
        self.abort_tasks();
        for (pid, _) in &procs {
            sys::signal(*pid, rustix::process::Signal::TERM);
        }
        let wait = futures::future::join_all(procs.into_iter().map(|(_, mut rx)| async move {
            let _ = rx.wait_for(|x| *x).await;
        }));
        let _ = tokio::time::timeout(Duration::from_secs(3), wait).await;
        self.destroy();
        tracing::info!(bridge = %self.shared.net.bridge, "local Slurm harness shut down");
    }

    fn abort_tasks(&self) {
        if let Ok(mut tasks) = self.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }

    fn destroy(&self) {
        let net = &self.shared.net;
        if std::env::var_os("SLINKY_SLURM_LOCAL_KEEP").is_some_and(|v| v == "1") {
            let kept = Path::new(STATE_DIR).join(format!("kept-{}", net.id));
            match std::fs::rename(&net.dir, &kept) {
                Ok(()) => tracing::info!(dir = %kept.display(), "the harness's logs are kept"),
                Err(e) => tracing::warn!(error = %e, "cannot keep the harness's logs"),
            }
        }
        net.destroy();
    }
}

impl Drop for SlurmLocal {
    fn drop(&mut self) {
        if self.down.swap(true, Ordering::SeqCst) {
            return;
        }
        self.abort_tasks();
        self.destroy();
    }
}

/// SIGTERM `pid`, SIGKILL after `grace`, and wait for its exit.
async fn stop(pid: u32, mut exited: tokio::sync::watch::Receiver<bool>, grace: Duration) {
    sys::signal(pid, rustix::process::Signal::TERM);
    if tokio::time::timeout(grace, exited.wait_for(|x| *x))
        .await
        .is_err()
    {
        sys::signal(pid, rustix::process::Signal::KILL);
        let _ = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|x| *x)).await;
    }
}

fn known_pods(st: &supervisor::State, role: Role) -> String {
    let names: Vec<&str> = st
        .pods
        .values()
        .filter(|e| e.plan.role == role)
        .map(|e| e.plan.name.as_str())
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The build must be reachable by `slurm` and `nobody`: every directory above it searchable
/// by others, the build itself readable.
fn check_traversable(slurm: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let abs = std::fs::canonicalize(slurm)
        .map_err(|e| Error::io(format!("cannot resolve {}", slurm.display()), e))?;
    for dir in abs.ancestors() {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(Error::NotReady(format!(
                "{} is not searchable by other users, so slurmctld (as slurm) and slurmrestd (as nobody) \
                 cannot run the build in {}: chmod o+x {} && chmod -R o+rX {}",
                dir.display(),
                abs.display(),
                dir.display(),
                abs.display()
            )));
        }
    }
    Ok(())
}
