//! The kubelet of the harness: one task owning the state, fed by the pod and Service watches,
//! the processes' exits and a tick. It makes a sandbox for each of the Controller's pods once
//! the pod is bound to a node, fills its volumes, runs its init containers to completion (a
//! failed one again, with a back-off), starts its daemon (restarting it with a back-off when it
//! exits, as a kubelet restarts a container), runs the preStop hook and SIGTERM when the pod is
//! being deleted, and removes the sandbox once the pod is gone. It also keeps the shared
//! `/etc/hosts` (pods and Services) and the slurmrestd and client sandboxes.

mod hosts;
mod local_conf;
mod pod_lifecycle;
mod pod_sandbox;
mod process;
mod reconcile;
mod state;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use futures::StreamExt as _;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Pod, Service},
};
use kube::{
    Api, Resource, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
use slinky_api::Controller;
use tokio::sync::{Mutex, mpsc};

pub(crate) use process::{connects, tail};
pub use state::RestdCommand;
pub(crate) use state::{Attachment, RESTD_HOSTNAME, RESTD_PORT, Shared, State};
use state::{CLIENT_HOSTNAME, Daemon, Event};

use crate::{
    error::Result,
    net::{self, Network},
    podspec,
    sandbox::{self, Sandbox, Source},
};
use hosts::{base_hosts, write_in_place};

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
            others: BTreeMap::new(),
            successors: BTreeMap::new(),
            services: BTreeMap::new(),
            init_pods: None,
            init_services: None,
            restapis: BTreeMap::new(),
            init_restapis: None,
            accounting: None,
            init_controller_seen: None,
            extra_hosts: BTreeMap::new(),
            restd_command: None,
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

    /// Start watching the Controller's namespace (pods, Services and slurmrestd Deployments),
    /// feeding the state task.
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
        let deployments = Api::<Deployment>::namespaced(a.client.clone(), &a.namespace);
        let tx = self.events.clone();
        let d = tokio::spawn(async move {
            let config = watcher::Config::default().labels("app.kubernetes.io/name=slurmrestd");
            let mut s = watcher(deployments, config).default_backoff().boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        if tx.send(Event::Deployment(Box::new(ev))).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "the harness's Deployment watch failed; retrying"),
                }
            }
        });
        let controllers = Api::<Controller>::namespaced(a.client.clone(), &a.namespace);
        let tx = self.events.clone();
        let c = tokio::spawn(async move {
            let mut s = watcher(controllers, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        if tx.send(Event::Controller(Box::new(ev))).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "the harness's Controller watch failed; retrying"),
                }
            }
        });
        vec![p, s, d, c]
    }

    async fn handle(&self, st: &mut State, ev: Event) {
        match ev {
            Event::Pod(p) => self.pod_event(st, *p),
            Event::Service(s) => named_event(&mut st.services, &mut st.init_services, *s),
            Event::Deployment(d) => named_event(&mut st.restapis, &mut st.init_restapis, *d),
            Event::Controller(c) => self.controller_event(st, *c),
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
}

impl Shared {
    /// The attached Controller's `spec.accountingRef` (its Accounting's slurmdbd pod is run).
    fn controller_event(&self, st: &mut State, ev: watcher::Event<Controller>) {
        let Some(name) = st.attached.as_ref().map(|a| a.controller.clone()) else {
            return;
        };
        let accounting = |c: &Controller| c.spec.accounting_ref.as_ref().map(|r| r.name.clone());
        match ev {
            watcher::Event::Init => st.init_controller_seen = Some(false),
            watcher::Event::InitApply(c) | watcher::Event::Apply(c) if c.name_any() == name => {
                if let Some(seen) = st.init_controller_seen.as_mut() {
                    *seen = true;
                }
                self.set_accounting(st, accounting(&c));
            }
            watcher::Event::InitDone => {
                // The relist did not show the Controller: it is gone.
                let seen = st.init_controller_seen.take();
                if seen == Some(false) {
                    self.set_accounting(st, None);
                }
            }
            watcher::Event::Delete(c) if c.name_any() == name => self.set_accounting(st, None),
            _ => {}
        }
    }

    /// A new Accounting for the Controller: the slurmdbd pods of another one go (their sandboxes,
    /// not the pods), and the namespace's other pods are looked at again, so that the new one's
    /// slurmdbd pod is taken up.
    fn set_accounting(&self, st: &mut State, accounting: Option<String>) {
        if st.accounting == accounting {
            return;
        }
        tracing::info!(from = ?st.accounting, to = ?accounting, "the Controller's Accounting (whose slurmdbd pod is run)");
        st.accounting = accounting;
        let stale: Vec<String> = st
            .pods
            .iter()
            .filter(|(_, e)| e.plan.role == podspec::Role::Slurmdbd)
            .filter(|(_, e)| {
                let instance = e
                    .pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(slinky_api::keys::LABEL_INSTANCE));
                instance != st.accounting.as_ref()
            })
            .map(|(u, _)| u.clone())
            .collect();
        for uid in stale {
            self.pod_gone(st, &uid);
        }
        let others = std::mem::take(&mut st.others);
        for pod in others.into_values() {
            self.pod_applied(st, pod);
        }
    }
}

/// A watch event of a kind the harness keeps by name (Services, slurmrestd Deployments): `seen`
/// holds the names of a relist until it is done.
fn named_event<K: Resource>(
    map: &mut BTreeMap<String, K>,
    seen: &mut Option<BTreeSet<String>>,
    ev: watcher::Event<K>,
) {
    match ev {
        watcher::Event::Init => *seen = Some(BTreeSet::new()),
        watcher::Event::InitApply(o) => {
            if let Some(seen) = seen.as_mut() {
                seen.insert(o.name_any());
            }
            map.insert(o.name_any(), o);
        }
        watcher::Event::InitDone => {
            if let Some(seen) = seen.take() {
                map.retain(|n, _| seen.contains(n));
            }
        }
        watcher::Event::Apply(o) => {
            map.insert(o.name_any(), o);
        }
        watcher::Event::Delete(o) => {
            map.remove(&o.name_any());
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
