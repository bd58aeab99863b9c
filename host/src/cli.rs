//! Command-line interface: argument definitions and the subcommands' wiring.

use std::{io::Write, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    plugins::{EngineHandle, Plugin, PluginRegistry, PluginSource, RuntimeConfig},
    render,
    telemetry::LogFormat,
};

/// A WebAssembly-pluggable reconciliation host for Slinky (Slurm on Kubernetes).
#[derive(Debug, Parser)]
#[command(name = "slinky-host", version, about)]
pub struct Cli {
    /// Options of every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by all commands.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Log level or filter (`info`, `debug`, `slinky_host=debug,warn`); `RUST_LOG` wins.
    #[arg(long, global = true, env = "SLINKY_HOST_LOG_LEVEL", default_value = "warn")]
    pub log_level: String,
    /// Log format.
    #[arg(long, global = true, env = "SLINKY_HOST_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Deadline of one plugin call, in milliseconds.
    #[arg(long, global = true, env = "SLINKY_HOST_PLUGIN_DEADLINE_MS", default_value_t = 1000)]
    pub plugin_deadline_ms: u64,
    /// Memory cap of one plugin call, in MiB.
    #[arg(long, global = true, env = "SLINKY_HOST_PLUGIN_MEMORY_MIB", default_value_t = 64)]
    pub plugin_memory_mib: usize,
    /// Directory of precompiled plugins (default: $XDG_CACHE_HOME/slinky-host/components).
    #[arg(long, global = true, env = "SLINKY_HOST_PLUGIN_CACHE")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Do not keep precompiled plugins on disk.
    #[arg(long, global = true, env = "SLINKY_HOST_NO_PLUGIN_CACHE")]
    pub no_plugin_cache: bool,
}

impl GlobalArgs {
    /// The plugin runtime configuration these options describe.
    pub fn runtime_config(&self) -> RuntimeConfig {
        let defaults = RuntimeConfig::default();
        RuntimeConfig {
            call_deadline: Duration::from_millis(self.plugin_deadline_ms.max(1)),
            memory_limit: self.plugin_memory_mib.max(1) << 20,
            cache_dir: if self.no_plugin_cache {
                None
            } else {
                self.plugin_cache_dir.clone().or(defaults.cache_dir)
            },
            ..defaults
        }
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the objects the builders make for Controller/NodeSet manifests (offline).
    Render(RenderArgs),
    /// Work with plugin files.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

/// Output formats of `render`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Kubernetes YAML, one document per object.
    Yaml,
    /// One JSON `v1` `List`.
    Json,
}

/// `render` options.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest files (YAML, multi-document, or JSON) with Controllers and NodeSets.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Plugin files overriding the bundled builders of the kinds they build.
    #[arg(long = "plugin")]
    pub plugins: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: OutputFormat,
    /// The cluster DNS domain given to builders.
    #[arg(long, env = "SLINKY_HOST_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
}

/// `plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load a plugin and print what it says about itself, its digest and contract version.
    Inspect {
        /// The plugin file (`.wasm` component).
        path: PathBuf,
    },
}

/// Run a parsed command line.
///
/// # Errors
/// Whatever the command fails with, with context naming the input.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let engine = EngineHandle::new(cli.global.runtime_config())?;
    match cli.command {
        Command::Render(args) => render_cmd(&engine, args),
        Command::Plugin(PluginCommand::Inspect { path }) => inspect(&engine, &path),
    }
}

fn render_cmd(engine: &Arc<EngineHandle>, args: RenderArgs) -> anyhow::Result<()> {
    let manifests = render::read_manifests(&args.files)?;
    let registry = PluginRegistry::new(engine, &args.plugins)?;
    let ctx = crate::BuildContext { cluster_domain: args.cluster_domain };
    let children = render::render(&manifests, &registry, &ctx)?;
    let text = match args.output {
        OutputFormat::Yaml => render::to_yaml(&children)?,
        OutputFormat::Json => serde_json::to_string_pretty(&render::to_json_list(&children))? + "\n",
    };
    std::io::stdout().lock().write_all(text.as_bytes()).context("cannot write to stdout")?;
    Ok(())
}

fn inspect(engine: &Arc<EngineHandle>, path: &std::path::Path) -> anyhow::Result<()> {
    let plugin = Plugin::load_file(engine, path).with_context(|| format!("cannot load {}", path.display()))?;
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
    let text = serde_yaml::to_string(&report)?;
    std::io::stdout().lock().write_all(text.as_bytes()).context("cannot write to stdout")?;
    Ok(())
}
