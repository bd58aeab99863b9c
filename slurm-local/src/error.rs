//! What can go wrong, each error naming what failed and how to fix it.

use std::path::PathBuf;

/// An error of the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Slurm build directory lacks the daemons.
    #[error(
        "no Slurm build in {}: {missing} is missing; run ../shared/tools/realslurm/setup.sh \
         (REALSLURM_DIR={} to build there)",
        dir.display(), dir.display()
    )]
    NoSlurm {
        /// The directory looked at.
        dir: PathBuf,
        /// The first file missing (`sbin/slurmctld` …).
        missing: String,
    },
    /// Not running as root.
    #[error(
        "needs root for network namespaces, bridges and mounts (running as uid {uid}); run the \
         tests or `slinky-host run --embedded --slurm` as root"
    )]
    NotRoot {
        /// The effective uid.
        uid: u32,
    },
    /// A tool the harness needs is not installed.
    #[error("`{tool}` is not installed: {why}")]
    MissingTool {
        /// The tool (`ip`, `nsenter` …).
        tool: String,
        /// What to install.
        why: String,
    },
    /// A user the daemons run as does not exist.
    #[error("the user `{user}` does not exist: {fix}")]
    NoUser {
        /// The user name.
        user: String,
        /// How to create it.
        fix: String,
    },
    /// A command the harness ran failed.
    #[error("{what}: `{command}` failed ({status}): {stderr}")]
    Command {
        /// What the harness was doing.
        what: String,
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error (trimmed).
        stderr: String,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What the harness was doing, naming the path.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A request to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What the harness asked.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// No free private /24 for the harness's bridge.
    #[error(
        "no free /24 in 10.200.0.0-10.250.255.0 for the bridge (every one is routed here); \
         remove stale `slinky-*` bridges with `ip link del`"
    )]
    NoSubnet,
    /// Every address of the bridge's /24 is in use.
    #[error("all 245 pod addresses of {subnet}.0/24 are in use")]
    NoAddress {
        /// The subnet's first three octets.
        subnet: String,
    },
    /// A pod the caller named is not run by the harness.
    #[error("no {role} pod named {name} is run by this harness (pods run: {known})")]
    NoSuchPod {
        /// The role looked for (`slurmctld`).
        role: String,
        /// The name asked for.
        name: String,
        /// The pods that are run.
        known: String,
    },
    /// An argument the harness cannot use.
    #[error("{0}")]
    Invalid(String),
    /// Nothing to run a command against yet.
    #[error("{0}")]
    NotReady(String),
    /// The harness is already serving a Controller.
    #[error("this harness already runs the Controller {0}; start another harness for another Controller")]
    AlreadyAttached(String),
    /// The harness was shut down.
    #[error("the harness has been shut down")]
    ShutDown,
    /// Something took too long.
    #[error("{0}")]
    Timeout(String),
}

/// A result of the harness.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] about `what`.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
