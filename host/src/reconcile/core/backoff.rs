//! Per-object exponential backoff with jitter, like controller-runtime's item rate limiter:
//! after the n-th consecutive failure of an object, its next attempt waits about
//! `BASE × 2ⁿ⁻¹` (5 ms, 10 ms, 20 ms, … up to [`MAX`]), jittered so objects failing together
//! do not retry in lockstep. Objects are keyed by kind and UID ([`key`]): a Controller and a
//! NodeSet of one name, or an object deleted and recreated under its name, never share a count.
//! Only a pass that succeeded resets it ([`Outcome`]): a pass that merely waited (on
//! expectations, on a missing Controller) leaves it growing.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hasher},
    sync::Mutex,
    time::Duration,
};

/// The first retry's delay.
pub const BASE: Duration = Duration::from_millis(5);
/// The longest delay.
pub const MAX: Duration = Duration::from_secs(300);

/// A random number (std's per-process random hash keys, mixed with `salt`): enough for jitter.
fn random(salt: u64) -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.finish()
}

/// `d` jittered into `[d/2, d]` ("equal jitter").
pub fn jitter(d: Duration) -> Duration {
    let nanos = d.as_nanos().min(u128::from(u64::MAX)) as u64;
    let half = nanos / 2;
    Duration::from_nanos(half + random(nanos) % (half + 1))
}

/// The delay after `failures` consecutive failures (≥ 1) between `base` and `max`, jittered.
pub fn delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(31);
    let d = base.saturating_mul(1u32 << exp).min(max);
    jitter(d).max(base.min(max))
}

/// The backoff key of an object: its kind and UID (its namespace and name before it has one).
pub fn key<K: kube::Resource<DynamicType = ()>>(obj: &K) -> String {
    let meta = obj.meta();
    match meta.uid.as_deref() {
        Some(uid) if !uid.is_empty() => format!("{}/{uid}", K::kind(&())),
        _ => format!(
            "{}/{}/{}",
            K::kind(&()),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
    }
}

/// What a pass did, for its object's backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A write or build failed: the count grows, the next attempt waits longer.
    Failed,
    /// The pass did its work and every write succeeded: the count resets.
    Succeeded,
    /// The pass only waited (expectations, a missing input): the count stays as it is.
    Waited,
}

impl Outcome {
    /// The outcome of a pass that `synced` (did its work) with `failed` writes or builds.
    pub fn of(synced: bool, failed: bool) -> Self {
        match (failed, synced) {
            (true, _) => Outcome::Failed,
            (false, true) => Outcome::Succeeded,
            (false, false) => Outcome::Waited,
        }
    }
}

/// Consecutive failures per object key.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, u32>) -> R) -> R {
        crate::reconcile::core::locked(&self.failures, f)
    }

    /// Count a failure of `key` and return how long to wait before its next attempt.
    pub fn failure(&self, key: &str) -> Duration {
        let n = self.with(|m| {
            let n = m.entry(key.to_string()).or_default();
            *n = n.saturating_add(1);
            *n
        });
        delay(n, BASE, MAX)
    }

    /// `key` succeeded: its next failure starts from [`BASE`] again.
    pub fn success(&self, key: &str) {
        self.with(|m| {
            m.remove(key);
        });
    }

    /// Record a pass's outcome: `Some(delay)` before the next attempt after a failure, `None`
    /// otherwise.
    pub fn record(&self, key: &str, outcome: Outcome) -> Option<Duration> {
        match outcome {
            Outcome::Failed => Some(self.failure(key)),
            Outcome::Succeeded => {
                self.success(key);
                None
            }
            Outcome::Waited => None,
        }
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &str) -> u32 {
        self.with(|m| m.get(key).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_from_milliseconds_to_minutes_and_reset() {
        let b = Backoff::default();
        let delays: Vec<Duration> = (0..30).map(|_| b.failure("ns/a")).collect();
        assert!(
            delays[0] >= BASE && delays[0] <= Duration::from_millis(5),
            "{delays:?}"
        );
        assert!(delays[4] >= Duration::from_millis(40) && delays[4] <= Duration::from_millis(80));
        assert!(delays[29] >= MAX / 2 && delays[29] <= MAX, "{delays:?}");
        for w in delays.windows(2).take(15) {
            assert!(w[1] >= w[0] / 2, "roughly growing: {w:?}");
        }
        assert_eq!(b.failures("ns/a"), 30);
        assert_eq!(b.failures("ns/b"), 0, "per object");
        b.success("ns/a");
        assert!(b.failure("ns/a") <= Duration::from_millis(5));
    }

    #[test]
    fn only_a_pass_that_succeeded_resets_the_count() {
        let b = Backoff::default();
        let k = "NodeSet/uid-1";
        let first = b.record(k, Outcome::of(true, true));
        assert!(first.is_some_and(|d| d <= Duration::from_millis(5)));
        // Passes that wait on expectations between failed ones leave the count growing.
        for _ in 0..5 {
            assert_eq!(b.record(k, Outcome::of(false, false)), None);
            b.record(k, Outcome::of(true, true));
        }
        assert_eq!(b.failures(k), 6);
        assert!(
            b.record(k, Outcome::of(true, true))
                .is_some_and(|d| d >= Duration::from_millis(80))
        );
        assert_eq!(b.record(k, Outcome::of(true, false)), None);
        assert_eq!(b.failures(k), 0);
    }

    #[test]
    fn keys_are_kind_and_uid() {
        use kube::api::ObjectMeta;
        use slinky_api::{Controller, NodeSet};
        let meta = |uid: &str| ObjectMeta {
            name: Some("slurm".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        };
        let c = Controller {
            metadata: meta("u1"),
            spec: Default::default(),
            status: None,
        };
        let n = NodeSet {
            metadata: meta("u1"),
            spec: Default::default(),
            status: None,
        };
        assert_eq!(key(&c), "Controller/u1");
        assert_eq!(key(&n), "NodeSet/u1");
        let recreated = NodeSet {
            metadata: meta("u2"),
            ..n.clone()
        };
        assert_ne!(key(&n), key(&recreated), "a namesake is another object");
    }

    #[test]
    fn jitter_stays_in_range_and_varies() {
        let d = Duration::from_secs(1);
        let samples: Vec<Duration> = (0..50).map(|_| jitter(d)).collect();
        assert!(samples.iter().all(|s| *s >= d / 2 && *s <= d));
        assert!(samples.iter().any(|s| *s != samples[0]), "jittered");
    }
}
