//! The command line: its arguments, and one module per command, each with what it does and
//! prints.

/// `apiserver`: the embedded Kubernetes API server alone.
pub mod apiserver;
/// `plugin check`: a plugin's outputs against the bundled builder's.
pub mod check;
/// `crds`: the CustomResourceDefinitions of the Slinky kinds.
pub mod crds;
/// `plugin diff`: what a plugin would change in a live cluster.
pub mod diff;
mod diff_live;
/// `manifests`: a complete install.
pub mod manifests;
/// `plugin`: its subcommands, and `plugin inspect`.
pub mod plugin;
/// `plugin reload`: ask a running host to rescan its plugins directory.
pub mod reload;
/// `render`: what the builders make of manifests, offline.
pub mod render;
/// `run`: reconcile on a cluster or on the embedded API server.
pub mod run;
/// `plugin new`: a new builder plugin crate.
pub mod scaffold;
/// `version`: the host's versions and bundled plugins.
pub mod version;

use std::{io::Write, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    plugins::{Allow, EngineHandle, RuntimeConfig, Tiering},
    telemetry::LogFormat,
};

/// Examples shown by `slinky-host --help`.
const EXAMPLES: &str = "Examples:
  # The example Slurm cluster on the embedded API server (no cluster needed)
  slinky-host run --embedded --apply examples/slurm-cluster.yaml

  # On a cluster: install the CRDs, then reconcile with the current kubeconfig
  slinky-host crds | kubectl apply --server-side -f -
  slinky-host run --namespace slurm

  # What the builders make of your manifests, offline
  slinky-host render -f cluster.yaml

  # A complete install (CRDs, RBAC, Deployment with leader election)
  slinky-host manifests | kubectl apply --server-side -f -

  # Write, check and hot-reload your own builder
  slinky-host plugin new site-pods --kind nodeset-pod
  slinky-host plugin check target/wasm32-wasip2/release/site_pods.wasm

Every option can also be set from the environment (SLINKY_HOST_...; see each command's --help).";

/// A WebAssembly-pluggable reconciliation host for Slinky (Slurm on Kubernetes).
#[derive(Debug, Parser)]
#[command(name = "slinky-host", version, about, after_help = EXAMPLES)]
pub struct Cli {
    /// Options of every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by all commands: shown under their own heading, after a command's own.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Log level or filter (`info`, `debug`, `slinky_host=debug,warn`); `RUST_LOG` wins.
    /// Default: `info` for `run`, `warn` for the other commands.
    #[arg(long, global = true, env = "SLINKY_HOST_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "SLINKY_HOST_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Deadline of one plugin call, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "SLINKY_HOST_PLUGIN_DEADLINE_MS",
        default_value_t = 1000
    )]
    pub plugin_deadline_ms: u64,
    /// Memory cap of one plugin call, in MiB.
    #[arg(
        long,
        global = true,
        env = "SLINKY_HOST_PLUGIN_MEMORY_MIB",
        default_value_t = 64
    )]
    pub plugin_memory_mib: usize,
    /// Plugin calls running at once (more wait for one to end); with the pooling allocator, its
    /// instance slots.
    #[arg(
        long,
        global = true,
        env = "SLINKY_HOST_PLUGIN_CONCURRENCY",
        default_value_t = slinky_runtime::DEFAULT_CONCURRENT_CALLS
    )]
    pub plugin_concurrency: u32,
    /// MiB of each pool slot's memory kept resident between calls (what a call touched beyond
    /// it is given back to the kernel): the pool's resident memory is at most this times
    /// --plugin-concurrency.
    #[arg(
        long,
        global = true,
        env = "SLINKY_HOST_PLUGIN_KEEP_RESIDENT_MIB",
        default_value_t = slinky_runtime::DEFAULT_KEEP_RESIDENT >> 20
    )]
    pub plugin_keep_resident_mib: usize,
    /// Directory of precompiled plugins (default: $XDG_CACHE_HOME/slinky-host/components).
    #[arg(long, global = true, env = "SLINKY_HOST_PLUGIN_CACHE")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Do not keep precompiled plugins on disk.
    #[arg(long, global = true, env = "SLINKY_HOST_NO_PLUGIN_CACHE")]
    pub no_plugin_cache: bool,
    /// How a plugin that is not in the cache is compiled: `tiered` serves it at once from Winch
    /// code and switches to Cranelift code compiled in the background; `optimized` compiles it
    /// with Cranelift before it serves; `baseline` runs Winch code only. Default: `tiered` for
    /// `run`; for the one-shot commands (`render`, `plugin check`, `plugin inspect`), which exit
    /// before a background compile ends, `optimized` (the cached artifact makes the next run
    /// fast), or `baseline` with --no-plugin-cache.
    #[arg(long, global = true, env = "SLINKY_HOST_PLUGIN_TIERING", value_enum)]
    pub plugin_tiering: Option<Tiering>,
    /// Let plugins build what the output policy refuses by default because it reaches past the
    /// parent's spec (repeatable, or comma-separated). The same for `run`, `render` and `plugin
    /// check`. Default: none. Each class, and why it is refused: docs/writing-plugins.md.
    #[arg(
        long = "allow",
        global = true,
        env = "SLINKY_HOST_ALLOW",
        value_enum,
        value_delimiter = ',',
        value_name = "CLASS"
    )]
    pub allow: Vec<Allow>,
}

