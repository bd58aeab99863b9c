//! A pod's sandbox: its volumes mounted and filled, slurmctld's configuration adapted to local
//! processes, and the cluster's `/etc/slurm` handed to the client and slurmrestd sandboxes.

use std::{path::Path, time::Duration};

use super::{
    local_conf::{cgroup_mode, conf_value, local_cgroup_conf, local_slurm_conf},
    state::{Shared, SlurmdbdConf, State},
};
use crate::{
    error::{Error, Result},
    podspec::{self, File, MountKind, Plan, Role},
    sandbox::{self, Sandbox, Source},
    sys,
};

impl Shared {
    pub(super) async fn make_pod_sandbox(&self, st: &mut State, uid: &str) -> Result<()> {
        let Some(a) = st.attached.clone() else {
            return Ok(());
        };
        let Some(e) = st.pods.get(uid) else { return Ok(()) };
        let plan = e.plan.clone();
        let owner = if plan.fs_group {
            (0, self.slurm_ids.1)
        } else {
            (0, 0)
        };
        let initconf = plan.role == Role::Slurmdbd && st.slurmdbd_conf == SlurmdbdConf::InitConf;
        let user = if plan.run_as_slurm { self.slurm_ids } else { (0, 0) };
        // The volumes' files first: a missing ConfigMap or Secret keeps the pod waiting.
        let mut files: Vec<(String, Vec<File>, (u32, u32))> = Vec::new();
        let mut mounts = Vec::new();
        for m in &plan.mounts {
            if !mountable(&m.path) {
                tracing::debug!(pod = %plan.name, path = %m.path, "not mounted: outside the sandbox's own directories and absent here");
                continue;
            }
            match &m.kind {
                MountKind::Files(sources) => {
                    let mut fs = podspec::files(&a.client, &a.namespace, sources).await?;
                    if initconf && m.path == "/etc/slurm" {
                        // What Slinky's initconf container made of the mounted files.
                        initconf_modes(&mut fs);
                        files.push((m.path.clone(), fs, user));
                        mounts.push((m.path.clone(), Source::Tmpfs));
                        continue;
                    }
                    if plan.fs_group {
                        // A kubelet makes the files of a read-only volume group-readable for fsGroup.
                        for f in &mut fs {
                            f.mode |= 0o040;
                        }
                    }
                    files.push((m.path.clone(), fs, owner));
                    mounts.push((m.path.clone(), Source::Tmpfs));
                }
                MountKind::EmptyDir => {
                    let dir = e.dir.join("volumes").join(&m.volume);
                    make_host_dir(&dir, owner, if plan.fs_group { 0o2777 } else { 0o777 })?;
                    mounts.push((m.path.clone(), Source::Bind(dir)));
                }
                MountKind::Claim(claim) => {
                    let dir = self.net.dir.join("claims").join(claim);
                    if !dir.exists() {
                        make_host_dir(&dir, owner, if plan.fs_group { 0o2775 } else { 0o755 })?;
                    }
                    mounts.push((m.path.clone(), Source::Bind(dir)));
                }
                MountKind::Unsupported(what) => {
                    tracing::debug!(pod = %plan.name, volume = %m.volume, "{what} volumes are not mounted");
                }
            }
        }
        let spec = sandbox::Spec {
            host: e.host,
            hostname: plan.hostname.clone(),
            dir: e.dir.clone(),
            hosts: self.hosts_path.clone(),
            resolv: self.resolv_path.clone(),
            mounts,
        };
        let sb = Sandbox::create(&self.net, &spec).await?;
        let result = self.fill_sandbox(st, &sb, &plan, &files, owner);
        if result.is_ok() && plan.role == Role::Slurmdbd {
            tracing::info!(pod = %plan.name, mode = ?st.slurmdbd_conf, "slurmdbd's /etc/slurm is filled");
        }
        if let Err(err) = result {
            sb.destroy(&self.net);
            return Err(err);
        }
        tracing::info!(pod = %plan.name, ip = %sb.ip, pause = sb.pause_pid, "sandbox ready");
        if let Some(e) = st.pods.get_mut(uid) {
            e.sandbox = Some(sb);
            e.backoff = Duration::from_secs(1);
        }
        Ok(())
    }

