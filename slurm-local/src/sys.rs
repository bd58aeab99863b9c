//! Small system helpers: running commands, signals, users, shell quoting.

use std::{path::Path, process::Stdio};

use crate::error::{Error, Result};

/// The tools the harness runs, with the package that has them.
pub(crate) const TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("nsenter", "util-linux"),
    ("unshare", "util-linux"),
    ("setpriv", "util-linux"),
    ("mount", "mount"),
    ("sh", "dash"),
    ("sleep", "coreutils"),
];

/// `program args…` as one line, for messages.
pub(crate) fn command_line(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run `program args…` and wait; an error names `what`, the command and its stderr.
pub(crate) async fn run(what: &str, program: &str, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Error::io(format!("{what}: cannot run {program}"), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            what: what.into(),
            command: command_line(program, args),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run `program args…` synchronously (for `Drop` and stale clean-up), ignoring failures but
/// returning stdout.
pub(crate) fn run_sync(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Send `signal` to `pid` (an error when it is gone is ignored).
pub(crate) fn signal(pid: u32, signal: rustix::process::Signal) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if let Some(pid) = rustix::process::Pid::from_raw(raw) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Whether a process `pid` exists.
pub(crate) fn alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    rustix::process::Pid::from_raw(raw).is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// A process's start time (field 22 of `/proc/PID/stat`), to tell a reused pid from its owner.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The effective uid.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The uid and gid of `user`, from `id`.
pub(crate) async fn user_ids(user: &str) -> Option<(u32, u32)> {
    let uid = run("user", "id", &["-u", user]).await.ok()?;
    let gid = run("user", "id", &["-g", user]).await.ok()?;
    Some((uid.trim().parse().ok()?, gid.trim().parse().ok()?))
}

/// Whether `tool` is on `PATH`.
pub(crate) fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// `s` quoted for `sh`.
pub(crate) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `path` as a `str` for a command line (the harness's own paths are UTF-8).
pub(crate) fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn own_start_time_is_read() {
        assert!(start_time(std::process::id()).is_some());
        assert!(alive(std::process::id()));
    }
}
