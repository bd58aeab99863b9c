//! How a [`Pass`] scales and rolls a Deployment (`sync.go`, `rolling.go`, `recreate.go`): a
//! scaling event or a paused Deployment is only scaled (proportionally during a rollout); a
//! `RollingUpdate` scales the new ReplicaSet up and the old ones down within the fenceposts; a
//! `Recreate` empties the old ReplicaSets before the new one starts.

use super::{DESIRED, MAX_REPLICAS, Pass, annotation, spec_replicas, status_of};
use crate::deployments::{controlled_by, int, key, s};

impl Pass<'_> {
    /// `isScalingEvent`: an active ReplicaSet's `desired-replicas` is not `spec.replicas`.
    pub(super) fn is_scaling_event(&mut self) -> bool {
        self.new_set(false);
        self.sets.iter().filter(|rs| spec_replicas(rs) > 0).any(|rs| {
            annotation(rs, DESIRED)
                .and_then(|d| d.parse::<i64>().ok())
                .is_some_and(|d| d != self.replicas)
        })
    }

    /// `sync`: a paused Deployment or a scaling event: scale, no rollout.
    pub(super) fn scale_only(&mut self, paused: bool) {
        let new = self.new_set(false);
        self.scale(new);
        if paused {
            self.cleanup(new);
        }
        self.status = self.calculated_status(new);
        self.write_status();
    }

    /// `scale`: the one active ReplicaSet (or the newest) to `replicas`; the old ones to 0 once
    /// the new one is saturated; else every active one proportionally (a rolling update).
    pub(super) fn scale(&mut self, new: Option<usize>) {
        let active: Vec<usize> = (0..self.sets.len())
            .filter(|&i| spec_replicas(&self.sets[i]) > 0)
            .collect();
        let target = match (active.as_slice(), new) {
            ([], Some(n)) => Some(n),
            // The newest old ReplicaSet.
            ([], None) => self.sets.len().checked_sub(1),
            ([one], _) => Some(*one),
            _ => None,
        };
        if let Some(i) = target {
            self.scale_set(i, self.replicas);
            return;
        }
        let saturated = new.is_some_and(|n| {
            let rs = &self.sets[n];
            spec_replicas(rs) == self.replicas
                && annotation(rs, DESIRED) == Some(self.replicas.to_string().as_str())
                && status_of(rs, "availableReplicas") == self.replicas
        });
        if saturated {
            for i in active {
                if Some(i) != new {
                    self.scale_set(i, 0);
                }
            }
            return;
        }
        if self.recreate {
            return;
        }
        self.scale_proportionally(active);
    }

    /// The proportional part of `scale`: what `replicas + maxSurge` adds to (or takes from)
    /// the active ReplicaSets, shared by their sizes (`GetProportion`), the rest to the largest.
    pub(super) fn scale_proportionally(&mut self, mut active: Vec<usize>) {
        let total: i64 = active.iter().map(|&i| spec_replicas(&self.sets[i])).sum();
        let allowed = if self.replicas > 0 {
            self.replicas + self.surge
        } else {
            0
        };
        let to_add = allowed - total;
        let created = |i: &usize| s(&self.sets[*i], "/metadata/creationTimestamp").to_string();
        // Larger first; among equals the newer first when growing, the older when shrinking.
        active.sort_by(|a, b| {
            let by_size = spec_replicas(&self.sets[*b]).cmp(&spec_replicas(&self.sets[*a]));
            let by_age = if to_add > 0 {
                created(b).cmp(&created(a))
            } else {
                created(a).cmp(&created(b))
            };
            by_size.then(by_age)
        });
        let mut added = 0;
        let mut sizes: Vec<i64> = Vec::new();
        for &i in &active {
            let rs = &self.sets[i];
            let size = spec_replicas(rs);
            let proportion = if to_add == 0 || to_add == added || size == 0 {
                0
            } else {
                let fraction = if self.replicas == 0 {
                    -size
                } else {
                    let annotated = annotation(rs, MAX_REPLICAS)
                        .and_then(|m| m.parse::<i64>().ok())
                        .unwrap_or_else(|| int(self.d, "/status/replicas", 0));
                    let share = (size * (self.replicas + self.surge)) as f64 / annotated.max(1) as f64;
                    share.round() as i64 - size
                };
                let room = to_add - added;
                if to_add > 0 {
                    fraction.min(room)
                } else {
                    fraction.max(room)
                }
            };
            sizes.push(size + proportion);
            added += proportion;
        }
        if let Some(first) = sizes.first_mut()
            && to_add != 0
        {
            *first = (*first + to_add - added).max(0);
        }
        let direction = if to_add > 0 { "up" } else { "down" };
        for (&i, size) in active.iter().zip(sizes) {
            self.scale_set_as(i, size, direction);
        }
    }

    /// `rolloutRolling`: scale the new ReplicaSet up, else the old ones down, within the
    /// fenceposts; clean up once complete; the rollout status.
    pub(super) fn rollout_rolling(&mut self) {
        let Some(new) = self.new_set(true) else {
            // The create failed; the status says why (or counts a hash collision). The next
            // pass retries.
            return;
        };
        let scaled = self.reconcile_new(new) || self.reconcile_old(new);
        if !scaled && self.complete(&self.status) {
            self.cleanup(Some(new));
        }
        self.sync_rollout_status(Some(new));
    }

    /// `reconcileNewReplicaSet`.
    pub(super) fn reconcile_new(&mut self, new: usize) -> bool {
        let current = spec_replicas(&self.sets[new]);
        if current == self.replicas {
            return false;
        }
        if current > self.replicas {
            return self.scale_set(new, self.replicas);
        }
        let total: i64 = self.sets.iter().map(spec_replicas).sum();
        let max_total = self.replicas + self.surge;
        if total >= max_total {
            return false;
        }
        let up = (max_total - total).min(self.replicas - current);
        self.scale_set(new, current + up)
    }

    /// `reconcileOldReplicaSets`: old replicas that are not available go first, then as many
    /// as keep `replicas - maxUnavailable` available.
    pub(super) fn reconcile_old(&mut self, new: usize) -> bool {
        let mut old = self.old_indices(Some(new));
        let old_count: i64 = old.iter().map(|&i| spec_replicas(&self.sets[i])).sum();
        if old_count == 0 {
            return false;
        }
        let all_count: i64 = self.sets.iter().map(spec_replicas).sum();
        let min_available = self.replicas - self.max_unavailable();
        let new_unavailable =
            spec_replicas(&self.sets[new]) - status_of(&self.sets[new], "availableReplicas");
        let max_scaled_down = all_count - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return false;
        }
        // `cleanupUnhealthyReplicas`, oldest first.
        old.retain(|&i| spec_replicas(&self.sets[i]) > 0);
        let mut cleaned = 0;
        for &i in &old {
            if cleaned >= max_scaled_down {
                break;
            }
            let (size, available) = (
                spec_replicas(&self.sets[i]),
                status_of(&self.sets[i], "availableReplicas"),
            );
            if size == 0 || size == available {
                continue;
            }
            let down = (max_scaled_down - cleaned).min(size - available);
            self.scale_set(i, size - down);
            cleaned += down;
        }
        // `scaleDownOldReplicaSetsForRollingUpdate`.
        let available: i64 = self
            .sets
            .iter()
            .map(|rs| status_of(rs, "availableReplicas"))
            .sum();
        let mut scaled_down = 0;
        if available > min_available {
            let budget = available - min_available;
            for &i in &old {
                if scaled_down >= budget {
                    break;
                }
                let size = spec_replicas(&self.sets[i]);
                if size == 0 {
                    continue;
                }
                let down = size.min(budget - scaled_down);
                self.scale_set(i, size - down);
                scaled_down += down;
            }
        }
        cleaned + scaled_down > 0
    }

    /// `rolloutRecreate`: every old ReplicaSet to 0; once none of their pods runs, the new one
    /// created (if need be) and scaled to `replicas`.
    pub(super) fn rollout_recreate(&mut self) {
        let mut new = self.new_set(false);
        let mut scaled_down = false;
        for i in self.old_indices(new) {
            if spec_replicas(&self.sets[i]) > 0 {
                scaled_down |= self.scale_set(i, 0);
            }
        }
        if scaled_down || self.old_pods_running(new) {
            self.sync_rollout_status(new);
            return;
        }
        if new.is_none() {
            new = self.new_set(true);
        }
        if let Some(n) = new {
            self.scale_set(n, self.replicas);
        }
        if self.complete(&self.status) {
            self.cleanup(new);
        }
        self.sync_rollout_status(new);
    }

    /// `oldPodsRunning`: an old ReplicaSet still counts pods, or has a pod not finished
    /// (terminating ones included).
    pub(super) fn old_pods_running(&self, new: Option<usize>) -> bool {
        let old = self.old_indices(new);
        if old.iter().any(|&i| status_of(&self.sets[i], "replicas") > 0) {
            return true;
        }
        let uids: Vec<&str> = old.iter().map(|&i| s(&self.sets[i], "/metadata/uid")).collect();
        let found = self.store.list(
            &key("", "pods"),
            &self.ns,
            &|p| {
                uids.iter().any(|u| controlled_by(p, u))
                    && !matches!(s(p, "/status/phase"), "Succeeded" | "Failed")
            },
            None,
            1,
        );
        found.is_ok_and(|(pods, _, _)| !pods.is_empty())
    }
}
