//! The typed counter families the host records into: reconciles, API writes and builder calls.
//! Each is a [`prometheus_client`] [`Family`] keyed by a label struct, registered once (through
//! [`Counters`]) and incremented by the code that counts; nothing is read at scrape time.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    hash::Hash,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{
        MetricType, TypedMetric,
        counter::{ConstCounter, Counter},
        family::Family,
    },
};

use super::{ControllerLabel, Durations, KindLabel, durations};

/// The labels of `reconcile_total`: the controller and `success` or `error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// The reconciled kind, lower-case (`nodeset`, `controller`).
    pub controller: String,
    /// `success` or `error`.
    pub result: String,
}

/// The labels of `reconcile_errors_total`: the controller and the error's metric label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    /// The reconciled kind, lower-case (`nodeset`, `controller`).
    pub controller: String,
    /// `kube`, `task`, or a builder error label.
    pub reason: String,
}

/// The labels of `writes_total`: the verb and the outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WriteLabels {
    /// `apply`, `create`, `delete`, `patch`, `status`, `dry_run`.
    pub verb: String,
    /// `ok`, `conflict`, `not_found`, `error`, `not_leader`.
    pub outcome: String,
}

/// The labels of `plugin_call_results_total`: the builder kind and the call's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PluginCallLabels {
    /// The builder kind (`nodeset-pod`, …).
    pub kind: String,
    /// `ok` or an error label (`deadline`, `memory_cap`, `trap`, …).
    pub result: String,
}

/// A family of counters that can also be read back (for summaries and tests): the counters live
/// in the [`Family`]; the label sets seen are kept, sorted, so that they can be listed and are
/// served in a stable order.
#[derive(Debug)]
pub struct Counts<L> {
    family: Family<L, Counter>,
    seen: Arc<Mutex<BTreeSet<L>>>,
}

impl<L> Clone for Counts<L> {
    fn clone(&self) -> Self {
        Counts {
            family: self.family.clone(),
            seen: self.seen.clone(),
        }
    }
}

impl<L: Clone + Hash + Eq> Default for Counts<L> {
    fn default() -> Self {
        Counts {
            family: Family::default(),
            seen: Arc::default(),
        }
    }
}

impl<L: Clone + Hash + Eq + Ord> Counts<L> {
    /// Add `n` to the counter of `labels`.
    pub fn inc_by(&self, labels: &L, n: u64) {
        // Known before its counter exists, so every counter is listed.
        if self.family.get(labels).is_none()
            && let Ok(mut seen) = self.seen.lock()
        {
            seen.insert(labels.clone());
        }
        self.family.get_or_create(labels).inc_by(n);
    }

    /// Add one to the counter of `labels`.
    pub fn inc(&self, labels: &L) {
        self.inc_by(labels, 1);
    }

    /// The counter of `labels` (0 when never counted).
    pub fn get(&self, labels: &L) -> u64 {
        self.family.get(labels).map_or(0, |c| c.get())
    }

    /// Every counter: labels → count, sorted.
    pub fn snapshot(&self) -> BTreeMap<L, u64> {
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        seen.into_iter()
            .filter_map(|l| self.family.get(&l).map(|c| c.get()).map(|n| (l, n)))
            .collect()
    }
}

impl<L> TypedMetric for Counts<L> {
    const TYPE: MetricType = MetricType::Counter;
}

impl<L: Clone + Hash + Eq + Ord + EncodeLabelSet + fmt::Debug> EncodeMetric for Counts<L> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        for (labels, n) in self.snapshot() {
            ConstCounter::new(n).encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A counter without labels.
#[derive(Debug, Clone, Default)]
pub struct Total(Counter);

impl Total {
    /// Add `n`.
    pub fn inc_by(&self, n: u64) {
        self.0.inc_by(n);
    }

    /// Add one.
    pub fn inc(&self) {
        self.0.inc();
    }