    /// Write the volumes' files; for slurmctld, adapt `slurm.conf` and `cgroup.conf` to local
    /// processes and make its state directory, and take its `/etc/slurm` as the cluster's.
    fn fill_sandbox(
        &self,
        st: &mut State,
        sb: &Sandbox,
        plan: &Plan,
        files: &[(String, Vec<File>, (u32, u32))],
        owner: (u32, u32),
    ) -> Result<()> {
        for (dir, fs, file_owner) in files {
            sb.write_files(dir, fs, *file_owner)?;
        }
        if plan.role != Role::Slurmctld {
            return Ok(());
        }
        let etc = sb.path("/etc/slurm");
        let conf_path = etc.join("slurm.conf");
        let Ok(conf) = std::fs::read_to_string(&conf_path) else {
            return Err(Error::NotReady(format!(
                "the slurmctld pod {} has no /etc/slurm/slurm.conf in its volumes",
                plan.name
            )));
        };
        let what = |p: &Path| format!("cannot adapt {} for local processes", p.display());
        std::fs::write(&conf_path, local_slurm_conf(&conf)).map_err(|e| Error::io(what(&conf_path), e))?;
        let cgroup_path = etc.join("cgroup.conf");
        let cgroup = std::fs::read_to_string(&cgroup_path).unwrap_or_default();
        let existed = cgroup_path.exists();
        std::fs::write(&cgroup_path, local_cgroup_conf(&cgroup))
            .map_err(|e| Error::io(what(&cgroup_path), e))?;
        if !existed {
            sb.write_files(
                "/etc/slurm",
                &[File {
                    path: "cgroup.conf".into(),
                    data: local_cgroup_conf("").into_bytes(),
                    mode: 0o644,
                }],
                owner,
            )?;
        }
        if !st.logged_cgroups {
            st.logged_cgroups = true;
            tracing::info!(
                cgroups = cgroup_mode(),
                "slurmctld's slurm.conf gets ProctrackType=proctrack/linuxproc and TaskPlugin=task/none, \
                 its cgroup.conf CgroupPlugin=disabled (the local daemons share the harness's cgroup; \
                 Slinky's generated cgroup/v2 needs a cgroup of its own per pod)"
            );
        }
        let user = if plan.run_as_slurm { self.slurm_ids } else { (0, 0) };
        for (key, default) in [
            ("StateSaveLocation", "/var/spool/slurmctld"),
            ("SlurmctldPidFile", "/run/slurmctld.pid"),
        ] {
            let value = conf_value(&conf, key).unwrap_or_else(|| default.to_string());
            let dir = if key == "StateSaveLocation" {
                value
            } else {
                Path::new(&value).parent().map(sys::path_str).unwrap_or_default()
            };
            if !dir.is_empty() && !sb.path(&dir).exists() {
                sb.make_dir(&dir, user, 0o755)?;
            }
        }
        if plan.run_as_slurm {
            // The daemon's log and pid directories, as the image makes them.
            for dir in ["/run/slurmctld", "/var/log/slurm"] {
                let p = sb.path(dir);
                if !p.exists() {
                    sb.make_dir(dir, user, 0o755)?;
                }
            }
        }
        st.conf = Some(read_dir_files(&etc));
        self.update_cluster_conf(st)
    }

    /// Give the client and slurmrestd sandboxes the cluster's `/etc/slurm` (slurmrestd without
    /// the keys).
    fn update_cluster_conf(&self, st: &mut State) -> Result<()> {
        let Some(conf) = st.conf.clone() else {
            return Ok(());
        };
        if let Some(sb) = &st.client.sandbox {
            sb.write_files("/etc/slurm", &conf, (0, 0))?;
        }
        if let Some(sb) = &st.restd.sandbox {
            let public: Vec<File> = conf
                .iter()
                .filter(|f| !f.path.ends_with(".key"))
                .map(|f| File {
                    mode: f.mode | 0o444,
                    ..f.clone()
                })
                .collect();
            sb.write_files("/etc/slurm", &public, (0, 0))?;
        }
        Ok(())
    }
}

/// The modes Slinky's `initconf` container (slurm-operator v0.4, for Slurm before 25.11) gave
/// the files it copied into slurmdbd's `/etc/slurm`: `*.conf` 0644, `slurmdbd.conf` and `*.key`
/// 0600 (other files keep their mode).
fn initconf_modes(files: &mut [File]) {
    for f in files {
        let name = f.path.rsplit('/').next().unwrap_or_default();
        if name == "slurmdbd.conf" || name.ends_with(".key") {
            f.mode = 0o600;
        } else if name.ends_with(".conf") {
            f.mode = 0o644;
        }
    }
}

/// Whether a mount at `path` can be made: inside the sandbox's own tmpfs (`/run`, `/var/spool`,
/// `/etc/slurm`), at `/var/log/slurm` (made here when missing), or over a directory that exists.
fn mountable(path: &str) -> bool {
    let own = ["/run", "/var/spool", "/etc/slurm"];
    if own
        .iter()
        .any(|o| path == *o || path.starts_with(&format!("{o}/")))
    {
        return true;
    }
    if path == "/var/log/slurm" {
        return std::fs::create_dir_all(path).is_ok();
    }
    Path::new(path).is_dir()
}

fn make_host_dir(dir: &Path, owner: (u32, u32), mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let what = || format!("cannot make {}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| Error::io(what(), e))?;
    std::os::unix::fs::chown(dir, Some(owner.0), Some(owner.1)).map_err(|e| Error::io(what(), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io(what(), e))
}

/// The regular files of a directory (recursively), with their modes.
fn read_dir_files(dir: &Path) -> Vec<File> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push((entry.path(), path));
            } else if meta.is_file()
                && let Ok(data) = std::fs::read(entry.path())
            {
                out.push(File {
                    path,
                    data,
                    mode: meta.permissions().mode() & 0o777,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initconf_makes_slurmdbd_conf_and_keys_private() {
        let file = |path: &str| File {
            path: path.into(),
            data: Vec::new(),
            mode: 0o640,
        };
        let mut fs = vec![
            file("slurmdbd.conf"),
            file("slurm.key"),
            file("jwt.key"),
            file("other.conf"),
            file("jwks.json"),
        ];
        initconf_modes(&mut fs);
        let modes: Vec<u32> = fs.iter().map(|f| f.mode).collect();
        assert_eq!(modes, [0o600, 0o600, 0o600, 0o644, 0o640]);
    }

    #[test]
    fn mounts_stay_inside_or_exist() {
        assert!(mountable("/run/slurmctld"));
        assert!(mountable("/var/spool/slurmctld/x"));
        assert!(mountable("/etc/slurm"));
        assert!(!mountable("/etc/slurmx"));
        assert!(!mountable("/no/such/dir/anywhere"));
    }
}
