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

/// Prometheus text for the plugin registry: the active builders and reloads.
pub fn plugin_metrics_text(out: &mut String, plugins: &PluginRegistry) {
    fn family(out: &mut String, name: &str, kind: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    family(
        out,
        "slinky_host_builder_info",
        "gauge",
        "The active builder plugin of each kind (value 1).",
    );
    for kind in crate::plugins::bundled::KINDS {
        let a = plugins.active_info(kind);
        let _ = writeln!(
            out,
            "slinky_host_builder_info{{kind=\"{kind}\",name=\"{}\",version=\"{}\",digest=\"{}\",source=\"{}\"}} 1",
            a.name,
            a.version,
            a.digest,
            a.source.replace('\\', "\\\\").replace('"', "\\\"")
        );
    }
    family(
        out,
        "slinky_host_builder_swaps_total",
        "counter",
        "Builder swaps by kind (hot reloads that took over, fallbacks included).",
    );
    for kind in crate::plugins::bundled::KINDS {
        let _ = writeln!(
            out,
            "slinky_host_builder_swaps_total{{kind=\"{kind}\"}} {}",
            plugins.swaps(kind)
        );
    }
    family(
        out,
        "slinky_host_plugin_reloads_total",
        "counter",
        "Plugin file versions considered by the reloader, by result (swapped, refused, unchanged).",
    );
    if let Ok(m) = plugins.reloads.results.lock() {
        for (result, n) in m.iter() {
            let _ = writeln!(out, "slinky_host_plugin_reloads_total{{result=\"{result}\"}} {n}");
        }
    }
    family(
        out,
        "slinky_host_plugin_reload_stage_seconds",
        "summary",
        "Time spent per reload stage (read, compile, validate, swap).",
    );
    if let Ok(m) = plugins.reloads.stages.lock() {
        for (stage, (sum, count)) in m.iter() {
            let _ = writeln!(
                out,
                "slinky_host_plugin_reload_stage_seconds_sum{{stage=\"{stage}\"}} {sum:.6}\n\
                 slinky_host_plugin_reload_stage_seconds_count{{stage=\"{stage}\"}} {count}"
            );
        }
    }
}

/// Prometheus text for the host's counters.
pub fn metrics_text(h: &Handles) -> String {
    let mut out = String::new();
    fn family(out: &mut String, name: &str, kind: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    family(
        &mut out,
        "slinky_host_ready",
        "gauge",
        "1 when every cache has synced.",
    );
    let _ = writeln!(
        out,
        "slinky_host_ready {}",
        u8::from(h.ready.load(Ordering::SeqCst))
    );
    family(
        &mut out,
        "slinky_host_leader",
        "gauge",
        "1 while this replica leads (always 1 without leader election).",
    );
    let _ = writeln!(out, "slinky_host_leader {}", u8::from(h.leader.may_write()));
    family(
        &mut out,
        "slinky_host_reconciles_total",
        "counter",
        "Reconciles by kind and result (ok or an error label).",
    );
    if let Ok(m) = h.metrics.reconciles.lock() {
        let mut rows: Vec<_> = m.iter().collect();
        rows.sort();
        for ((kind, result), n) in rows {
            let _ = writeln!(
                out,
                "slinky_host_reconciles_total{{kind=\"{kind}\",result=\"{result}\"}} {n}"
            );
        }
    }
    family(
        &mut out,
        "slinky_host_reconcile_seconds_total",
        "counter",
        "Time spent reconciling, by kind.",
    );
    if let Ok(m) = h.metrics.seconds.lock() {
        let mut rows: Vec<_> = m.iter().collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        for (kind, s) in rows {
            let _ = writeln!(
                out,
                "slinky_host_reconcile_seconds_total{{kind=\"{kind}\"}} {s:.6}"
            );
        }
    }
    family(
        &mut out,
        "slinky_host_writes_total",
        "counter",
        "API writes by verb and outcome.",
    );
    for ((verb, outcome), n) in h.writes.snapshot() {
        let _ = writeln!(
            out,
            "slinky_host_writes_total{{verb=\"{verb}\",outcome=\"{outcome}\"}} {n}"
        );
    }
    family(
        &mut out,
        "slinky_host_conflict_retries_total",
        "counter",
        "Status writes retried after a 409, from a fresh read.",
    );
    let _ = writeln!(
        out,
        "slinky_host_conflict_retries_total {}",
        h.writes.conflict_retries.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "slinky_host_expectations_pending",
        "gauge",
        "Pod creations and deletions awaited in the watch.",
    );
    let _ = writeln!(
        out,
        "slinky_host_expectations_pending {}",
        h.expectations.total_pending()
    );
    family(
        &mut out,
        "slinky_host_plugin_calls_total",
        "counter",
        "Builder plugin calls.",
    );
    let _ = writeln!(
        out,
        "slinky_host_plugin_calls_total {}",
        h.metrics.plugin_calls.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "slinky_host_plugin_failures_total",
        "counter",
        "Builder plugin calls that failed (trap, deadline, memory, policy, error).",
    );
    let _ = writeln!(
        out,
        "slinky_host_plugin_failures_total {}",
        h.metrics.plugin_failures.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "slinky_host_plugin_call_seconds",
        "summary",
        "Builder plugin calls by builder kind: time spent (sum) and calls (count).",
    );
    family(
        &mut out,
        "slinky_host_plugin_call_results_total",
        "counter",
        "Builder plugin calls by builder kind and result (ok, deadline, memory_cap, trap, rejected, build_error, ...).",
    );
    if let Ok(m) = h.metrics.plugin.lock() {
        let mut per_kind: std::collections::BTreeMap<&str, (u64, f64)> = Default::default();
        for ((kind, result), (n, secs)) in m.iter() {
            let e = per_kind.entry(kind).or_default();
            e.0 += n;
            e.1 += secs;
            let _ = writeln!(
                out,
                "slinky_host_plugin_call_results_total{{kind=\"{kind}\",result=\"{result}\"}} {n}"
            );
        }
        for (kind, (n, secs)) in per_kind {
            let _ = writeln!(
                out,
                "slinky_host_plugin_call_seconds_sum{{kind=\"{kind}\"}} {secs:.6}\n\
                 slinky_host_plugin_call_seconds_count{{kind=\"{kind}\"}} {n}"
            );
        }
    }
    out
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
