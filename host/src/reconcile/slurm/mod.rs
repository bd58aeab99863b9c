//! The host's line to Slurm: one slurmrestd client per Controller ([`slinky_slurm::Client`]),
//! found and authenticated the way Slinky does it, and the node list a pass acts on.
//!
//! # Guarantees
//! * A Controller's slurmrestd is the `--slurmrestd-url` given for it (or for every Controller),
//!   else the Service of the oldest RestApi that references it, `http://<restapi>-restapi.<ns>:6820`
//!   (as Slinky; the port is the RestApi's `spec.service.port` if set), else
//!   `http://<controller>-restapi.<namespace>:6820` while that Service exists (a slurmrestd this
//!   host does not build, named as Slinky's Helm chart names it). Without any, the Controller's Slurm is
//!   [`Reach::Off`]: its NodeSets behave as Slinky's without a Slurm client (pods are deleted
//!   without a drain) and say so in their status, except those that had a slurmrestd before:
//!   for them no slurmrestd is an unreachable one (closed stays closed, see
//!   `nodeset::drain`).
//! * With a slurmrestd, Slurm is **fail-closed**: when it cannot be asked (no JWT key, no
//!   answer within the deadline, a refused token, an unknown data parser), [`Reach::Failed`]
//!   names the cause and the callers delete nothing that could run a job.
//! * The tokens are HS256 JWTs signed with the Controller's `jwtKeyRef` (read by name, RBAC
//!   `get`), for the Slurm user `slurm`, valid 15 minutes and renewed at 80 %. A client is
//!   rebuilt when its URL or key changes, and the key is re-read at most once a minute.
//! * At most one node list per Controller per [`NODES_TTL`] (10 s): every NodeSet of a Controller
//!   shares it, so the steady request rate stays flat with the NodeSet count. A drain or undrain forgets it, so the next pass reads what it
//!   did. A pass about to delete a pod reads a fresh one ([`Cluster::fresh_nodes`]): a delete is
//!   never decided on a list older than the pass. Once the nodes have not changed for
//!   [`NODES_QUIET`], reads ask with the time of the last whole list (`update_time`): an
//!   unchanged list is a 304 without a body; a whole list at least every [`NODES_WHOLE_EVERY`],
//!   and within [`NODES_TTL`] before a delete.
//! * Drains and undrains of several nodes go in one request (a host list).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use slinky_api::{Controller, RestApi};
use slinky_slurm::{Client, NodeUpdate, jwt::Tokens};

use super::{Caches, core::locked};

mod node_list;

use node_list::Listed;

/// How long a node list is shared between passes: at steady state a Controller's slurmrestd is
/// asked for its nodes at most once in this, whatever its NodeSet count (the passes of
/// [`super::nodeset::PROTECT_INTERVAL`] share it); every decision to delete reads a fresh one.
pub const NODES_TTL: Duration = Duration::from_secs(10);
/// How long the nodes must not have changed before a list is read with the time of the last
/// one (a 304 while nothing changed).
pub const NODES_QUIET: Duration = Duration::from_secs(30);
/// A whole node list at least this often, whatever the 304s say (a failover to a slurmctld
/// whose clock is behind must not hide changes for longer). A decision to delete a pod asks a
/// 304 only within [`NODES_TTL`] of a whole list.
pub const NODES_WHOLE_EVERY: Duration = Duration::from_secs(60);
/// How long a job list (the busy nodes' deadlines) is used: jobs' end times change when jobs
/// start and end, and only order which busy node a scale-in drains first.
pub const JOBS_TTL: Duration = Duration::from_secs(10);

/// When each busy node's jobs end, by node name.
pub type Deadlines = HashMap<String, slinky_slurm::Deadline>;
/// How long a client's key is trusted before the Secret is read again.
const KEY_TTL: Duration = Duration::from_secs(60);
/// The Slurm user the host's tokens are for (`SlurmUser` of the generated slurm.conf).
pub const SLURM_USER: &str = "slurm";
/// slurmrestd's port in Slinky's RestApi Service.
pub const RESTAPI_PORT: u16 = 6820;

