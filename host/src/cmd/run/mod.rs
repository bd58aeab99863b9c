//! `slinky-host run`: reconcile on a cluster (`--kubeconfig`, in-cluster config) or on the
//! embedded API server (`--embedded`).

mod cluster;
#[cfg(feature = "embedded")]
mod slurm;

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use kube::Client;
use tokio::task::JoinHandle;

use self::cluster::connect;
pub use self::cluster::{apply_files, identified, install_crds};
use crate::{
    plugins::{
        BuildContext, EngineHandle, PluginRegistry,
        reload::{self, ReloadConfig, ReloadHandle},
    },
    reconcile::{self, Handles, RunConfig},
};

/// Options of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig of the cluster (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "SLINKY_HOST_KUBECONFIG", conflicts_with = "embedded")]
    pub kubeconfig: Option<PathBuf>,
    /// Start the embedded API server (with simulated pod lifecycle) and reconcile on it.
    #[arg(long, env = "SLINKY_HOST_EMBEDDED")]
    pub embedded: bool,
    /// With --embedded: apply these manifests after installing the CRDs.
    #[arg(
        long = "apply",
        env = "SLINKY_HOST_APPLY",
        value_delimiter = ',',
        requires = "embedded"
    )]
    pub apply: Vec<PathBuf>,
    /// With --embedded: write the kubeconfig here (default: ./embedded.kubeconfig).
    #[arg(
        long,
        env = "SLINKY_HOST_KUBECONFIG_OUT",
        default_value = "embedded.kubeconfig"
    )]
    pub kubeconfig_out: PathBuf,
    /// Serve only this namespace; repeatable (default: all namespaces).
    #[arg(long = "namespace", env = "SLINKY_HOST_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Serve /metrics, /healthz, /livez and /readyz here (for Prometheus and the kubelet).
    #[arg(long, env = "SLINKY_HOST_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: std::net::SocketAddr,
    /// Serve the admin endpoints (/plugins, POST /plugins/reload) here. Keep it on loopback
    /// (the default): anyone who reaches it can trigger reloads and read plugin digests.
    #[arg(long, env = "SLINKY_HOST_ADMIN_ADDR", default_value = "127.0.0.1:8081")]
    pub admin_addr: std::net::SocketAddr,
    /// Plugin files overriding the bundled builders of their kinds.
    #[arg(long = "plugin", env = "SLINKY_HOST_PLUGINS", value_delimiter = ',')]
    pub plugins: Vec<PathBuf>,
    /// Watch this directory for builder plugins (`*.wasm`) and hot-reload them: a file building a
    /// kind overrides that kind's builder; removing it falls back (to the bundled builder, or a
    /// `--plugin` file). May be a mounted ConfigMap.
    #[arg(long, env = "SLINKY_HOST_PLUGINS_DIR")]
    pub plugins_dir: Option<PathBuf>,
    /// How often the plugins directory is scanned, in milliseconds (a file must be unchanged for
    /// one period before it is read). `slinky-host plugin reload` or SIGHUP rescans at once.
    #[arg(long, env = "SLINKY_HOST_PLUGINS_POLL_MS", default_value_t = 1000)]
    pub plugins_poll_ms: u64,
    /// The cluster DNS domain given to builders.
    #[arg(long, env = "SLINKY_HOST_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Resync period of healthy objects, in seconds.
    #[arg(long, env = "SLINKY_HOST_RESYNC_SECONDS", default_value_t = slinky_api::defaults::RESYNC_SECONDS)]
    pub resync_seconds: u64,
    /// Delete and recreate a StatefulSet whose `serviceName`, selector or volume claim templates
    /// differ from what its builder builds (its claims are retained and reattached). Off: the
    /// difference is reported as `ImmutableFieldChanged` and slurmctld keeps its StatefulSet.
    #[arg(long, env = "SLINKY_HOST_RECREATE_STATEFULSETS")]
    pub recreate_statefulsets: bool,
    /// How often the key Secrets Controllers reference (`slurmKeyRef`, `jwtKeyRef`) are re-read,
    /// in seconds: a rotated key reaches slurmctld's StatefulSet within about this long. The host
    /// reads Secrets by name only (RBAC `get`), never lists or watches them.
    #[arg(long, env = "SLINKY_HOST_SECRET_POLL_SECONDS", default_value_t = 15)]
    pub secret_poll_seconds: u64,
    /// The slurmrestd a Controller's Slurm is asked through, as `NAMESPACE/CONTROLLER=URL`, or
    /// `URL` for every Controller; repeatable. Default: `http://<controller>-restapi.<namespace>:6820`
    /// when that Service exists (the RestApi's Service, as Slinky's Helm chart names it), else
    /// the Controller's Slurm is not asked (pods are deleted without a drain, as Slinky does
    /// without a Slurm client).
    #[arg(
        long = "slurmrestd-url",
        env = "SLINKY_HOST_SLURMRESTD_URL",
        value_delimiter = ','
    )]
    pub slurmrestd_urls: Vec<String>,
    /// With --embedded: run the first Controller's slurmctld and slurmd pods as real local
    /// Slurm daemons of the build in DIR (`../shared/tools/realslurm/setup.sh`), each in its own
    /// network, mount and UTS namespace; one slurmrestd, the `--slurmrestd-url` default. Root only.
    #[arg(long, env = "SLINKY_HOST_SLURM", value_name = "DIR", requires = "embedded")]
    pub slurm: Option<PathBuf>,
    /// Elect a leader on a Lease: only the leader reconciles, the others keep warm caches and
    /// take over within the lease duration. On in the deployed manifests.
    #[arg(long, env = "SLINKY_HOST_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(
        long,
        env = "SLINKY_HOST_LEADER_ELECTION_LEASE",
        default_value = "slinky-host"
    )]
    pub leader_election_lease: String,
    /// The Lease's namespace (default: $POD_NAMESPACE, else `default`).
    #[arg(long, env = "SLINKY_HOST_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// This replica's identity in the Lease (default: $POD_NAME, else host name and pid).
    #[arg(long, env = "SLINKY_HOST_LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,
    /// Lease duration in seconds: a dead leader is replaced within it.
    #[arg(long, env = "SLINKY_HOST_LEADER_ELECTION_LEASE_SECONDS", default_value_t = 15)]
    pub leader_election_lease_seconds: u64,
    /// Renew this many seconds before expiry. The write fence closes half of it before expiry and
    /// every write is abandoned after a quarter of it, so a quarter is the clock skew tolerated
    /// between nodes.
    #[arg(long, env = "SLINKY_HOST_LEADER_ELECTION_GRACE_SECONDS", default_value_t = 4)]
    pub leader_election_grace_seconds: u64,
    /// Serve the cluster's `BuilderPlugin` custom resources (`plugins.slinky.slurm.net`): each
    /// adds a step to the pipelines of the builder kinds it lists. On by default; a cluster
    /// without the CRD simply has none.
    #[arg(long, env = "SLINKY_HOST_BUILDER_PLUGINS", default_value_t = true, action = clap::ArgAction::Set)]
    pub builder_plugins: bool,
    /// The public key(s) (PEM, ECDSA P-256: `cosign.pub`, or `slinky-host plugin keygen`'s)
    /// every BuilderPlugin module must carry a signature of: a cosign signature for a registry
    /// module, `<key>.sig` beside a ConfigMap module. Without it, no registry module runs
    /// (unless `--allow-unsigned-plugins`) and ConfigMap modules run on their pinned digest.
    #[arg(long, env = "SLINKY_HOST_PLUGIN_PUBLIC_KEY", value_name = "PEM")]
    pub plugin_public_key: Option<PathBuf>,
    /// Without `--plugin-public-key`, run BuilderPlugin modules from registries on their pinned
    /// digest alone (unsigned: whoever may create a BuilderPlugin chooses code every pod of its
    /// step runs). Off by default: such modules are refused as `Unverified`.
    #[arg(long, env = "SLINKY_HOST_ALLOW_UNSIGNED_PLUGINS")]
    pub allow_unsigned_plugins: bool,
    /// How long start-up waits for the BuilderPlugins to load before reconciling without those
    /// still loading (each joins its pipelines when it loads; its parents' pods may roll once
    /// more). A registry that never answers delays only its own step.
    #[arg(
        long,
        env = "SLINKY_HOST_BUILDER_PLUGINS_STARTUP_SECONDS",
        default_value_t = 60
    )]
    pub builder_plugins_startup_seconds: u64,
    /// The namespaces BuilderPlugin modules kept in ConfigMaps are read from; repeatable or
    /// comma-separated (default: the host's own namespace; `*`: any, which lets whoever may
    /// edit a ConfigMap there choose code that runs in every pod the step builds).
    #[arg(
        long = "plugin-configmap-namespace",
        env = "SLINKY_HOST_PLUGIN_CONFIGMAP_NAMESPACES",
        value_delimiter = ','
    )]
    pub plugin_configmap_namespaces: Vec<String>,
    /// Registry credentials for BuilderPlugin modules: a Docker config (`{"auths": {…}}`, the
    /// `.dockerconfigjson` of a `kubectl create secret docker-registry` Secret, or `docker
    /// login`'s `config.json`), read again whenever a registry asks (a rotated Secret is used
    /// without a restart). Sent only to the registry each is for and the token realm it names.
    #[arg(long, env = "SLINKY_HOST_REGISTRY_CREDENTIALS", value_name = "FILE")]
    pub registry_credentials: Option<PathBuf>,
    /// A registry (`host:port`) reached over plain HTTP; repeatable (loopback registries always
    /// are).
    #[arg(
        long = "insecure-registry",
        env = "SLINKY_HOST_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,
    /// Where modules pulled from registries, and every module that loaded, are kept (default:
    /// `oci/` in the compiled-component cache, `$SLINKY_HOST_PLUGIN_CACHE/oci`).
    #[arg(long, env = "SLINKY_HOST_OCI_CACHE")]
    pub oci_cache: Option<PathBuf>,
    /// Stop after this many seconds (for demos and smoke tests; default: run until signalled).
    #[arg(long, env = "SLINKY_HOST_RUN_FOR_SECONDS")]
    pub run_for_seconds: Option<u64>,
}

