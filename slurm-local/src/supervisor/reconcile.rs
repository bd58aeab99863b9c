//! The state task's tick: bring every pod and harness daemon towards what it should be (make
//! sandboxes, start daemons, wait for slurmd's conf server), and keep `/etc/hosts` current.

use std::{collections::BTreeSet, net::SocketAddr, time::Instant};

use super::{
    hosts::write_in_place,
    local_conf::conf_value,
    process::{connects, log_path, spawn},
    state::{CONF_SERVER_WAIT, MAX_BACKOFF, ProcKey, RESTD_PORT, RestdCommand, Shared, State},
};
use crate::{
    error::Result,
    podspec::{self, Role},
    sandbox::User,
    sys,
};

impl Shared {
    /// Bring every pod and daemon towards what it should be, and rewrite `/etc/hosts`.
    pub(super) async fn reconcile(&self, st: &mut State) {
        let now = Instant::now();
        let reachable = self.reachable_conf_servers(st).await;
        let uids: Vec<String> = st.pods.keys().cloned().collect();
        for uid in uids {
            let Some(e) = st.pods.get(&uid) else { continue };
            if e.terminating || e.gone || now < e.next_start {
                continue;
            }
            let bound = e.pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            if e.sandbox.is_none() && bound {
                let result = self.make_pod_sandbox(st, &uid).await;
                self.note(st, &uid, result);
                continue;
            }
            if e.sandbox.is_some() && e.proc.is_none() && !e.held {
                let wait = match (&e.plan.role, &e.plan.conf_server) {
                    (Role::Slurmd, Some(server)) if !reachable.contains(server) => {
                        let since = e.waiting_since.unwrap_or(now);
                        now.duration_since(since) < CONF_SERVER_WAIT
                    }
                    _ => false,
                };
                if wait {
                    if let Some(e) = st.pods.get_mut(&uid)
                        && e.waiting_since.is_none()
                    {
                        e.waiting_since = Some(now);
                        tracing::info!(pod = %e.plan.name, "slurmd waits for its --conf-server to answer");
                    }
                    continue;
                }
                let result = self.start_pod(st, &uid).await;
                self.note(st, &uid, result);
            }
        }
        self.reconcile_daemons(st, now).await;
        let text = self.hosts(st);
        if text != st.hosts_text {
            match write_in_place(&self.hosts_path, &text) {
                Ok(()) => st.hosts_text = text,
                Err(e) => tracing::warn!(error = %e, "cannot rewrite the sandboxes' /etc/hosts"),
            }
        }
    }

