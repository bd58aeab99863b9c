//! The daemons' processes: started in a sandbox with their output in a log file, their exit
//! reported to the state task; and how to look at them from outside (log tail, a listening port).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

use super::state::{Entry, Event, Proc, ProcKey};
use crate::{
    error::{Error, Result},
    sandbox::{Sandbox, User},
};

/// Start `program args…` in `sb`, its output appended to `log`; a task reports its exit.
#[allow(
    clippy::too_many_arguments,
    reason = "one call per daemon kind; a struct would only rename them"
)]
pub(super) fn spawn(
    sb: &Sandbox,
    slurm: &Path,
    user: User,
    program: &str,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
    key: ProcKey,
    incarnation: u64,
    events: mpsc::UnboundedSender<Event>,
) -> Result<Proc> {
    let mut c = sb.command(slurm, user, program, args, env);
    let out = open_log(log).ok_or_else(|| {
        Error::io(
            format!("cannot open {}", log.display()),
            std::io::Error::other("open failed"),
        )
    })?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io(format!("cannot open {}", log.display()), e))?;
    c.stdout(out).stderr(err).kill_on_drop(true);
    let mut child = c
        .spawn()
        .map_err(|e| Error::io(format!("cannot start {program} in a sandbox"), e))?;
    let pid = child.id().unwrap_or_default();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let status = child.wait().await.ok();
        let _ = tx.send(true);
        let _ = events.send(Event::Exited {
            key,
            incarnation,
            status,
        });
    });
    Ok(Proc {
        pid,
        incarnation,
        started: Instant::now(),
        exited: rx,
    })
}

pub(super) fn open_log(path: &Path) -> Option<std::fs::File> {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .ok()
}

/// The daemon's output file of a pod.
pub(crate) fn log_path(e: &Entry) -> PathBuf {
    e.dir.join(format!("{}.out", e.plan.container.name))
}

/// The output file of a pod's init container `name` (its latest run: each run starts it afresh,
/// as a kubelet keeps a container's current log).
pub(crate) fn init_log_path(e: &Entry, name: &str) -> PathBuf {
    e.dir.join(format!("init-{name}.out"))
}

/// A file's text, trimmed, at most its last 2,000 bytes (an init container's output: its file
/// holds its latest run only).
pub(crate) fn output(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let text = text.trim();
    let mut start = text.len().saturating_sub(2000);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// The last lines of a file, on one line.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Whether a TCP connection to `addr` is accepted within 300 ms.
pub(crate) async fn connects(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_millis(300), tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}