fn summary(h: &Handles) -> String {
    let pods = h.pods.state();
    let ready = pods.iter().filter(|p| slinky_api::pods::is_ready(p)).count();
    let writes: Vec<String> = h
        .writes
        .snapshot()
        .iter()
        .map(|((v, o), n)| format!("{v}/{o}={n}"))
        .collect();
    format!(
        "controllers={} nodesets={} pods={} ready={} writes[{}]",
        h.controllers.state().len(),
        h.nodesets.state().len(),
        pods.len(),
        ready,
        writes.join(" ")
    )
}

/// `run`: load the plugins, start the async runtime and [`run`] the host on it.
///
/// # Errors
/// As [`run`], or a plugin that does not load.
pub fn execute(engine: &Arc<EngineHandle>, args: RunArgs) -> anyhow::Result<()> {
    if !engine.allowances().is_empty() {
        tracing::warn!(allow = %engine.allowances(),
            "the output policy lets plugins build these classes past their parents' specs (--allow)");
    }
    let plugins = Arc::new(PluginRegistry::new(engine, &args.plugins)?);
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(run(args, plugins))
}

/// The plugins-directory reloader of `run --plugins-dir`: its handle and its task.
type Reloader = (ReloadHandle, JoinHandle<()>);

/// Run the host.
///
/// # Errors
/// Setup failures (kubeconfig, embedded server, CRDs, manifests, plugins, HTTP address).
pub async fn run(mut args: RunArgs, plugins: Arc<PluginRegistry>) -> anyhow::Result<()> {
    let api_requests = Arc::new(crate::client::ApiRequests::default());
    let (server, client) = connect(&args, api_requests.clone()).await?;
    let local_slurm = start_local_slurm(&mut args, &client).await?;
    let build = BuildContext {
        cluster_domain: args.cluster_domain.clone(),
        ..BuildContext::default()
    };
    let reloader = start_reloader(&args, &plugins, &build).await?;
    let reload_handle = reloader.as_ref().map(|(h, _)| h.clone());
    let (leadership, election) = start_election(&args, &client).await?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown = {
        let mut rx = stop_rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|s| *s).await;
        })
    };
    let config = RunConfig {
        namespaces: args.namespaces.clone(),
        build,
        leadership,
        resync: Some(Duration::from_secs(args.resync_seconds.max(1))),
        recreate_statefulsets: args.recreate_statefulsets,
        secret_poll: Some(Duration::from_secs(args.secret_poll_seconds.max(1))),
        slurmrestd_urls: args.slurmrestd_urls.clone(),
        api_requests,
        builder_plugins: builder_plugin_source(&args, &client).await?,
        builder_plugins_startup: Some(Duration::from_secs(args.builder_plugins_startup_seconds)),
    };
    let (handles, host) = reconcile::start(client, plugins.clone(), config, "slinky-host", shutdown);
    let endpoints = crate::serve::Endpoints::new(handles.clone(), plugins, reload_handle.clone());
    let (http, _) = crate::serve::serve(args.http_addr, crate::serve::Listener::Metrics, endpoints.clone())
        .await
        .with_context(|| format!("cannot serve on {}", args.http_addr))?;
    let (admin, _) = crate::serve::serve(args.admin_addr, crate::serve::Listener::Admin, endpoints)
        .await
        .with_context(|| format!("cannot serve the admin endpoints on {}", args.admin_addr))?;
    let host = tokio::spawn(host);

    let summaries = tokio::spawn(print_summaries(handles.clone()));
    let hangups = tokio::spawn(rescan_on_sighup(reload_handle));
    wait_for_stop(args.run_for_seconds).await?;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(30), host).await;
    if let Some(task) = election {
        // Stops the lease manager, which releases the Lease: a successor takes over at once.
        task.abort();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    summaries.abort();
    hangups.abort();
    if let Some((_, task)) = reloader {
        task.abort();
    }
    http.abort();
    admin.abort();
    println!("{}", summary(&handles));
    if let Some(s) = local_slurm {
        s.shutdown().await;
    }
    if let Some(s) = server {
        s.shutdown().await;
    }
    Ok(())
}

