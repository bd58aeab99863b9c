//! `slinky-host plugin reload`: ask a running host to rescan its plugins directory now.

use std::{io::Write, time::Duration};

use anyhow::Context as _;

/// `POST path` on `addr` with hyper's HTTP/1 client: the status and the body.
async fn post(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(hyper::StatusCode, String)> {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| {
        format!("cannot reach the host at {addr}: is `slinky-host run` serving its admin endpoints there (--admin-addr)?")
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .with_context(|| format!("no HTTP/1 connection to {addr}"))?;
    let driver = tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<bytes::Bytes>::new())
        .context("cannot build the request")?;
    let response = sender
        .send_request(request)
        .await
        .with_context(|| format!("no answer from {addr}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .with_context(|| format!("the answer from {addr} broke off"))?
        .to_bytes();
    driver.abort();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `plugin reload`: `POST /plugins/reload` on the running host's admin endpoint.
///
/// # Errors
/// The host can't be reached or answers an error, or a version was refused (the error lists them).
pub fn execute(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (status, body) = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), post(addr, "/plugins/reload"))
            .await
            .with_context(|| format!("the host at {addr} did not answer within 120 s"))?
    })?;
    if status != hyper::StatusCode::OK {
        anyhow::bail!("the host at {addr} answered {status}: {}", body.trim());
    }
    let report: crate::plugins::reload::ScanReport = serde_json::from_str(&body)
        .with_context(|| format!("the host at {addr} answered something else than a reload report"))?;
    let mut out = std::io::stdout().lock();
    for s in &report.swapped {
        writeln!(out, "swapped: {s}")?;
    }
    for p in &report.pending {
        writeln!(out, "pending: {p}")?;
    }
    if report.swapped.is_empty() && report.refused.is_empty() {
        writeln!(out, "nothing changed")?;
    }
    drop(out);
    if !report.refused.is_empty() {
        let lines: Vec<String> = report
            .refused
            .iter()
            .map(|r| format!("refused: {}: {}", r.source, r.reason))
            .collect();
        anyhow::bail!("{}\n(the previous versions keep serving)", lines.join("\n"));
    }
    Ok(())
}
