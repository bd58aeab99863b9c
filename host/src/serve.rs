//! The host's HTTP endpoints, on two listeners.
//!
//! * `--http-addr` (what Prometheus and the kubelet reach): `/healthz` and `/livez` (alive),
//!   `/readyz` (caches synced), `/metrics` (OpenMetrics when asked for, else Prometheus text
//!   0.0.4; see [`crate::metrics`]).
//! * `--admin-addr` (loopback by default, never in a Service): `/plugins` (JSON: the active
//!   builder per kind, refusals, the plugins directory) and `POST /plugins/reload` (rescan the
//!   plugins directory now; JSON report), plus `/healthz`.

use std::{
    convert::Infallible,
    fmt,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use crate::{
    metrics::{Exposition, counters, gauges, labels},
    plugins::{PluginRegistry, reload::ReloadHandle},
    reconcile::Handles,
};

/// What the endpoints serve.
#[derive(Clone)]
pub struct Endpoints {
    /// The running host.
    pub handles: Handles,
    /// The builder plugins.
    pub plugins: Arc<PluginRegistry>,
    /// The reloader, when a plugins directory is watched.
    pub reload: Option<ReloadHandle>,
    /// The metrics registry.
    pub exposition: Arc<Exposition>,
}

impl Endpoints {
    /// Endpoints of a running host.
    pub fn new(handles: Handles, plugins: Arc<PluginRegistry>, reload: Option<ReloadHandle>) -> Self {
        let state = HostState {
            handles: handles.clone(),
            plugins: plugins.clone(),
        };
        let exposition = Arc::new(Exposition::new(
            handles.metrics.clone(),
            handles.writes.clone(),
            plugins.reloads.stage_durations.clone(),
            Box::new(state),
        ));
        Endpoints {
            handles,
            plugins,
            reload,
            exposition,
        }
    }
}

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Health, readiness and metrics.
    Metrics,
    /// Plugin status and reloads.
    Admin,
}

fn text(code: StatusCode, body: impl Into<String>) -> (StatusCode, String, &'static str) {
    (code, body.into(), "text/plain; charset=utf-8")
}

fn json(v: &serde_json::Value) -> (StatusCode, String, &'static str) {
    (
        StatusCode::OK,
        serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
        "application/json",
    )
}

async fn answer(
    e: &Endpoints,
    listener: Listener,
    req: &Request<Incoming>,
) -> (StatusCode, String, &'static str) {
    let h = &e.handles;
    match (listener, req.method(), req.uri().path()) {
        (_, _, "/healthz" | "/livez") => text(StatusCode::OK, "ok\n"),
        (Listener::Metrics, _, "/readyz") if h.ready.load(Ordering::SeqCst) => text(StatusCode::OK, "ok\n"),
        (Listener::Metrics, _, "/readyz") => text(StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n"),
        (Listener::Metrics, _, "/metrics") => {
            let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok());
            let (body, content_type) = e.exposition.render(accept);
            (StatusCode::OK, body, content_type)
        }
        (Listener::Admin, _, "/plugins") => json(&e.plugins.status_json()),
        (Listener::Admin, &Method::POST, "/plugins/reload") => match &e.reload {
            Some(r) => match r.rescan().await {
                Some(report) => json(&serde_json::to_value(report).unwrap_or_default()),
                None => text(StatusCode::SERVICE_UNAVAILABLE, "the reloader stopped\n"),
            },
            None => text(
                StatusCode::CONFLICT,
                "no plugins directory is watched: start `run` with --plugins-dir\n",
            ),
        },
        (Listener::Admin, _, "/plugins/reload") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "use POST /plugins/reload\n")
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Serve one listener's endpoints until the task is dropped; the task and the address bound
/// (`addr` with port 0 binds a free one).
///
/// # Errors
/// When the address can't be bound.
pub async fn serve(
    addr: SocketAddr,
    listener: Listener,
    endpoints: Endpoints,
) -> std::io::Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let socket = tokio::net::TcpListener::bind(addr).await?;
    let what = match listener {
        Listener::Metrics => "/healthz, /readyz, /metrics",
        Listener::Admin => "/plugins, POST /plugins/reload (admin)",
    };
    let bound = socket.local_addr()?;
    tracing::info!(addr = %bound, "serving {what}");
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = socket.accept().await else {
                continue;
            };
            let e = endpoints.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let e = e.clone();
                    async move {
                        let (code, body, content_type) = answer(&e, listener, &req).await;
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        *r.status_mut() = code;
                        r.headers_mut().insert(
                            header::CONTENT_TYPE,
                            header::HeaderValue::from_static(content_type),
                        );
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((task, bound))
}

/// What `/metrics` reads at each scrape: the host's state (readiness, leadership, pending
/// expectations) and the plugin registry's (active builders, swaps, reload results). The
/// counters and histograms are recorded as they happen ([`crate::metrics`]).
struct HostState {
    handles: Handles,
    plugins: Arc<PluginRegistry>,
}

impl fmt::Debug for HostState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostState").finish_non_exhaustive()
    }
}

