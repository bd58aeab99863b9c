//! # slinky-apiserver
//!
//! An embedded Kubernetes API server: real HTTP on loopback, real semantics, fault injection.
//!
//! It serves `run --embedded`, every integration test and the benchmarks, so the host is always
//! exercised through the real kube client (list/watch, resourceVersions, 409s, 410s); `kubectl`
//! works against it too. It is a small, honest API server, not a mock: what it does not support is
//! refused with a proper `Status` error. See `docs/embedded-apiserver.md` for the list of what it
//! does and does not do.

mod cel;
mod convert;
mod deployments;
mod faults;
mod http;
mod lifecycle;
mod patch;
use slinky_protobuf as protobuf;
mod recorder;
mod resources;
mod schema;
mod selectors;
mod statefulsets;
mod store;
pub mod testing;
mod tls;
mod validation;

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch};

pub use faults::{Decision, FaultError, FaultRule, Faults, Times};
pub use lifecycle::LifecycleConfig;
pub use resources::{ResKey, ResourceType};
pub use selectors::{FieldSelector, LabelSelector};
pub use store::{DeleteOpts, Store};

/// An API error, sent as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` (`NotFound`, `Conflict`, `AlreadyExists`, `Invalid`, …).
    pub reason: String,
    /// The message.
    pub message: String,
    /// `details`.
    pub details: Option<Value>,
    /// `Retry-After` seconds.
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// An error with a code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// Add `details` naming the object.
    pub fn with_details(mut self, rt: &ResourceType, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": rt.group, "kind": rt.plural}));
        self
    }

    /// 404 NotFound for an object.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(rt, name)
    }

    /// 409 Conflict for a stale resourceVersion.
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                rt.qualified()
            ),
        )
        .with_details(rt, name)
    }

    /// 422 Invalid with causes `(field, message)`.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<(&str, String)>) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let kind = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let text = match text.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut e = Self::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {text}"));
        e.details = Some(json!({
            "name": name, "group": rt.group, "kind": rt.kind,
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
        }));
        e
    }

    /// 410 Gone for a compacted resourceVersion.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if let Some(r) = self.retry_after {
            s["details"]["retryAfterSeconds"] = r.into();
        }
        s
    }
}

/// Settings of the embedded API server.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Address to listen on (port 0 picks a free one).
    pub addr: SocketAddr,
    /// The bearer token clients must send.
    pub token: String,
    /// Events kept for watches (older resourceVersions get 410 Gone).
    pub watch_window: usize,
    /// Seed of the fault-injection RNG.
    pub fault_seed: u64,
    /// Simulated pod lifecycle (scheduling and readiness), off when `None`.
    pub lifecycle: Option<LifecycleConfig>,
    /// With the lifecycle simulation: a simulated StatefulSet controller makes and replaces the
    /// pods of StatefulSets (see `statefulsets.rs`). Off by default (tests count their pods);
    /// on for `slinky-host apiserver` and `run --embedded`.
    pub statefulsets: bool,
    /// With the lifecycle simulation: a simulated deployment controller and replica set
    /// controller give Deployments their ReplicaSets and the ReplicaSets their pods (see
    /// `deployments/`). Off by default (tests count their pods); on for `slinky-host apiserver`
    /// and `run --embedded`.
    pub deployments: bool,
    /// Serve HTTPS (a CA generated at start; kubectl only sends tokens over TLS). Plain HTTP
    /// when false.
    pub tls: bool,
    /// Persist the store here (snapshot + write-ahead log); memory only when `None`.
    pub state_dir: Option<std::path::PathBuf>,
    /// The `SidecarContainers` feature gate of Kubernetes 1.28 (alpha there, off by default; on
    /// from 1.29). On by default here. Off, the server drops the `restartPolicy` of init
    /// containers (native sidecars) from pods and pod templates, unless the object it updates
    /// already had one, as kube-apiserver 1.28 does: a sidecar then runs as a plain init
    /// container, which on a real kubelet never ends and holds the pod in `Init`.
    pub sidecar_containers: bool,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        ApiServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: random_token(),
            watch_window: 10_000,
            fault_seed: 0,
            lifecycle: None,
            statefulsets: false,
            deployments: false,
            tls: true,
            state_dir: None,
            sidecar_containers: true,
        }
    }
}

/// 128 random bits as hex (from the OS-seeded hasher keys of `RandomState`).
pub(crate) fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

