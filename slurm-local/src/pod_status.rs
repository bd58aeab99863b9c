//! What the harness tells about the pods it runs: their processes and their logs.

use std::{net::Ipv4Addr, path::PathBuf};

use crate::{harness::SlurmLocal, podspec::Role};

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
    /// Its init containers (not the sidecars) have all completed in this sandbox: the daemon
    /// may start.
    pub initialized: bool,
    /// The daemon's pid while it runs.
    pub pid: Option<u32>,
    /// How often the daemon was restarted.
    pub restarts: u32,
    /// The pod is being deleted (preStop and SIGTERM done or under way).
    pub terminating: bool,
    /// Kept down by [`SlurmLocal::kill_slurmctld`].
    pub held: bool,
}

impl SlurmLocal {
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
                initialized: e.sandbox.is_some() && e.inits_done >= e.plan.init_containers.len(),
                pid: e.proc.as_ref().map(|p| p.pid),
                restarts: e.restarts,
                terminating: e.terminating,
                held: e.held,
            })
            .collect()
    }

    /// What the pod `pod` logged (its latest sandbox, even when gone): the daemon's output,
    /// its init containers' (`init-<name>.out`, their latest runs), the preStop hook's, then
    /// the `*.log` files of its emptyDir volumes (slurmctld.log, slurmd.log). `None` when the
    /// harness never ran such a pod.
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
}
