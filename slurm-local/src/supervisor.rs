//! The kubelet of the harness: one task owning the state, fed by the pod and Service watches,
//! the processes' exits and a tick. It makes a sandbox for each of the Controller's pods once
//! the pod is bound to a node, fills its volumes, starts its daemon (restarting it with a
//! back-off when it exits, as a kubelet restarts a container), runs the preStop hook and
//! SIGTERM when the pod is being deleted, and removes the sandbox once the pod is gone. It also
//! keeps the shared `/etc/hosts` (pods and Services) and the slurmrestd and client sandboxes.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Seek as _, Write as _},
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::ExitStatus,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::{Mutex, mpsc, watch};

use crate::{
    error::{Error, Result},
    net::{self, Network},
    podspec::{self, File, MountKind, Plan, Role},
    sandbox::{self, Sandbox, Source, User},
    sys,
};

/// What the state task reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// A pod watch event.
    Pod(Box<watcher::Event<Pod>>),
    /// A Service watch event.
    Service(Box<watcher::Event<Service>>),
    /// A process exited.
    Exited {
        /// Whose.
        key: ProcKey,
        /// Which start of it.
        incarnation: u64,
        /// How.
        status: Option<ExitStatus>,
    },
    /// A pod's termination (preStop, SIGTERM, the wait) finished.
    Terminated {
        /// The pod's UID.
        uid: String,
    },
}

/// Whose process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProcKey {
    /// A pod's daemon (by UID).
    Pod(String),
    /// slurmrestd.
    Restd,
    /// The client sandbox's sackd.
    Sackd,
}

/// A started process.
#[derive(Debug)]
pub(crate) struct Proc {
    /// Its pid.
    pub pid: u32,
    /// Which start.
    pub incarnation: u64,
    /// When.
    pub started: Instant,
    /// Becomes true when it exited.
    pub exited: watch::Receiver<bool>,
}

/// A pod the harness runs.
#[derive(Debug)]
pub(crate) struct Entry {
    pub pod: Pod,
    pub plan: Plan,
    pub host: u8,
    pub dir: PathBuf,
    pub sandbox: Option<Sandbox>,
    pub proc: Option<Proc>,
    pub restarts: u32,
    pub next_start: Instant,
    pub backoff: Duration,
    /// Kept down by [`crate::SlurmLocal::kill_slurmctld`].
    pub held: bool,
    /// Its termination has begun.
    pub terminating: bool,
    /// The termination finished.
    pub terminated: bool,
    /// The pod is gone from the API.
    pub gone: bool,
    /// When it started waiting for its conf server.
    pub waiting_since: Option<Instant>,
    /// The last problem logged (so it is logged once).
    pub last_error: Option<String>,
}

/// A harness daemon that is not a pod (slurmrestd, sackd).
#[derive(Debug)]
pub(crate) struct Daemon {
    pub sandbox: Option<Sandbox>,
    pub proc: Option<Proc>,
    pub wanted: bool,
    pub next_start: Instant,
    pub backoff: Duration,
}

impl Daemon {
    fn new(sandbox: Sandbox, wanted: bool) -> Self {
        Daemon {
            sandbox: Some(sandbox),
            proc: None,
            wanted,
            next_start: Instant::now(),
            backoff: Duration::from_secs(1),
        }
    }
}

/// The Controller whose pods are run.
#[derive(Clone)]
pub(crate) struct Attachment {
    pub client: kube::Client,
    pub namespace: String,
    pub controller: String,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("namespace", &self.namespace)
            .field("controller", &self.controller)
            .finish_non_exhaustive()
    }
}

/// The harness's state.
#[derive(Debug)]
pub(crate) struct State {
    pub attached: Option<Attachment>,
    pub pods: BTreeMap<String, Entry>,
    pub services: BTreeMap<String, Service>,
    /// UIDs and names seen during a watch's initial list.
    init_pods: Option<BTreeSet<String>>,
    init_services: Option<BTreeSet<String>>,
    /// The Controller's `/etc/slurm` as its slurmctld reads it (after the harness's changes).
    pub conf: Option<Vec<File>>,
    pub restd: Daemon,
    pub client: Daemon,
    used_hosts: BTreeSet<u8>,
    last_host: BTreeMap<String, u8>,
    incarnation: u64,
    hosts_text: String,
    logged_cgroups: bool,
    pub shut: bool,
}

