//! Simulated pod lifecycle (like kwok): a few simulated nodes; pods get scheduled to one
//! (`spec.nodeName`), then become `Running` and `Ready` after a delay. No containers run. Tests
//! can make a pod fail, become unready, or stay pending.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{sync::watch, time::Instant};

use super::{
    ApiError, DeleteOpts, ResKey, Store,
    store::{Op, Sub},
};

/// Lifecycle simulation settings.
#[derive(Debug, Clone)]
pub struct LifecycleConfig {
    /// Simulated nodes (`sim-node-0` …).
    pub nodes: usize,
    /// From creation to scheduling.
    pub schedule_delay: Duration,
    /// From scheduling to Running and Ready.
    pub ready_delay: Duration,
    /// How fast the simulated kubelet lets terminating pods' grace periods pass: a pod deleted
    /// with a grace period of `g` seconds is removed `g × grace_period_scale` seconds later. 1.0
    /// is real time (the default, and what `apiserver` and `run --embedded` use); tests use a
    /// small factor (0.01 ends a 30 s grace period in 300 ms). Only pods bound to the simulated
    /// nodes are finished: on others, as on a real cluster without their kubelet, a terminating
    /// pod stays until it is deleted with a grace period of 0.
    pub grace_period_scale: f64,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            nodes: 3,
            schedule_delay: Duration::from_millis(100),
            ready_delay: Duration::from_millis(500),
            grace_period_scale: 1.0,
        }
    }
}

const MANAGER: &str = "embedded-kubelet";

/// The simulated controllers that run with the kubelet, each on its own switch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Controllers {
    /// The StatefulSet controller ([`crate::statefulsets`]).
    pub(crate) statefulsets: bool,
    /// The deployment and replica set controllers ([`crate::deployments`]).
    pub(crate) deployments: bool,
}

/// The running simulation.
#[derive(Debug)]
pub struct Lifecycle {
    store: Arc<Store>,
    held: Arc<Mutex<HashSet<(String, String)>>>,
    stop: watch::Sender<bool>,
}

fn pods() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "pods".into(),
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn condition(kind: &str, status: bool) -> Value {
    // As the kubelet writes them: `lastProbeTime: null` included (a typed read drops it, so a
    // client that tests the conditions it read against the stored ones never matches).
    json!({"type": kind, "status": if status { "True" } else { "False" }, "lastProbeTime": null,
           "lastTransitionTime": now()})
}

fn running_status(pod: &Value, ready: bool, ip: &str) -> Value {
    let statuses: Vec<Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": now()}}})
        })
        .collect();
    json!({
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.0.0.1", "startTime": now(),
        "qosClass": "BestEffort",
        "conditions": [condition("PodScheduled", true), condition("Initialized", true),
                       condition("ContainersReady", ready), condition("Ready", ready)],
        "containerStatuses": statuses,
    })
}

