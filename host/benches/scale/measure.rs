//! What the scale benchmark measures with: the process's RSS, the CPU seconds of a process and of
//! the real kube-apiserver, a count of a namespace's pods as they appear ([`PodCount`]), and the
//! passes of the host's reconcilers.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use slinky_host::reconcile;

/// A size field of the process's `/proc/self/status` (`VmRSS:`, `VmHWM:`, `RssAnon:` …) in MiB.
pub(crate) fn rss_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU seconds (user + system) process `pid` has used (`/proc/PID/stat`, 100 ticks a second).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) end with `)`.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A pid file of `REALKUBE_DIR` (`apiserver.pid`, `etcd.pid`), when the bench runs against a
/// real kube-apiserver (their CPU is printed beside ours).
fn server_pid(file: &str) -> Option<String> {
    let dir = std::env::var_os("REALKUBE_DIR")?;
    let pid = std::fs::read_to_string(PathBuf::from(dir).join(file)).ok()?;
    Some(pid.trim().to_string())
}

/// The machine's CPU ticks so far (`/proc/stat`'s first line, every core, 100 a second).
#[derive(Clone, Copy)]
pub(crate) struct MachineTicks {
    /// Idle (iowait included).
    idle: f64,
    /// Taken by the hypervisor for other guests (`steal`): time this machine's cores lost.
    steal: f64,
    /// All of them.
    total: f64,
}

fn machine_ticks() -> MachineTicks {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0.0);
    MachineTicks {
        idle: at(3) + at(4),
        steal: at(7),
        // guest and guest_nice (8, 9) are already counted in user and nice.
        total: ticks.iter().take(8).sum(),
    }
}

/// CPU counters at the start of a scale-up ([`cpu_now`]), for [`cpu_note`].
#[derive(Clone, Copy)]
pub(crate) struct CpuBefore {
    /// The measured process's CPU seconds.
    pub(crate) ours: f64,
    pub(crate) server: f64,
    pub(crate) etcd: f64,
    pub(crate) machine: MachineTicks,
    /// etcd's puts and WAL fsyncs so far ([`etcd_writes`]).
    pub(crate) etcd_writes: Option<(f64, f64)>,
}

/// etcd's puts and WAL fsyncs so far (its `/metrics`, at the client URL kube-apiserver was
/// started with): how many puts a fsync carried. etcd syncs its log once per batch of
/// proposals, so the same puts arriving more evenly cost it more syncs and more CPU.
fn etcd_writes() -> Option<(f64, f64)> {
    use std::io::{Read, Write};
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", server_pid("apiserver.pid")?)).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let servers = args
        .iter()
        .position(|a| a == "--etcd-servers")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--etcd-servers=").map(str::to_string))
        })?;
    let addr = servers
        .split(',')
        .next()?
        .strip_prefix("http://")?
        .trim_end_matches('/');
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let value = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    Some((
        value("etcd_mvcc_put_total")?,
        value("etcd_disk_wal_fsync_duration_seconds_count")?,
    ))
}

/// The CPU seconds process `pid` (`who`), the API server and etcd used since `before`, and how
/// much of the machine's CPU stayed idle meanwhile: a side that leaves the cores idle while
/// kube-apiserver is the bound has not kept it busy.
pub(crate) fn cpu_note(pid: &str, who: &str, before: CpuBefore) -> String {
    let ours = cpu_seconds(pid) - before.ours;
    let Some(server) = server_pid("apiserver.pid").map(|p| cpu_seconds(&p) - before.server) else {
        return format!("CPU: {ours:.1} s {who} (the embedded API server runs in the parent)");
    };
    let etcd = server_pid("etcd.pid").map_or(0.0, |p| cpu_seconds(&p) - before.etcd);
    let now = machine_ticks();
    let total = (now.total - before.machine.total).max(1.0);
    let idle_share = (now.idle - before.machine.idle) / total;
    // What else ran meanwhile (the pod count, the bench, the other controllers, the kernel's
    // interrupts), and what the hypervisor took: a round's time moves with both.
    let busy = (total - (now.idle - before.machine.idle) - (now.steal - before.machine.steal)) / 100.0;
    let rest = busy - ours - server - etcd;
    let steal = (now.steal - before.machine.steal) / 100.0;
    let syncs = before
        .etcd_writes
        .zip(etcd_writes())
        .map(|((p0, f0), (p1, f1))| {
            let (puts, fsyncs) = (p1 - p0, f1 - f0);
            format!(
                "; etcd's {puts:.0} puts in {fsyncs:.0} log syncs ({:.1} a sync)",
                puts / fsyncs.max(1.0)
            )
        })
        .unwrap_or_default();
    format!(
        "CPU: {ours:.1} s {who}, {server:.1} s kube-apiserver's, {etcd:.1} s etcd's, {rest:.1} s the rest's; the machine {:.0} % idle, {steal:.1} s stolen{syncs}",
        idle_share * 100.0
    )
}

pub(crate) fn cpu_now(pid: &str) -> CpuBefore {
    let of = |file: &str| server_pid(file).map_or(0.0, |p| cpu_seconds(&p));
    CpuBefore {
        ours: cpu_seconds(pid),
        server: of("apiserver.pid"),
        etcd: of("etcd.pid"),
        machine: machine_ticks(),
        etcd_writes: etcd_writes(),
    }
}