/// What every part of the harness shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub slurm: PathBuf,
    pub net: Network,
    pub cluster_domain: String,
    pub hosts_path: PathBuf,
    pub resolv_path: PathBuf,
    /// The local `slurm` user's uid and gid.
    pub slurm_ids: (u32, u32),
    pub state: Mutex<State>,
    pub events: mpsc::UnboundedSender<Event>,
}

/// The hostname of the client sandbox.
pub(crate) const CLIENT_HOSTNAME: &str = "slinky-client";
/// The hostname of the slurmrestd sandbox.
pub(crate) const RESTD_HOSTNAME: &str = "slinky-restapi";
/// slurmrestd's port.
pub(crate) const RESTD_PORT: u16 = 6820;

const MAX_BACKOFF: Duration = Duration::from_secs(16);
/// How long slurmd waits for its `--conf-server` to answer before it is started anyway (it then
/// retries every 10 s itself).
const CONF_SERVER_WAIT: Duration = Duration::from_secs(60);
/// The longest a termination waits between SIGTERM and SIGKILL, whatever the grace period.
const MAX_GRACE: Duration = Duration::from_secs(10);

impl Shared {
    /// The harness: hosts files written, restd and client sandboxes made, no pod yet.
    pub async fn new(
        slurm: PathBuf,
        net: Network,
        cluster_domain: String,
        slurm_ids: (u32, u32),
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<Event>)> {
        let hosts_path = net.dir.join("hosts");
        let resolv_path = net.dir.join("resolv.conf");
        write_in_place(&hosts_path, &base_hosts(&net))?;
        // No name server in the sandboxes (they have no route out): unknown names fail at once.
        write_in_place(&resolv_path, "options timeout:1 attempts:1\n")?;
        let mk = |host: u8, hostname: &str| sandbox::Spec {
            host,
            hostname: hostname.to_string(),
            dir: net.dir.join(hostname),
            hosts: hosts_path.clone(),
            resolv: resolv_path.clone(),
            mounts: vec![("/var/log/slurm".into(), Source::Tmpfs)],
        };
        let restd = Sandbox::create(&net, &mk(net::RESTD_HOST, RESTD_HOSTNAME)).await?;
        let client = Sandbox::create(&net, &mk(net::CLIENT_HOST, CLIENT_HOSTNAME)).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let state = State {
            attached: None,
            pods: BTreeMap::new(),
            services: BTreeMap::new(),
            init_pods: None,
            init_services: None,
            conf: None,
            restd: Daemon::new(restd, true),
            client: Daemon::new(client, true),
            used_hosts: BTreeSet::new(),
            last_host: BTreeMap::new(),
            incarnation: 0,
            hosts_text: String::new(),
            logged_cgroups: false,
            shut: false,
        };
        Ok((
            Arc::new(Shared {
                slurm,
                net,
                cluster_domain,
                hosts_path,
                resolv_path,
                slurm_ids,
                state: Mutex::new(state),
                events: tx,
            }),
            rx,
        ))
    }

