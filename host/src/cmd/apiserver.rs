//! `slinky-host apiserver`: the embedded Kubernetes API server alone (for kubectl and
//! experiments).

use std::path::PathBuf;
#[cfg(feature = "embedded")]
use std::{io::Write, time::Duration};

use clap::Args;

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
    /// Simulate pod scheduling and readiness on this many nodes, with the StatefulSet,
    /// deployment and replica set controllers (0: off).
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
    /// Feature gates as kube-apiserver takes them. The one known: `SidecarContainers` (default
    /// true); `SidecarContainers=false` serves as a default Kubernetes 1.28 does, dropping native
    /// sidecars' `restartPolicy`.
    #[arg(long, env = "SLINKY_HOST_FEATURE_GATES", value_delimiter = ',')]
    pub feature_gates: Vec<String>,
}

/// The `SidecarContainers` gate from `--feature-gates` entries (true when not given).
///
/// # Errors
/// An entry that is not `Name=true|false`, or a gate other than `SidecarContainers`.
pub fn sidecar_containers(gates: &[String]) -> Result<bool, String> {
    let mut on = true;
    for gate in gates {
        let value = match gate.trim().split_once('=') {
            Some(("SidecarContainers", v)) => v,
            Some((name, _)) => {
                return Err(format!(
                    "--feature-gates {gate}: unknown gate {name:?} (the embedded API server knows SidecarContainers)"
                ));
            }
            None => {
                return Err(format!(
                    "--feature-gates {gate}: give it as Name=true or Name=false"
                ));
            }
        };
        on = match value {
            "true" => true,
            "false" => false,
            _ => return Err(format!("--feature-gates {gate}: the value is true or false")),
        };
    }
    Ok(on)
}

/// Without the `embedded` feature there is no embedded API server.
///
/// # Errors
/// Always.
#[cfg(not(feature = "embedded"))]
pub fn execute(_: ApiserverArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "this slinky-host was built without the `embedded` feature: `apiserver` is not available (build one with `cargo build -p slinky-host --features embedded`)"
    )
}

/// Run the embedded API server until Ctrl-C, with `args`' faults, latency and simulated nodes.
///
/// # Errors
/// A bad fault rule, a port in use, or a kubeconfig that can't be written.
#[cfg(feature = "embedded")]
pub fn execute(args: ApiserverArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;

    use crate::embedded::{ApiServer, ApiServerConfig, FaultRule, LifecycleConfig};
    let rules = args
        .faults
        .iter()
        .map(|f| FaultRule::parse(f))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let sidecar_containers = sidecar_containers(&args.feature_gates).map_err(anyhow::Error::msg)?;
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
            deployments: args.simulate_nodes > 0,
            sidecar_containers,
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

#[cfg(test)]
mod tests {
    use super::sidecar_containers;

    #[test]
    fn feature_gates_turn_sidecars_off_and_refuse_what_they_do_not_know() {
        let gates = |g: &[&str]| sidecar_containers(&g.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(gates(&[]), Ok(true));
        assert_eq!(gates(&["SidecarContainers=false"]), Ok(false));
        assert_eq!(gates(&["SidecarContainers=true"]), Ok(true));
        assert!(gates(&["SidecarContainers=no"]).is_err_and(|e| e.contains("true or false")));
        assert!(gates(&["InPlacePodVerticalScaling=true"]).is_err_and(|e| e.contains("unknown gate")));
        assert!(gates(&["SidecarContainers"]).is_err_and(|e| e.contains("Name=true")));
    }
}