fn random_token() -> String {
    random_hex()
}

/// Shared state of the running server.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Arc<Store>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) token: String,
    pub(crate) addr: SocketAddr,
    pub(crate) tls: Option<tls::Tls>,
    /// Every distinct (user agent, verb, group, resource) requested: an audit of who used what.
    pub(crate) audit: std::sync::Mutex<std::collections::BTreeSet<AuditRecord>>,
}

/// One distinct kind of request the server received (see [`ApiServer::audit`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditRecord {
    /// The client's `User-Agent` up to the first `/` (`unknown` when absent).
    pub user_agent: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`).
    pub verb: String,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource, with `/subresource` when one was addressed.
    pub resource: String,
}

/// A running embedded API server. Dropping it (or [`ApiServer::shutdown`]) stops it.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    lifecycle: Option<lifecycle::Lifecycle>,
}

impl ApiServer {
    /// Start serving on the configured address.
    ///
    /// # Errors
    /// When the address can't be bound.
    pub async fn start(config: ApiServerConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(config.addr).await?;
        let addr = listener.local_addr()?;
        let tls = if config.tls {
            Some(tls::generate().map_err(std::io::Error::other)?)
        } else {
            None
        };
        let store = Store::open(config.watch_window, config.state_dir.as_deref())?;
        store.set_sidecar_containers(config.sidecar_containers);
        let shared = Arc::new(Shared {
            store,
            faults: Arc::new(Faults::new(config.fault_seed)),
            token: config.token.clone(),
            addr,
            tls,
            audit: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(http::serve(listener, shared.clone(), stop_rx));
        let controllers = lifecycle::Controllers {
            statefulsets: config.statefulsets,
            deployments: config.deployments,
        };
        let lifecycle = config
            .lifecycle
            .map(|lc| lifecycle::Lifecycle::start(shared.store.clone(), lc, controllers));
        tracing::info!(%addr, "embedded API server listening");
        Ok(ApiServer {
            shared,
            stop,
            task: Some(task),
            lifecycle,
        })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `https://127.0.0.1:PORT` (or `http://` without TLS).
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// The CA certificate (PEM) clients must trust, when serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.shared.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// The bearer token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The store (for tests and the lifecycle simulation).
    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    /// Every distinct kind of resource request received so far, with the client's user agent:
    /// what a client needs RBAC for.
    pub fn audit(&self) -> Vec<AuditRecord> {
        self.shared
            .audit
            .lock()
            .map(|a| a.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.shared.faults
    }

    /// The pod lifecycle simulation, when on.
    pub fn lifecycle(&self) -> Option<&lifecycle::Lifecycle> {
        self.lifecycle.as_ref()
    }

    /// A kubeconfig (YAML) for this server, with token auth.
    pub fn kubeconfig_yaml(&self) -> String {
        use base64::Engine;
        let ca = self
            .ca_pem()
            .map(|pem| {
                format!(
                    "    certificate-authority-data: {}\n",
                    base64::engine::general_purpose::STANDARD.encode(pem)
                )
            })
            .unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: slinky-embedded\n  cluster:\n    server: {}\n{ca}\
             users:\n- name: slinky-embedded\n  user:\n    token: {}\ncontexts:\n- name: slinky-embedded\n  context:\n    \
             cluster: slinky-embedded\n    user: slinky-embedded\n    namespace: default\ncurrent-context: slinky-embedded\n",
            self.url(),
            self.token()
        )
    }

    /// Write the kubeconfig to `path` (mode 0600).
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.kubeconfig_yaml())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(())
    }

    /// A kube client for this server.
    ///
    /// # Errors
    /// When the client can't be built.
    #[allow(
        clippy::expect_used,
        reason = "a loopback socket address always forms a valid URI"
    )]
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        let uri: ::http::Uri = self
            .url()
            .parse()
            .expect("http://<socket address> is a valid URI");
        let mut config = kube::Config::new(uri);
        config.auth_info.token = Some(self.token().to_string().into());
        config.root_cert = self.shared.tls.as_ref().map(|t| vec![t.ca_der.clone()]);
        config.read_timeout = Some(Duration::from_secs(330));
        kube::Client::try_from(config)
    }

    /// Stop serving (open watches end).
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(lc) = &self.lifecycle {
            lc.stop();
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(lc) = &self.lifecycle {
            lc.stop();
        }
    }
}
