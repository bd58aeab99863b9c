//! The harness's network: one Linux bridge `slinky-<id>` with a free 10.x.y.0/24 (the bridge
//! holds .1, so the root namespace reaches every sandbox), and per sandbox a network namespace
//! `slinky-<id>-<n>` joined to the bridge by a veth pair, its end `eth0` holding 10.x.y.n.
//!
//! Every harness records its owner (pid and process start time) in
//! `/var/lib/slinky-slurm-local/<id>/owner` before it makes anything, under a lock file. A harness
//! starting finds the bridges, namespaces and directories of owners that are gone (a crashed
//! run), kills what still runs in those namespaces and removes them.

use std::{
    io::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use crate::{
    error::{Error, Result},
    sys,
};

/// Where harnesses keep their records and work files (not under `/run`, which each sandbox
/// covers with its own tmpfs).
pub const STATE_DIR: &str = "/var/lib/slinky-slurm-local";

/// The first pod address of the /24 (.1 is the bridge, .2 slurmrestd, .3 the client).
pub(crate) const FIRST_POD_HOST: u8 = 10;
/// The last usable address.
pub(crate) const LAST_HOST: u8 = 254;
/// slurmrestd's host number.
pub(crate) const RESTD_HOST: u8 = 2;
/// The client sandbox's host number.
pub(crate) const CLIENT_HOST: u8 = 3;

/// One harness's bridge and subnet.
#[derive(Debug, Clone)]
pub(crate) struct Network {
    /// Eight hex digits naming everything of this harness.
    pub id: String,
    /// `slinky-<id>`.
    pub bridge: String,
    /// The /24's first three octets.
    pub prefix: [u8; 3],
    /// `/var/lib/slinky-slurm-local/<id>`: the owner record and the work files.
    pub dir: PathBuf,
}

impl Network {
    /// Clean up crashed runs' leftovers, then make a bridge on a free /24 (all under the lock).
    ///
    /// # Errors
    /// The lock or the record cannot be written, no /24 is free, `ip` fails.
    pub fn create() -> Result<Self> {
        std::fs::create_dir_all(STATE_DIR).map_err(|e| Error::io(format!("cannot create {STATE_DIR}"), e))?;
        let lock_path = Path::new(STATE_DIR).join(".lock");
        let lock = std::fs::File::create(&lock_path)
            .map_err(|e| Error::io(format!("cannot open {}", lock_path.display()), e))?;
        lock.lock()
            .map_err(|e| Error::io(format!("cannot lock {}", lock_path.display()), e))?;
        clean_stale();
        let id = new_id();
        let dir = Path::new(STATE_DIR).join(&id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        // Logs stay root's (the sandboxes reach their files through bind mounts, not this path).
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| Error::io(format!("cannot restrict {}", dir.display()), e))?;
        let me = std::process::id();
        let record = format!("{me} {}\n", sys::start_time(me).unwrap_or_default());
        let owner = dir.join("owner");
        std::fs::File::create(&owner)
            .and_then(|mut f| f.write_all(record.as_bytes()))
            .map_err(|e| Error::io(format!("cannot write {}", owner.display()), e))?;
        let net = Network {
            bridge: format!("slinky-{id}"),
            prefix: free_subnet().ok_or(Error::NoSubnet)?,
            id,
            dir,
        };
        let gw = format!("{}/24", net.addr(1));
        for args in [
            vec!["link", "add", net.bridge.as_str(), "type", "bridge"],
            vec!["addr", "add", gw.as_str(), "dev", net.bridge.as_str()],
            vec!["link", "set", net.bridge.as_str(), "up"],
        ] {
            if let Err(e) = run_ip_sync("create the harness's bridge", &args) {
                net.destroy();
                return Err(e);
            }
        }
        drop(lock);
        Ok(net)
    }

    /// 10.x.y.`host`.
    pub fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.prefix[0], self.prefix[1], self.prefix[2], host)
    }

    /// The network namespace of host number `host`.
    pub fn netns(&self, host: u8) -> String {
        format!("slinky-{}-{host}", self.id)
    }

    /// The bridge-side veth of host number `host` (at most 15 characters).
    fn veth(&self, host: u8) -> String {
        format!("sl{}{host:02x}", self.id)
    }

    /// Make the namespace of `host` with `eth0` on the bridge and `lo` up (a leftover namespace
    /// of that name is removed first).
    ///
    /// # Errors
    /// `ip` fails.
    pub async fn add_netns(&self, host: u8) -> Result<String> {
        let ns = self.netns(host);
        if netns_list().contains(&ns) {
            remove_netns(&ns);
        }
        let veth = self.veth(host);
        let addr = format!("{}/24", self.addr(host));
        let what = format!("network namespace {ns} ({})", self.addr(host));
        sys::run(&what, "ip", &["netns", "add", &ns]).await?;
        let steps: [Vec<&str>; 5] = [
            vec![
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
            vec!["link", "set", &veth, "master", &self.bridge, "up"],
            vec!["-n", &ns, "addr", "add", &addr, "dev", "eth0"],
            vec!["-n", &ns, "link", "set", "eth0", "up"],
            vec!["-n", &ns, "link", "set", "lo", "up"],
        ];
        for args in steps {
            if let Err(e) = sys::run(&what, "ip", &args).await {
                remove_netns(&ns);
                return Err(e);
            }
        }
        Ok(ns)
    }

    /// Kill what runs in `host`'s namespace and remove it (its veth goes with it).
    pub fn remove_host(&self, host: u8) {
        remove_netns(&self.netns(host));
    }

    /// Remove everything of this harness: processes in its namespaces, the namespaces, the
    /// bridge, the directory.
    pub fn destroy(&self) {
        cleanup(&self.id);
    }
}

