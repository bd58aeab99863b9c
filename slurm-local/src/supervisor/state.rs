//! The harness's state and what feeds it: the events of the state task, the processes it
//! started, the pods and daemons it runs, and what every part shares.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::PathBuf,
    process::ExitStatus,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Pod, Service},
};
use kube::runtime::watcher;
use slinky_api::Controller;
use tokio::sync::{Mutex, mpsc, watch};

use crate::{
    net::Network,
    podspec::{File, Plan},
    sandbox::Sandbox,
};

/// What the state task reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// A pod watch event.
    Pod(Box<watcher::Event<Pod>>),
    /// A Service watch event.
    Service(Box<watcher::Event<Service>>),
    /// A watch event of a slurmrestd Deployment (a RestApi's).
    Deployment(Box<watcher::Event<Deployment>>),
    /// A watch event of a Controller of the namespace (the attached one names its Accounting).
    Controller(Box<watcher::Event<Controller>>),
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
    /// A pod's running init container (by the pod's UID).
    Init(String),
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
    /// The main container's process.
    pub proc: Option<Proc>,
    /// How many of the plan's init containers completed in this sandbox (the next one runs, or
    /// the main container once all did).
    pub inits_done: usize,
    /// The init container running now (the `inits_done`th).
    pub init_proc: Option<Proc>,
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

/// How slurmrestd is started: the container of a RestApi's Deployment (its args and plain env),
/// or the harness's own command when the namespace has no RestApi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestdCommand {
    /// The Deployment it comes from, if any.
    pub deployment: Option<String>,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
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
    pub(super) fn new(sandbox: Sandbox, wanted: bool) -> Self {
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
    /// The namespace's other pods, by UID (one becomes a pod the harness runs when the
    /// Controller's `accountingRef` comes to name its Accounting).
    pub(super) others: BTreeMap<String, Pod>,
    /// Pods that came under the name of one whose daemon is still stopping, by name: each is
    /// taken up once its predecessor is torn down (see `pod_applied`).
    pub(super) successors: BTreeMap<String, Pod>,
    pub services: BTreeMap<String, Service>,
    /// UIDs and names seen during a watch's initial list.
    pub(super) init_pods: Option<BTreeSet<String>>,
    pub(super) init_services: Option<BTreeSet<String>>,
    /// The namespace's slurmrestd Deployments (`app.kubernetes.io/name=slurmrestd`), by name.
    pub restapis: BTreeMap<String, Deployment>,
    pub(super) init_restapis: Option<BTreeSet<String>>,
    /// The Accounting the attached Controller's `spec.accountingRef` names: its slurmdbd pod is
    /// run too.
    pub accounting: Option<String>,
    /// Whether the Controller's watch relist (since its `Init`) has shown it.
    pub(super) init_controller_seen: Option<bool>,
    /// Names the sandboxes' `/etc/hosts` gives besides pods and Services
    /// ([`crate::SlurmLocal::add_host`]).
    pub extra_hosts: BTreeMap<String, Ipv4Addr>,
    /// What the running slurmrestd was started with.
    pub restd_command: Option<RestdCommand>,
    /// The Controller's `/etc/slurm` as its slurmctld reads it (after the harness's changes).
    pub conf: Option<Vec<File>>,
    pub restd: Daemon,
    pub client: Daemon,
    pub(super) used_hosts: BTreeSet<u8>,
    pub(super) last_host: BTreeMap<String, u8>,
    pub(super) incarnation: u64,
    pub(super) hosts_text: String,
    pub(super) logged_cgroups: bool,
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

pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(16);
/// How long slurmd waits for its `--conf-server` to answer before it is started anyway (it then
/// retries every 10 s itself).
pub(super) const CONF_SERVER_WAIT: Duration = Duration::from_secs(60);
/// The longest a termination waits between SIGTERM and SIGKILL, whatever the grace period.
pub(super) const MAX_GRACE: Duration = Duration::from_secs(10);
