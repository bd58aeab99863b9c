//! Faults on demand: stopping and starting slurmrestd, killing a slurmctld and letting it run
//! again (for fail-closed and fail-over tests).

use std::time::Duration;

use crate::{
    error::{Error, Result},
    harness::SlurmLocal,
    podspec::Role,
    supervisor, sys,
};

impl SlurmLocal {
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

    /// What the running slurmrestd was started with (the RestApi Deployment's container, or the
    /// harness's own command); `None` while none runs.
    pub async fn slurmrestd_command(&self) -> Option<supervisor::RestdCommand> {
        let st = self.shared.state.lock().await;
        st.restd.proc.as_ref().and(st.restd_command.clone())
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
        self.kill_daemon(Role::Slurmctld, "slurmctld", pod).await
    }

    /// Let the slurmctld of `pod` run again after [`kill_slurmctld`](Self::kill_slurmctld)
    /// (started within a tick, 250 ms).
    ///
    /// # Errors
    /// No such slurmctld pod is run.
    pub async fn restart_slurmctld(&self, pod: &str) -> Result<()> {
        self.restart_daemon(Role::Slurmctld, "slurmctld", pod).await
    }

    /// SIGKILL the slurmd of worker pod `pod` and keep it down (a crashed container in
    /// back-off; the pod stays) until [`restart_slurmd`](Self::restart_slurmd): slurmctld then
    /// marks its node DOWN, "Not responding", after `SlurmdTimeout`.
    ///
    /// # Errors
    /// No such worker pod is run.
    pub async fn kill_slurmd(&self, pod: &str) -> Result<()> {
        self.kill_daemon(Role::Slurmd, "slurmd", pod).await
    }

    /// Let the slurmd of `pod` run again after [`kill_slurmd`](Self::kill_slurmd).
    ///
    /// # Errors
    /// No such worker pod is run.
    pub async fn restart_slurmd(&self, pod: &str) -> Result<()> {
        self.restart_daemon(Role::Slurmd, "slurmd", pod).await
    }

    async fn kill_daemon(&self, role: Role, what: &str, pod: &str) -> Result<()> {
        let proc = {
            let mut st = self.shared.state.lock().await;
            let known = known_pods(&st, role);
            let Some(e) = st
                .pods
                .values_mut()
                .find(|e| e.plan.name == pod && e.plan.role == role && !e.terminating)
            else {
                return Err(Error::NoSuchPod {
                    role: what.into(),
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
        tracing::info!(pod, "{what} killed (kept down)");
        Ok(())
    }

    async fn restart_daemon(&self, role: Role, what: &str, pod: &str) -> Result<()> {
        let mut st = self.shared.state.lock().await;
        let known = known_pods(&st, role);
        let Some(e) = st
            .pods
            .values_mut()
            .find(|e| e.plan.name == pod && e.plan.role == role && !e.terminating)
        else {
            return Err(Error::NoSuchPod {
                role: what.into(),
                name: pod.into(),
                known,
            });
        };
        e.held = false;
        e.next_start = std::time::Instant::now();
        e.backoff = Duration::from_secs(1);
        Ok(())
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