    /// The state task: events and a 250 ms tick, until the channel closes.
    pub async fn run(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Event>) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { return };
                    let mut st = self.state.lock().await;
                    if st.shut { return; }
                    self.handle(&mut st, ev).await;
                    self.reconcile(&mut st).await;
                }
                _ = tick.tick() => {
                    let mut st = self.state.lock().await;
                    if st.shut { return; }
                    self.reconcile(&mut st).await;
                }
            }
        }
    }

    /// Start watching the Controller's namespace (pods and Services), feeding the state task.
    pub fn watch(self: &Arc<Self>, a: &Attachment) -> Vec<tokio::task::JoinHandle<()>> {
        let pods = Api::<Pod>::namespaced(a.client.clone(), &a.namespace);
        let services = Api::<Service>::namespaced(a.client.clone(), &a.namespace);
        let tx = self.events.clone();
        let p = tokio::spawn(async move {
            let mut s = watcher(pods, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        if tx.send(Event::Pod(Box::new(ev))).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "the harness's pod watch failed; retrying"),
                }
            }
        });
        let tx = self.events.clone();
        let s = tokio::spawn(async move {
            let mut s = watcher(services, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        if tx.send(Event::Service(Box::new(ev))).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "the harness's Service watch failed; retrying"),
                }
            }
        });
        vec![p, s]
    }

    async fn handle(&self, st: &mut State, ev: Event) {
        match ev {
            Event::Pod(p) => self.pod_event(st, *p),
            Event::Service(s) => service_event(st, *s),
            Event::Exited {
                key,
                incarnation,
                status,
            } => self.exited(st, key, incarnation, status),
            Event::Terminated { uid } => {
                let Some(e) = st.pods.get_mut(&uid) else { return };
                e.terminated = true;
                if e.gone {
                    self.teardown(st, &uid);
                } else if let Some(a) = st.attached.clone() {
                    // As a kubelet does once the containers stopped: the pod is finished now.
                    let name = e.plan.name.clone();
                    tokio::spawn(finish_pod(a, name, uid));
                }
            }
        }
    }

    fn pod_event(&self, st: &mut State, ev: watcher::Event<Pod>) {
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
                    let missing: Vec<String> =
                        st.pods.keys().filter(|u| !seen.contains(*u)).cloned().collect();
                    for uid in missing {
                        self.pod_gone(st, &uid);
                    }
                }
            }
            watcher::Event::Apply(p) => self.pod_applied(st, p),
            watcher::Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    if let Some(e) = st.pods.get_mut(&uid) {
                        e.pod = p;
                    }
                    self.pod_gone(st, &uid);
                }
            }
        }
    }

    fn pod_applied(&self, st: &mut State, pod: Pod) {
        let Some(a) = st.attached.clone() else { return };
        let Some(role) = podspec::role_of(&pod, &a.controller) else {
            return;
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
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

    fn pod_gone(&self, st: &mut State, uid: &str) {
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
        let proc = e.proc.as_ref().map(|p| (p.pid, p.exited.clone()));
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

    fn teardown(&self, st: &mut State, uid: &str) {
        let Some(e) = st.pods.remove(uid) else { return };
        if let Some(p) = &e.proc {
            sys::signal(p.pid, rustix::process::Signal::KILL);
        }
        if let Some(sb) = &e.sandbox {
            sb.destroy(&self.net);
        }
        st.used_hosts.remove(&e.host);
        tracing::info!(pod = %e.plan.name, "the pod is gone: its sandbox is removed");
    }

    fn exited(&self, st: &mut State, key: ProcKey, incarnation: u64, status: Option<ExitStatus>) {
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
            ProcKey::Restd | ProcKey::Sackd => {
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

    /// Bring every pod and daemon towards what it should be, and rewrite `/etc/hosts`.
    async fn reconcile(&self, st: &mut State) {
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

    /// `name` as the sandboxes' `/etc/hosts` resolves it.
    pub fn resolve(&self, st: &State, name: &str) -> Option<Ipv4Addr> {
        st.hosts_text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let ip = it.next()?.parse().ok()?;
            it.any(|n| n == name).then_some(ip)
        })
    }

    async fn make_pod_sandbox(&self, st: &mut State, uid: &str) -> Result<()> {
        let Some(a) = st.attached.clone() else {
            return Ok(());
        };
        let Some(e) = st.pods.get(uid) else { return Ok(()) };
        let plan = e.plan.clone();
        let owner = if plan.fs_group {
            (0, self.slurm_ids.1)
        } else {
            (0, 0)
        };
        // The volumes' files first: a missing ConfigMap or Secret keeps the pod waiting.
        let mut files: Vec<(String, Vec<File>)> = Vec::new();
        let mut mounts = Vec::new();
        for m in &plan.mounts {
            if !mountable(&m.path) {
                tracing::debug!(pod = %plan.name, path = %m.path, "not mounted: outside the sandbox's own directories and absent here");
                continue;
            }
            match &m.kind {
                MountKind::Files(sources) => {
                    let mut fs = podspec::files(&a.client, &a.namespace, sources).await?;
                    if plan.fs_group {
                        // A kubelet makes the files of a read-only volume group-readable for fsGroup.
                        for f in &mut fs {
                            f.mode |= 0o040;
                        }
                    }
                    files.push((m.path.clone(), fs));
                    mounts.push((m.path.clone(), Source::Tmpfs));
                }
                MountKind::EmptyDir => {
                    let dir = e.dir.join("volumes").join(&m.volume);
                    make_host_dir(&dir, owner, if plan.fs_group { 0o2777 } else { 0o777 })?;
                    mounts.push((m.path.clone(), Source::Bind(dir)));
                }
                MountKind::Claim(claim) => {
                    let dir = self.net.dir.join("claims").join(claim);
                    if !dir.exists() {
                        make_host_dir(&dir, owner, if plan.fs_group { 0o2775 } else { 0o755 })?;
                    }
                    mounts.push((m.path.clone(), Source::Bind(dir)));
                }
                MountKind::Unsupported(what) => {
                    tracing::debug!(pod = %plan.name, volume = %m.volume, "{what} volumes are not mounted");
                }
            }
        }
        let spec = sandbox::Spec {
            host: e.host,
            hostname: plan.hostname.clone(),
            dir: e.dir.clone(),
            hosts: self.hosts_path.clone(),
            resolv: self.resolv_path.clone(),
            mounts,
        };
        let sb = Sandbox::create(&self.net, &spec).await?;
        let result = self.fill_sandbox(st, &sb, &plan, &files, owner);
        if let Err(err) = result {
            sb.destroy(&self.net);
            return Err(err);
        }
        tracing::info!(pod = %plan.name, ip = %sb.ip, pause = sb.pause_pid, "sandbox ready");
        if let Some(e) = st.pods.get_mut(uid) {
            e.sandbox = Some(sb);
            e.backoff = Duration::from_secs(1);
        }
        Ok(())
    }

    /// Write the volumes' files; for slurmctld, adapt `slurm.conf` and `cgroup.conf` to local
    /// processes and make its state directory, and take its `/etc/slurm` as the cluster's.
    fn fill_sandbox(
        &self,
        st: &mut State,
        sb: &Sandbox,
        plan: &Plan,
        files: &[(String, Vec<File>)],
        owner: (u32, u32),
    ) -> Result<()> {
        for (dir, fs) in files {
            sb.write_files(dir, fs, owner)?;
        }
        if plan.role != Role::Slurmctld {
            return Ok(());
        }
        let etc = sb.path("/etc/slurm");
        let conf_path = etc.join("slurm.conf");
        let Ok(conf) = std::fs::read_to_string(&conf_path) else {
            return Err(Error::NotReady(format!(
                "the slurmctld pod {} has no /etc/slurm/slurm.conf in its volumes",
                plan.name
            )));
        };
        let what = |p: &Path| format!("cannot adapt {} for local processes", p.display());
        std::fs::write(&conf_path, local_slurm_conf(&conf)).map_err(|e| Error::io(what(&conf_path), e))?;
        let cgroup_path = etc.join("cgroup.conf");
        let cgroup = std::fs::read_to_string(&cgroup_path).unwrap_or_default();
        let existed = cgroup_path.exists();
        std::fs::write(&cgroup_path, local_cgroup_conf(&cgroup))
            .map_err(|e| Error::io(what(&cgroup_path), e))?;
        if !existed {
            sb.write_files(
                "/etc/slurm",
                &[File {
                    path: "cgroup.conf".into(),
                    data: local_cgroup_conf("").into_bytes(),
                    mode: 0o644,
                }],
                owner,
            )?;
        }
        if !st.logged_cgroups {
            st.logged_cgroups = true;
            tracing::info!(
                cgroups = cgroup_mode(),
                "slurmctld's slurm.conf gets ProctrackType=proctrack/linuxproc and TaskPlugin=task/none, \
                 its cgroup.conf CgroupPlugin=disabled (the local daemons share the harness's cgroup; \
                 Slinky's generated cgroup/v2 needs a cgroup of its own per pod)"
            );
        }
        let user = if plan.run_as_slurm { self.slurm_ids } else { (0, 0) };
        for (key, default) in [
            ("StateSaveLocation", "/var/spool/slurmctld"),
            ("SlurmctldPidFile", "/run/slurmctld.pid"),
        ] {
            let value = conf_value(&conf, key).unwrap_or_else(|| default.to_string());
            let dir = if key == "StateSaveLocation" {
                value
            } else {
                Path::new(&value).parent().map(sys::path_str).unwrap_or_default()
            };
            if !dir.is_empty() && !sb.path(&dir).exists() {
                sb.make_dir(&dir, user, 0o755)?;
            }
        }
        if plan.run_as_slurm {
            // The daemon's log and pid directories, as the image makes them.
            for dir in ["/run/slurmctld", "/var/log/slurm"] {
                let p = sb.path(dir);
                if !p.exists() {
                    sb.make_dir(dir, user, 0o755)?;
                }
            }
        }
        st.conf = Some(read_dir_files(&etc));
        self.update_cluster_conf(st)
    }

    /// Give the client and slurmrestd sandboxes the cluster's `/etc/slurm` (slurmrestd without
    /// the keys).
    fn update_cluster_conf(&self, st: &mut State) -> Result<()> {
        let Some(conf) = st.conf.clone() else {
            return Ok(());
        };
        if let Some(sb) = &st.client.sandbox {
            sb.write_files("/etc/slurm", &conf, (0, 0))?;
        }
        if let Some(sb) = &st.restd.sandbox {
            let public: Vec<File> = conf
                .iter()
                .filter(|f| !f.path.ends_with(".key"))
                .map(|f| File {
                    mode: f.mode | 0o444,
                    ..f.clone()
                })
                .collect();
            sb.write_files("/etc/slurm", &public, (0, 0))?;
        }
        Ok(())
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
        if st.restd.wanted && st.restd.proc.is_none() && now >= st.restd.next_start && ctld_up {
            st.incarnation += 1;
            let inc = st.incarnation;
            let slurm_conf = conf
                .iter()
                .find(|f| f.path == "slurm.conf")
                .map(|f| String::from_utf8_lossy(&f.data).into_owned())
                .unwrap_or_default();
            let mut args = vec!["-a".to_string(), "rest_auth/jwt".to_string()];
            let accounting = conf_value(&slurm_conf, "AccountingStorageType").unwrap_or_default();
            if accounting.is_empty() || accounting.ends_with("/none") {
                // The default plugin set also loads openapi/slurmdbd, which stops slurmrestd
                // ("Failure loading plugin path bindings") without accounting.
                args.extend(["-s".to_string(), "openapi/slurmctld".to_string()]);
            }
            args.push(format!("0.0.0.0:{RESTD_PORT}"));
            if let Some(sb) = &st.restd.sandbox {
                let log = sb.dir.join("slurmrestd.out");
                let env = [("SLURM_JWT".to_string(), "daemon".to_string())];
                match spawn(
                    sb,
                    &self.slurm,
                    User::Nobody,
                    "slurmrestd",
                    &args,
                    &env,
                    &log,
                    ProcKey::Restd,
                    inc,
                    self.events.clone(),
                ) {
                    Ok(p) => {
                        tracing::info!(url = %format!("http://{}:{RESTD_PORT}", sb.ip), pid = p.pid, "slurmrestd started");
                        st.restd.proc = Some(p);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start slurmrestd");
                        st.restd.next_start = now + MAX_BACKOFF;
                    }
                }
            }
        }
    }

    /// The sandboxes' `/etc/hosts`: every pod's name, hostname and `hostname.subdomain…` names,
    /// and each Service's names mapped to its first running pod.
    fn hosts(&self, st: &State) -> String {
        let mut text = base_hosts(&self.net);
        let ns = st
            .attached
            .as_ref()
            .map(|a| a.namespace.clone())
            .unwrap_or_default();
        let domain = &self.cluster_domain;
        // The newest pod of a name wins (an old one may still be terminating).
        let mut by_name: BTreeMap<&str, &Entry> = BTreeMap::new();
        for e in st.pods.values().filter(|e| e.sandbox.is_some()) {
            let newer = by_name
                .get(e.plan.name.as_str())
                .is_none_or(|o| o.terminating && !e.terminating);
            if newer {
                by_name.insert(&e.plan.name, e);
            }
        }
        for e in by_name.values() {
            let mut names = vec![e.plan.name.clone()];
            if e.plan.hostname != e.plan.name {
                names.push(e.plan.hostname.clone());
            }
            if let Some(sub) = &e.plan.subdomain {
                let h = &e.plan.hostname;
                names.extend([
                    format!("{h}.{sub}"),
                    format!("{h}.{sub}.{ns}"),
                    format!("{h}.{sub}.{ns}.svc"),
                    format!("{h}.{sub}.{ns}.svc.{domain}"),
                ]);
            }
            text.push_str(&format!("{} {}\n", self.net.addr(e.host), names.join(" ")));
        }
        for (name, svc) in &st.services {
            let Some(selector) = svc
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .filter(|s| !s.is_empty())
            else {
                continue;
            };
            let endpoint = by_name.values().find(|e| {
                e.proc.is_some()
                    && !e.terminating
                    && selector
                        .iter()
                        .all(|(k, v)| e.pod.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
            });
            if let Some(e) = endpoint {
                text.push_str(&format!(
                    "{} {name} {name}.{ns} {name}.{ns}.svc {name}.{ns}.svc.{domain}\n",
                    self.net.addr(e.host)
                ));
            }
        }
        text
    }
}

fn service_event(st: &mut State, ev: watcher::Event<Service>) {
    match ev {
        watcher::Event::Init => st.init_services = Some(BTreeSet::new()),
        watcher::Event::InitApply(s) => {
            if let Some(seen) = st.init_services.as_mut() {
                seen.insert(s.name_any());
            }
            st.services.insert(s.name_any(), s);
        }
        watcher::Event::InitDone => {
            if let Some(seen) = st.init_services.take() {
                st.services.retain(|n, _| seen.contains(n));
            }
        }
        watcher::Event::Apply(s) => {
            st.services.insert(s.name_any(), s);
        }
        watcher::Event::Delete(s) => {
            st.services.remove(&s.name_any());
        }
    }
}

/// The pod is finished: delete it at once (grace 0, this UID only), as a kubelet does once its
/// containers have stopped.
async fn finish_pod(a: Attachment, name: String, uid: String) {
    let api = Api::<Pod>::namespaced(a.client, &a.namespace);
    let dp = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => tracing::warn!(pod = %name, error = %e, "cannot finish the terminated pod"),
    }
}

/// Start `program args…` in `sb`, its output appended to `log`; a task reports its exit.
#[allow(
    clippy::too_many_arguments,
    reason = "one call per daemon kind; a struct would only rename them"
)]
fn spawn(
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

fn open_log(path: &Path) -> Option<std::fs::File> {
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

/// Whether a mount at `path` can be made: inside the sandbox's own tmpfs (`/run`, `/var/spool`,
/// `/etc/slurm`), at `/var/log/slurm` (made here when missing), or over a directory that exists.
fn mountable(path: &str) -> bool {
    let own = ["/run", "/var/spool", "/etc/slurm"];
    if own
        .iter()
        .any(|o| path == *o || path.starts_with(&format!("{o}/")))
    {
        return true;
    }
    if path == "/var/log/slurm" {
        return std::fs::create_dir_all(path).is_ok();
    }
    Path::new(path).is_dir()
}

fn make_host_dir(dir: &Path, owner: (u32, u32), mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let what = || format!("cannot make {}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| Error::io(what(), e))?;
    std::os::unix::fs::chown(dir, Some(owner.0), Some(owner.1)).map_err(|e| Error::io(what(), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io(what(), e))
}

/// The regular files of a directory (recursively), with their modes.
fn read_dir_files(dir: &Path) -> Vec<File> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push((entry.path(), path));
            } else if meta.is_file()
                && let Ok(data) = std::fs::read(entry.path())
            {
                out.push(File {
                    path,
                    data,
                    mode: meta.permissions().mode() & 0o777,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The last value of `key` in a `slurm.conf` (keys are case-insensitive).
pub(crate) fn conf_value(conf: &str, key: &str) -> Option<String> {
    conf.lines()
        .filter_map(|l| {
            let l = l.trim();
            let (k, v) = l.split_once('=')?;
            (k.trim().eq_ignore_ascii_case(key))
                .then(|| v.split_whitespace().next().unwrap_or_default().to_string())
        })
        .next_back()
}

const LOCAL_NOTE: &str = "# slinky-slurm-local: changed for local processes without a cgroup of their own";

/// `slurm.conf` with its ProctrackType and TaskPlugin lines commented out and the local ones
/// appended.
pub(crate) fn local_slurm_conf(conf: &str) -> String {
    let mut out = String::new();
    for line in conf.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        if key.eq_ignore_ascii_case("ProctrackType") || key.eq_ignore_ascii_case("TaskPlugin") {
            out.push('#');
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!(
        "{LOCAL_NOTE}\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
    ));
    out
}

/// `cgroup.conf` with `CgroupPlugin=disabled` (its own line commented out) and
/// `IgnoreSystemd=yes`.
pub(crate) fn local_cgroup_conf(conf: &str) -> String {
    let mut out = format!("{LOCAL_NOTE}\nCgroupPlugin=disabled\n");
    let mut ignore = false;
    for line in conf.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        if key.eq_ignore_ascii_case("CgroupPlugin") {
            out.push('#');
        }
        ignore |= key.eq_ignore_ascii_case("IgnoreSystemd");
        out.push_str(line);
        out.push('\n');
    }
    if !ignore {
        out.push_str("IgnoreSystemd=yes\n");
    }
    out
}

fn cgroup_mode() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else {
        "v1 or hybrid"
    }
}

fn base_hosts(net: &Network) -> String {
    format!(
        "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{} {RESTD_HOSTNAME}\n{} {CLIENT_HOSTNAME}\n",
        net.addr(net::RESTD_HOST),
        net.addr(net::CLIENT_HOST)
    )
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

/// Rewrite `path` without truncating it first (bind mounts keep the inode; a reader never sees
/// an empty file).
fn write_in_place(path: &Path, text: &str) -> Result<()> {
    let what = || format!("cannot write {}", path.display());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io(what(), e))?;
    f.seek(std::io::SeekFrom::Start(0))
        .map_err(|e| Error::io(what(), e))?;
    f.write_all(text.as_bytes()).map_err(|e| Error::io(what(), e))?;
    f.set_len(text.len() as u64).map_err(|e| Error::io(what(), e))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::io(what(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_conf_is_adapted_not_duplicated() {
        let conf = "ClusterName=x\nProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n";
        let out = local_slurm_conf(conf);
        assert!(out.contains("#ProctrackType=proctrack/cgroup"));
        assert!(out.contains("#TaskPlugin=task/cgroup"));
        assert_eq!(
            conf_value(&out, "ProctrackType").as_deref(),
            Some("proctrack/linuxproc")
        );
        assert_eq!(conf_value(&out, "tasKplugin").as_deref(), Some("task/none"));
        let cg = local_cgroup_conf("CgroupPlugin=cgroup/v2\nConstrainCores=yes\n");
        assert!(
            cg.contains(
                "CgroupPlugin=disabled\n#CgroupPlugin=cgroup/v2\nConstrainCores=yes\nIgnoreSystemd=yes\n"
            ),
            "{cg}"
        );
        assert_eq!(conf_value("A=1\n#A=2\nA=3 # c\n", "A").as_deref(), Some("3"));
    }

    #[test]
    fn mounts_stay_inside_or_exist() {
        assert!(mountable("/run/slurmctld"));
        assert!(mountable("/var/spool/slurmctld/x"));
        assert!(mountable("/etc/slurm"));
        assert!(!mountable("/etc/slurmx"));
        assert!(!mountable("/no/such/dir/anywhere"));
    }
}
