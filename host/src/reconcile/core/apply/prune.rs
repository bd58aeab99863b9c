//! Pruning: the children a parent controls that its builders no longer return are deleted with a
//! UID precondition, never those of the kinds kept for their state, and only children the host
//! built (by its applied-hash annotation).

use super::*;

impl<'a, P: kube::Resource<DynamicType = ()>> ChildSync<'a, P> {
    /// Delete the uncached child `kind`/`name` of the parent's namespace when the parent controls
    /// it and the host built it (a kind not served, or no such object, is nothing to do).
    pub async fn prune_uncached(&mut self, kind: ChildKind, name: &str) {
        let ns = self.parent.meta().namespace.clone().unwrap_or_default();
        let live = match self.live(kind, &ns, name, true).await {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(%kind, name, error = %e, "cannot read a child to prune (its kind may not be served)");
                return;
            }
        };
        let uid = self.parent_uid();
        let ours = owners(&live).iter().any(|(u, ctl)| *ctl && *u == uid)
            && live
                .pointer("/metadata/annotations/slinky.slurm.net~1builder")
                .is_some();
        if !ours {
            return;
        }
        self.about = Some(child_ref(kind, &ns, name));
        let what = format!("{kind} {name}");
        match self
            .core
            .writer
            .delete_child(kind, &ns, name, field(&live, "/metadata/uid").unwrap_or_default())
            .await
        {
            Ok(true) => {
                self.applied.forget(&(kind, ns.clone(), name.to_string()));
                self.core
                    .event_about(
                        self.parent,
                        self.about.clone(),
                        EventType::Normal,
                        "SuccessfulDelete",
                        format!("Deleted {what}: the host no longer builds it"),
                    )
                    .await;
            }
            Ok(false) => {}
            Err(e) => {
                let msg = format!("Error deleting {what}: {}", writer::message(&e));
                self.failed("FailedDelete", msg, false).await;
            }
        }
    }

    /// Delete the objects of `kinds` in the parent's namespace that the parent controls and the
    /// host built, but for those in `keep`; those of the `kept` kinds are never deleted because a
    /// build left them out (a builder is third-party code): each is reported instead (a
    /// `ChildFailure` condition and an Event), and only the parent's deletion removes it.
    pub async fn prune(
        &mut self,
        kinds: &[ChildKind],
        keep: &BTreeSet<(ChildKind, String)>,
        kept: &[ChildKind],
    ) {
        let ns = self.parent.meta().namespace.clone().unwrap_or_default();
        let uid = self.parent_uid();
        for &kind in kinds {
            let stale: Vec<(String, String)> = self
                .caches
                .controlled(kind, &ns, &uid)
                .into_iter()
                .filter(|(name, _)| !keep.contains(&(kind, name.clone())))
                .collect();
            for (name, object_uid) in stale {
                self.about = Some(child_ref(kind, &ns, &name));
                let what = format!("{kind} {name}");
                if kept.contains(&kind) {
                    let msg = format!(
                        "{what} is no longer built by the {} builder, and is kept: the host never \
                         deletes it because a build left it out (it holds state). Fix or roll back the \
                         builder plugin; deleting the {} deletes it",
                        P::kind(&()),
                        P::kind(&())
                    );
                    self.failed("NotBuilt", msg, true).await;
                    continue;
                }
                let key: ChildKey = (kind, ns.clone(), name.clone());
                match self.core.writer.delete_child(kind, &ns, &name, &object_uid).await {
                    Ok(deleted) => {
                        self.applied.forget(&key);
                        if deleted {
                            self.core
                                .event_about(
                                    self.parent,
                                    self.about.clone(),
                                    EventType::Normal,
                                    "SuccessfulDelete",
                                    format!("Deleted {what}: the host no longer builds it"),
                                )
                                .await;
                        }
                    }
                    Err(e) => {
                        let msg = format!("Error deleting {what}: {}", writer::message(&e));
                        self.failed("FailedDelete", msg, false).await;
                    }
                }
            }
        }
    }
}

/// The keys of `children`, for pruning.
pub fn keys_of(children: &[Child]) -> BTreeSet<(ChildKind, String)> {
    children.iter().map(|c| (c.kind, c.name().to_string())).collect()
}
