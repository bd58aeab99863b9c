//! The runtime's own metric families (a leaf: imports nothing from the crate). The host registers
//! them in its `/metrics` registry.

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
