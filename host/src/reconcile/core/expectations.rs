//! Controller expectations: per owner (a NodeSet, keyed by its UID), the pod creations and
//! deletions a reconcile asked for and has not yet seen in the pod watch. A NodeSet creates or
//! deletes pods only while its expectations are satisfied, so a cache lagging behind the API
//! cannot cause duplicates.
//!
//! # Guarantees
//! Every raised expectation is lowered by an observed watch event, by an explicit release when a
//! write failed or was never attempted, by a completed relist that shows the pod gone, or by
//! expiry (5 minutes). No path leaves one raised: the Slinky wedge (a create expectation raised,
//! then an early return before the creates) cannot happen because every create not made is
//! released by name.
//!
//! Keys are owner UIDs, not names: a NodeSet deleted and recreated under the same name starts
//! with no expectations of its predecessor. Creations are tracked by pod name (ordinal pods
//! have fixed names), deletions by pod UID (never a namesake).

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

/// How long an expectation lives without being observed.
pub const EXPIRY: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
struct Entry {
    /// Pod names being created → when the create returned (`None` while in flight).
    adds: HashMap<String, Option<Instant>>,
    /// Pod UIDs whose deletion we wait to observe.
    dels: HashSet<String>,
    raised_at: Option<Instant>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.adds.is_empty() && self.dels.is_empty()
    }
}

/// What a completed relist of pods showed, for [`Expectations::relisted`].
#[derive(Debug, Default)]
pub struct Relist {
    /// When the relist started: creations that returned before it must be in it.
    pub started: Option<Instant>,
    /// Pod names per owner UID.
    pub names: HashMap<String, HashSet<String>>,
    /// Every pod UID listed.
    pub uids: HashSet<String>,
}