/// With `--slurm DIR`: the local Slurm, its slurmrestd the default `--slurmrestd-url`.
#[cfg(feature = "embedded")]
async fn start_local_slurm(args: &mut RunArgs, client: &Client) -> anyhow::Result<Option<slurm::LocalSlurm>> {
    let Some(dir) = args.slurm.clone() else {
        return Ok(None);
    };
    Ok(Some(slurm::LocalSlurm::start(args, client, &dir).await?))
}

/// No local Slurm: this host was built without the `embedded` feature.
#[cfg(not(feature = "embedded"))]
enum NoLocalSlurm {}

#[cfg(not(feature = "embedded"))]
impl NoLocalSlurm {
    async fn shutdown(self) {
        match self {}
    }
}

/// Without the `embedded` feature there is no `--slurm`.
#[cfg(not(feature = "embedded"))]
async fn start_local_slurm(args: &mut RunArgs, _: &Client) -> anyhow::Result<Option<NoLocalSlurm>> {
    anyhow::ensure!(
        args.slurm.is_none(),
        "this slinky-host was built without the `embedded` feature: --slurm is not available (build one with `cargo build -p slinky-host --features embedded`)"
    );
    Ok(None)
}

/// With `--plugins-dir`: watch it for builder plugins, printing the first scan's overrides and
/// refusals.
async fn start_reloader(
    args: &RunArgs,
    plugins: &Arc<PluginRegistry>,
    build: &BuildContext,
) -> anyhow::Result<Option<Reloader>> {
    let Some(dir) = &args.plugins_dir else {
        return Ok(None);
    };
    let config = ReloadConfig {
        dir: dir.clone(),
        poll: Duration::from_millis(args.plugins_poll_ms.max(10)),
        build: build.clone(),
    };
    let (handle, first, task) = reload::start(plugins.clone(), config)
        .await
        .with_context(|| format!("cannot watch the plugins directory {}", dir.display()))?;
    for s in &first.swapped {
        println!("plugin override: {s}");
    }
    for r in &first.refused {
        println!("plugin refused: {}: {}", r.source, r.reason);
    }
    Ok(Some((handle, task)))
}

