//! The host's HTTP endpoints: `/healthz` (alive), `/readyz` (caches synced), `/metrics`
//! (Prometheus text), `/plugins` (JSON: the active builder per kind, refusals, the plugins
//! directory) and `POST /plugins/reload` (rescan the plugins directory now; JSON report).

use std::{convert::Infallible, fmt::Write as _, net::SocketAddr, sync::atomic::Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;

use crate::{
    plugins::{PluginRegistry, reload::ReloadHandle},
    reconcile::Handles,
};

/// What the endpoints serve.
#[derive(Clone)]
pub struct Endpoints {
    /// The running host.
    pub handles: Handles,
    /// The builder plugins.
    pub plugins: std::sync::Arc<PluginRegistry>,
    /// The reloader, when a plugins directory is watched.
    pub reload: Option<ReloadHandle>,
}

/// Prometheus text being written: a family's `# HELP`/`# TYPE`, then its samples.
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; label values are escaped as the format requires.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| {
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                format!("{k}=\"{v}\"")
            })
            .collect();
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{}}} {value}", labels.join(","));
        }
    }

    /// A summary's `_sum` and `_count`.
    fn summary(&mut self, name: &str, labels: &[(&str, &str)], sum: f64, count: u64) {
        self.sample(&format!("{name}_sum"), labels, format!("{sum:.6}"));
        self.sample(&format!("{name}_count"), labels, count);
    }
}

/// Prometheus text for the plugin registry: the active builders and reloads.
pub fn plugin_metrics_text(out: &mut String, plugins: &PluginRegistry) {
    let mut t = Text(std::mem::take(out));
    let kinds = crate::plugins::bundled::KINDS;
    t.family(
        "slinky_host_builder_info",
        "gauge",
        "The active builder plugin of each kind (value 1).",
    );
    for kind in kinds {
        let a = plugins.active_info(kind);
        t.sample(
            "slinky_host_builder_info",
            &[
                ("kind", kind.as_str()),
                ("name", &a.name),
                ("version", &a.version),
                ("digest", &a.digest),
                ("source", &a.source),
            ],
            1,
        );
    }
    t.family(
        "slinky_host_builder_swaps_total",
        "counter",
        "Builder swaps by kind (hot reloads that took over, fallbacks included).",
    );
    for kind in kinds {
        t.sample(
            "slinky_host_builder_swaps_total",
            &[("kind", kind.as_str())],
            plugins.swaps(kind),
        );
    }
    t.family(
        "slinky_host_plugin_reloads_total",
        "counter",
        "Plugin file versions considered by the reloader, by result (swapped, refused, unchanged).",
    );
    for (result, n) in plugins
        .reloads
        .results
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default()
    {
        t.sample("slinky_host_plugin_reloads_total", &[("result", result)], n);
    }
    t.family(
        "slinky_host_plugin_reload_stage_seconds",
        "summary",
        "Time spent per reload stage (read, compile, validate, swap).",
    );
    for (stage, (sum, count)) in plugins
        .reloads
        .stages
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default()
    {
        t.summary(
            "slinky_host_plugin_reload_stage_seconds",
            &[("stage", stage)],
            sum,
            count,
        );
    }
    *out = t.0;
}

