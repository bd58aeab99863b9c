//! A private MariaDB for slurmdbd (Debian's `mariadb-server`): a fresh data directory under
//! `/var/lib/slinky-slurm-local/mariadb-<id>` (owned by `mysql`), one `mariadbd` running as
//! `mysql` on a free port of the harness's bridge address (so every pod sandbox reaches it), its
//! root reached through its Unix socket by the harness only.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::io::AsyncWriteExt as _;

use crate::{
    error::{Error, Result},
    sys,
};

/// The programs of Debian's `mariadb-server` and `mariadb-client` the harness runs.
const PROGRAMS: &[(&str, &str)] = &[
    ("mariadbd", "mariadb-server"),
    ("mariadb-install-db", "mariadb-server"),
    ("mariadb", "mariadb-client"),
];

/// Where a program is: on `PATH`, else in `/usr/sbin` or `/usr/bin` (root's `PATH` may lack
/// `/usr/sbin` under `sudo` or CI).
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether a MariaDB can be started here: its programs and the `mysql` user.
///
/// # Errors
/// What is missing and which Debian package has it, as one line.
pub fn usable() -> std::result::Result<(), String> {
    for (name, package) in PROGRAMS {
        if program(name).is_none() {
            return Err(format!(
                "`{name}` is not installed: apt-get install {package} (slurmdbd's database)"
            ));
        }
    }
    let known = std::process::Command::new("id")
        .args(["-u", "mysql"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !known {
        return Err("the user `mysql` does not exist: apt-get install mariadb-server makes it".into());
    }
    Ok(())
}

/// A running private `mariadbd`. Stopped by [`stop`](Self::stop), killed when dropped; its
/// directory goes with the harness's.
#[derive(Debug)]
pub struct MariaDb {
    addr: SocketAddrV4,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    child: tokio::sync::Mutex<Option<tokio::process::Child>>,
}

/// `s` as an SQL string literal.
fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `s` as an SQL identifier.
fn sql_ident(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

impl MariaDb {
    /// Make a fresh data directory in `dir` and start `mariadbd` as `mysql` on a free port of
    /// `bind`; returns once it accepts connections (30 s at most).
    ///
    /// # Errors
    /// [`usable`] fails, the directory cannot be made, `mariadb-install-db` fails, or `mariadbd`
    /// exits or does not listen in time (its log in the message).
    pub(crate) async fn start(dir: &Path, bind: Ipv4Addr) -> Result<Self> {
        usable().map_err(Error::NotReady)?;
        let (Some(mariadbd), Some(install_db)) = (program("mariadbd"), program("mariadb-install-db")) else {
            return Err(Error::NotReady("mariadbd is not installed".into()));
        };
        let Some((uid, gid)) = sys::user_ids("mysql").await else {
            return Err(Error::NoUser {
                user: "mysql".into(),
                fix: "apt-get install mariadb-server makes it (mariadbd runs as it)".into(),
            });
        };
        let what = |p: &Path| format!("cannot make MariaDB's directory {}", p.display());
        std::fs::create_dir_all(dir).map_err(|e| Error::io(what(dir), e))?;
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|e| Error::io(what(dir), e))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| Error::io(what(dir), e))?;
        let data = dir.join("data");
        let datadir = format!("--datadir={}", sys::path_str(&data));
        let install = [
            "--no-defaults",
            datadir.as_str(),
            "--user=mysql",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ];
        sys::run(
            "make MariaDB's data directory",
            &sys::path_str(&install_db),
            &install,
        )
        .await?;
        // A free port of the bridge address (nothing else binds that address).
        let port = std::net::TcpListener::bind((bind, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::io(format!("cannot find a free port on {bind}"), e))?
            .port();
        let socket = dir.join("mariadbd.sock");
        let log = dir.join("mariadbd.log");
        let out = std::fs::File::create(&log)
            .map_err(|e| Error::io(format!("cannot create {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("cannot open {}", log.display()), e))?;
        let args = [
            "--no-defaults".to_string(),
            datadir.clone(),
            format!("--socket={}", sys::path_str(&socket)),
            format!("--pid-file={}", sys::path_str(&dir.join("mariadbd.pid"))),
            format!("--port={port}"),
            format!("--bind-address={bind}"),
            "--skip-log-bin".into(),
            // Clients connect from the sandboxes, which no name server knows.
            "--skip-name-resolve".into(),
            // What slurmdbd asks of its database ("Database settings not recommended values"),
            // but for its 4 GiB innodb_buffer_pool_size: it only warns about the default 128 MiB.
            "--innodb-lock-wait-timeout=900".into(),
        ];
        let child = tokio::process::Command::new("setpriv")
            .args([
                "--reuid=mysql",
                "--regid=mysql",
                "--init-groups",
                "--pdeathsig",
                "KILL",
                "--",
            ])
            .arg(&mariadbd)
            .args(&args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::io("cannot start mariadbd (setpriv)", e))?;
        let db = MariaDb {
            addr: SocketAddrV4::new(bind, port),
            dir: dir.to_path_buf(),
            socket,
            log,
            child: tokio::sync::Mutex::new(Some(child)),
        };
        for _ in 0..150 {
            if crate::supervisor::connects(SocketAddr::V4(db.addr)).await {
                tracing::info!(addr = %db.addr, dir = %db.dir.display(), "MariaDB started");
                return Ok(db);
            }
            let exited = match db.child.lock().await.as_mut() {
                Some(c) => c.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                return Err(Error::Command {
                    what: "start MariaDB".into(),
                    command: format!("{} {}", mariadbd.display(), args.join(" ")),
                    status: status.to_string(),
                    stderr: db.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        db.stop().await;
        Err(Error::Timeout(format!(
            "mariadbd does not listen on {} after 30 s: {}",
            db.addr,
            db.log_tail()
        )))
    }

    /// Where it listens (the bridge address, a free port).
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Its data directory's parent (data, socket, pid file, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of its log, on one line.
    pub fn log_tail(&self) -> String {
        crate::supervisor::tail(&self.log)
    }

    /// Run `sql` as MariaDB's root (through the Unix socket); returns the rows (tab-separated,
    /// no header).
    ///
    /// # Errors
    /// The client cannot run, or the statement fails (MariaDB's message).
    pub async fn sql(&self, sql: &str) -> Result<String> {
        let client = program("mariadb").ok_or_else(|| Error::MissingTool {
            tool: "mariadb".into(),
            why: "install the Debian package mariadb-client".into(),
        })?;
        let socket = format!("--socket={}", sys::path_str(&self.socket));
        let args = [
            "--no-defaults",
            socket.as_str(),
            "--user=root",
            "--batch",
            "--skip-column-names",
        ];
        let mut child = tokio::process::Command::new(&client)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::io("cannot run the mariadb client", e))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(sql.as_bytes())
                .await
                .map_err(|e| Error::io("cannot send SQL to the mariadb client", e))?;
        }
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .map_err(|_| Error::Timeout("the mariadb client did not finish within 30 s".into()))?
            .map_err(|e| Error::io("the mariadb client failed", e))?;
        if !out.status.success() {
            return Err(Error::Command {
                what: "an SQL statement for slurmdbd's database".into(),
                command: format!("{} {}", client.display(), args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Create the database user `user` (from any host) with `password`, allowed everything on
    /// `database` (slurmdbd creates the database itself), as an Accounting's `storageConfig`
    /// names them.
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    pub async fn create_user(&self, user: &str, password: &str, database: &str) -> Result<()> {
        let who = format!("{}@'%'", sql_string(user));
        self.sql(&format!(
            "CREATE USER {who} IDENTIFIED BY {};\nGRANT ALL ON {}.* TO {who};\n",
            sql_string(password),
            sql_ident(database)
        ))
        .await
        .map(drop)
    }

    /// Give the database user `user` a new `password`.
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    pub async fn set_password(&self, user: &str, password: &str) -> Result<()> {
        self.sql(&format!(
            "ALTER USER {}@'%' IDENTIFIED BY {};\n",
            sql_string(user),
            sql_string(password)
        ))
        .await
        .map(drop)
    }

    /// Stop `mariadbd` (SIGTERM, SIGKILL after 10 s) and wait for it.
    pub async fn stop(&self) {
        let Some(mut child) = self.child.lock().await.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            sys::signal(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        tracing::info!(addr = %self.addr, "MariaDB stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_quoting_keeps_values_whole() {
        assert_eq!(sql_string("p#ss word"), "'p#ss word'");
        assert_eq!(sql_string(r"it's \ here"), r"'it\'s \\ here'");
        assert_eq!(sql_ident("slurm_acct_db"), "`slurm_acct_db`");
        assert_eq!(sql_ident("a`b"), "`a``b`");
    }
}