/// With `--builder-plugins` (the default) and the CRD served: where BuilderPlugins' modules
/// come from (the host loads them before anything reconciles).
async fn builder_plugin_source(
    args: &RunArgs,
    client: &Client,
) -> anyhow::Result<Option<Arc<slinky_plugin_source::ModuleSource>>> {
    if !args.builder_plugins || !reconcile::builder_plugin::served(client).await? {
        return Ok(None);
    }
    let source = crate::cmd::module_source(
        client,
        args.oci_cache.clone(),
        args.insecure_registries.clone(),
        args.plugin_public_key.as_deref(),
        args.allow_unsigned_plugins,
        args.plugin_configmap_namespaces.clone(),
        args.registry_credentials.as_deref(),
    )?;
    match (&args.plugin_public_key, args.allow_unsigned_plugins) {
        (Some(_), _) => tracing::info!("BuilderPlugin modules run only when their signature verifies"),
        (None, true) => tracing::warn!(
            "--allow-unsigned-plugins: BuilderPlugin modules from registries run on their pinned digest \
             alone, unsigned (whoever may create a BuilderPlugin chooses code its pods run)"
        ),
        (None, false) => tracing::info!(
            "no --plugin-public-key: BuilderPlugin modules from registries are refused (Unverified); \
             ConfigMap modules run on their pinned digest"
        ),
    }
    Ok(Some(Arc::new(source)))
}