    /// The count.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// Reconciles by controller and result: `reconcile_total` (`success`, `error`) and
/// `reconcile_errors_total` (by reason), recorded together.
#[derive(Debug, Clone, Default)]
pub struct Reconciles {
    results: Counts<ReconcileLabels>,
    errors: Counts<ReconcileErrorLabels>,
}

impl Reconciles {
    /// Count one reconcile of `kind` (any case) with `result`: `ok` or an error label.
    pub fn record(&self, kind: &str, result: &str) {
        let controller = kind.to_lowercase();
        let ok = result == "ok";
        self.results.inc(&ReconcileLabels {
            controller: controller.clone(),
            result: if ok { "success" } else { "error" }.into(),
        });
        if !ok {
            self.errors.inc(&ReconcileErrorLabels {
                controller,
                reason: result.into(),
            });
        }
    }

    /// Count of reconciles of `kind` (any case) with `result` (`ok` or an error label).
    pub fn count(&self, kind: &str, result: &str) -> u64 {
        let controller = kind.to_lowercase();
        if result == "ok" {
            self.results.get(&ReconcileLabels {
                controller,
                result: "success".into(),
            })
        } else {
            self.errors.get(&ReconcileErrorLabels {
                controller,
                reason: result.into(),
            })
        }
    }

    /// All counts: ((controller, `ok` or an error label), n), sorted.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        let ok = self
            .results
            .snapshot()
            .into_iter()
            .filter(|(l, _)| l.result == "success")
            .map(|(l, n)| ((l.controller, "ok".to_string()), n));
        let errors = self
            .errors
            .snapshot()
            .into_iter()
            .map(|(l, n)| ((l.controller, l.reason), n));
        ok.chain(errors).collect()
    }
}

/// Reconcile and builder-call counters and timings, recorded by the reconcilers.
#[derive(Debug)]
pub struct ReconcileMetrics {
    /// Reconciles by controller and result.
    pub reconciles: Reconciles,
    /// Reconcile durations per controller (`nodeset`, `controller`).
    pub durations: Durations<ControllerLabel>,
    /// Plugin calls made.
    pub plugin_calls: Total,
    /// Plugin calls that failed (trap, deadline, memory, policy, builder error).
    pub plugin_failures: Total,
    /// Builder calls by builder kind and result (`ok` or an error label).
    pub plugin_results: Counts<PluginCallLabels>,
    /// Builder call durations per builder kind.
    pub plugin_durations: Durations<KindLabel>,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        ReconcileMetrics {
            reconciles: Reconciles::default(),
            durations: durations(),
            plugin_calls: Total::default(),
            plugin_failures: Total::default(),
            plugin_results: Counts::default(),
            plugin_durations: durations(),
        }
    }
}

impl ReconcileMetrics {
    /// Record one reconcile of `kind` with `result` (`ok` or an error label) that took `secs`.
    pub fn record(&self, kind: &str, result: &str, secs: f64) {
        self.reconciles.record(kind, result);
        self.durations
            .get_or_create(&ControllerLabel {
                controller: kind.to_lowercase(),
            })
            .observe(secs);
    }

    /// Record one builder call of `kind` with `result` (`ok` or an error label) that took `secs`.
    pub fn record_plugin_call(&self, kind: &str, result: &str, secs: f64) {
        self.plugin_results.inc(&PluginCallLabels {
            kind: kind.into(),
            result: result.into(),
        });
        self.plugin_durations
            .get_or_create(&KindLabel { kind: kind.into() })
            .observe(secs);
    }

    /// Count of reconciles of `kind` with `result` (`ok` or an error label).
    pub fn count(&self, kind: &str, result: &str) -> u64 {
        self.reconciles.count(kind, result)
    }

    /// All reconcile counts: ((controller, result), n), sorted.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.reconciles.snapshot()
    }

    /// All builder call counts: ((kind, result), n).
    pub fn plugin_results(&self) -> BTreeMap<(String, String), u64> {
        self.plugin_results
            .snapshot()
            .into_iter()
            .map(|(l, n)| ((l.kind, l.result), n))
            .collect()
    }
}

