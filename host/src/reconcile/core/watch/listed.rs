//! The names a watch has shown: a re-list tells which ones were deleted while it was down (no
//! deletion event tells).

use std::collections::BTreeSet;

use kube::runtime::watcher;

/// The names a watch has shown, to tell which ones a re-list no longer has.
#[derive(Default)]
pub(super) struct ListedNames {
    /// The names as the watch last showed them.
    current: BTreeSet<String>,
    /// The names of the list under way.
    listing: BTreeSet<String>,
}

impl ListedNames {
    /// Take in one watch event (after [`ListedNames::gone`] for an `InitDone`).
    pub(super) fn see<K: kube::Resource>(&mut self, ev: &watcher::Event<K>) {
        match ev {
            watcher::Event::Apply(o) => {
                self.current.insert(o.meta().name.clone().unwrap_or_default());
            }
            watcher::Event::Delete(o) => {
                self.current.remove(o.meta().name.as_deref().unwrap_or_default());
            }
            watcher::Event::Init => self.listing.clear(),
            watcher::Event::InitApply(o) => {
                self.listing.insert(o.meta().name.clone().unwrap_or_default());
            }
            watcher::Event::InitDone => self.current = self.listing.clone(),
        }
    }

    /// At the end of a list: the names shown before that it does not have.
    pub(super) fn gone(&self) -> Vec<String> {
        self.current.difference(&self.listing).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relist_names_what_it_no_longer_has() {
        let bp = |n: &str| slinky_api::BuilderPlugin::new(n, Default::default());
        let mut names = ListedNames::default();
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(bp("a")),
            watcher::Event::InitApply(bp("b")),
            watcher::Event::InitDone,
            watcher::Event::Apply(bp("c")),
            watcher::Event::Delete(bp("a")),
        ] {
            names.see(&ev);
        }
        // The watch is down while b is deleted; the re-list has c and a new d.
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(bp("c")),
            watcher::Event::InitApply(bp("d")),
        ] {
            names.see(&ev);
        }
        assert_eq!(names.gone(), vec!["b".to_string()]);
        names.see(&watcher::Event::<slinky_api::BuilderPlugin>::InitDone);
        assert!(names.gone().is_empty(), "after the list, nothing more is gone");
    }
}
