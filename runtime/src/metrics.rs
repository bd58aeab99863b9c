//! The runtime's own metric families (a leaf: imports nothing from the crate). The host registers
//! them in its `/metrics` registry.

use std::{collections::BTreeMap, sync::Mutex};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
};

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

/// Counters and stage timings of reloads.
#[derive(Debug)]
pub struct ReloadMetrics {
    /// result (`swapped`, `refused`, `unchanged`) → count.
    pub results: Mutex<BTreeMap<&'static str, u64>>,
    /// stage (`read`, `compile`, `validate`, `swap`) → (seconds, count).
    pub stages: Mutex<BTreeMap<&'static str, (f64, u64)>>,
    /// The same stage times as a histogram per stage (for `/metrics`).
    pub stage_durations: Durations<StageLabel>,
}

impl Default for ReloadMetrics {
    fn default() -> Self {
        ReloadMetrics {
            results: Mutex::default(),
            stages: Mutex::default(),
            stage_durations: durations(),
        }
    }
}

impl ReloadMetrics {
    /// Count one reload attempt with `result`.
    pub fn count(&self, result: &'static str) {
        if let Ok(mut m) = self.results.lock() {
            *m.entry(result).or_default() += 1;
        }
    }

    /// Record the duration of one stage.
    pub fn time(&self, stage: &'static str, d: std::time::Duration) {
        if let Ok(mut m) = self.stages.lock() {
            let e = m.entry(stage).or_default();
            e.0 += d.as_secs_f64();
            e.1 += 1;
        }
        self.stage_durations
            .get_or_create(&StageLabel { stage: stage.into() })
            .observe(d.as_secs_f64());
    }

    /// The count of `result`.
    pub fn results_of(&self, result: &str) -> u64 {
        self.results
            .lock()
            .map(|m| m.get(result).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}
