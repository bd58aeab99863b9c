//! `/metrics`: one [`prometheus_client`] registry, served as OpenMetrics when the scraper asks
//! for it (`Accept: application/openmetrics-text`, as Prometheus does) and as Prometheus text
//! 0.0.4 otherwise, each with its `Content-Type`.
//!
//! Names follow controller-runtime's where there is one (`slinky_host_reconcile_total`,
//! `…_reconcile_errors_total`, `…_reconcile_time_seconds`, label `controller`); process metrics
//! have the standard `process_*` names. The metrics table of `docs/operating.md` maps each to its
//! controller-runtime or client-go counterpart.
//!
//! This module is a leaf: it imports nothing from the rest of the crate. The counters and
//! histograms are typed families ([`families`]) that the code that counts records into; what
//! only exists at scrape time (readiness, leadership, the active builders …) is a [`Collector`]
//! the caller passes to [`Exposition::new`].

mod families;
mod process;

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

pub use families::{
    Counts, PluginCallLabels, ReconcileErrorLabels, ReconcileLabels, ReconcileMetrics, Reconciles, Total,
    WriteLabels, WriteMetrics,
};

/// The label set of per-controller metrics (`controller="nodeset"`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// The reconciled kind, lower-case (`nodeset`, `controller`).
    pub controller: String,
}

/// The label set of per-builder-kind metrics (`kind="nodeset-pod"`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The builder kind.
    pub kind: String,
}

/// Histogram families of durations (buckets from 0.5 ms doubling to ~16 s) and the reload
/// stages' label: the plugin runtime's, so every duration the host serves has the same buckets.
pub use slinky_runtime::metrics::{Durations, StageLabel, durations};

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format's content type.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The host's metrics registry.
pub struct Exposition {
    registry: Registry,
}

impl fmt::Debug for Exposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exposition").finish_non_exhaustive()
    }
}

impl Exposition {
    /// Every metric of a running host and its plugins: the families the reconcilers and the
    /// writer record into, the reload stages' histogram, and `state`, read at each scrape.
    pub fn new(
        reconciles: Arc<ReconcileMetrics>,
        writes: Arc<WriteMetrics>,
        reload_stages: Durations<StageLabel>,
        state: Box<dyn Collector>,
    ) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(process::ProcessCollector));
        let ours = registry.sub_registry_with_prefix("slinky_host");
        ours.register(
            "reconcile_time_seconds",
            "Time per reconcile, by controller (controller-runtime's reconcile_time_seconds)",
            reconciles.durations.clone(),
        );
        ours.register(
            "plugin_call_seconds",
            "Time per builder plugin call, by builder kind",
            reconciles.plugin_durations.clone(),
        );
        ours.register(
            "plugin_reload_stage_seconds",
            "Time per plugin reload stage (read, compile, validate, swap)",
            reload_stages,
        );
        ours.register_collector(Box::new(families::Counters { reconciles, writes }));
        ours.register_collector(state);
        Exposition { registry }
    }

    /// The metrics in the format `accept` asks for, with its content type.
    pub fn render(&self, accept: Option<&str>) -> (String, &'static str) {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(%error, "cannot encode the metrics");
        }
        if wants_openmetrics(accept) {
            (text, OPENMETRICS)
        } else {
            (to_text_004(&text), TEXT)
        }
    }
}

/// Whether an `Accept` header asks for OpenMetrics (Prometheus sends it first).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// OpenMetrics text as Prometheus text 0.0.4: no `# EOF` or `# UNIT` lines, counters declared
/// under the `_total` name their samples carry.
pub fn to_text_004(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Label pairs of one sample of a family read at scrape time.
pub fn labels<'a>(pairs: &[(&'a str, &str)]) -> Vec<(&'a str, String)> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect()
}

/// One family of counters read at scrape time.
///
/// # Errors
/// When the encoder fails.
pub fn counters<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, V)>,
) -> fmt::Result
where
    ConstCounter<V>: EncodeMetric,
{
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            ConstCounter::new(value).encode(metric)?;
            break;
        }
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One family of gauges read at scrape time.
///
/// # Errors
/// When the encoder fails.
pub fn gauges<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, V)>,
) -> fmt::Result
where
    ConstGauge<V>: EncodeMetric,
{
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            ConstGauge::new(value).encode(metric)?;
            break;
        }
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_becomes_prometheus_text() {
        let om = "# HELP x_writes API writes.\n# TYPE x_writes counter\nx_writes_total{verb=\"create\"} 3\n\
                  # HELP x_ready Ready.\n# TYPE x_ready gauge\nx_ready 1\n# UNIT x_t seconds\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP x_writes_total API writes.\n# TYPE x_writes_total counter\nx_writes_total{verb=\"create\"} 3\n\
             # HELP x_ready Ready.\n# TYPE x_ready gauge\nx_ready 1\n"
        );
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }

    /// Nothing read at scrape time.
    #[derive(Debug)]
    struct NoState;

    impl Collector for NoState {
        fn encode(&self, _: DescriptorEncoder) -> fmt::Result {
            Ok(())
        }
    }

    #[test]
    fn recorded_counters_are_served_with_their_help() {
        let (reconciles, writes) = (
            Arc::new(ReconcileMetrics::default()),
            Arc::new(WriteMetrics::default()),
        );
        let exposition = Exposition::new(reconciles.clone(), writes.clone(), durations(), Box::new(NoState));
        let (empty, _) = exposition.render(Some("application/openmetrics-text"));
        assert!(
            empty.contains(
                "# HELP slinky_host_reconcile_errors Failed reconciles by controller and reason (kube, task, \
                 or a builder error label); controller-runtime's reconcile_errors_total adds the reason\n\
                 # TYPE slinky_host_reconcile_errors counter\n# HELP"
            ),
            "{empty}"
        );
        reconciles.record("NodeSet", "ok", 0.01);
        reconciles.record("NodeSet", "kube", 0.01);
        writes.record("create", "ok");
        writes.conflict_retries.inc();
        let (text, content_type) = exposition.render(None);
        assert_eq!(content_type, TEXT);
        for line in [
            "slinky_host_reconcile_total{controller=\"nodeset\",result=\"error\"} 1",
            "slinky_host_reconcile_total{controller=\"nodeset\",result=\"success\"} 1",
            "slinky_host_reconcile_errors_total{controller=\"nodeset\",reason=\"kube\"} 1",
            "slinky_host_writes_total{verb=\"create\",outcome=\"ok\"} 1",
            "slinky_host_conflict_retries_total 1",
            "slinky_host_plugin_calls_total 0",
            "# TYPE slinky_host_writes_total counter",
            "# HELP slinky_host_plugin_failures_total Builder plugin calls that failed (trap, deadline, memory, policy, error)",
            "slinky_host_reconcile_time_seconds_count{controller=\"nodeset\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
