//! `/metrics`: one [`prometheus_client`] registry, served as OpenMetrics when the scraper asks
//! for it (`Accept: application/openmetrics-text`, as Prometheus does) and as Prometheus text
//! 0.0.4 otherwise, each with its `Content-Type`.
//!
//! Names follow controller-runtime's where there is one (`slinky_host_reconcile_total`,
//! `…_reconcile_errors_total`, `…_reconcile_time_seconds`, label `controller`); process metrics
//! have the standard `process_*` names. The README's metrics table maps each to its
//! controller-runtime or client-go counterpart.

use std::{fmt, sync::Arc, sync::atomic::Ordering};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType,
        counter::ConstCounter,
        family::Family,
        gauge::ConstGauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::{plugins::PluginRegistry, reconcile::Handles};

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

/// The label set of per-stage metrics (`stage="compile"`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// The reload stage.
    pub stage: String,
}

/// A histogram family of durations in seconds: buckets from 0.5 ms doubling to ~16 s.
pub type Durations<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// A new, empty histogram family of durations.
pub fn durations<L: Clone + std::hash::Hash + Eq>() -> Durations<L> {
    Family::new_with_constructor(duration_histogram as fn() -> Histogram)
}

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
    /// Every metric of a running host and its plugins.
    pub fn new(handles: Handles, plugins: Arc<PluginRegistry>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let ours = registry.sub_registry_with_prefix("slinky_host");
        ours.register(
            "reconcile_time_seconds",
            "Time per reconcile, by controller (controller-runtime's reconcile_time_seconds)",
            handles.metrics.durations.clone(),
        );
        ours.register(
            "plugin_call_seconds",
            "Time per builder plugin call, by builder kind",
            handles.metrics.plugin_durations.clone(),
        );
        ours.register(
            "plugin_reload_stage_seconds",
            "Time per plugin reload stage (read, compile, validate, swap)",
            plugins.reloads.stage_durations.clone(),
        );
        ours.register_collector(Box::new(HostCollector { handles, plugins }));
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

fn labels<'a>(pairs: &[(&'a str, &str)]) -> Vec<(&'a str, String)> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect()
}

/// One family of counters read at scrape time.
fn counters<V>(
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
fn gauges<V>(
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

/// The host's counters and gauges, read from its handles and plugin registry at each scrape.
struct HostCollector {
    handles: Handles,
    plugins: Arc<PluginRegistry>,
}

impl fmt::Debug for HostCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCollector").finish_non_exhaustive()
    }
}

