//! A "pod sandbox": a network namespace on the harness's bridge, and private mount and UTS
//! namespaces held by a pause process (`sleep infinity`, as Kubernetes' pause container), with
//! tmpfs on `/run`, `/var/spool` and `/etc/slurm`, the harness's `/etc/hosts` and
//! `/etc/resolv.conf` bound over the machine's, the pod's hostname, and the pod's volumes.
//! Daemons and commands enter it with `nsenter`; files are written into it through
//! `/proc/<pause>/root`.

use std::{
    net::Ipv4Addr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::io::AsyncBufReadExt as _;

use crate::{
    error::{Error, Result},
    net::Network,
    podspec::File,
    sys::{self, sh_quote},
};

/// What is mounted at a path of the sandbox.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A fresh tmpfs (files are written into it afterwards).
    Tmpfs,
    /// A directory of the harness, bound.
    Bind(PathBuf),
}

/// How to make a sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// Host number on the bridge.
    pub host: u8,
    /// The hostname.
    pub hostname: String,
    /// The sandbox's work directory (logs).
    pub dir: PathBuf,
    /// The harness's hosts file.
    pub hosts: PathBuf,
    /// The harness's resolv.conf.
    pub resolv: PathBuf,
    /// Extra mounts, parents first.
    pub mounts: Vec<(String, Source)>,
}

/// A running sandbox.
#[derive(Debug)]
pub(crate) struct Sandbox {
    /// Host number on the bridge.
    pub host: u8,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The pause process holding the namespaces.
    pub pause_pid: u32,
    /// Its work directory.
    pub dir: PathBuf,
    /// The pause process (killed when dropped).
    _pause: tokio::process::Child,
}

/// A user to run a command as, by name (`setpriv`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum User {
    /// root.
    Root,
    /// The local `slurm` user and its groups.
    Slurm,
    /// `nobody:nogroup`, no supplementary groups.
    Nobody,
}

/// `PATH` inside sandboxes: the Slurm build first.
pub(crate) fn path_env(slurm: &Path) -> String {
    format!(
        "{}/bin:{}/sbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        sys::path_str(slurm),
        sys::path_str(slurm)
    )
}

impl Sandbox {
    /// Make the namespaces, the mounts and the pause process.
    ///
    /// # Errors
    /// `ip` fails, or the pause process does not report its mounts done within 10 s (its
    /// stderr is in the message).
    pub async fn create(net: &Network, spec: &Spec) -> Result<Self> {
        std::fs::create_dir_all(&spec.dir)
            .map_err(|e| Error::io(format!("cannot create {}", spec.dir.display()), e))?;
        let ns = net.add_netns(spec.host).await?;
        let mut script = String::from("set -e\n");
        for (target, size) in [("/run", "64m"), ("/var/spool", "256m"), ("/etc/slurm", "16m")] {
            script.push_str(&format!(
                "mount -t tmpfs -o mode=0755,size={size} slinky {target}\n"
            ));
        }
        script.push_str(&format!(
            "mount --bind {} /etc/hosts\nmount --bind {} /etc/resolv.conf\nhostname {}\n",
            sh_quote(&sys::path_str(&spec.hosts)),
            sh_quote(&sys::path_str(&spec.resolv)),
            sh_quote(&spec.hostname)
        ));
        for (target, source) in &spec.mounts {
            let t = sh_quote(target);
            match source {
                Source::Tmpfs => script.push_str(&format!(
                    "mkdir -p {t}\nmount -t tmpfs -o mode=0755,size=16m slinky {t}\n"
                )),
                Source::Bind(dir) => script.push_str(&format!(
                    "mkdir -p {t}\nmount --bind {} {t}\n",
                    sh_quote(&sys::path_str(dir))
                )),
            }
        }
        script.push_str("mkdir -p /run/slurm /var/spool/slurmd\necho ready\nexec sleep infinity\n");
        let err_path = spec.dir.join("sandbox.err");
        let err = std::fs::File::create(&err_path)
            .map_err(|e| Error::io(format!("cannot create {}", err_path.display()), e))?;
        let netns_path = format!("--net=/run/netns/{ns}");
        let spawned = tokio::process::Command::new("setpriv")
            .args([
                "--pdeathsig",
                "KILL",
                "nsenter",
                &netns_path,
                "unshare",
                "-m",
                "-u",
            ])
            .args(["--propagation", "private", "sh", "-c", &script])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .kill_on_drop(true)
            .spawn();
        let mut pause = match spawned {
            Ok(c) => c,
            Err(e) => {
                net.remove_host(spec.host);
                return Err(Error::io("cannot start a sandbox's pause process (setpriv)", e));
            }
        };
        let ready = async {
            let out = pause.stdout.take()?;
            let mut line = String::new();
            tokio::io::BufReader::new(out).read_line(&mut line).await.ok()?;
            (line.trim() == "ready").then_some(())
        };
        let ok = tokio::time::timeout(Duration::from_secs(10), ready)
            .await
            .ok()
            .flatten();
        let pid = pause.id();
        match (ok, pid) {
            (Some(()), Some(pause_pid)) => Ok(Sandbox {
                host: spec.host,
                ip: net.addr(spec.host),
                pause_pid,
                dir: spec.dir.clone(),
                _pause: pause,
            }),
            _ => {
                let _ = pause.start_kill();
                net.remove_host(spec.host);
                let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
                Err(Error::Command {
                    what: format!("cannot make the sandbox of {}", spec.hostname),
                    command: "setpriv nsenter unshare sh -c <mounts>".into(),
                    status: "no `ready` within 10 s".into(),
                    stderr: stderr.trim().to_string(),
                })
            }
        }
    }