impl Lifecycle {
    /// Create the nodes and start the simulation task (with the simulated `controllers` that
    /// are on).
    pub(crate) fn start(store: Arc<Store>, config: LifecycleConfig, controllers: Controllers) -> Self {
        let nodes = ResKey {
            group: String::new(),
            plural: "nodes".into(),
        };
        for i in 0..config.nodes {
            let node = json!({
                "metadata": {"name": format!("sim-node-{i}"), "labels": {"kubernetes.io/hostname": format!("sim-node-{i}"), "kubernetes.io/os": "linux"}},
                "spec": {},
            });
            if let Ok(created) = store.create(&nodes, "", node, MANAGER, false) {
                let name = created["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let _ = store.modify(&nodes, "", &name, Sub::Status, MANAGER, Op::Server, |cur, _| {
                    let mut n = cur.clone();
                    n["status"] = json!({"conditions": [condition("Ready", true)],
                        "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"},
                        "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"}});
                    Ok(n)
                });
            }
        }
        let held = Arc::new(Mutex::new(HashSet::new()));
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(run(store.clone(), config, held.clone(), stop_rx, controllers));
        Lifecycle { store, held, stop }
    }

    pub(crate) fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Keep a pod Pending (unscheduled) until released.
    pub fn hold_pending(&self, ns: &str, name: &str) {
        if let Ok(mut h) = self.held.lock() {
            h.insert((ns.to_string(), name.to_string()));
        }
    }

    /// Release a held pod.
    pub fn release(&self, ns: &str, name: &str) {
        if let Ok(mut h) = self.held.lock() {
            h.remove(&(ns.to_string(), name.to_string()));
        }
    }

    /// Make a pod fail (phase Failed, not ready).
    ///
    /// # Errors
    /// 404 when the pod is absent.
    pub fn fail(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        self.store
            .modify(&pods(), ns, name, Sub::Status, MANAGER, Op::Server, |cur, _| {
                let mut p = cur.clone();
                p["status"]["phase"] = "Failed".into();
                p["status"]["conditions"] =
                    json!([condition("Ready", false), condition("ContainersReady", false)]);
                Ok(p)
            })
            .map(drop)
    }

    /// Make a running pod ready or unready.
    ///
    /// # Errors
    /// 404 when the pod is absent.
    pub fn set_ready(&self, ns: &str, name: &str, ready: bool) -> Result<(), ApiError> {
        self.store
            .modify(&pods(), ns, name, Sub::Status, MANAGER, Op::Server, |cur, _| {
                let mut p = cur.clone();
                let ip = p
                    .pointer("/status/podIP")
                    .and_then(Value::as_str)
                    .unwrap_or("10.244.0.1")
                    .to_string();
                p["status"] = running_status(cur, ready, &ip);
                Ok(p)
            })
            .map(drop)
    }
}

async fn run(
    store: Arc<Store>,
    config: LifecycleConfig,
    held: Arc<Mutex<HashSet<(String, String)>>>,
    mut stop: watch::Receiver<bool>,
    controllers: Controllers,
) {
    let mut kubelet = Kubelet {
        store,
        config,
        held,
        seen: HashMap::new(),
        scheduled: HashMap::new(),
        terminating: HashMap::new(),
        next_node: 0,
        next_ip: 2,
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
            _ = stop.changed() => return,
        }
        if controllers.statefulsets {
            crate::statefulsets::sync(&kubelet.store);
        }
        if controllers.deployments {
            crate::deployments::sync(&kubelet.store);
        }
        kubelet.pass();
    }
}

/// The simulated scheduler and kubelet, and what they remember between passes (by pod uid).
struct Kubelet {
    store: Arc<Store>,
    config: LifecycleConfig,
    held: Arc<Mutex<HashSet<(String, String)>>>,
    /// When each pod was first seen.
    seen: HashMap<String, Instant>,
    /// When each pod was scheduled.
    scheduled: HashMap<String, Instant>,
    /// Terminating pods on our nodes: when the kubelet finishes each (uid → deadline).
    terminating: HashMap<String, Instant>,
    /// The node the next pod is bound to (round robin).
    next_node: usize,
    /// The next pod IP.
    next_ip: u32,
}