/// Eight hex digits, unlikely to repeat (pid, time, a per-process counter, hashed).
fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    format!("{:08x}", h.finish() as u32)
}

fn run_ip_sync(what: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::io(format!("{what}: cannot run ip"), e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Command {
        what: what.into(),
        command: sys::command_line("ip", args),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// The names of the network namespaces (`ip netns list`).
fn netns_list() -> Vec<String> {
    sys::run_sync("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// SIGKILL every process in namespace `ns`, then delete it.
fn remove_netns(ns: &str) {
    if let Some(pids) = sys::run_sync("ip", &["netns", "pids", ns]) {
        for pid in pids.split_whitespace().filter_map(|p| p.parse().ok()) {
            sys::signal(pid, rustix::process::Signal::KILL);
        }
    }
    let _ = sys::run_sync("ip", &["netns", "del", ns]);
}

/// The directory of harness `id`'s MariaDB (not under its work directory, which only root may
/// enter: `mariadbd` runs as `mysql`).
pub(crate) fn mariadb_dir(id: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("mariadb-{id}"))
}

/// Remove everything of harness `id`.
fn cleanup(id: &str) {
    let prefix = format!("slinky-{id}-");
    for ns in netns_list().into_iter().filter(|n| n.starts_with(&prefix)) {
        remove_netns(&ns);
    }
    let _ = sys::run_sync("ip", &["link", "del", &format!("slinky-{id}")]);
    let _ = std::fs::remove_dir_all(Path::new(STATE_DIR).join(id));
    // A MariaDB left running (its harness died without killing it) goes too.
    let db = mariadb_dir(id);
    let pid = std::fs::read_to_string(db.join("mariadbd.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok());
    if let Some(pid) = pid {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "mariadbd" {
            sys::signal(pid, rustix::process::Signal::KILL);
        }
    }
    let _ = std::fs::remove_dir_all(db);
}

/// Whether `s` is a harness id (eight lowercase hex digits).
fn is_id(s: &str) -> bool {
    s.len() == 8
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether the owner recorded for `id` still runs (same pid, same start time).
fn owner_alive(id: &str) -> bool {
    let Ok(record) = std::fs::read_to_string(Path::new(STATE_DIR).join(id).join("owner")) else {
        return false;
    };
    let mut it = record.split_whitespace();
    let (Some(pid), Some(start)) = (
        it.next().and_then(|p| p.parse::<u32>().ok()),
        it.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        return false;
    };
    sys::alive(pid) && sys::start_time(pid) == Some(start)
}

/// Remove the leftovers of harnesses whose owner is gone (called under the lock).
fn clean_stale() {
    let mut ids = std::collections::BTreeSet::new();
    if let Ok(dir) = std::fs::read_dir(STATE_DIR) {
        ids.extend(
            dir.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .map(|n| n.strip_prefix("mariadb-").map(str::to_string).unwrap_or(n))
                .filter(|n| is_id(n)),
        );
    }
    let bridges = sys::run_sync("ip", &["-o", "link", "show", "type", "bridge"]).unwrap_or_default();
    for line in bridges.lines() {
        if let Some(name) = line.split(':').nth(1).map(str::trim)
            && let Some(id) = name.strip_prefix("slinky-").filter(|i| is_id(i))
        {
            ids.insert(id.to_string());
        }
    }
    for ns in netns_list() {
        if let Some(id) = ns
            .strip_prefix("slinky-")
            .and_then(|r| r.split('-').next())
            .filter(|i| is_id(i))
        {
            ids.insert(id.to_string());
        }
    }
    for id in ids.into_iter().filter(|id| !owner_alive(id)) {
        tracing::info!(harness = %id, "removing a crashed run's bridge, namespaces and processes");
        cleanup(&id);
    }
}

/// An IPv4 network `(address, prefix length)`.
type Net4 = (u32, u32);

/// The IPv4 networks in use here: interface addresses and routes.
fn used_networks() -> Vec<Net4> {
    let mut nets = Vec::new();
    let addrs = sys::run_sync("ip", &["-4", "-o", "addr", "show"]).unwrap_or_default();
    for line in addrs.lines() {
        let mut it = line.split_whitespace();
        if it.any(|t| t == "inet")
            && let Some(n) = it.next().and_then(parse_cidr)
        {
            nets.push(n);
        }
    }
    let routes = sys::run_sync("ip", &["-4", "route", "show", "table", "all"]).unwrap_or_default();
    for line in routes.lines() {
        let first = line
            .split_whitespace()
            .find(|t| *t != "local" && *t != "broadcast" && *t != "unicast");
        if let Some(n) = first.and_then(parse_cidr) {
            nets.push(n);
        }
    }
    nets
}

/// `a.b.c.d/len` or `a.b.c.d` (a /32).
fn parse_cidr(s: &str) -> Option<Net4> {
    let (addr, len) = s.split_once('/').unwrap_or((s, "32"));
    let addr: Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    (len <= 32).then_some((u32::from(addr), len))
}

/// Whether two networks overlap.
fn overlaps(a: Net4, b: Net4) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a.0 & mask == b.0 & mask
}

/// The first 10.x.y.0/24 (x in 200..=250) that overlaps nothing here.
fn free_subnet() -> Option<[u8; 3]> {
    let used = used_networks();
    (200u8..=250)
        .flat_map(|x| (0u8..=255).map(move |y| [10, x, y]))
        .find(|p| {
            let net = (u32::from(Ipv4Addr::new(p[0], p[1], p[2], 0)), 24);
            !used.iter().any(|u| overlaps(*u, net))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_overlap_by_the_shorter_prefix() {
        let ten = parse_cidr("10.0.0.0/8").unwrap_or_default();
        let a = parse_cidr("10.200.1.0/24").unwrap_or_default();
        let b = parse_cidr("10.200.2.7/32").unwrap_or_default();
        assert!(overlaps(ten, a));
        assert!(!overlaps(a, b));
        assert!(overlaps(a, parse_cidr("10.200.1.9").unwrap_or_default()));
        assert_eq!(parse_cidr("default"), None);
    }

    #[test]
    fn names_fit_the_kernel() {
        let id = new_id();
        assert!(is_id(&id), "{id}");
        let net = Network {
            id: id.clone(),
            bridge: format!("slinky-{id}"),
            prefix: [10, 200, 0],
            dir: PathBuf::new(),
        };
        assert!(net.bridge.len() <= 15);
        assert!(net.veth(LAST_HOST).len() <= 15);
    }
}