/// With `--leader-elect`: elect a leader on the Lease (the election task is returned, to be
/// stopped on shutdown); else this replica always leads.
async fn start_election(
    args: &RunArgs,
    client: &Client,
) -> anyhow::Result<(reconcile::Leadership, Option<JoinHandle<()>>)> {
    if !args.leader_elect {
        return Ok((reconcile::Leadership::always(), None));
    }
    let config = reconcile::LeaderConfig {
        lease_name: args.leader_election_lease.clone(),
        namespace: args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into()),
        identity: args
            .leader_election_identity
            .clone()
            .unwrap_or_else(reconcile::core::leader::default_identity),
        duration: Duration::from_secs(args.leader_election_lease_seconds),
        grace: Duration::from_secs(args.leader_election_grace_seconds),
    };
    let what = format!(
        "{}/{} as {}",
        config.namespace, config.lease_name, config.identity
    );
    let (l, task) = reconcile::core::leader::elect(client.clone(), config)
        .await
        .with_context(|| format!("cannot start leader election on the Lease {what}"))?;
    tracing::info!(lease = %what, "leader election started");
    Ok((l, Some(task)))
}

/// Print the [`summary`] every 2 s when it changed.
async fn print_summaries(handles: Handles) {
    let mut last = String::new();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let s = summary(&handles);
        if s != last {
            println!("{s}");
            last = s;
        }
    }
}

/// Wait for Ctrl-C, SIGTERM, or `--run-for-seconds` to pass.
async fn wait_for_stop(run_for_seconds: Option<u64>) -> anyhow::Result<()> {
    let deadline = async {
        match run_for_seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; finishing in-flight writes"),
        _ = sigterm.recv() => tracing::info!("terminated; finishing in-flight writes"),
        _ = deadline => {}
    }
    Ok(())
}

/// SIGHUP forces a rescan of the plugins directory (logged when nothing is watched).
async fn rescan_on_sighup(reload: Option<ReloadHandle>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        match &reload {
            Some(r) => match r.rescan().await {
                Some(report) => tracing::info!(swapped = ?report.swapped, refused = report.refused.len(),
                    pending = ?report.pending, "SIGHUP: plugins directory rescanned"),
                None => tracing::warn!("SIGHUP: the reloader has stopped"),
            },
            None => tracing::warn!("SIGHUP ignored: no --plugins-dir is watched"),
        }
    }
}
