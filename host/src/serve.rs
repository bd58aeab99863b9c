//! The host's HTTP endpoints: `/healthz` (alive), `/readyz` (caches synced), `/metrics`
//! (Prometheus text).

use std::{convert::Infallible, fmt::Write as _, net::SocketAddr, sync::atomic::Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;

use crate::reconcile::Handles;

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
    out
}

/// Serve the endpoints until the task is dropped.
///
/// # Errors
/// When the address can't be bound.
pub async fn serve(addr: SocketAddr, handles: Handles) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /healthz, /readyz, /metrics");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let h = handles.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let h = h.clone();
                    async move {
                        let (code, body) = match req.uri().path() {
                            "/healthz" | "/livez" => (StatusCode::OK, "ok\n".to_string()),
                            "/readyz" if h.ready.load(Ordering::SeqCst) => {
                                (StatusCode::OK, "ok\n".to_string())
                            }
                            "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n".to_string()),
                            "/metrics" => (StatusCode::OK, metrics_text(&h)),
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