impl Cli {
    /// The log level: the one asked for, else `info` for `run` and `warn` for the others.
    pub fn log_level(&self) -> &str {
        match (&self.global.log_level, &self.command) {
            (Some(level), _) => level,
            (None, Command::Run(_)) => "info",
            (None, _) => "warn",
        }
    }
}

impl GlobalArgs {
    /// The plugin runtime configuration these options describe, for a long-running process
    /// (`run`) or a one-shot command (see `--plugin-tiering` for the difference).
    pub fn runtime_config(&self, long_running: bool) -> RuntimeConfig {
        let defaults = RuntimeConfig::default();
        let cache_dir = if self.no_plugin_cache {
            None
        } else {
            self.plugin_cache_dir.clone().or(defaults.cache_dir.clone())
        };
        let tiering = match (self.plugin_tiering, long_running, &cache_dir) {
            (Some(tiering), _, _) => tiering,
            (None, true, _) => Tiering::Tiered,
            (None, false, Some(_)) => Tiering::Optimized,
            (None, false, None) => Tiering::Baseline,
        };
        RuntimeConfig {
            call_deadline: Duration::from_millis(self.plugin_deadline_ms.max(1)),
            memory_limit: self.plugin_memory_mib.max(1) << 20,
            max_concurrent_calls: self.plugin_concurrency.max(1),
            keep_resident: self.plugin_keep_resident_mib << 20,
            cache_dir,
            tiering,
            allow: self.allow.iter().copied().collect(),
            ..defaults
        }
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the objects the builders make for Controller/NodeSet manifests (offline).
    Render(render::RenderArgs),
    /// Work with plugin files.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Run the embedded Kubernetes API server alone (for kubectl and experiments).
    Apiserver(apiserver::ApiserverArgs),
    /// Print the CustomResourceDefinitions of the Slinky kinds (YAML).
    Crds,
    /// Print a complete install (CRDs, RBAC, Deployment with leader election, metrics Service)
    /// for `kubectl apply --server-side -f -`.
    Manifests(Box<manifests::ManifestsArgs>),
    /// Reconcile Controllers and NodeSets on a cluster, or on the embedded API server.
    #[command(after_help = RUN_EXAMPLES)]
    Run(Box<run::RunArgs>),
    /// Print the host's version, contract and wasmtime versions, and its bundled plugins'
    /// digests.
    Version {
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
        output: OutputFormat,
    },
}

/// Examples shown by `slinky-host run --help`.
const RUN_EXAMPLES: &str = "Examples:
  # Everything in-process: the embedded API server, simulated nodes, the example cluster
  slinky-host run --embedded --apply examples/slurm-cluster.yaml
  kubectl --kubeconfig embedded.kubeconfig get slurm,pods -A

  # On a cluster, two replicas electing a leader, hot-reloading builders from a directory
  slinky-host run --leader-elect --plugins-dir /etc/slinky-host/plugins

  # Only some namespaces, with metrics on all interfaces (admin stays on loopback)
  slinky-host run --namespace slurm --namespace hpc --http-addr 0.0.0.0:8080";

/// Output formats of `render`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Kubernetes YAML, one document per object.
    Yaml,
    /// One JSON `v1` `List`.
    Json,
}

/// Run a parsed command line.
///
/// # Errors
/// Whatever the command fails with, with context naming the input.
pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    use plugin::PluginCommand;
    let long_running = matches!(cli.command, Command::Run(_));
    let engine = || EngineHandle::new(cli.global.runtime_config(long_running));
    match cli.command {
        Command::Render(args) => render::execute(&engine()?, args),
        Command::Plugin(PluginCommand::Inspect { path }) => plugin::inspect(&engine()?, &path),
        Command::Plugin(PluginCommand::Reload { admin_addr }) => reload::execute(admin_addr),
        Command::Plugin(PluginCommand::Push {
            path,
            reference,
            sign_key,
            insecure,
            registry_credentials,
        }) => plugin::push(
            &engine()?,
            &path,
            &reference,
            sign_key.as_deref(),
            insecure,
            registry_credentials.as_deref(),
        ),
        Command::Plugin(PluginCommand::Keygen { prefix }) => plugin::keygen(&prefix),
        Command::Plugin(PluginCommand::Sign { path, key, output }) => plugin::sign(&path, &key, output),
        Command::Plugin(PluginCommand::Diff(args)) => match args.path.clone() {
            Some(path) => diff::execute(&engine()?, args, &path),
            None => diff_live::execute(&engine()?, &args),
        },
        Command::Plugin(PluginCommand::New { name, kind, dir, sdk }) => {
            scaffold::execute(&name, kind, dir, sdk.as_deref())
        }
        Command::Plugin(PluginCommand::Check {
            path,
            files,
            cluster_domain,
            settings,
        }) => {
            let engine = engine()?;
            if let Some(settings) = settings.as_deref() {
                plugin::check_settings(&engine, &path, settings)?;
            }
            check::execute(&engine, &path, &files, cluster_domain)
        }
        Command::Apiserver(args) => apiserver::execute(args),
        Command::Run(args) => run::execute(&engine()?, *args),
        Command::Manifests(args) => print(&manifests::yaml(&args)?),
        Command::Version { output } => version::execute(output),
        Command::Crds => print(&crds::crds_yaml()?),
    }
}