/// Why a Controller's Slurm cannot be asked now: `(reason, message)` for an Event and a
/// condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// `SlurmUnreachable`, `SlurmUnauthorized`, `SlurmRefused`, `SlurmNotConfigured`.
    pub reason: &'static str,
    /// What happened and how to fix it.
    pub message: String,
}

impl Unavailable {
    /// From a client error.
    pub fn of(e: &slinky_slurm::Error) -> Unavailable {
        use slinky_slurm::Error as E;
        let reason = match e {
            E::Unreachable { .. } | E::Timeout { .. } => "SlurmUnreachable",
            E::Unauthorized { .. } => "SlurmUnauthorized",
            E::Url { .. } | E::NoVersion { .. } | E::Unsupported { .. } => "SlurmNotConfigured",
            E::Slurm { .. } | E::Http { .. } | E::Parse { .. } => "SlurmRefused",
        };
        Unavailable {
            reason,
            message: e.to_string(),
        }
    }
}

/// A Controller's Slurm, as a pass may ask it.
#[derive(Clone)]
pub enum Reach {
    /// No slurmrestd is configured for this Controller.
    Off,
    /// One is configured but cannot be asked: nothing that could run a job is deleted.
    Failed(Unavailable),
    /// Ask it.
    On(Arc<Cluster>),
}

/// One Controller's slurmrestd client and its shared node list.
pub struct Cluster {
    client: Client,
    /// When its key was last read and found the same.
    checked: Mutex<Instant>,
    nodes: tokio::sync::Mutex<Listed>,
    /// When each busy node's jobs end, read at most once per [`JOBS_TTL`].
    deadlines: tokio::sync::Mutex<Option<(Instant, Arc<Deadlines>)>>,
    /// Nodes Slurm did not list while their pods ran: name → (the pod's UID, when first found
    /// missing), forgotten once a list names them again; a new pod of the same name starts its
    /// own clock. In memory only: a host restarted counts afresh, which only waits longer.
    missing: Mutex<HashMap<String, (String, Instant)>>,
}

impl Cluster {
    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// When each busy node's jobs end (the job list, at most once per [`JOBS_TTL`]).
    ///
    /// # Errors
    /// Slurm could not be asked.
    pub async fn deadlines(&self) -> Result<Arc<Deadlines>, Unavailable> {
        let mut held = self.deadlines.lock().await;
        if let Some((at, d)) = held.as_ref()
            && at.elapsed() < JOBS_TTL
        {
            return Ok(d.clone());
        }
        let jobs = self.client.jobs().await.map_err(|e| Unavailable::of(&e))?;
        let d = Arc::new(slinky_slurm::deadlines(&jobs));
        *held = Some((Instant::now(), d.clone()));
        Ok(d)
    }

    /// The ids of the jobs pending in `partition`, on a fresh job list.
    ///
    /// # Errors
    /// Slurm could not be asked.
    pub async fn pending_in(&self, partition: &str) -> Result<Vec<u64>, Unavailable> {
        let jobs = self.client.jobs().await.map_err(|e| Unavailable::of(&e))?;
        Ok(jobs
            .iter()
            .filter(|j| j.is_pending() && j.in_partition(partition))
            .map(|j| j.job_id)
            .collect())
    }

    /// Delete the record of `node` (a worker gone for good).
    ///
    /// # Errors
    /// Why Slurm did not do it.
    pub async fn delete_node(&self, node: &str) -> Result<(), Unavailable> {
        let r = self.client.delete_node(node).await;
        self.forget_nodes().await;
        r.map_err(|e| Unavailable::of(&e))
    }

    /// Drain `node` with `reason` (prefixed with [`slinky_slurm::REASON_PREFIX`]).
    ///
    /// # Errors
    /// Why Slurm did not do it.
    pub async fn drain(&self, node: &str, reason: &str) -> Result<(), Unavailable> {
        only(self.drain_nodes(&[node.to_string()], reason).await)
    }

    /// Drain every node of `nodes` with `reason` (prefixed with
    /// [`slinky_slurm::REASON_PREFIX`]): one request for all of them. Returns the nodes drained
    /// and why the others were not.
    pub async fn drain_nodes(&self, nodes: &[String], reason: &str) -> (Vec<String>, Option<Unavailable>) {
        let reason = format!("{} {reason}", slinky_slurm::REASON_PREFIX);
        self.update(nodes, NodeUpdate::Drain(&reason)).await
    }