/// Write counters.
#[derive(Debug, Default)]
pub struct WriteMetrics {
    counts: Counts<WriteLabels>,
    /// 409s retried from a fresh read.
    pub conflict_retries: Total,
    /// Writes between their fence check and their answer.
    in_flight: std::sync::atomic::AtomicU64,
}

impl WriteMetrics {
    /// Count one write of `verb` with `outcome`.
    pub fn record(&self, verb: &str, outcome: &str) {
        self.counts.inc(&WriteLabels {
            verb: verb.into(),
            outcome: outcome.into(),
        });
    }

    /// All counts: ((verb, outcome), n).
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.counts
            .snapshot()
            .into_iter()
            .map(|(l, n)| ((l.verb, l.outcome), n))
            .collect()
    }

    /// Total successful writes of a verb.
    pub fn ok(&self, verb: &str) -> u64 {
        self.counts.get(&WriteLabels {
            verb: verb.into(),
            outcome: "ok".into(),
        })
    }

    /// Total writes (any outcome).
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// Writes that passed (or are at) their fence check and have no answer yet: once the fence
    /// is closed, at most these can still land.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A write enters: counted in flight before its fence is checked.
    pub(crate) fn enter(&self) {
        self.in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A write has its answer (or was refused).
    pub(crate) fn leave(&self) {
        self.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The counter families, served under the names and help texts `/metrics` has always had.
///
/// A collector rather than `Registry::register`: `register` appends a period to the help text and
/// leaves out a family until its first sample, and these were served without either.
pub(super) struct Counters {
    pub(super) reconciles: Arc<ReconcileMetrics>,
    pub(super) writes: Arc<WriteMetrics>,
}

impl fmt::Debug for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

/// One counter family under `name` with `help`.
fn family(e: &mut DescriptorEncoder, name: &str, help: &str, metric: &impl EncodeMetric) -> fmt::Result {
    metric.encode(e.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for Counters {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let (r, w) = (&self.reconciles, &self.writes);
        family(
            &mut e,
            "reconcile",
            "Reconciles by controller and result (success or error), as controller-runtime's reconcile_total",
            &r.reconciles.results,
        )?;
        family(
            &mut e,
            "reconcile_errors",
            "Failed reconciles by controller and reason (kube, task, or a builder error label); controller-runtime's reconcile_errors_total adds the reason",
            &r.reconciles.errors,
        )?;
        family(
            &mut e,
            "writes",
            "API writes by verb and outcome (ok, conflict, not_found, error, not_leader)",
            &w.counts,
        )?;
        family(
            &mut e,
            "conflict_retries",
            "Status writes retried after a 409, from a fresh read",
            &w.conflict_retries.0,
        )?;
        family(&mut e, "plugin_calls", "Builder plugin calls", &r.plugin_calls.0)?;
        family(
            &mut e,
            "plugin_failures",
            "Builder plugin calls that failed (trap, deadline, memory, policy, error)",
            &r.plugin_failures.0,
        )?;
        family(
            &mut e,
            "plugin_call_results",
            "Builder plugin calls by builder kind and result (ok, deadline, memory_cap, trap, rejected, build_error, ...)",
            &r.plugin_results,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_back_by_their_labels() {
        let r = Reconciles::default();
        r.record("NodeSet", "ok");
        r.record("NodeSet", "ok");
        r.record("NodeSet", "kube");
        r.record("Controller", "deadline");
        assert_eq!(r.count("NodeSet", "ok"), 2);
        assert_eq!(r.count("nodeset", "kube"), 1);
        assert_eq!(r.count("Controller", "ok"), 0);
        let all: Vec<_> = r.snapshot().into_iter().collect();
        assert_eq!(
            all,
            [
                (("controller".to_string(), "deadline".to_string()), 1),
                (("nodeset".to_string(), "kube".to_string()), 1),
                (("nodeset".to_string(), "ok".to_string()), 2),
            ]
        );
        let w = WriteMetrics::default();
        w.record("create", "ok");
        w.record("create", "conflict");
        assert_eq!((w.ok("create"), w.ok("delete"), w.total()), (1, 0, 2));
    }
}
