//! A pod's life as the watch shows it: taken up once it is bound, terminated (preStop,
//! SIGTERM, SIGKILL) when it is being deleted, torn down once gone; a daemon's exit and its
//! restart back-off; the sandbox addresses pods get.

use std::{
    collections::BTreeSet,
    process::ExitStatus,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt as _, runtime::watcher};

use super::{
    process::{init_log_path, log_path, open_log, output, tail},
    state::{Entry, Event, MAX_BACKOFF, MAX_GRACE, ProcKey, Shared, State},
};
use crate::{
    error::Error,
    net::{self, Network},
    podspec::{self, Plan},
    sandbox::User,
    sys,
};

impl Shared {
    pub(super) fn pod_event(&self, st: &mut State, ev: watcher::Event<Pod>) {
        match ev {
            watcher::Event::Init => st.init_pods = Some(BTreeSet::new()),
            watcher::Event::InitApply(p) => {
                if let (Some(seen), Some(uid)) = (st.init_pods.as_mut(), p.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                self.pod_applied(st, p);
            }
            watcher::Event::InitDone => {
                if let Some(seen) = st.init_pods.take() {
                    // Before the gone ones are torn down: their teardown starts a successor.
                    st.successors
                        .retain(|_, p| p.metadata.uid.as_ref().is_some_and(|u| seen.contains(u)));
                    let missing: Vec<String> =
                        st.pods.keys().filter(|u| !seen.contains(*u)).cloned().collect();
                    for uid in missing {
                        self.pod_gone(st, &uid);
                    }
                    st.others.retain(|u, _| seen.contains(u));
                }
            }
            watcher::Event::Apply(p) => self.pod_applied(st, p),
            watcher::Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    st.others.remove(&uid);
                    st.successors
                        .retain(|_, p| p.metadata.uid.as_deref() != Some(uid.as_str()));
                    if let Some(e) = st.pods.get_mut(&uid) {
                        e.pod = p;
                    }
                    self.pod_gone(st, &uid);
                }
            }
        }
    }

    /// A pod as the watch shows it now: taken up when it is one of the Slurm pods the harness
    /// runs, else kept among the others (an Accounting named later may make it one).
    pub(super) fn pod_applied(&self, st: &mut State, pod: Pod) {
        let Some(a) = st.attached.clone() else { return };
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        // This copy is newer than one kept waiting for its predecessor (and when it is deleted,
        // finished or no Slurm pod, the waiting one must not start).
        let before = st.successors.len();
        st.successors
            .retain(|_, p| p.metadata.uid.as_deref() != Some(uid.as_str()));
        let waited = st.successors.len() != before;
        let Some(role) = podspec::role_of(&pod, &a.controller, st.accounting.as_deref()) else {
            if !st.pods.contains_key(&uid) {
                st.others.insert(uid, pod);
            }
            return;
        };
        st.others.remove(&uid);
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if let Some(e) = st.pods.get_mut(&uid) {
            e.pod = pod;
            if deleting && !e.terminating {
                self.begin_termination(st, &uid);
            }
            return;
        }
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Failed" || p == "Succeeded");
        if deleting || finished {
            return;
        }
        let Some(plan) = Plan::new(&pod, role) else {
            tracing::warn!(pod = %pod.name_any(), "a Slurm pod without a spec or containers is not run");
            return;
        };
        // One of another UID waiting under this name was deleted meanwhile.
        st.successors.remove(&plan.name);
        // A pod re-created under a name whose deletion the watch did not show: the old one goes.
        let replaced: Vec<String> = st
            .pods
            .iter()
            .filter(|(u, e)| e.plan.name == plan.name && **u != uid)
            .map(|(u, _)| u.clone())
            .collect();
        for old in replaced {
            self.pod_gone(st, &old);
        }
        // Its predecessor's daemon is still stopping: a kubelet never meets this (the API keeps a
        // pod until its kubelet has stopped the containers, and a StatefulSet makes the next one
        // only then), but the embedded API server's simulated kubelet ends grace periods early.
        // Two slurmctlds on one state directory lose what the last one saves at its exit (a
        // dynamic node registered meanwhile, unlisted then until SlurmdTimeout): the new daemon
        // starts once the old one has stopped.
        if st.pods.values().any(|e| e.plan.name == plan.name) {
            if !waited {
                tracing::info!(pod = %plan.name, "waits for the daemon of its predecessor of the same name to stop");
            }
            st.successors.insert(plan.name.clone(), pod);
            return;
        }
        let Some(host) = allocate(st, &plan.name) else {
            tracing::error!(pod = %plan.name, "{}", Error::NoAddress { subnet: prefix_str(&self.net) });
            return;
        };
        let short = uid.get(..8).unwrap_or(&uid);
        let dir = self.net.dir.join("pods").join(format!("{}-{short}", plan.name));
        tracing::info!(pod = %plan.name, role = %role, hostname = %plan.hostname, ip = %self.net.addr(host), "running a Slurm pod locally");
        st.pods.insert(
            uid,
            Entry {
                pod,
                plan,
                host,
                dir,
                sandbox: None,
                proc: None,
                inits_done: 0,
                init_proc: None,
                restarts: 0,
                next_start: Instant::now(),
                backoff: Duration::from_secs(1),
                held: false,
                terminating: false,
                terminated: false,
                gone: false,
                waiting_since: None,
                last_error: None,
            },
        );
    }

    /// The pod is gone (or no longer one the harness runs): stop its daemon, then remove its
    /// sandbox.
    pub(super) fn pod_gone(&self, st: &mut State, uid: &str) {
        let Some(e) = st.pods.get_mut(uid) else { return };
        e.gone = true;
        if e.terminated || e.sandbox.is_none() {
            self.teardown(st, uid);
        } else if !e.terminating {
            self.begin_termination(st, uid);
        }
    }

    /// Run the preStop hook, SIGTERM the daemon, wait (its grace period, at most 10 s), SIGKILL;
    /// then report [`Event::Terminated`].
    fn begin_termination(&self, st: &mut State, uid: &str) {
        let Some(e) = st.pods.get_mut(uid) else { return };
        e.terminating = true;
        let pre_stop = match (&e.sandbox, e.plan.pre_stop()) {
            (Some(sb), Some(cmd)) if e.proc.is_some() => {
                let (program, args) = cmd
                    .split_first()
                    .map(|(p, a)| (p.clone(), a.to_vec()))
                    .unwrap_or_default();
                let mut c = sb.command(&self.slurm, User::Root, &program, &args, &[]);
                let log = open_log(&e.dir.join("prestop.out"));
                if let Some(f) = log {
                    if let Ok(f2) = f.try_clone() {
                        c.stdout(f2);
                    }
                    c.stderr(f);
                }
                c.kill_on_drop(true);
                Some(c)
            }
            _ => None,
        };
        // The main container's process, or the init container running instead.
        let proc = e
            .proc
            .as_ref()
            .or(e.init_proc.as_ref())
            .map(|p| (p.pid, p.exited.clone()));
        let grace = e.plan.grace.min(MAX_GRACE);
        let name = e.plan.name.clone();
        let tx = self.events.clone();
        let uid = uid.to_string();
        tracing::info!(pod = %name, "the pod is being deleted: preStop, then SIGTERM");
        tokio::spawn(async move {
            let deadline = Instant::now() + grace;
            if let Some(mut c) = pre_stop {
                match tokio::time::timeout(grace, c.status()).await {
                    Ok(Ok(s)) if s.success() => tracing::info!(pod = %name, "preStop hook done"),
                    Ok(Ok(s)) => {
                        tracing::warn!(pod = %name, status = %s, "the preStop hook failed (see prestop.out)")
                    }
                    Ok(Err(e)) => tracing::warn!(pod = %name, error = %e, "cannot run the preStop hook"),
                    Err(_) => tracing::warn!(pod = %name, "the preStop hook outlived the grace period"),
                }
            }
            if let Some((pid, mut exited)) = proc {
                sys::signal(pid, rustix::process::Signal::TERM);
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_secs(2));
                if tokio::time::timeout(left, exited.wait_for(|x| *x)).await.is_err() {
                    tracing::warn!(pod = %name, pid, "still running after SIGTERM: SIGKILL");
                    sys::signal(pid, rustix::process::Signal::KILL);
                    let _ = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|x| *x)).await;
                }
            }
            let _ = tx.send(Event::Terminated { uid });
        });
    }

    pub(super) fn teardown(&self, st: &mut State, uid: &str) {
        let Some(e) = st.pods.remove(uid) else { return };
        for p in e.proc.iter().chain(&e.init_proc) {
            sys::signal(p.pid, rustix::process::Signal::KILL);
        }
        if let Some(sb) = &e.sandbox {
            sb.destroy(&self.net);
        }
        st.used_hosts.remove(&e.host);
        tracing::info!(pod = %e.plan.name, "the pod is gone: its sandbox is removed");
        if let Some(next) = st.successors.remove(&e.plan.name) {
            self.pod_applied(st, next);
        }
    }

    pub(super) fn exited(&self, st: &mut State, key: ProcKey, incarnation: u64, status: Option<ExitStatus>) {
        let how = status.map_or_else(|| "unknown status".to_string(), |s| s.to_string());
        let now = Instant::now();
        let next = |started: Instant, backoff: &mut Duration| {
            *backoff = if now.duration_since(started) > Duration::from_secs(60) {
                Duration::from_secs(1)
            } else {
                (*backoff * 2).min(MAX_BACKOFF)
            };
            now + *backoff
        };
        match key {
            ProcKey::Pod(uid) => {
                let Some(e) = st.pods.get_mut(&uid) else { return };
                let Some(p) = e.proc.take_if(|p| p.incarnation == incarnation) else {
                    return;
                };
                if e.terminating || e.held {
                    tracing::info!(pod = %e.plan.name, %how, "{} stopped", e.plan.role);
                    return;
                }
                let wait = e.backoff;
                e.next_start = next(p.started, &mut e.backoff).max(now + wait);
                e.restarts += 1;
                tracing::warn!(pod = %e.plan.name, %how, restart_in = ?wait, log = %e.dir.display(),
                    "{} exited; restarting it (last output: {})", e.plan.role, tail(&log_path(e)));
            }
            ProcKey::Init(uid) => {
                let Some(e) = st.pods.get_mut(&uid) else { return };
                let Some(p) = e.init_proc.take_if(|p| p.incarnation == incarnation) else {
                    return;
                };
                let name = e
                    .plan
                    .init_containers
                    .get(e.inits_done)
                    .map(|i| i.container.name.clone())
                    .unwrap_or_default();
                if e.terminating {
                    tracing::info!(pod = %e.plan.name, init_container = %name, %how, "init container stopped");
                    return;
                }
                if status.is_some_and(|s| s.success()) {
                    e.inits_done += 1;
                    e.next_start = now;
                    tracing::info!(pod = %e.plan.name, init_container = %name, "init container completed");
                    return;
                }
                // As a kubelet with the pod's restartPolicy Always: the failed init container runs
                // again after a back-off, and the main container waits.
                let wait = e.backoff;
                e.next_start = next(p.started, &mut e.backoff).max(now + wait);
                let out = init_log_path(e, &name);
                tracing::warn!(pod = %e.plan.name, init_container = %name, %how, restart_in = ?wait,
                    log = %out.display(), "init container failed; the pod does not start, running it again (output: {})",
                    output(&out));
            }
            ProcKey::Restd | ProcKey::Sackd => {
                // slurmrestd stopped because its command changed: start the new one at once.
                let replaced = key == ProcKey::Restd && st.restd_command.is_none();
                let (d, name) = match key {
                    ProcKey::Restd => (&mut st.restd, "slurmrestd"),
                    _ => (&mut st.client, "sackd"),
                };
                let Some(p) = d.proc.take_if(|p| p.incarnation == incarnation) else {
                    return;
                };
                if !d.wanted {
                    tracing::info!(%how, "{name} stopped");
                    return;
                }
                if replaced {
                    tracing::info!(%how, "{name} stopped for its new command");
                    d.next_start = now;
                    return;
                }
                d.next_start = next(p.started, &mut d.backoff);
                let out = d
                    .sandbox
                    .as_ref()
                    .map(|s| s.dir.join(format!("{name}.out")))
                    .unwrap_or_default();
                tracing::warn!(%how, "{name} exited; restarting it (last output: {})", tail(&out));
            }
        }
    }
}

fn prefix_str(net: &Network) -> String {
    format!("{}.{}.{}", net.prefix[0], net.prefix[1], net.prefix[2])
}

/// A host number for pod `name`: the one it had last if free, else the lowest free.
fn allocate(st: &mut State, name: &str) -> Option<u8> {
    let host = st
        .last_host
        .get(name)
        .copied()
        .filter(|h| !st.used_hosts.contains(h))
        .or_else(|| (net::FIRST_POD_HOST..=net::LAST_HOST).find(|h| !st.used_hosts.contains(h)))?;
    st.used_hosts.insert(host);
    st.last_host.insert(name.to_string(), host);
    Some(host)
}