/// Expectations of every owner, keyed by owner UID.
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
        crate::reconcile::core::locked(&self.entries, f)
    }

    fn lower(&self, owner: &str, f: impl FnOnce(&mut Entry)) {
        self.with(|m| {
            if let Some(e) = m.get_mut(owner) {
                f(e);
                if e.is_empty() {
                    m.remove(owner);
                }
            }
        });
    }

    /// Expect the creation of these pods (by name) for `owner`.
    pub fn expect_creations(&self, owner: &str, names: impl IntoIterator<Item = String>) {
        self.with(|m| {
            let e = m.entry(owner.to_string()).or_default();
            e.adds.extend(names.into_iter().map(|n| (n, None)));
            e.raised_at = Some(Instant::now());
        });
    }

    /// The create of `name` returned: the pod exists now (its watch event may still be on the way).
    pub fn creation_succeeded(&self, owner: &str, name: &str) {
        self.with(|m| {
            if let Some(t) = m.get_mut(owner).and_then(|e| e.adds.get_mut(name)) {
                *t = Some(Instant::now());
            }
        });
    }

    /// The creation of `name` was observed in the watch, or will never happen (the create failed
    /// or was never attempted): stop waiting for it.
    pub fn creation_observed(&self, owner: &str, name: &str) {
        self.lower(owner, |e| {
            e.adds.remove(name);
        });
    }

    /// Expect the deletion of these pod UIDs for `owner`.
    pub fn expect_deletions(&self, owner: &str, uids: impl IntoIterator<Item = String>) {
        self.with(|m| {
            let e = m.entry(owner.to_string()).or_default();
            e.dels.extend(uids);
            e.raised_at = Some(Instant::now());
        });
    }

    /// The deletion of pod `uid` was observed (or failed: release it).
    pub fn deletion_observed(&self, owner: &str, uid: &str) {
        self.lower(owner, |e| {
            e.dels.remove(uid);
        });
    }

    /// A relist of every pod completed and its result is in the cache: deletions of pods not in
    /// it happened, and creations that returned before the relist started but are not in it
    /// were deleted again meanwhile. Neither will ever be observed: release them.
    pub fn relisted(&self, relist: &Relist) {
        let empty = HashSet::new();
        self.with(|m| {
            m.retain(|owner, e| {
                e.dels.retain(|uid| relist.uids.contains(uid));
                let names = relist.names.get(owner).unwrap_or(&empty);
                e.adds.retain(|name, returned| {
                    let before = matches!((returned, relist.started), (Some(r), Some(s)) if *r < s);
                    names.contains(name) || !before
                });
                !e.is_empty()
            });
        });
    }

    /// Whether `owner` may create or delete pods: nothing pending, or the expectation expired.
    pub fn satisfied(&self, owner: &str) -> bool {
        let expiry = self.expiry.unwrap_or(EXPIRY);
        self.with(|m| match m.get(owner) {
            None => true,
            Some(e) if e.is_empty() => true,
            Some(e) if e.raised_at.is_some_and(|t| t.elapsed() > expiry) => {
                tracing::warn!(
                    owner,
                    adds = ?e.adds.keys().collect::<Vec<_>>(),
                    dels = e.dels.len(),
                    "expectations expired without being observed"
                );
                m.remove(owner);
                true
            }
            Some(_) => false,
        })
    }

    /// Pending (creations, deletions) for `owner`.
    pub fn pending(&self, owner: &str) -> (usize, usize) {
        self.with(|m| m.get(owner).map_or((0, 0), |e| (e.adds.len(), e.dels.len())))
    }

    /// Total pending expectations (for metrics).
    pub fn total_pending(&self) -> i64 {
        self.with(|m| m.values().map(|e| (e.adds.len() + e.dels.len()) as i64).sum())
    }

    /// Forget every owner not in `live` (a relist of the owners showed them gone).
    pub fn retain_owners(&self, live: &HashSet<String>) {
        self.with(|m| m.retain(|owner, _| live.contains(owner)));
    }

    /// Forget `owner` (it is gone).
    pub fn forget(&self, owner: &str) {
        self.with(|m| {
            m.remove(owner);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_expectations_are_lowered_released_or_expire() {
        let e = Expectations::new();
        assert!(e.satisfied("u1"));
        e.expect_creations("u1", ["w-0".to_string(), "w-1".to_string(), "w-2".to_string()]);
        e.expect_deletions("u1", ["p1".to_string()]);
        assert!(!e.satisfied("u1"));
        e.creation_observed("u1", "w-0");
        e.creation_observed("u1", "w-9"); // not expected: no effect
        assert_eq!(e.pending("u1"), (2, 1));
        e.creation_observed("u1", "w-1");
        e.creation_observed("u1", "w-2");
        assert!(!e.satisfied("u1"), "a deletion is still pending");
        e.deletion_observed("u1", "p1");
        assert!(e.satisfied("u1"));
        assert_eq!(e.total_pending(), 0);

        let short = Expectations::with_expiry(Duration::from_millis(1));
        short.expect_creations("k", ["a".to_string()]);
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.satisfied("k"), "expired");
    }

    #[test]
    fn a_completed_relist_releases_what_it_shows_gone() {
        let e = Expectations::new();
        e.expect_creations("u1", ["w-0".to_string(), "w-1".to_string(), "w-2".to_string()]);
        e.expect_deletions("u1", ["old".to_string(), "kept".to_string()]);
        e.creation_succeeded("u1", "w-0");
        e.creation_succeeded("u1", "w-1");
        let started = Instant::now();
        // w-0 was created before the relist and is in it (observed as a creation elsewhere);
        // w-1 was created before the relist and is missing: deleted meanwhile; w-2's create was
        // still in flight: it may appear later.
        let relist = Relist {
            started: Some(started),
            names: HashMap::from([("u1".to_string(), HashSet::from(["w-0".to_string()]))]),
            uids: HashSet::from(["kept".to_string()]),
        };
        e.relisted(&relist);
        assert_eq!(
            e.pending("u1"),
            (2, 1),
            "w-0 and w-2 still awaited, 'old' released"
        );
        e.creation_observed("u1", "w-0");
        e.creation_succeeded("u1", "w-2"); // returned after the relist started
        e.relisted(&relist);
        assert_eq!(
            e.pending("u1"),
            (1, 1),
            "w-2 returned after the relist started: kept"
        );
    }
}