impl HostState {
    /// The host's own gauges.
    fn encode_host(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let h = &self.handles;
        gauges(
            e,
            "build_info",
            "The host's version, contract version and wasmtime version (value 1)",
            [(
                labels(&[
                    ("version", env!("CARGO_PKG_VERSION")),
                    ("contract", crate::plugins::CONTRACT_VERSION),
                    ("wasmtime", crate::plugins::WASMTIME_VERSION),
                ]),
                1i64,
            )],
        )?;
        gauges(
            e,
            "ready",
            "1 when every cache has synced",
            [(Vec::new(), i64::from(h.ready.load(Ordering::SeqCst)))],
        )?;
        gauges(
            e,
            "leader",
            "1 while this replica leads (always 1 without leader election); client-go's leader_election_master_status",
            [(Vec::new(), i64::from(h.leader.may_write()))],
        )?;
        gauges(
            e,
            "expectations_pending",
            "Pod creations and deletions awaited in the watch",
            [(Vec::new(), h.expectations.total_pending())],
        )?;
        counters(
            e,
            "slurm_requests",
            "Requests sent to the Controllers' slurmrestd (node lists, drains, pings)",
            [(Vec::new(), h.slurm.requests())],
        )?;
        let requests = h.api_requests.snapshot();
        counters(
            e,
            "api_requests",
            "Requests sent to the Kubernetes API server, by verb (HTTP method) and resource (client-go's rest_client_requests_total)",
            requests
                .iter()
                .map(|((verb, resource), n)| (labels(&[("verb", verb), ("resource", resource)]), *n)),
        )
    }

    /// The plugin registry's gauges and counters.
    fn encode_plugins(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let kinds = crate::plugins::bundled::KINDS;
        gauges(
            e,
            "plugin_optimized",
            "1 when the active plugin of a builder kind runs Cranelift code, 0 while it runs Winch (baseline) code",
            kinds.iter().map(|&kind| {
                let tier = self.plugins.active(kind).tier();
                (
                    labels(&[("kind", kind.as_str())]),
                    i64::from(tier == crate::plugins::Tier::Optimized),
                )
            }),
        )?;
        gauges(
            e,
            "builder_info",
            "The active builder plugin of each kind (value 1)",
            kinds.iter().map(|&kind| {
                let a = self.plugins.active_info(kind);
                (
                    labels(&[
                        ("kind", kind.as_str()),
                        ("name", &a.name),
                        ("version", &a.version),
                        ("digest", &a.digest),
                        ("source", &a.source),
                    ]),
                    1i64,
                )
            }),
        )?;
        counters(
            e,
            "builder_swaps",
            "Builder swaps by kind (hot reloads that took over, fallbacks included)",
            kinds
                .iter()
                .map(|&kind| (labels(&[("kind", kind.as_str())]), self.plugins.swaps(kind))),
        )?;
        let logs = self.plugins.engine().guest_log_counts();
        counters(
            e,
            "plugin_log_lines",
            "Log lines builder plugins wrote (the log import), by plugin name and level",
            logs.iter().flat_map(|c| {
                c.lines.iter().map(|(level, n)| {
                    (
                        labels(&[("plugin", c.plugin.as_str()), ("level", level.as_str())]),
                        *n,
                    )
                })
            }),
        )?;
        counters(
            e,
            "plugin_log_dropped",
            "Log lines of builder plugins dropped (past 32 a call or the per-plugin rate limit), by plugin name",
            logs.iter()
                .map(|c| (labels(&[("plugin", c.plugin.as_str())]), c.dropped)),
        )?;
        counters(
            e,
            "plugin_calls_waited",
            "Builder calls that waited for one of the --plugin-concurrency slots",
            std::iter::once((labels(&[]), self.plugins.engine().calls_waited())),
        )?;
        counters(
            e,
            "plugin_reloads",
            "Plugin file versions considered by the reloader, by result (swapped, refused, unchanged)",
            self.plugins
                .reloads
                .results
                .lock()
                .map(|m| m.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|(r, n)| (labels(&[("result", r)]), n)),
        )
    }
}

impl Collector for HostState {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.encode_host(&mut e)?;
        self.encode_plugins(&mut e)
    }
}