    /// Log a pod's problem once, and back off.
    fn note(&self, st: &mut State, uid: &str, result: Result<()>) {
        let Some(e) = st.pods.get_mut(uid) else { return };
        match result {
            Ok(()) => e.last_error = None,
            Err(err) => {
                let msg = err.to_string();
                if e.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(pod = %e.plan.name, error = %msg, "cannot run the pod yet; retrying");
                }
                e.last_error = Some(msg);
                e.next_start = Instant::now() + e.backoff;
                e.backoff = (e.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// The conf servers (host, port) of waiting slurmds that accept a connection now.
    async fn reachable_conf_servers(&self, st: &State) -> BTreeSet<(String, u16)> {
        let wanted: BTreeSet<(String, u16)> = st
            .pods
            .values()
            .filter(|e| e.sandbox.is_some() && e.proc.is_none() && !e.terminating)
            .filter_map(|e| e.plan.conf_server.clone())
            .collect();
        let mut ok = BTreeSet::new();
        for (host, port) in wanted {
            let Some(ip) = self.resolve(st, &host) else {
                continue;
            };
            if connects(SocketAddr::from((ip, port))).await {
                ok.insert((host, port));
            }
        }
        ok
    }

    /// Start a pod's daemon in its sandbox.
    async fn start_pod(&self, st: &mut State, uid: &str) -> Result<()> {
        let Some(client) = st.attached.as_ref().map(|a| a.client.clone()) else {
            return Ok(());
        };
        st.incarnation += 1;
        let incarnation = st.incarnation;
        let host_ip = self.net.addr(1).to_string();
        let Some(e) = st.pods.get_mut(uid) else {
            return Ok(());
        };
        let Some(sb) = &e.sandbox else { return Ok(()) };
        let plan = &e.plan;
        let env = podspec::env(&client, &e.pod, &plan.container, &sb.ip.to_string(), &host_ip).await?;
        let (program, args, user) = match plan.role {
            Role::Slurmctld => {
                let mut args = vec!["-D".to_string(), "-i".to_string()];
                args.extend(plan.args());
                let user = if plan.run_as_slurm {
                    User::Slurm
                } else {
                    User::Root
                };
                (
                    format!("{}/sbin/slurmctld", sys::path_str(&self.slurm)),
                    args,
                    user,
                )
            }
            Role::Slurmdbd => {
                // As Slinky's image entrypoint (`tini -g -- slurmdbd -D`), the args appended.
                let mut args = vec!["-D".to_string()];
                args.extend(plan.args());
                let user = if plan.run_as_slurm {
                    User::Slurm
                } else {
                    User::Root
                };
                (
                    format!("{}/sbin/slurmdbd", sys::path_str(&self.slurm)),
                    args,
                    user,
                )
            }
            Role::Slurmd => {
                // As Slinky's image entrypoint: the arguments are evaluated by a shell.
                let line = format!(
                    "exec {} -D -N {} {}",
                    sys::sh_quote(&format!("{}/sbin/slurmd", sys::path_str(&self.slurm))),
                    sys::sh_quote(&plan.hostname),
                    plan.args().join(" ")
                );
                ("sh".to_string(), vec!["-c".to_string(), line], User::Root)
            }
        };
        let log = log_path(e);
        let proc = spawn(
            sb,
            &self.slurm,
            user,
            &program,
            &args,
            &env,
            &log,
            ProcKey::Pod(uid.to_string()),
            incarnation,
            self.events.clone(),
        )?;
        tracing::info!(pod = %plan.name, pid = proc.pid, restarts = e.restarts, "{} started", plan.role);
        e.proc = Some(proc);
        e.waiting_since = None;
        Ok(())
    }

    /// Start or keep slurmrestd and the client's sackd once the cluster's configuration is known.
    async fn reconcile_daemons(&self, st: &mut State, now: Instant) {
        let Some(conf) = st.conf.clone() else { return };
        let ctld_up = st
            .pods
            .values()
            .any(|e| e.plan.role == Role::Slurmctld && e.proc.is_some() && !e.terminating);
        if st.client.wanted && st.client.proc.is_none() && now >= st.client.next_start && ctld_up {
            st.incarnation += 1;
            let inc = st.incarnation;
            if let Some(sb) = &st.client.sandbox {
                let log = sb.dir.join("sackd.out");
                match spawn(
                    sb,
                    &self.slurm,
                    User::Root,
                    "sackd",
                    &["-D".into()],
                    &[],
                    &log,
                    ProcKey::Sackd,
                    inc,
                    self.events.clone(),
                ) {
                    Ok(p) => st.client.proc = Some(p),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start sackd in the client sandbox");
                        st.client.next_start = now + MAX_BACKOFF;
                    }
                }
            }
        }
        let slurm_conf = conf
            .iter()
            .find(|f| f.path == "slurm.conf")
            .map(|f| String::from_utf8_lossy(&f.data).into_owned())
            .unwrap_or_default();
        let command = restd_command(st, &slurm_conf);
        if let (Some(p), Some(running)) = (&st.restd.proc, &st.restd_command)
            && *running != command
        {
            // As a Deployment rolls its pods: the new command once this one has stopped.
            tracing::info!(from = ?command.deployment, "slurmrestd's command changed; restarting it");
            crate::sys::signal(p.pid, rustix::process::Signal::TERM);
            st.restd_command = None;
        }
        if st.restd.wanted && st.restd.proc.is_none() && now >= st.restd.next_start && ctld_up {
            st.incarnation += 1;
            let inc = st.incarnation;
            if let Some(sb) = &st.restd.sandbox {
                let log = sb.dir.join("slurmrestd.out");
                match spawn(
                    sb,
                    &self.slurm,
                    User::Nobody,
                    "slurmrestd",
                    &command.args,
                    &command.env,
                    &log,
                    ProcKey::Restd,
                    inc,
                    self.events.clone(),
                ) {
                    Ok(p) => {
                        tracing::info!(url = %format!("http://{}:{RESTD_PORT}", sb.ip), pid = p.pid,
                            from = ?command.deployment, args = ?command.args, "slurmrestd started");
                        st.restd.proc = Some(p);
                        st.restd_command = Some(command);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start slurmrestd");
                        st.restd.next_start = now + MAX_BACKOFF;
                    }
                }
            }
        }
    }
}

/// How slurmrestd runs: as the oldest RestApi Deployment's `slurmrestd` container says (its args
/// and plain environment, judged by the real slurmrestd), else the harness's own command (JWT
/// auth, `SLURM_JWT=daemon`, `-s openapi/slurmctld` without accounting, on port 6820).
fn restd_command(st: &State, slurm_conf: &str) -> RestdCommand {
    // A Deployment being deleted or scaled to zero runs no slurmrestd.
    let live = st
        .restapis
        .values()
        .filter(|d| d.metadata.deletion_timestamp.is_none() && d.spec.replicas != Some(0));
    let oldest = live.min_by(|a, b| {
        let at =
            |d: &k8s_openapi::api::apps::v1::Deployment| d.metadata.creation_timestamp.as_ref().map(|t| t.0);
        at(a)
            .cmp(&at(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let container = oldest.and_then(|d| {
        let pod = d.spec.template.spec.as_ref()?;
        pod.containers
            .iter()
            .find(|c| c.name == "slurmrestd")
            .map(|c| (d, c))
    });
    if let Some((d, c)) = container {
        return RestdCommand {
            deployment: d.metadata.name.clone(),
            args: c.args.clone().unwrap_or_default(),
            env: c
                .env
                .iter()
                .flatten()
                .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
                .collect(),
        };
    }
    let mut args = vec!["-a".to_string(), "rest_auth/jwt".to_string()];
    let accounting = conf_value(slurm_conf, "AccountingStorageType").unwrap_or_default();
    if accounting.is_empty() || accounting.ends_with("/none") {
        // The default plugin set also loads openapi/slurmdbd, which stops slurmrestd
        // ("Failure loading plugin path bindings") without accounting.
        args.extend(["-s".to_string(), "openapi/slurmctld".to_string()]);
    }
    args.push(format!("0.0.0.0:{RESTD_PORT}"));
    RestdCommand {
        deployment: None,
        args,
        env: vec![("SLURM_JWT".to_string(), "daemon".to_string())],
    }
}