    /// Mark `node` DRAIN with `reason` as it is (someone else's reason, given back).
    ///
    /// # Errors
    /// Why Slurm did not do it.
    pub async fn drain_as_is(&self, node: &str, reason: &str) -> Result<(), Unavailable> {
        only(self.update(&[node.to_string()], NodeUpdate::Drain(reason)).await)
    }

    /// Set the reason of `node`, DOWN, to `reason` as it is (someone else's, given back): only
    /// for a node that is DOWN already (Slurm kills the jobs of a node marked DOWN).
    ///
    /// # Errors
    /// Why Slurm did not do it.
    pub async fn down_as_is(&self, node: &str, reason: &str) -> Result<(), Unavailable> {
        only(self.update(&[node.to_string()], NodeUpdate::Down(reason)).await)
    }

    /// Undrain `node` (`resume` too when it is DOWN by the host's reason).
    ///
    /// # Errors
    /// Why Slurm did not do it.
    pub async fn undrain(&self, node: &str, resume: bool) -> Result<(), Unavailable> {
        only(self.undrain_nodes(&[node.to_string()], resume).await)
    }

    /// Undrain every node of `nodes` (`resume` when they are DOWN by the host's reason): one
    /// request for all of them. Returns the nodes undrained and why the others were not.
    pub async fn undrain_nodes(&self, nodes: &[String], resume: bool) -> (Vec<String>, Option<Unavailable>) {
        let update = if resume {
            NodeUpdate::Resume
        } else {
            NodeUpdate::Undrain
        };
        self.update(nodes, update).await
    }

    /// `update` on `nodes` in one request; the node list is read again at the next ask.
    async fn update(&self, nodes: &[String], update: NodeUpdate<'_>) -> (Vec<String>, Option<Unavailable>) {
        let (done, error) = self.client.update_nodes(nodes, update).await;
        self.forget_nodes().await;
        (done, error.map(|e| Unavailable::of(&e)))
    }
}

/// The outcome of an update of one node.
fn only((_, error): (Vec<String>, Option<Unavailable>)) -> Result<(), Unavailable> {
    error.map_or(Ok(()), Err)
}

/// `--slurmrestd-url` values.
#[derive(Debug, Clone, Default)]
struct Urls {
    /// `namespace/controller` → URL.
    exact: HashMap<String, String>,
    /// For every Controller without an exact one.
    all: Option<String>,
}

impl Urls {
    fn parse(values: &[String]) -> Urls {
        let mut urls = Urls::default();
        for v in values {
            match v.split_once('=') {
                Some((key, url)) if !key.contains("://") => {
                    urls.exact.insert(key.trim().to_string(), url.trim().to_string());
                }
                _ => urls.all = Some(v.trim().to_string()),
            }
        }
        urls
    }
}

