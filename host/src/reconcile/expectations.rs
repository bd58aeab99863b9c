//! Controller expectations: per owner key, the creations and deletions a reconcile asked for and
//! has not yet seen in the pod watch. A NodeSet creates or deletes pods only while its
//! expectations are satisfied, so a cache lagging behind the API cannot cause duplicates.
//!
//! # Guarantees
//! Every raised expectation is lowered by an observed watch event, by an explicit release when a
//! write failed or was never attempted, or by expiry (5 minutes). No path leaves one raised: the
//! Slinky wedge (a create expectation raised, then an early return before the creates) cannot
//! happen because [`Expectations::release_creations`] is called for every create not made.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

/// How long an expectation lives without being observed.
pub const EXPIRY: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
struct Entry {
    adds: i64,
    /// Pod UIDs whose deletion we wait to observe.
    dels: HashSet<String>,
    raised_at: Option<Instant>,
}

/// Expectations of every owner, keyed `namespace/name`.
#[derive(Debug, Default)]
pub struct Expectations {
    entries: Mutex<HashMap<String, Entry>>,
    expiry: Option<Duration>,
}

impl Expectations {
    /// Expectations with the standard 5-minute expiry.
    pub fn new() -> Self {
        Self::default()
    }

    /// With another expiry (tests).
    pub fn with_expiry(expiry: Duration) -> Self {
        Expectations {
            entries: Mutex::default(),
            expiry: Some(expiry),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Entry>) -> R) -> R {
        match self.entries.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Expect `n` creations for `key`.
    pub fn expect_creations(&self, key: &str, n: usize) {
        self.with(|m| {
            let e = m.entry(key.to_string()).or_default();
            e.adds += n as i64;
            e.raised_at = Some(Instant::now());
        });
    }

    /// Expect the deletion of these pod UIDs for `key`.
    pub fn expect_deletions(&self, key: &str, uids: impl IntoIterator<Item = String>) {
        self.with(|m| {
            let e = m.entry(key.to_string()).or_default();
            e.dels.extend(uids);
            e.raised_at = Some(Instant::now());
        });
    }

    /// A creation was observed (or will never happen: release it).
    pub fn creation_observed(&self, key: &str) {
        self.release_creations(key, 1);
    }

    /// Lower the creation expectation by `n` (creates that failed or were never attempted).
    pub fn release_creations(&self, key: &str, n: usize) {
        self.with(|m| {
            if let Some(e) = m.get_mut(key) {
                e.adds = (e.adds - n as i64).max(0);
            }
        });
    }

    /// The deletion of pod `uid` was observed (or failed: release it).
    pub fn deletion_observed(&self, key: &str, uid: &str) {
        self.with(|m| {
            if let Some(e) = m.get_mut(key) {
                e.dels.remove(uid);
            }
        });
    }

    /// Whether `key` may create or delete pods: nothing pending, or the expectation expired.
    pub fn satisfied(&self, key: &str) -> bool {
        let expiry = self.expiry.unwrap_or(EXPIRY);
        self.with(|m| match m.get_mut(key) {
            None => true,
            Some(e) if e.adds <= 0 && e.dels.is_empty() => true,
            Some(e) if e.raised_at.is_some_and(|t| t.elapsed() > expiry) => {
                tracing::warn!(
                    key,
                    adds = e.adds,
                    dels = e.dels.len(),
                    "expectations expired without being observed"
                );
                *e = Entry::default();
                true
            }
            Some(_) => false,
        })
    }

    /// The pod UIDs whose deletion `key` still waits to observe (for diagnostics).
    pub fn pending_deletions(&self, key: &str) -> Vec<String> {
        self.with(|m| {
            m.get(key)
                .map(|e| e.dels.iter().cloned().collect())
                .unwrap_or_default()
        })
    }

    /// Pending (creations, deletions) for `key`.
    pub fn pending(&self, key: &str) -> (i64, usize) {
        self.with(|m| m.get(key).map_or((0, 0), |e| (e.adds, e.dels.len())))
    }

    /// Total pending expectations (for metrics).
    pub fn total_pending(&self) -> i64 {
        self.with(|m| m.values().map(|e| e.adds + e.dels.len() as i64).sum())
    }

    /// Forget `key` (its owner is gone).
    pub fn forget(&self, key: &str) {
        self.with(|m| {
            m.remove(key);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_expectations_are_lowered_released_or_expire() {
        let e = Expectations::new();
        assert!(e.satisfied("ns/a"));
        e.expect_creations("ns/a", 3);
        e.expect_deletions("ns/a", ["u1".to_string()]);
        assert!(!e.satisfied("ns/a"));
        e.creation_observed("ns/a");
        e.release_creations("ns/a", 2);
        assert!(!e.satisfied("ns/a"), "a deletion is still pending");
        e.deletion_observed("ns/a", "u1");
        assert!(e.satisfied("ns/a"));
        e.release_creations("ns/a", 5);
        assert_eq!(e.pending("ns/a"), (0, 0), "never negative");

        let short = Expectations::with_expiry(Duration::from_millis(1));
        short.expect_creations("k", 1);
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.satisfied("k"), "expired");
    }
}
