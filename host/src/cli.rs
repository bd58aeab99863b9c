//! Command-line interface: argument definitions and the subcommands' wiring.

use std::{io::Write, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    plugins::{EngineHandle, Plugin, PluginRegistry, PluginSource, RuntimeConfig, Tiering},
    render,
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

/// Options shared by all commands.
#[derive(Debug, Args)]
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
            cache_dir,
            tiering,
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
    /// Run the embedded Kubernetes API server alone (for kubectl and experiments).
    Apiserver(ApiserverArgs),
    /// Print the CustomResourceDefinitions of the Slinky kinds (YAML).
    Crds,
    /// Print a complete install (CRDs, RBAC, Deployment with leader election, metrics Service)
    /// for `kubectl apply --server-side -f -`.
    Manifests(crate::manifests::ManifestsArgs),
    /// Reconcile Controllers and NodeSets on a cluster, or on the embedded API server.
    #[command(after_help = RUN_EXAMPLES)]
    Run(Box<crate::run::RunArgs>),
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

/// `apiserver` options.
#[derive(Debug, Args)]
pub struct ApiserverArgs {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, env = "SLINKY_HOST_APISERVER_PORT", default_value_t = 6443)]
    pub port: u16,
    /// Write a kubeconfig for the server here.
    #[arg(
        long,
        env = "SLINKY_HOST_KUBECONFIG_OUT",
        default_value = "embedded.kubeconfig"
    )]
    pub kubeconfig_out: PathBuf,
    /// Events kept for watches; older resourceVersions get 410 Gone.
    #[arg(long, env = "SLINKY_HOST_WATCH_WINDOW", default_value_t = 10_000)]
    pub watch_window: usize,
    /// Simulate pod scheduling and readiness on this many nodes (0: off).
    #[arg(long, env = "SLINKY_HOST_SIMULATE_NODES", default_value_t = 3)]
    pub simulate_nodes: usize,
    /// Fault rules `verb:resource:error:times[:after]`, e.g. `create:pods:500:0.1`,
    /// `update:nodesets/status:409:count=5`, `create:pods:timeout:count=2:after`.
    #[arg(long = "fault", env = "SLINKY_HOST_FAULTS", value_delimiter = ',')]
    pub faults: Vec<String>,
    /// Seed of the fault RNG (replays the same faults for the same requests).
    #[arg(long, env = "SLINKY_HOST_FAULT_SEED", default_value_t = 0)]
    pub fault_seed: u64,
    /// Latency added to every request, in milliseconds.
    #[arg(long, env = "SLINKY_HOST_LATENCY_MS", default_value_t = 0)]
    pub latency_ms: u64,
    /// Delay of every watch event, in milliseconds.
    #[arg(long, env = "SLINKY_HOST_WATCH_DELAY_MS", default_value_t = 0)]
    pub watch_delay_ms: u64,
    /// Keep the objects here across restarts (snapshot + write-ahead log); memory only by default.
    #[arg(long, env = "SLINKY_HOST_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
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
}

impl From<KindArg> for crate::plugins::BuilderKind {
    fn from(k: KindArg) -> Self {
        match k {
            KindArg::ControllerService => crate::plugins::BuilderKind::ControllerService,
            KindArg::NodesetPod => crate::plugins::BuilderKind::NodesetPod,
            KindArg::ControllerChildren => crate::plugins::BuilderKind::ControllerChildren,
            KindArg::NodesetChildren => crate::plugins::BuilderKind::NodesetChildren,
        }
    }
}