/// The Slurm clients of every Controller.
pub struct SlurmClients {
    kube: kube::Client,
    urls: Urls,
    timeout: Duration,
    clusters: Mutex<HashMap<String, (String, Arc<Cluster>)>>,
    /// Requests of the clients replaced or forgotten since the start.
    retired: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SlurmClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmClients")
            .field("urls", &self.urls)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SlurmClients {
    /// Clients made with `kube` (to read JWT keys), the `--slurmrestd-url` values and a deadline
    /// per call.
    pub fn new(kube: kube::Client, urls: &[String], timeout: Duration) -> SlurmClients {
        SlurmClients {
            kube,
            urls: Urls::parse(urls),
            timeout,
            clusters: Mutex::new(HashMap::new()),
            retired: Default::default(),
        }
    }

    /// Where `c`'s slurmrestd is, if anywhere; `Err` (why Slurm cannot be asked) for a RestApi
    /// whose Service does not exist (yet).
    fn url_of(&self, c: &Controller, caches: &Caches) -> Option<Result<String, String>> {
        let ns = c.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", c.name_any());
        if let Some(url) = self.urls.exact.get(&key).or(self.urls.all.as_ref()) {
            return Some(Ok(url.clone()));
        }
        let services = &caches.children.services;
        if let Some(r) = oldest_restapi(&caches.restapis, &ns, &c.name_any()) {
            let service = r.restapi_key();
            if services.get(&ObjectRef::new(&service).within(&ns)).is_none() {
                return Some(Err(format!(
                    "RestApi {ns}/{} serves Controller {}, but its Service {service} does not exist \
                     (yet): see the RestApi's conditions",
                    r.name_any(),
                    c.name_any()
                )));
            }
            let port = r.spec.service.port.unwrap_or(i32::from(RESTAPI_PORT));
            return Some(Ok(format!("http://{service}.{ns}:{port}")));
        }
        let service = format!("{}-restapi", c.name_any());
        services
            .get(&ObjectRef::new(&service).within(&ns))
            .map(|_| Ok(format!("http://{service}.{ns}:{RESTAPI_PORT}")))
    }

    /// `c`'s Slurm: its client, or why there is none.
    pub async fn reach(&self, c: &Controller, caches: &Caches) -> Reach {
        let url = match self.url_of(c, caches) {
            None => return Reach::Off,
            Some(Err(message)) => {
                return Reach::Failed(Unavailable {
                    reason: "SlurmUnreachable",
                    message,
                });
            }
            Some(Ok(url)) => url,
        };
        let key = format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any());
        let held = locked(&self.clusters, |m| {
            m.get(&key)
                .filter(|(held_url, _)| *held_url == url)
                .map(|(_, cluster)| cluster.clone())
        });
        if let Some(cluster) = &held
            && locked(&cluster.checked, |at| at.elapsed()) < KEY_TTL
        {
            return Reach::On(cluster.clone());
        }
        let jwt = match self.jwt_key(c).await {
            Ok(k) => k,
            Err(message) => {
                return Reach::Failed(Unavailable {
                    reason: "SlurmNotConfigured",
                    message,
                });
            }
        };
        if let Some(cluster) = held
            && cluster.client.tokens().signs_with(&jwt)
        {
            // Same URL and key: keep the client (and the data parser it agreed on).
            locked(&cluster.checked, |at| *at = Instant::now());
            return Reach::On(cluster);
        }
        match Client::new(
            &url,
            Tokens::new(jwt, SLURM_USER, slinky_slurm::jwt::LIFETIME),
            self.timeout,
        ) {
            Ok(client) => {
                let cluster = Arc::new(Cluster {
                    client,
                    checked: Mutex::new(Instant::now()),
                    nodes: tokio::sync::Mutex::default(),
                    deadlines: tokio::sync::Mutex::new(None),
                    missing: Mutex::new(HashMap::new()),
                });
                if let Some((_, old)) = locked(&self.clusters, |m| m.insert(key, (url, cluster.clone()))) {
                    self.retire(&old);
                }
                Reach::On(cluster)
            }
            Err(e) => Reach::Failed(Unavailable::of(&e)),
        }
    }

