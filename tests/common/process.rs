//! Real `slinky-host run` processes on a test cluster, their metrics, and a TCP proxy that can
//! cut a client off the API server (a partition).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result, ensure};

use crate::{TestCluster, http_get};

/// A free loopback address.
///
/// # Errors
/// No port could be bound.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The addresses a `slinky-host run` logs it serves on (`serving /healthz…`, `serving
/// /plugins…`), read from its stderr (within 60 s), which is drained afterwards.
///
/// # Errors
/// It exited or said nothing of both within 60 s.
pub fn bound_addresses(stderr: impl std::io::Read + Send + 'static) -> Result<(SocketAddr, SocketAddr, Log)> {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    let log = Log::default();
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(std::result::Result::ok)
        {
            kept.push(&line);
            let addr = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("addr="))
                .and_then(|a| a.parse::<SocketAddr>().ok());
            if let Some(addr) = addr {
                let admin = line.contains("/plugins");
                // The reader is gone once both were read: keep draining.
                let _ = tx.send((admin, addr));
            }
        }
    });
    let (mut http, mut admin) = (None, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while http.is_none() || admin.is_none() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (is_admin, addr) = rx
            .recv_timeout(left)
            .context("slinky-host run never said where it serves")?;
        if is_admin {
            admin = Some(addr);
        } else {
            http = Some(addr);
        }
    }
    Ok((
        http.context("no http address")?,
        admin.context("no admin address")?,
        log,
    ))
}

/// The lines a process wrote, as they come.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, line: &str) {
        if let Ok(mut l) = self.0.lock() {
            l.push(line.to_string());
        }
    }

    /// Every line so far.
    pub fn text(&self) -> String {
        self.0.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

/// A `slinky-host run` process on the test cluster.
pub struct HostProcess {
    child: Child,
    /// Its `--http-addr`.
    pub addr: SocketAddr,
    /// Its `--admin-addr`.
    pub admin: SocketAddr,
}

impl HostProcess {
    /// Start `slinky-host run` on `c` serving `ns` (resync 2 s) with leader-election identity
    /// `identity` and `extra` arguments.
    ///
    /// # Errors
    /// The process could not start.
    pub fn start(c: &TestCluster, ns: &str, identity: &str, extra: &[&str]) -> Result<Self> {
        // Port 0: the process binds its own ports and logs them (a port picked here and handed
        // over could be taken by another process meanwhile).
        let mut child = Command::new(crate::binary())
            .arg("run")
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .args([
                "--namespace",
                ns,
                "--http-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
                "--resync-seconds",
                "2",
            ])
            .args([
                "--leader-election-namespace",
                ns,
                "--leader-election-identity",
                identity,
            ])
            .args(extra)
            .env("SLINKY_HOST_PLUGIN_CACHE", crate::cache_dir())
            .env("RUST_LOG", "slinky_host::serve=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().context("no stderr")?;
        let (addr, admin) = match bound_addresses(stderr) {
            Ok((addr, admin, _)) => (addr, admin),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        Ok(HostProcess { child, addr, admin })
    }

    /// Its `/metrics`, parsed.
    ///
    /// # Errors
    /// Not reachable, or not Prometheus text.
    pub async fn metrics(&self) -> Result<BTreeMap<String, f64>> {
        parse_prometheus(&http_get(self.addr, "/metrics").await?)
    }

    /// Whether it says it leads.
    pub async fn leads(&self) -> bool {
        self.metrics()
            .await
            .ok()
            .and_then(|m| m.get("slinky_host_leader").copied())
            == Some(1.0)
    }

    /// Its writes of `verb` with `outcome`.
    pub async fn writes(&self, verb: &str, outcome: &str) -> f64 {
        let key = format!("slinky_host_writes_total{{verb=\"{verb}\",outcome=\"{outcome}\"}}");
        self.metrics()
            .await
            .ok()
            .and_then(|m| m.get(&key).copied())
            .unwrap_or(0.0)
    }

    /// Its successful writes.
    pub async fn ok_writes(&self) -> f64 {
        self.metrics()
            .await
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| {
                        k.starts_with("slinky_host_writes_total") && k.contains("outcome=\"ok\"")
                    })
                    .map(|(_, v)| v)
                    .sum()
            })
            .unwrap_or(0.0)
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Parse Prometheus text: every sample line `name{labels} value` keyed by `name{labels}`; every
/// sample's family has `# HELP` and `# TYPE`, and its samples follow them.
///
/// # Errors
/// A malformed line, or a sample without its family's HELP/TYPE.
pub fn parse_prometheus(text: &str) -> Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    let mut helped = std::collections::BTreeSet::new();
    let mut typed = std::collections::BTreeSet::new();
    // The family of the last `# TYPE`: a family's samples follow it, not another's.
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split_whitespace().next().unwrap_or_default().to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let name = parts.next().unwrap_or_default().to_string();
            let kind = parts.next().unwrap_or_default();
            ensure!(
                ["counter", "gauge", "summary", "histogram", "untyped"].contains(&kind),
                "bad TYPE line {line:?}"
            );
            typed.insert(name.clone());
            current = name;
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("bad sample line {line:?}"))?;
        let value: f64 = value.parse().with_context(|| format!("bad value in {line:?}"))?;
        let name = key.split('{').next().unwrap_or_default();
        ensure!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        let family = ["_sum", "_count", "_bucket"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        ensure!(
            typed.contains(family) && helped.contains(family),
            "{name} has no HELP/TYPE"
        );
        ensure!(
            family == current,
            "{name} stands under the family {current}, not its own"
        );
        if let Some(labels) = key.strip_prefix(name) {
            ensure!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "bad labels in {line:?}"
            );
        }
        out.insert(key.to_string(), value);
    }
    Ok(out)
}

/// A TCP proxy that can be cut: a partition between one client and the API server.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forward to `upstream`.
    ///
    /// # Errors
    /// No port could be bound.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let t = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                if let Ok(mut t) = t.lock() {
                    t.push(conn);
                }
            }
        });
        Ok(Proxy { addr, tasks, accept })
    }

    /// Cut every connection and refuse new ones.
    pub fn cut(&self) {
        self.accept.abort();
        if let Ok(t) = self.tasks.lock() {
            for task in t.iter() {
                task.abort();
            }
        }
    }
}