/// Write a command's output to stdout.
///
/// # Errors
/// Stdout is closed.
pub fn print(text: &str) -> anyhow::Result<()> {
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write to stdout")
}

/// Where BuilderPlugins' modules come from: OCI registries (plain HTTP only to loopback and
/// `insecure` ones) kept in `cache` (default: inside the compiled-component cache, the install's
/// writable emptyDir), ConfigMaps read with `client` from `config_map_namespaces` (empty: the
/// client's default namespace, the host's own), signatures verified with the PEM public keys at
/// `public_key` when given; without keys, registry modules run only with `allow_unsigned`;
/// registries that ask for credentials get those of the Docker config `credentials`.
///
/// # Errors
/// The key cannot be read or parsed; the system's root certificates cannot be read.
pub(crate) fn module_source(
    client: &kube::Client,
    cache: Option<std::path::PathBuf>,
    insecure: Vec<String>,
    public_key: Option<&std::path::Path>,
    allow_unsigned: bool,
    config_map_namespaces: Vec<String>,
    credentials: Option<&std::path::Path>,
) -> anyhow::Result<slinky_plugin_source::ModuleSource> {
    use anyhow::Context as _;
    let public_key = match public_key {
        None => None,
        Some(path) => {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --plugin-public-key {}", path.display()))?;
            Some(
                slinky_plugin_source::PublicKey::from_pem(&pem)
                    .with_context(|| format!("--plugin-public-key {}", path.display()))?,
            )
        }
    };
    let cache = cache.or_else(|| crate::plugins::default_cache_dir().map(|d| d.join("oci")));
    let proxies = slinky_plugin_source::Proxies::from_env();
    if let Some(proxy) = "https://registry.invalid/"
        .parse()
        .ok()
        .and_then(|u| proxies.route(&u))
    {
        tracing::info!(%proxy, "registries are reached through the environment's proxy (HTTPS_PROXY; NO_PROXY names exceptions)");
    }
    let oci = slinky_plugin_source::Oci::with_proxies(
        slinky_plugin_source::DigestStore::new(cache),
        insecure,
        proxies,
    )?
    .with_credentials(registry_credentials(credentials)?);
    Ok(slinky_plugin_source::ModuleSource::new(
        oci,
        client.clone(),
        public_key,
        crate::plugins::gunzip_if_gzipped,
    )
    .allowing_unsigned(allow_unsigned)
    .with_config_map_namespaces(config_map_namespaces))
}

/// The registry credentials in the Docker config `file`, or none.
///
/// # Errors
/// The file cannot be read or is no Docker config.
pub(crate) fn registry_credentials(
    file: Option<&std::path::Path>,
) -> anyhow::Result<slinky_plugin_source::Credentials> {
    Ok(match file {
        Some(f) => slinky_plugin_source::Credentials::from_file(f.to_path_buf())?,
        None => slinky_plugin_source::Credentials::none(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--allow` takes every class by the name the policy's refusals print, repeated or
    /// comma-separated, and the runtime gets exactly those.
    #[test]
    fn allow_takes_every_class_by_the_name_refusals_print() -> Result<(), clap::Error> {
        for class in Allow::ALL {
            let cli = Cli::try_parse_from(["slinky-host", "crds", "--allow", class.as_str()])?;
            let allow = cli.global.runtime_config(false).allow;
            assert_eq!(allow.iter().collect::<Vec<_>>(), [class]);
        }
        let cli = Cli::try_parse_from([
            "slinky-host",
            "crds",
            "--allow",
            "host-path,finalizers",
            "--allow=privileges",
        ])?;
        assert_eq!(
            cli.global.runtime_config(true).allow.to_string(),
            "finalizers,host-path,privileges"
        );
        let cli = Cli::try_parse_from(["slinky-host", "crds"])?;
        assert!(cli.global.runtime_config(true).allow.is_empty());
        assert!(Cli::try_parse_from(["slinky-host", "crds", "--allow", "everything"]).is_err());
        Ok(())
    }
}
