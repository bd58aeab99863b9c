//! `slinky-host plugin`: its subcommands, and `plugin inspect`.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::{Subcommand, ValueEnum};

use super::print;
use crate::plugins::{EngineHandle, Plugin, PluginSource};

/// `plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load a plugin and print what it says about itself, its digest and contract version.
    Inspect {
        /// The plugin file (`.wasm` component).
        path: PathBuf,
    },
    /// Create a new builder plugin crate that starts from the bundled builder's behaviour.
    New {
        /// The plugin (crate) name, e.g. `site-gpu-pods`.
        name: String,
        /// The builder kind it builds.
        #[arg(long, value_enum)]
        kind: KindArg,
        /// Where to create it (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The guest SDK to depend on (default: the `guest-sdk` of the source tree this binary
        /// was built from).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Load a plugin, print describe(), build inputs with it through the output policy, and show
    /// how its outputs differ from the bundled builder's. Exits 1 when a build fails.
    Check {
        /// The plugin file (`.wasm` component).
        path: PathBuf,
        /// Manifests with Controllers/NodeSets to build (default: the example cluster).
        #[arg(short = 'f', long = "filename")]
        files: Vec<PathBuf>,
        /// The cluster DNS domain given to builders.
        #[arg(long, env = "SLINKY_HOST_CLUSTER_DOMAIN", default_value = "cluster.local")]
        cluster_domain: String,
    },
    /// Ask a running `run --plugins-dir` host to rescan its plugins directory now (like SIGHUP)
    /// and print what it swapped and refused; exits 1 when a version was refused.
    Reload {
        /// The host's admin address (its `run --admin-addr`).
        #[arg(long, env = "SLINKY_HOST_ADMIN_ADDR", default_value = "127.0.0.1:8081")]
        admin_addr: std::net::SocketAddr,
    },
}

/// A builder kind on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// The Controller's Service.
    ControllerService,
    /// A NodeSet's pods.
    NodesetPod,
    /// The Controller's other children: the slurmctld StatefulSet, the slurm.conf ConfigMap, the
    /// internal Service.
    ControllerChildren,
    /// A NodeSet's other children: the workers' Service and PodDisruptionBudget, the SSH ConfigMap.
    NodesetChildren,
    /// A RestApi's children: slurmrestd's Deployment and Service.
    RestapiChildren,
    /// A LoginSet's children: the login Deployment, its Service and sshd_config.
    LoginsetChildren,
    /// An Accounting's children: slurmdbd's StatefulSet, Service and slurmdbd.conf Secret.
    AccountingChildren,
}

impl From<KindArg> for crate::plugins::BuilderKind {
    fn from(k: KindArg) -> Self {
        match k {
            KindArg::ControllerService => crate::plugins::BuilderKind::ControllerService,
            KindArg::NodesetPod => crate::plugins::BuilderKind::NodesetPod,
            KindArg::ControllerChildren => crate::plugins::BuilderKind::ControllerChildren,
            KindArg::NodesetChildren => crate::plugins::BuilderKind::NodesetChildren,
            KindArg::RestapiChildren => crate::plugins::BuilderKind::RestapiChildren,
            KindArg::LoginsetChildren => crate::plugins::BuilderKind::LoginsetChildren,
            KindArg::AccountingChildren => crate::plugins::BuilderKind::AccountingChildren,
        }
    }
}

/// `plugin inspect`: load the plugin at `path` and print what it says about itself.
///
/// # Errors
/// The plugin does not load, or stdout is closed.
pub fn inspect(engine: &Arc<EngineHandle>, path: &std::path::Path) -> anyhow::Result<()> {
    let plugin =
        Plugin::load_file(engine, path).with_context(|| format!("cannot load {}", path.display()))?;
    let info = plugin.info();
    let report = serde_json::json!({
        "name": info.name,
        "version": info.version,
        "kinds": info.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        "contractVersion": info.contract_version,
        "hostContractVersion": crate::plugins::CONTRACT_VERSION,
        "digest": format!("sha256:{}", plugin.digest()),
        "source": match plugin.source() { PluginSource::Bundled => "bundled".to_string(), PluginSource::File(p) => p.display().to_string() },
    });
    print(&serde_saphyr::to_string(&report)?)
}