/// Waits until kube-apiserver and etcd (of `REALKUBE_DIR`) have used under a tenth of a core
/// over a second, at most 20 s: each side's scale-up starts on servers done with what came
/// before it (the previous side's namespace deletion, its own start). Returns the note to print
/// (nothing without a real API server).
pub(crate) async fn servers_quiet() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("REALKUBE_DIR")?);
    let pid = |file: &str| std::fs::read_to_string(dir.join(file)).map(|p| p.trim().to_string());
    let pids = [pid("apiserver.pid").ok()?, pid("etcd.pid").ok()?];
    let used = || pids.iter().map(|p| cpu_seconds(p)).sum::<f64>();
    let started = std::time::Instant::now();
    let mut before = used();
    while started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = used();
        if now - before < 0.1 {
            return Some(format!(
                "servers quiet after {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
        before = now;
    }
    Some("servers still busy after 20 s".into())
}

/// Counts the pods of `namespace` as they appear (a metadata watch); `wait(n)` returns when `n`
/// exist.
///
/// It watches from a thread of its own, with its own runtime and client: in the host's child
/// process, a watch on the host's runtime would take turns on the host's two worker threads and
/// count its JSON decoding as the host's CPU, while kcm's side is counted from another process.
/// The thread's CPU is left out of the host's ([`PodCount::cpu_seconds`]).
pub(crate) struct PodCount {
    seen: Arc<std::sync::Mutex<HashSet<String>>>,
    changed: Arc<tokio::sync::Notify>,
    /// `self/task/<tid>` of the watching thread (for its CPU).
    thread: Arc<std::sync::OnceLock<String>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl PodCount {
    pub(crate) async fn start(kubeconfig: &Path, namespace: &str) -> anyhow::Result<Self> {
        let seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let thread = Arc::new(std::sync::OnceLock::new());
        let (s, c, t) = (seen.clone(), changed.clone(), thread.clone());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (kubeconfig, namespace) = (kubeconfig.to_path_buf(), namespace.to_string());
        std::thread::Builder::new()
            .name("pod-count".into())
            .spawn(move || {
                if let Ok(link) = std::fs::read_link("/proc/thread-self") {
                    // `<pid>/task/<tid>`
                    if let Some(tid) = link.file_name() {
                        let _ = t.set(format!("self/task/{}", tid.to_string_lossy()));
                    }
                }
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let client = match crate::client_from(&kubeconfig, Arc::default()).await {
                        Ok(client) => client,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let api: Api<kube::core::PartialObjectMeta<Pod>> = Api::namespaced(client, &namespace);
                    let mut ready = Some(ready_tx);
                    let mut events =
                        std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
                    let mut stopped = std::pin::pin!(stopped);
                    loop {
                        let ev = tokio::select! {
                            ev = events.next() => ev,
                            _ = &mut stopped => None,
                        };
                        let Some(ev) = ev else { break };
                        match ev {
                            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                                s.lock().expect("lock").insert(p.name_any());
                            }
                            Ok(watcher::Event::Delete(p)) => {
                                s.lock().expect("lock").remove(&p.name_any());
                            }
                            Ok(watcher::Event::InitDone) => {
                                if let Some(r) = ready.take() {
                                    let _ = r.send(Ok(()));
                                }
                            }
                            Ok(watcher::Event::Init) | Err(_) => {}
                        }
                        c.notify_waiters();
                    }
                });
            })?;
        ready_rx.await??;
        Ok(Self {
            seen,
            changed,
            thread,
            stop: Some(stop),
        })
    }

    /// The CPU seconds its thread has used.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        self.thread.get().map_or(0.0, |t| cpu_seconds(t))
    }

    fn now(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    pub(crate) async fn wait(&self, n: usize) {
        loop {
            let notified = self.changed.notified();
            if self.now() >= n {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }
}

impl Drop for PodCount {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Passes of every parent (NodeSets and the Controller) so far, whatever their result.
pub(crate) fn passes(handles: &reconcile::Handles) -> u64 {
    handles.metrics.snapshot().values().sum()
}

/// A CPU profile of the real kube-apiserver while one side scales up (`BENCH_PPROF_DIR`): its
/// `/debug/pprof/profile` over `BENCH_PPROF_SECONDS` (default 20) from now, written to
/// `<dir>/<label>.pprof`; read it with `go tool pprof -top`. Awaited at the end of the scale-up,
/// so each side's window holds its scale-up and then idle time, not the other's work.
pub(crate) fn pprof(client: &Client, label: &str) -> Option<tokio::task::JoinHandle<()>> {
    let dir = PathBuf::from(std::env::var_os("BENCH_PPROF_DIR")?);
    server_pid("apiserver.pid")?;
    let seconds: u64 = std::env::var("BENCH_PPROF_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let (client, file) = (client.clone(), dir.join(format!("{label}.pprof")));
    Some(tokio::spawn(async move {
        use http_body_util::BodyExt;
        let fetched = async {
            let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
                .body(kube::client::Body::empty())?;
            let body = client.send(request).await?.into_body().collect().await?;
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&file, body.to_bytes())?;
            anyhow::Ok(())
        };
        match fetched.await {
            Ok(()) => println!("  (kube-apiserver's CPU profile: {})", file.display()),
            Err(e) => println!("  (no kube-apiserver CPU profile: {e})"),
        }
    }))
}
