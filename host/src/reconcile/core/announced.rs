//! The child problems announced by an Event once while they stand ([`Announced`]): what the
//! child path ([`super::apply`]) remembers across passes, held by the reconcilers' [`super::Core`].

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
};

/// The once-only problems of each parent (`NotOwned`, `NotBuilt`, `ImmutableFieldChanged`) that
/// were announced by an Event, by parent UID: each is announced once while it stands, however
/// many children fail at once (the condition names only the first), and again if it recurs.
#[derive(Debug, Default)]
pub struct Announced(Mutex<HashMap<String, BTreeSet<String>>>);

impl Announced {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, BTreeSet<String>>) -> R) -> R {
        crate::reconcile::core::locked(&self.0, f)
    }

    /// Whether `message` of `parent` is new (and remember it).
    pub(crate) fn first(&self, parent: &str, message: &str) -> bool {
        self.with(|m| {
            m.entry(parent.to_string())
                .or_default()
                .insert(message.to_string())
        })
    }

    /// Keep only the problems of `parent` that still stand.
    pub(crate) fn keep_only(&self, parent: &str, standing: BTreeSet<String>) {
        self.with(|m| {
            if standing.is_empty() {
                m.remove(parent);
            } else {
                m.insert(parent.to_string(), standing);
            }
        });
    }
}