    /// `/proc/<pause>/root`: the sandbox's file system as the harness reaches it.
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pause_pid))
    }

    /// A path of the sandbox (absolute inside it) as the harness reaches it.
    pub fn path(&self, inside: &str) -> PathBuf {
        self.root().join(inside.trim_start_matches('/'))
    }

    /// Write `files` under `dir` (absolute inside the sandbox), owned by `owner` (uid, gid).
    ///
    /// # Errors
    /// A file that cannot be written.
    pub fn write_files(&self, dir: &str, files: &[File], owner: (u32, u32)) -> Result<()> {
        for f in files {
            let path = self.path(dir).join(&f.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| Error::io(format!("cannot create {}", parent.display()), e))?;
            }
            let what = || format!("cannot write {dir}/{} in a sandbox", f.path);
            std::fs::write(&path, &f.data).map_err(|e| Error::io(what(), e))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))
                .map_err(|e| Error::io(what(), e))?;
            std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1))
                .map_err(|e| Error::io(what(), e))?;
        }
        Ok(())
    }

    /// Make `dir` (absolute inside the sandbox) and give it to `owner` with `mode`.
    ///
    /// # Errors
    /// It cannot be made.
    pub fn make_dir(&self, dir: &str, owner: (u32, u32), mode: u32) -> Result<()> {
        let path = self.path(dir);
        let what = || format!("cannot make {dir} in a sandbox");
        std::fs::create_dir_all(&path).map_err(|e| Error::io(what(), e))?;
        std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1)).map_err(|e| Error::io(what(), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io(what(), e))
    }

    /// A command running `program args…` inside the sandbox as `user`, with a clean
    /// environment (`PATH` with the Slurm build first, then `env`), killed if the harness dies.
    pub fn command(
        &self,
        slurm: &Path,
        user: User,
        program: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("setpriv");
        c.args([
            "--pdeathsig",
            "KILL",
            "nsenter",
            "-t",
            &self.pause_pid.to_string(),
            "-m",
            "-u",
            "-n",
            "--",
        ]);
        match user {
            User::Root => {}
            User::Slurm => {
                c.args([
                    "setpriv",
                    "--reuid=slurm",
                    "--regid=slurm",
                    "--init-groups",
                    "--pdeathsig",
                    "KILL",
                    "--",
                ]);
            }
            User::Nobody => {
                c.args([
                    "setpriv",
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    "--pdeathsig",
                    "KILL",
                    "--",
                ]);
            }
        }
        c.arg(program).args(args);
        c.env_clear()
            .env("PATH", path_env(slurm))
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8");
        for (k, v) in env {
            c.env(k, v);
        }
        c.current_dir("/").stdin(Stdio::null());
        c
    }

    /// Kill everything in the sandbox and remove its namespace.
    pub fn destroy(&self, net: &Network) {
        sys::signal(self.pause_pid, rustix::process::Signal::KILL);
        net.remove_host(self.host);
    }
}