    /// Requests sent to every Controller's slurmrestd since the start (`slurm_requests_total`).
    pub fn requests(&self) -> u64 {
        let current: u64 = locked(&self.clusters, |m| {
            m.values().map(|(_, c)| c.client.requests()).sum()
        });
        current + self.retired.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn retire(&self, old: &Cluster) {
        self.retired
            .fetch_add(old.client.requests(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Forget `namespace/name`'s client (the Controller is gone).
    pub fn forget(&self, key: &str) {
        if let Some((_, old)) = locked(&self.clusters, |m| m.remove(key)) {
            self.retire(&old);
        }
    }

    /// The bytes of `c`'s JWT key, or what is missing.
    async fn jwt_key(&self, c: &Controller) -> Result<Vec<u8>, String> {
        let ns = c.namespace().unwrap_or_default();
        let Some(r) = c.spec.jwt_key_ref.as_ref() else {
            return Err(format!(
                "Controller {ns}/{} has no jwtKeyRef: the host signs its slurmrestd tokens with \
                 the cluster's JWT key; set spec.jwtKeyRef to the Secret slurmctld reads as jwt.key",
                c.name_any()
            ));
        };
        let api: Api<Secret> = Api::namespaced(self.kube.clone(), &ns);
        let secret = api
            .get_opt(&r.name)
            .await
            .map_err(|e| format!("cannot read Secret {ns}/{} (jwtKeyRef): {e}", r.name))?
            .ok_or_else(|| format!("Secret {ns}/{} (jwtKeyRef) does not exist", r.name))?;
        slinky_api::contract::secret_value(&secret, &r.key)
            .filter(|b| !b.is_empty())
            .ok_or_else(|| format!("Secret {ns}/{} (jwtKeyRef) has no key {:?}", r.name, r.key))
    }
}

/// The Slurm node name of a worker pod: its hostname (Slinky's `<template hostname><ordinal>`),
/// else its name.
pub fn node_name(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.name_any())
}

/// The oldest RestApi of namespace `ns` that references the Controller `controller` (by
/// creation time, then name; being deleted ones left out): the one whose slurmrestd Slinky talks to.
fn oldest_restapi(store: &Store<RestApi>, ns: &str, controller: &str) -> Option<Arc<RestApi>> {
    store
        .state()
        .into_iter()
        .filter(|r| r.namespace().as_deref() == Some(ns) && r.spec.controller_ref.name == controller)
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| {
            let at = |r: &RestApi| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
            at(a).cmp(&at(b)).then_with(|| a.name_any().cmp(&b.name_any()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_for_one_controller_or_for_all() {
        let urls = Urls::parse(&[
            "http://10.0.0.1:6820".into(),
            "slurm/big=http://big-restapi.slurm:6820".into(),
        ]);
        assert_eq!(urls.all.as_deref(), Some("http://10.0.0.1:6820"));
        assert_eq!(
            urls.exact.get("slurm/big").map(String::as_str),
            Some("http://big-restapi.slurm:6820")
        );
        // A URL whose query holds `=` is still a URL for all.
        let urls = Urls::parse(&["http://h:6820/?a=b".into()]);
        assert_eq!(urls.all.as_deref(), Some("http://h:6820/?a=b"));
        assert!(urls.exact.is_empty());
    }

    /// Slinky's rule: the oldest RestApi of the Controller (then by name), never one being deleted
    /// or another Controller's or namespace's.
    #[test]
    fn the_oldest_restapi_of_the_controller_serves_it() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let (store, mut writer) = kube::runtime::reflector::store::<RestApi>();
        let restapi = |name: &str, ns: &str, controller: &str, created: i64, deleting: bool| {
            let mut r = RestApi::new(name, Default::default());
            r.metadata.namespace = Some(ns.into());
            r.metadata.uid = Some(format!("{ns}-{name}"));
            r.spec.controller_ref.name = controller.into();
            let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default());
            r.metadata.creation_timestamp = Some(at(created));
            r.metadata.deletion_timestamp = deleting.then(|| at(created + 1));
            r
        };
        for r in [
            restapi("young", "slurm", "slurm", 300, false),
            restapi("b-old", "slurm", "slurm", 100, false),
            restapi("a-old", "slurm", "slurm", 100, false),
            restapi("oldest-going", "slurm", "slurm", 10, true),
            restapi("other-controller", "slurm", "big", 1, false),
            restapi("other-namespace", "elsewhere", "slurm", 1, false),
        ] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(r));
        }
        let pick = |ns: &str, c: &str| oldest_restapi(&store, ns, c).map(|r| r.name_any());
        assert_eq!(pick("slurm", "slurm").as_deref(), Some("a-old"));
        assert_eq!(pick("slurm", "big").as_deref(), Some("other-controller"));
        assert_eq!(pick("slurm", "none"), None);
    }

    #[test]
    fn unavailable_names_the_cause() {
        let e = slinky_slurm::Error::Timeout {
            url: "http://x".into(),
            after: Duration::from_secs(5),
        };
        assert_eq!(Unavailable::of(&e).reason, "SlurmUnreachable");
        let e = slinky_slurm::Error::Unauthorized {
            url: "http://x".into(),
            status: 401,
            message: String::new(),
        };
        assert_eq!(Unavailable::of(&e).reason, "SlurmUnauthorized");
    }
}
