//! A Controller's shared node list: read at most once per [`NODES_TTL`], whole while nodes
//! change and at least every [`NODES_WHOLE_EVERY`], and with the time of the last whole list
//! (a 304) once they have been quiet for [`NODES_QUIET`].

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use slinky_slurm::{Node, NodeList};

use super::{Cluster, NODES_QUIET, NODES_TTL, NODES_WHOLE_EVERY, Unavailable, locked};

/// The shared node list: when it was read, and slurmctld's time of it.
#[derive(Default, Clone)]
pub(super) struct Listed {
    list: Option<(Instant, Arc<Vec<Node>>)>,
    /// slurmctld's time of the last whole list.
    last_update: Option<i64>,
    /// When the last whole list was read.
    whole_at: Option<Instant>,
    /// When a list last differed from the one before.
    changed_at: Option<Instant>,
    /// A drain or undrain since: read again (with the time: what changed comes back).
    stale: bool,
}

impl Listed {
    /// The time to read the list with at `now`: the last whole list's, once the nodes have
    /// been quiet for [`NODES_QUIET`] and that list is younger than `whole_within`; else none
    /// (read it whole).
    fn since(&self, whole_within: Duration, now: Instant) -> Option<i64> {
        let quiet = self
            .changed_at
            .is_none_or(|t| now.saturating_duration_since(t) >= NODES_QUIET);
        let recent = self
            .whole_at
            .is_some_and(|t| now.saturating_duration_since(t) < whole_within);
        if quiet && recent && self.list.is_some() {
            self.last_update
        } else {
            None
        }
    }
}

impl Cluster {
    /// Every node, read at most once per [`NODES_TTL`] (callers at the same time share one read).
    ///
    /// # Errors
    /// Why Slurm could not be asked.
    pub async fn nodes(&self) -> Result<Arc<Vec<Node>>, Unavailable> {
        let mut held = self.nodes.lock().await;
        if let Some((at, nodes)) = held.list.as_ref()
            && at.elapsed() < NODES_TTL
            && !held.stale
        {
            return Ok(nodes.clone());
        }
        self.read_nodes(&mut held, NODES_WHOLE_EVERY).await
    }

    /// Read the node list into `held`. Once the nodes have been quiet for [`NODES_QUIET`] and
    /// the last whole list is younger than `whole_within`, it is read with that list's time, so
    /// an unchanged list costs a 304 (slurmctld's time is its packing time, so a change in the
    /// same second is never missed). While nodes change (a scale-in, a busy cluster) every read
    /// is whole: slurmrestd 25.05 fails a read since a time when the nodes changed and the
    /// partitions did not, and a read that packs the list twice is no saving.
    async fn read_nodes(
        &self,
        held: &mut Listed,
        whole_within: Duration,
    ) -> Result<Arc<Vec<Node>>, Unavailable> {
        let since = held.since(whole_within, Instant::now());
        let read = self
            .client
            .nodes_since(since)
            .await
            .map_err(|e| Unavailable::of(&e))?;
        let now = Instant::now();
        let nodes = match (read, held.list.take()) {
            (NodeList::Unchanged, Some((_, nodes))) => nodes,
            (NodeList::Changed { nodes, last_update }, before) => {
                if before.is_none_or(|(_, b)| *b != nodes) {
                    held.changed_at = Some(now);
                }
                held.last_update = last_update;
                held.whole_at = Some(now);
                let nodes = Arc::new(nodes);
                self.listed(&nodes);
                nodes
            }
            (NodeList::Unchanged, None) => {
                Arc::new(self.client.nodes().await.map_err(|e| Unavailable::of(&e))?)
            }
        };
        held.list = Some((now, nodes.clone()));
        held.stale = false;
        Ok(nodes)
    }

    /// Forget the missing nodes a list names again.
    fn listed(&self, nodes: &[Node]) {
        locked(&self.missing, |m| {
            if !m.is_empty() {
                let names: std::collections::HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                m.retain(|name, _| !names.contains(name.as_str()));
            }
        });
    }

    /// How long `node` has been missing from Slurm's lists while its pod (`pod_uid`) ran, and
    /// whether this is the first time it is found missing (the clock starts now).
    pub fn missing_for(&self, node: &str, pod_uid: &str) -> (Duration, bool) {
        locked(&self.missing, |m| match m.get(node) {
            Some((uid, since)) if uid == pod_uid => (since.elapsed(), false),
            _ => {
                m.insert(node.to_string(), (pod_uid.to_string(), Instant::now()));
                (Duration::ZERO, true)
            }
        })
    }

    /// Every node, read now (whatever the shared list's age): what a delete is decided on.
    ///
    /// # Errors
    /// Why Slurm could not be asked.
    pub async fn fresh_nodes(&self) -> Result<Arc<Vec<Node>>, Unavailable> {
        let mut held = self.nodes.lock().await;
        self.read_nodes(&mut held, NODES_TTL).await
    }

    /// Forget the node list (after a change the next pass must see).
    pub async fn forget_nodes(&self) {
        self.nodes.lock().await.stale = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_asked_since_its_time_only_when_quiet_and_recent() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let held = Listed {
            list: Some((t0, Arc::new(Vec::new()))),
            last_update: Some(1_000),
            whole_at: Some(at(40)),
            changed_at: Some(t0),
            stale: false,
        };
        // Quiet for 50 s, the whole list 10 s old.
        assert_eq!(held.since(NODES_WHOLE_EVERY, at(50)), Some(1_000));
        // A delete decision wants a whole list within NODES_TTL.
        assert_eq!(held.since(NODES_TTL, at(50)), None);
        assert_eq!(held.since(NODES_TTL, at(45)), Some(1_000));
        // Nodes changed 20 s ago: not quiet yet.
        let busy = Listed {
            changed_at: Some(at(30)),
            ..held.clone()
        };
        assert_eq!(busy.since(NODES_WHOLE_EVERY, at(50)), None);
        // The whole list is older than a minute.
        assert_eq!(held.since(NODES_WHOLE_EVERY, at(101)), None);
        // Nothing read yet.
        assert_eq!(Listed::default().since(NODES_WHOLE_EVERY, at(50)), None);
    }
}
