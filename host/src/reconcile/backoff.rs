//! Per-object exponential backoff with jitter, like controller-runtime's item rate limiter:
//! after the n-th consecutive failure of an object, its next attempt waits about
//! `BASE × 2ⁿ⁻¹` (5 ms, 10 ms, 20 ms, … up to [`MAX`]), jittered so objects failing together
//! do not retry in lockstep. A success resets the object's count.

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

/// Consecutive failures per object key.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, u32>) -> R) -> R {
        match self.failures.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
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
    fn jitter_stays_in_range_and_varies() {
        let d = Duration::from_secs(1);
        let samples: Vec<Duration> = (0..50).map(|_| jitter(d)).collect();
        assert!(samples.iter().all(|s| *s >= d / 2 && *s <= d));
        assert!(samples.iter().any(|s| *s != samples[0]), "jittered");
    }
}
