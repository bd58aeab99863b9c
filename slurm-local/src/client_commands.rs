//! Slurm's client commands (`scontrol`, `sinfo`, `srun` …) run in the client sandbox, and what
//! their output says.

use std::{process::Output, time::Duration};

use crate::{
    error::{Error, Result},
    harness::SlurmLocal,
    sandbox::User,
};

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

impl SlurmLocal {
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
}