/// Prometheus text for the host's counters.
pub fn metrics_text(h: &Handles) -> String {
    let mut t = Text(String::new());
    t.family("slinky_host_ready", "gauge", "1 when every cache has synced.");
    t.sample("slinky_host_ready", &[], u8::from(h.ready.load(Ordering::SeqCst)));
    t.family(
        "slinky_host_leader",
        "gauge",
        "1 while this replica leads (always 1 without leader election).",
    );
    t.sample("slinky_host_leader", &[], u8::from(h.leader.may_write()));
    t.family(
        "slinky_host_reconciles_total",
        "counter",
        "Reconciles by kind and result (ok or an error label).",
    );
    let reconciles: std::collections::BTreeMap<_, _> = h
        .metrics
        .reconciles
        .lock()
        .map(|m| m.clone().into_iter().collect())
        .unwrap_or_default();
    for ((kind, result), n) in &reconciles {
        t.sample(
            "slinky_host_reconciles_total",
            &[("kind", kind), ("result", result)],
            n,
        );
    }
    t.family(
        "slinky_host_reconcile_seconds_total",
        "counter",
        "Time spent reconciling, by kind.",
    );
    let seconds: std::collections::BTreeMap<_, _> = h
        .metrics
        .seconds
        .lock()
        .map(|m| m.clone().into_iter().collect())
        .unwrap_or_default();
    for (kind, secs) in &seconds {
        t.sample(
            "slinky_host_reconcile_seconds_total",
            &[("kind", kind)],
            format!("{secs:.6}"),
        );
    }
    t.family(
        "slinky_host_writes_total",
        "counter",
        "API writes by verb and outcome.",
    );
    for ((verb, outcome), n) in h.writes.snapshot() {
        t.sample(
            "slinky_host_writes_total",
            &[("verb", &verb), ("outcome", &outcome)],
            n,
        );
    }
    for (name, kind, help, value) in [
        (
            "slinky_host_conflict_retries_total",
            "counter",
            "Status writes retried after a 409, from a fresh read.",
            h.writes.conflict_retries.load(Ordering::Relaxed),
        ),
        (
            "slinky_host_plugin_calls_total",
            "counter",
            "Builder plugin calls.",
            h.metrics.plugin_calls.load(Ordering::Relaxed),
        ),
        (
            "slinky_host_plugin_failures_total",
            "counter",
            "Builder plugin calls that failed (trap, deadline, memory, policy, error).",
            h.metrics.plugin_failures.load(Ordering::Relaxed),
        ),
    ] {
        t.family(name, kind, help);
        t.sample(name, &[], value);
    }
    t.family(
        "slinky_host_expectations_pending",
        "gauge",
        "Pod creations and deletions awaited in the watch.",
    );
    t.sample(
        "slinky_host_expectations_pending",
        &[],
        h.expectations.total_pending(),
    );
    let calls = h.metrics.plugin.lock().map(|m| m.clone()).unwrap_or_default();
    t.family(
        "slinky_host_plugin_call_results_total",
        "counter",
        "Builder plugin calls by builder kind and result (ok, deadline, memory_cap, trap, rejected, build_error, ...).",
    );
    let mut per_kind: std::collections::BTreeMap<&str, (u64, f64)> = Default::default();
    for ((kind, result), (n, secs)) in &calls {
        let e = per_kind.entry(kind).or_default();
        e.0 += n;
        e.1 += secs;
        t.sample(
            "slinky_host_plugin_call_results_total",
            &[("kind", kind), ("result", result)],
            n,
        );
    }
    t.family(
        "slinky_host_plugin_call_seconds",
        "summary",
        "Builder plugin calls by builder kind: time spent (sum) and calls (count).",
    );
    for (kind, (n, secs)) in per_kind {
        t.summary("slinky_host_plugin_call_seconds", &[("kind", kind)], secs, n);
    }
    t.0
}

/// Serve the endpoints until the task is dropped.
///
/// # Errors
/// When the address can't be bound.
pub async fn serve(addr: SocketAddr, endpoints: Endpoints) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /healthz, /readyz, /metrics, /plugins");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let e = endpoints.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let e = e.clone();
                    async move {
                        let h = &e.handles;
                        let json = |v: serde_json::Value| {
                            serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
                        };
                        let (code, body) = match (req.method(), req.uri().path()) {
                            (_, "/healthz" | "/livez") => (StatusCode::OK, "ok\n".to_string()),
                            (_, "/readyz") if h.ready.load(Ordering::SeqCst) => {
                                (StatusCode::OK, "ok\n".to_string())
                            }
                            (_, "/readyz") => {
                                (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n".to_string())
                            }
                            (_, "/metrics") => {
                                let mut text = metrics_text(h);
                                plugin_metrics_text(&mut text, &e.plugins);
                                (StatusCode::OK, text)
                            }
                            (_, "/plugins") => (StatusCode::OK, json(e.plugins.status_json())),
                            (&hyper::Method::POST, "/plugins/reload") => match &e.reload {
                                Some(r) => match r.rescan().await {
                                    Some(report) => (
                                        StatusCode::OK,
                                        json(serde_json::to_value(report).unwrap_or_default()),
                                    ),
                                    None => {
                                        (StatusCode::SERVICE_UNAVAILABLE, "the reloader stopped\n".into())
                                    }
                                },
                                None => (
                                    StatusCode::CONFLICT,
                                    "no plugins directory is watched: start `run` with --plugins-dir\n"
                                        .into(),
                                ),
                            },
                            (_, "/plugins/reload") => (
                                StatusCode::METHOD_NOT_ALLOWED,
                                "use POST /plugins/reload\n".into(),
                            ),
                            _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
                        };
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        *r.status_mut() = code;
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    }))
}
