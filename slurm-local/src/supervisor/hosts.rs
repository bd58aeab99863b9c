//! The sandboxes' shared `/etc/hosts`: pods and Services by name, and how a name resolves.

use std::{
    collections::BTreeMap,
    io::{Seek as _, Write as _},
    net::Ipv4Addr,
    path::Path,
};

use super::state::{CLIENT_HOSTNAME, Entry, RESTD_HOSTNAME, Shared, State};
use crate::{
    error::{Error, Result},
    net::{self, Network},
};

impl Shared {
    /// `name` as the sandboxes' `/etc/hosts` resolves it.
    pub fn resolve(&self, st: &State, name: &str) -> Option<Ipv4Addr> {
        st.hosts_text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let ip = it.next()?.parse().ok()?;
            it.any(|n| n == name).then_some(ip)
        })
    }

    /// The sandboxes' `/etc/hosts`: every pod's name, hostname and `hostname.subdomain…` names,
    /// and each Service's names mapped to its first running pod.
    pub(super) fn hosts(&self, st: &State) -> String {
        let mut text = base_hosts(&self.net);
        for (name, ip) in &st.extra_hosts {
            text.push_str(&format!("{ip} {name}\n"));
        }
        let ns = st
            .attached
            .as_ref()
            .map(|a| a.namespace.clone())
            .unwrap_or_default();
        let domain = &self.cluster_domain;
        // The newest pod of a name wins (an old one may still be terminating).
        let mut by_name: BTreeMap<&str, &Entry> = BTreeMap::new();
        for e in st.pods.values().filter(|e| e.sandbox.is_some()) {
            let newer = by_name
                .get(e.plan.name.as_str())
                .is_none_or(|o| o.terminating && !e.terminating);
            if newer {
                by_name.insert(&e.plan.name, e);
            }
        }
        for e in by_name.values() {
            let mut names = vec![e.plan.name.clone()];
            if e.plan.hostname != e.plan.name {
                names.push(e.plan.hostname.clone());
            }
            if let Some(sub) = &e.plan.subdomain {
                let h = &e.plan.hostname;
                names.extend([
                    format!("{h}.{sub}"),
                    format!("{h}.{sub}.{ns}"),
                    format!("{h}.{sub}.{ns}.svc"),
                    format!("{h}.{sub}.{ns}.svc.{domain}"),
                ]);
            }
            text.push_str(&format!("{} {}\n", self.net.addr(e.host), names.join(" ")));
        }
        for (name, svc) in &st.services {
            let Some(selector) = svc
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .filter(|s| !s.is_empty())
            else {
                continue;
            };
            let endpoint = by_name.values().find(|e| {
                e.proc.is_some()
                    && !e.terminating
                    && selector
                        .iter()
                        .all(|(k, v)| e.pod.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
            });
            if let Some(e) = endpoint {
                text.push_str(&format!(
                    "{} {name} {name}.{ns} {name}.{ns}.svc {name}.{ns}.svc.{domain}\n",
                    self.net.addr(e.host)
                ));
            }
        }
        text
    }
}

impl Shared {
    /// Give the sandboxes' `/etc/hosts` the name `name` for `ip` (replacing an earlier address
    /// of that name), written at once.
    ///
    /// # Errors
    /// A name that cannot be one (empty, with whitespace or `#`), or the file cannot be written.
    pub(crate) fn add_host(&self, st: &mut State, name: &str, ip: Ipv4Addr) -> Result<()> {
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '#') {
            return Err(Error::Invalid(format!(
                "{name:?} cannot be a host name in /etc/hosts: give one without spaces or '#'"
            )));
        }
        st.extra_hosts.insert(name.to_string(), ip);
        let text = self.hosts(st);
        write_in_place(&self.hosts_path, &text)?;
        st.hosts_text = text;
        Ok(())
    }
}

pub(super) fn base_hosts(net: &Network) -> String {
    format!(
        "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{} {RESTD_HOSTNAME}\n{} {CLIENT_HOSTNAME}\n",
        net.addr(net::RESTD_HOST),
        net.addr(net::CLIENT_HOST)
    )
}

/// Rewrite `path` without truncating it first (bind mounts keep the inode; a reader never sees
/// an empty file).
pub(super) fn write_in_place(path: &Path, text: &str) -> Result<()> {
    let what = || format!("cannot write {}", path.display());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io(what(), e))?;
    f.seek(std::io::SeekFrom::Start(0))
        .map_err(|e| Error::io(what(), e))?;
    f.write_all(text.as_bytes()).map_err(|e| Error::io(what(), e))?;
    f.set_len(text.len() as u64).map_err(|e| Error::io(what(), e))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::io(what(), e))
}