impl Collector for HostCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let h = &self.handles;
        gauges(
            &mut e,
            "build_info",
            "The host's version, contract version and wasmtime version (value 1)",
            [(
                labels(&[
                    ("version", env!("CARGO_PKG_VERSION")),
                    ("contract", crate::plugins::CONTRACT_VERSION),
                    ("wasmtime", crate::plugins::WASMTIME_VERSION),
                ]),
                1i64,
            )],
        )?;
        gauges(
            &mut e,
            "plugin_optimized",
            "1 when the active plugin of a builder kind runs Cranelift code, 0 while it runs Winch (baseline) code",
            crate::plugins::bundled::KINDS.iter().map(|&kind| {
                let tier = self.plugins.active(kind).tier();
                (
                    labels(&[("kind", kind.as_str())]),
                    i64::from(tier == crate::plugins::Tier::Optimized),
                )
            }),
        )?;
        gauges(
            &mut e,
            "ready",
            "1 when every cache has synced",
            [(Vec::new(), i64::from(h.ready.load(Ordering::SeqCst)))],
        )?;
        gauges(
            &mut e,
            "leader",
            "1 while this replica leads (always 1 without leader election); client-go's leader_election_master_status",
            [(Vec::new(), i64::from(h.leader.may_write()))],
        )?;
        let reconciles = h.metrics.snapshot();
        counters(
            &mut e,
            "reconcile",
            "Reconciles by controller and result (success or error), as controller-runtime's reconcile_total",
            reconciles
                .iter()
                .fold(
                    std::collections::BTreeMap::<(String, &str), u64>::new(),
                    |mut m, ((kind, result), n)| {
                        let r = if result == "ok" { "success" } else { "error" };
                        *m.entry((kind.to_lowercase(), r)).or_default() += n;
                        m
                    },
                )
                .into_iter()
                .map(|((c, r), n)| (labels(&[("controller", &c), ("result", r)]), n)),
        )?;
        counters(
            &mut e,
            "reconcile_errors",
            "Failed reconciles by controller and reason (kube, task, or a builder error label); controller-runtime's reconcile_errors_total adds the reason",
            reconciles
                .iter()
                .filter(|((_, r), _)| r != "ok")
                .map(|((k, r), n)| (labels(&[("controller", &k.to_lowercase()), ("reason", r)]), *n)),
        )?;
        counters(
            &mut e,
            "writes",
            "API writes by verb and outcome (ok, conflict, not_found, error, not_leader)",
            h.writes
                .snapshot()
                .into_iter()
                .map(|((v, o), n)| (labels(&[("verb", &v), ("outcome", &o)]), n)),
        )?;
        counters(
            &mut e,
            "conflict_retries",
            "Status writes retried after a 409, from a fresh read",
            [(Vec::new(), h.writes.conflict_retries.load(Ordering::Relaxed))],
        )?;
        gauges(
            &mut e,
            "expectations_pending",
            "Pod creations and deletions awaited in the watch",
            [(Vec::new(), h.expectations.total_pending())],
        )?;
        counters(
            &mut e,
            "plugin_calls",
            "Builder plugin calls",
            [(Vec::new(), h.metrics.plugin_calls.load(Ordering::Relaxed))],
        )?;
        counters(
            &mut e,
            "plugin_failures",
            "Builder plugin calls that failed (trap, deadline, memory, policy, error)",
            [(Vec::new(), h.metrics.plugin_failures.load(Ordering::Relaxed))],
        )?;
        counters(
            &mut e,
            "plugin_call_results",
            "Builder plugin calls by builder kind and result (ok, deadline, memory_cap, trap, rejected, build_error, ...)",
            h.metrics
                .plugin_results()
                .into_iter()
                .map(|((k, r), n)| (labels(&[("kind", &k), ("result", &r)]), n)),
        )?;
        let kinds = crate::plugins::bundled::KINDS;
        gauges(
            &mut e,
            "builder_info",
            "The active builder plugin of each kind (value 1)",
            kinds.iter().map(|&kind| {
                let a = self.plugins.active_info(kind);
                (
                    labels(&[
                        ("kind", kind.as_str()),
                        ("name", &a.name),
                        ("version", &a.version),
                        ("digest", &a.digest),
                        ("source", &a.source),
                    ]),
                    1i64,
                )
            }),
        )?;
        counters(
            &mut e,
            "builder_swaps",
            "Builder swaps by kind (hot reloads that took over, fallbacks included)",
            kinds
                .iter()
                .map(|&kind| (labels(&[("kind", kind.as_str())]), self.plugins.swaps(kind))),
        )?;
        counters(
            &mut e,
            "plugin_reloads",
            "Plugin file versions considered by the reloader, by result (swapped, refused, unchanged)",
            self.plugins
                .reloads
                .results
                .lock()
                .map(|m| m.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|(r, n)| (labels(&[("result", r)]), n)),
        )?;
        Ok(())
    }
}

/// `process_*`: CPU time, memory, file descriptors and start time, read from `/proc/self`
/// (Linux; nothing elsewhere); help texts have no final period: the encoder adds one.
#[derive(Debug)]
struct ProcessCollector;

/// Linux reports CPU time in USER_HZ, which is 100 on every architecture it supports.
const USER_HZ: f64 = 100.0;

#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    start_time: f64,
    open_fds: u64,
    max_fds: u64,
}

fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command (which may contain spaces), from field 3 on.
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15, starttime 22, vsize 23 (1-based, so 11, 12, 19, 20 here).
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(0);
    Some(ProcessStats {
        cpu_seconds: (num(11) + num(12)) as f64 / USER_HZ,
        virtual_bytes: num(20),
        resident_bytes: rss_kib * 1024,
        start_time: boot as f64 + num(19) as f64 / USER_HZ,
        open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
        max_fds,
    })
}

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(p) = process_stats() else {
            return Ok(());
        };
        counters(
            &mut e,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            [(Vec::new(), p.cpu_seconds)],
        )?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                p.start_time,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                p.max_fds as f64,
            ),
        ] {
            gauges(&mut e, name, help, [(Vec::new(), value)])?;
        }
        Ok(())
    }
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

    #[test]
    fn process_stats_are_read_from_proc() {
        let Some(p) = process_stats() else {
            return; // not Linux
        };
        assert!(
            p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes,
            "{p:?}"
        );
        assert!(p.open_fds > 0 && p.max_fds >= p.open_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        assert!(p.start_time > now - 3600.0 && p.start_time <= now + 1.0, "{p:?}");
    }
}
