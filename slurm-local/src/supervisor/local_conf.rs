//! slurmctld's `slurm.conf` and `cgroup.conf` as local processes without a cgroup of their own
//! need them.

use std::path::Path;

/// The last value of `key` in a `slurm.conf` (keys are case-insensitive).
pub(crate) fn conf_value(conf: &str, key: &str) -> Option<String> {
    conf.lines()
        .filter_map(|l| {
            let l = l.trim();
            let (k, v) = l.split_once('=')?;
            (k.trim().eq_ignore_ascii_case(key))
                .then(|| v.split_whitespace().next().unwrap_or_default().to_string())
        })
        .next_back()
}

const LOCAL_NOTE: &str = "# slinky-slurm-local: changed for local processes without a cgroup of their own";

/// `slurm.conf` with its ProctrackType and TaskPlugin lines commented out and the local ones
/// appended.
pub(crate) fn local_slurm_conf(conf: &str) -> String {
    let mut out = String::new();
    for line in conf.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        if key.eq_ignore_ascii_case("ProctrackType") || key.eq_ignore_ascii_case("TaskPlugin") {
            out.push('#');
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!(
        "{LOCAL_NOTE}\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
    ));
    out
}

/// `cgroup.conf` with `CgroupPlugin=disabled` (its own line commented out) and
/// `IgnoreSystemd=yes`.
pub(crate) fn local_cgroup_conf(conf: &str) -> String {
    let mut out = format!("{LOCAL_NOTE}\nCgroupPlugin=disabled\n");
    let mut ignore = false;
    for line in conf.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        if key.eq_ignore_ascii_case("CgroupPlugin") {
            out.push('#');
        }
        ignore |= key.eq_ignore_ascii_case("IgnoreSystemd");
        out.push_str(line);
        out.push('\n');
    }
    if !ignore {
        out.push_str("IgnoreSystemd=yes\n");
    }
    out
}

pub(super) fn cgroup_mode() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else {
        "v1 or hybrid"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_conf_is_adapted_not_duplicated() {
        let conf = "ClusterName=x\nProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n";
        let out = local_slurm_conf(conf);
        assert!(out.contains("#ProctrackType=proctrack/cgroup"));
        assert!(out.contains("#TaskPlugin=task/cgroup"));
        assert_eq!(
            conf_value(&out, "ProctrackType").as_deref(),
            Some("proctrack/linuxproc")
        );
        assert_eq!(conf_value(&out, "tasKplugin").as_deref(), Some("task/none"));
        let cg = local_cgroup_conf("CgroupPlugin=cgroup/v2\nConstrainCores=yes\n");
        assert!(
            cg.contains(
                "CgroupPlugin=disabled\n#CgroupPlugin=cgroup/v2\nConstrainCores=yes\nIgnoreSystemd=yes\n"
            ),
            "{cg}"
        );
        assert_eq!(conf_value("A=1\n#A=2\nA=3 # c\n", "A").as_deref(), Some("3"));
    }
}