/// Run a parsed command line.
///
/// # Errors
/// Whatever the command fails with, with context naming the input.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let long_running = matches!(cli.command, Command::Run(_));
    let engine = || EngineHandle::new(cli.global.runtime_config(long_running));
    match cli.command {
        Command::Render(args) => render_cmd(&engine()?, args),
        Command::Plugin(PluginCommand::Inspect { path }) => inspect(&engine()?, &path),
        Command::Plugin(PluginCommand::Reload { admin_addr }) => reload(admin_addr),
        Command::Plugin(PluginCommand::New { name, kind, dir, sdk }) => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let made = crate::scaffold::new_plugin(&name, kind.into(), &dir, sdk.as_deref())?;
            let d = made.dir.display();
            let w = made.wasm.display();
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "created {d}: a {} builder starting from the bundled one\n\nnext:\n  cd {d}\n  cargo test\n  \
                 cargo build --target wasm32-wasip2 --release\n  slinky-host plugin check {w}\n  \
                 slinky-host render -f cluster.yaml --plugin {w}\n  \
                 cp {w} PLUGINS_DIR/   # a running `slinky-host run --plugins-dir PLUGINS_DIR` hot-reloads it",
                crate::plugins::BuilderKind::from(kind)
            )?;
            Ok(())
        }
        Command::Plugin(PluginCommand::Check {
            path,
            files,
            cluster_domain,
        }) => {
            let manifests = render::read_manifests(&files)?;
            let references = render::read_references(&files)?;
            let ctx = crate::BuildContext { cluster_domain };
            let report = crate::check::check_with(&engine()?, &path, &manifests, &references, &ctx)?;
            std::io::stdout()
                .lock()
                .write_all(report.text.as_bytes())
                .context("cannot write to stdout")?;
            if !report.ok {
                anyhow::bail!("{} failed on some inputs (see FAIL above)", path.display());
            }
            Ok(())
        }
        Command::Apiserver(args) => apiserver(args),
        Command::Run(args) => {
            let engine = engine()?;
            let plugins = Arc::new(PluginRegistry::new(&engine, &args.plugins)?);
            let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            runtime.block_on(crate::run::run(*args, plugins))
        }
        Command::Manifests(args) => {
            let text = crate::manifests::yaml(&args)?;
            std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .context("cannot write to stdout")?;
            Ok(())
        }
        Command::Version { output } => {
            let report = version_report();
            let text = match output {
                OutputFormat::Yaml => serde_saphyr::to_string(&report)?,
                OutputFormat::Json => serde_json::to_string_pretty(&report)? + "\n",
            };
            std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .context("cannot write to stdout")?;
            Ok(())
        }
        Command::Crds => {
            let text = crate::crds::crds_yaml()?;
            std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .context("cannot write to stdout")?;
            Ok(())
        }
    }
}

/// Without the `embedded` feature there is no embedded API server.
#[cfg(not(feature = "embedded"))]
fn apiserver(_: ApiserverArgs) -> anyhow::Result<()> {
    anyhow::bail!("this slinky-host was built without the `embedded` feature: `apiserver` is not available")
}

#[cfg(feature = "embedded")]
fn apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    use crate::embedded::{ApiServer, ApiServerConfig, FaultRule, LifecycleConfig};
    let rules = args
        .faults
        .iter()
        .map(|f| FaultRule::parse(f))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let config = ApiServerConfig {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], args.port)),
            watch_window: args.watch_window,
            fault_seed: args.fault_seed,
            lifecycle: (args.simulate_nodes > 0).then(|| LifecycleConfig {
                nodes: args.simulate_nodes,
                ..Default::default()
            }),
            state_dir: args.state_dir.clone(),
            statefulsets: args.simulate_nodes > 0,
            ..Default::default()
        };
        let server = ApiServer::start(config)
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{}", args.port))?;
        for rule in rules {
            server.faults().add(rule);
        }
        server
            .faults()
            .set_latency(Duration::from_millis(args.latency_ms));
        server
            .faults()
            .set_watch_delay(Duration::from_millis(args.watch_delay_ms));
        server
            .write_kubeconfig(&args.kubeconfig_out)
            .with_context(|| format!("cannot write the kubeconfig to {}", args.kubeconfig_out.display()))?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "embedded API server at {}", server.url())?;
        writeln!(out, "kubeconfig: {}", args.kubeconfig_out.display())?;
        writeln!(
            out,
            "try: kubectl --kubeconfig {} get namespaces",
            args.kubeconfig_out.display()
        )?;
        drop(out);
        tokio::signal::ctrl_c().await.context("cannot wait for Ctrl-C")?;
        server.shutdown().await;
        Ok(())
    })
}