/// The node names a pod's required node affinity allows by `matchFields metadata.name In`
/// (the first term that has such a field, as a DaemonSet's or a pinned pod's), if any: the only
/// node affinity the simulated scheduler honours.
fn pinned_nodes(pod: &Value) -> Option<Vec<String>> {
    pod.pointer(
        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
    )?
    .as_array()?
    .iter()
    .flat_map(|t| t["matchFields"].as_array().cloned().unwrap_or_default())
    .find(|f| f["key"] == "metadata.name" && f["operator"] == "In")
    .map(|f| {
        f["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    })
}

impl Kubelet {
    /// Whether node `n` is one of the simulated nodes: `sim-node-<i>` made at start, or one a
    /// client made since under such a name (a node joining the cluster) while it exists.
    fn our_node(&self, n: &str) -> bool {
        let numbered = n.strip_prefix("sim-node-").and_then(|i| i.parse::<usize>().ok());
        let nodes = ResKey {
            group: String::new(),
            plural: "nodes".into(),
        };
        numbered.is_some() && self.store.get(&nodes, "", n).is_ok()
    }

    /// One pass over every pod: terminating pods finished, pending pods scheduled, scheduled
    /// pods started.
    fn pass(&mut self) {
        let Ok((items, _, _)) = self.store.list(&pods(), "", &|_| true, None, 0) else {
            return;
        };
        let now = Instant::now();
        let live: HashSet<String> = items
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .collect();
        self.seen.retain(|uid, _| live.contains(uid));
        self.scheduled.retain(|uid, _| live.contains(uid));
        self.terminating.retain(|uid, _| live.contains(uid));
        for pod in items {
            self.step(&pod, now);
        }
    }

    /// What the scheduler or the kubelet does next with `pod`.
    fn step(&mut self, pod: &Value, now: Instant) {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            self.terminate(pod, uid, &ns, &name, now);
            return;
        }
        if self
            .held
            .lock()
            .map(|h| h.contains(&(ns.clone(), name.clone())))
            .unwrap_or(false)
        {
            return;
        }
        let first = *self.seen.entry(uid.clone()).or_insert(now);
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .map(str::to_string);
        match node {
            None if now >= first + self.config.schedule_delay && self.config.nodes > 0 => {
                let pinned = pinned_nodes(pod);
                self.schedule(uid, &ns, &name, pinned.as_deref(), now);
            }
            Some(_) if pod.pointer("/status/phase").and_then(Value::as_str) == Some("Pending") => {
                let at = *self.scheduled.entry(uid).or_insert(now);
                if now >= at + self.config.ready_delay {
                    self.start_running(&ns, &name);
                }
            }
            _ => {}
        }
    }

    /// A terminating pod bound to one of our nodes: deleted for good once its (scaled) grace
    /// period has passed, as its kubelet does after stopping the containers.
    fn terminate(&mut self, pod: &Value, uid: String, ns: &str, name: &str, now: Instant) {
        let bound_here = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| self.our_node(n));
        if !bound_here {
            return;
        }
        let grace = pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            .max(0);
        let scaled = Duration::from_secs_f64(grace as f64 * self.config.grace_period_scale.max(0.0));
        let deadline = self.terminating.entry(uid.clone()).or_insert(now + scaled);
        // A shortened grace period (a second delete) brings the end forward.
        *deadline = (*deadline).min(now + scaled);
        if now >= *deadline && grace > 0 {
            // The kubelet has stopped the containers: it deletes the pod for good.
            let _ = self.store.delete(
                &pods(),
                ns,
                name,
                &DeleteOpts {
                    uid: Some(uid),
                    grace_period: Some(0),
                    ..Default::default()
                },
            );
        }
    }

    /// Bind a pending pod to the next node (round robin) and mark it scheduled.
    fn schedule(&mut self, uid: String, ns: &str, name: &str, pinned: Option<&[String]>, now: Instant) {
        let target = match pinned {
            // A pod pinned by name goes to the first of its nodes that is ours, or stays Pending.
            Some(names) => match names.iter().find(|n| self.our_node(n)) {
                Some(n) => n.clone(),
                None => return,
            },
            None => {
                self.next_node += 1;
                format!("sim-node-{}", (self.next_node - 1) % self.config.nodes)
            }
        };
        let bound = self.store.bind(ns, name, &target);
        if bound.is_ok() {
            let _ = self.store.modify(
                &pods(),
                ns,
                name,
                Sub::Status,
                "embedded-scheduler",
                Op::Server,
                |cur, _| {
                    let mut p = cur.clone();
                    p["status"]["conditions"] = json!([condition("PodScheduled", true)]);
                    Ok(p)
                },
            );
            self.scheduled.insert(uid, now);
        }
    }

    /// A scheduled pod becomes Running and Ready, with the next pod IP.
    fn start_running(&mut self, ns: &str, name: &str) {
        let ip = format!("10.244.{}.{}", self.next_ip / 250, self.next_ip % 250 + 1);
        self.next_ip += 1;
        let _ = self
            .store
            .modify(&pods(), ns, name, Sub::Status, MANAGER, Op::Server, |cur, _| {
                let mut p = cur.clone();
                p["status"] = running_status(cur, true, &ip);
                Ok(p)
            });
    }
}
