//! The harness itself: checking the machine, making the network and the state task, attaching
//! to a Controller, its addresses, and shutting it all down.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::{
    error::{Error, Result},
    mariadb::MariaDb,
    net::{self, STATE_DIR},
    supervisor::{self, Attachment, Shared, SlurmdbdConf},
    sys,
};

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

/// The harness: a bridge, the slurmrestd and client sandboxes, and (once attached to a
/// Controller) its pods' daemons. See the [crate] documentation.
#[derive(Debug)]
pub struct SlurmLocal {
    pub(crate) shared: Arc<Shared>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    mariadb: tokio::sync::Mutex<Option<Arc<MariaDb>>>,
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
            mariadb: tokio::sync::Mutex::new(None),
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

    /// The bridge's own address (`10.x.y.1`): the root network namespace as the sandboxes reach
    /// it (where [`start_mariadb`](Self::start_mariadb) listens).
    pub fn bridge_addr(&self) -> std::net::Ipv4Addr {
        self.shared.net.addr(1)
    }

    /// Give every sandbox's `/etc/hosts` the name `name` for `addr` from now on (an
    /// Accounting's `storageConfig.host`, naming [`start_mariadb`](Self::start_mariadb)'s
    /// address); a later call for the same name replaces its address.
    ///
    /// # Errors
    /// A name `/etc/hosts` cannot hold (empty, with whitespace or `#`), the file cannot be
    /// written, or shut down.
    pub async fn add_host(&self, name: &str, addr: std::net::Ipv4Addr) -> Result<()> {
        let mut st = self.shared.state.lock().await;
        if st.shut {
            return Err(Error::ShutDown);
        }
        self.shared.add_host(&mut st, name, addr)?;
        tracing::info!(name, %addr, "a host name for the sandboxes");
        Ok(())
    }

    /// How slurmdbd's `/etc/slurm` is filled from its pod's projected volume for sandboxes made
    /// from now on ([`SlurmdbdConf::InitConf`] unless set).
    pub async fn set_slurmdbd_conf(&self, mode: SlurmdbdConf) {
        self.shared.state.lock().await.slurmdbd_conf = mode;
    }

    /// Start a private MariaDB (Debian's `mariadb-server`) for slurmdbd on a free port of
    /// [`bridge_addr`](Self::bridge_addr), in a fresh data directory; stopped by
    /// [`shutdown`](Self::shutdown) after the daemons, removed with the harness. Create the
    /// Accounting's database user with [`MariaDb::create_user`] and name it with
    /// [`add_host`](Self::add_host).
    ///
    /// # Errors
    /// MariaDB is not installed ([`crate::mariadb_usable`]), one already runs, or it does not
    /// start (its log in the message).
    pub async fn start_mariadb(&self) -> Result<Arc<MariaDb>> {
        let mut slot = self.mariadb.lock().await;
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        if slot.is_some() {
            return Err(Error::Invalid("this harness already runs a MariaDB".into()));
        }
        let db = Arc::new(MariaDb::start(&net::mariadb_dir(&self.shared.net.id), self.bridge_addr()).await?);
        *slot = Some(db.clone());
        Ok(db)
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
        if let Some(db) = self.mariadb.lock().await.take() {
            db.stop().await;
        }
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