/// What `version` prints: this binary's versions and the digests of the plugins it embeds (the
/// digests a pod's `slinky.slurm.net/builder-digest` annotation shows when the bundled builder
/// built it).
pub fn version_report() -> serde_json::Value {
    let plugins: Vec<serde_json::Value> = crate::plugins::bundled::KINDS
        .iter()
        .map(|&kind| {
            let bytes = crate::plugins::bundled::bundled_bytes(kind);
            serde_json::json!({
                "kind": kind.as_str(),
                "digest": format!("sha256:{}", crate::plugins::digest(bytes)),
                "bytes": bytes.len(),
            })
        })
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "contractVersion": crate::plugins::CONTRACT_VERSION,
        "wasmtime": crate::plugins::WASMTIME_VERSION,
        "bundledPlugins": plugins,
    })
}

fn render_cmd(engine: &Arc<EngineHandle>, args: RenderArgs) -> anyhow::Result<()> {
    let manifests = render::read_manifests(&args.files)?;
    let references = render::read_references(&args.files)?;
    let registry = PluginRegistry::new(engine, &args.plugins)?;
    let ctx = crate::BuildContext {
        cluster_domain: args.cluster_domain,
    };
    let children = render::render_with(&manifests, &references, &registry, &ctx)?;
    let text = match args.output {
        OutputFormat::Yaml => render::to_yaml(&children)?,
        OutputFormat::Json => serde_json::to_string_pretty(&render::to_json_list(&children))? + "\n",
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write to stdout")?;
    Ok(())
}

fn inspect(engine: &Arc<EngineHandle>, path: &std::path::Path) -> anyhow::Result<()> {
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
    let text = serde_saphyr::to_string(&report)?;
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write to stdout")?;
    Ok(())
}

/// `POST path` on `addr` with hyper's HTTP/1 client: the status and the body.
async fn post(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(hyper::StatusCode, String)> {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| {
        format!("cannot reach the host at {addr}: is `slinky-host run` serving its admin endpoints there (--admin-addr)?")
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .with_context(|| format!("no HTTP/1 connection to {addr}"))?;
    let driver = tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<bytes::Bytes>::new())
        .context("cannot build the request")?;
    let response = sender
        .send_request(request)
        .await
        .with_context(|| format!("no answer from {addr}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .with_context(|| format!("the answer from {addr} broke off"))?
        .to_bytes();
    driver.abort();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `plugin reload`: `POST /plugins/reload` on the running host's admin endpoint.
fn reload(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (status, body) = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), post(addr, "/plugins/reload"))
            .await
            .with_context(|| format!("the host at {addr} did not answer within 120 s"))?
    })?;
    if status != hyper::StatusCode::OK {
        anyhow::bail!("the host at {addr} answered {status}: {}", body.trim());
    }
    let report: crate::plugins::reload::ScanReport = serde_json::from_str(&body)
        .with_context(|| format!("the host at {addr} answered something else than a reload report"))?;
    let mut out = std::io::stdout().lock();
    for s in &report.swapped {
        writeln!(out, "swapped: {s}")?;
    }
    for p in &report.pending {
        writeln!(out, "pending: {p}")?;
    }
    if report.swapped.is_empty() && report.refused.is_empty() {
        writeln!(out, "nothing changed")?;
    }
    drop(out);
    if !report.refused.is_empty() {
        let lines: Vec<String> = report
            .refused
            .iter()
            .map(|r| format!("refused: {}: {}", r.source, r.reason))
            .collect();
        anyhow::bail!("{}\n(the previous versions keep serving)", lines.join("\n"));
    }
    Ok(())
}
