//! What the real-Slurm tests (`tests/slurm*.rs`) share: the example cluster with a local Slurm
//! and a host asking it, and `scontrol`/`sbatch` as an admin would use them.

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use slinky_host::{PluginRegistry, reconcile::RunConfig};
use slinky_slurm_local::SlurmLocal;

use crate::{
    TestCluster, default_engine, eventually,
    host::{Host, apply_example, apply_file},
};

/// The example cluster with `replicas` workers and its RestApi in a fresh namespace named after
/// `prefix`, its Slurm running locally (slurmrestd as the RestApi's Deployment runs it) and a
/// host asking that Slurm.
///
/// # Errors
/// The example could not be applied or the harness could not start.
pub async fn start(
    c: &TestCluster,
    slurm: &Path,
    prefix: &str,
    replicas: i32,
) -> Result<(String, SlurmLocal, Host)> {
    let ns = c.namespace(prefix).await;
    apply_example(c, &ns, replicas).await?;
    apply_file(c, &ns, "restapi.yaml", |_| {}).await?;
    let harness = SlurmLocal::start(c.client.clone(), slurm, &ns, "slurm").await?;
    let host = host_for(c, &ns, &harness)?;
    Ok((ns, harness, host))
}

/// A host reconciling namespace `ns` (resync 1 s) that asks the harness' slurmrestd.
///
/// # Errors
/// The plugin registry could not be made.
pub fn host_for(c: &TestCluster, ns: &str, harness: &SlurmLocal) -> Result<Host> {
    host_with_resync(c, ns, harness, Duration::from_secs(1))
}

/// [`host_for`], resyncing every `resync`.
///
/// # Errors
/// The plugin registry could not be made.
pub fn host_with_resync(c: &TestCluster, ns: &str, harness: &SlurmLocal, resync: Duration) -> Result<Host> {
    let config = RunConfig {
        namespaces: vec![ns.to_string()],
        resync: Some(resync),
        slurmrestd_urls: vec![harness.restapi_url()],
        ..Default::default()
    };
    Ok(Host::start_config(
        c.client.clone(),
        Arc::new(PluginRegistry::new(&default_engine(), &[])?),
        config,
    ))
}

/// `scontrol show <what> <name> -o`, one line of `Key=Value` pairs.
///
/// # Errors
/// `scontrol` failed.
pub async fn show(h: &SlurmLocal, what: &str, name: &str) -> Result<String> {
    Ok(h.exec_ok(&["scontrol", "show", what, name, "-o"]).await?)
}

/// The value of `key` in a `scontrol show … -o` line (up to the next space: not for `Reason=`,
/// which may hold spaces).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[at..];
    let end = rest.find(' ').unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Wait until every one of `nodes` is registered and idle.
///
/// # Errors
/// They were not, within 120 s (the error lists the nodes Slurm has).
pub async fn nodes_idle(h: &SlurmLocal, nodes: &[&str]) -> Result<()> {
    let ok = eventually(120, || async {
        let listed = h.nodes(None).await.ok()?;
        nodes
            .iter()
            .all(|n| listed.iter().any(|l| l.name == *n && l.state.starts_with("idle")))
            .then_some(())
    })
    .await;
    if ok.is_none() {
        bail!("nodes {nodes:?} never all idle: {:?}", h.nodes(None).await?);
    }
    Ok(())
}

/// Submit a job on `node` in partition `slinky` that runs until [`end_job`] ends it (its script
/// exits 0 on SIGUSR1: the job is COMPLETED, not cancelled); returns its id once it runs. A job
/// of a fixed length races a slow machine; this one ends when the test says so.
///
/// # Errors
/// `sbatch` failed, or the job did not run within 30 s.
pub async fn run_open_job(h: &SlurmLocal, node: &str) -> Result<String> {
    run_open_job_limited(h, node, None).await
}

/// [`run_open_job`] with a time limit of `minutes` when given (Slurm starts a job on nodes a
/// reservation will take only if it is to end before).
///
/// # Errors
/// `sbatch` failed, or the job did not run within 30 s.
pub async fn run_open_job_limited(h: &SlurmLocal, node: &str, minutes: Option<u32>) -> Result<String> {
    let script = "trap 'exit 0' USR1; while :; do sleep 1; done";
    let time = minutes.map(|m| format!("--time={m}"));
    let mut args = vec!["sbatch", "--parsable", "-p", "slinky", "-w", node];
    args.extend(time.as_deref());
    args.extend(["--wrap", script]);
    let out = h.exec_ok(&args).await?;
    let id = out.trim().split(';').next().unwrap_or_default().to_string();
    let running = eventually(30, || async {
        let line = show(h, "job", &id).await.ok()?;
        (field(&line, "JobState") == Some("RUNNING")).then_some(())
    })
    .await;
    ensure!(
        running.is_some(),
        "job {id} never ran: {}",
        show(h, "job", &id).await?
    );
    Ok(id)
}

/// End a job of [`run_open_job`]: its script gets SIGUSR1 and exits 0.
///
/// # Errors
/// `scancel` failed.
pub async fn end_job(h: &SlurmLocal, id: &str) -> Result<()> {
    h.exec_ok(&["scancel", "--batch", "--signal=USR1", id]).await?;
    Ok(())
}

/// The state of job `id` (`RUNNING`, `COMPLETED`, …).
///
/// # Errors
/// `scontrol` failed.
pub async fn job_state(h: &SlurmLocal, id: &str) -> Result<String> {
    // slurmctld restarts when slurm.conf changes (a NodeSet added or deleted): scontrol cannot
    // reach it for some seconds ("slurm_get_port: Address family '0'"), so it is asked again
    // for up to a minute.
    let since = std::time::Instant::now();
    loop {
        match show(h, "job", id).await {
            Ok(line) => return Ok(field(&line, "JobState").unwrap_or_default().to_string()),
            Err(e) if since.elapsed() >= std::time::Duration::from_secs(60) => return Err(e),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

/// The Slurm build's version, `(major, minor)`, from `slurmctld -V` (`slurm 25.05.8`; slurmdbd
/// reads its configuration before it answers `-V`).
///
/// # Errors
/// slurmctld could not be run or printed no version.
pub fn version(slurm: &Path) -> Result<(u32, u32)> {
    let out = std::process::Command::new(slurm.join("sbin/slurmctld"))
        .arg("-V")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = text.split_whitespace().nth(1).context("no version")?;
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or_default());
    Ok((it.next().unwrap_or_default(), it.next().unwrap_or_default()))
}

/// `GET path` on the harness' slurmrestd with a token for user `slurm` (`scontrol token`):
/// status and body.
///
/// # Errors
/// No token, no connection, no answer within 10 s, or no HTTP status line.
pub async fn restd_get(h: &SlurmLocal, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let token = h.exec_ok(&["scontrol", "token", "username=slurm"]).await?;
    let token = token.trim().trim_start_matches("SLURM_JWT=");
    let mut s = tokio::net::TcpStream::connect(h.restapi_addr()).await?;
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: x\r\nX-SLURM-USER-NAME: slurm\r\nX-SLURM-USER-TOKEN: {token}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut text)).await??;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status")?;
    Ok((status, body.to_string()))
}
