//! A Slurm node as slurmrestd lists it (the fields the host reads; the same in data parsers
//! v0.0.41 to v0.0.43), and what its state means for the pod behind it.

use serde::Deserialize;

/// The prefix of every drain reason the host sets. A drain whose reason lacks it was set by
/// someone else (an admin, a health check) and is never undone by the host (Slinky's #3).
pub const REASON_PREFIX: &str = "slurm-operator:";

/// One node of `GET /slurm/<version>/nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Node {
    /// The node's name (a worker pod's hostname).
    pub name: String,
    /// The base state and its flags, e.g. `["IDLE", "DRAIN", "DYNAMIC_NORM"]`.
    #[serde(default)]
    pub state: Vec<String>,
    /// Why the node is drained or down (empty when it is not).
    #[serde(default)]
    pub reason: String,
    /// Who set the reason.
    #[serde(default)]
    pub reason_set_by_user: String,
    /// The node's comment.
    #[serde(default)]
    pub comment: String,
    /// Its features (a worker's are its NodeSet's Slurm name and `extraConf`'s), as slurmrestd
    /// lists them: a list, or one comma-separated string (older data parsers).
    #[serde(default, deserialize_with = "features")]
    pub features: Vec<String>,
}

/// Features as a list or a comma-separated string.
fn features<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Either {
        List(Vec<String>),
        Text(String),
        Nothing(()),
    }
    Ok(match <Either as serde::Deserialize>::deserialize(d)? {
        Either::List(l) => l,
        Either::Text(t) => t.split(',').filter(|f| !f.is_empty()).map(String::from).collect(),
        Either::Nothing(()) => Vec::new(),
    })
}

impl Node {
    /// A node named `name` in the states `state` (base state and flags, e.g. `["IDLE",
    /// "DRAIN"]`) with `reason`, as a list would show it (no comment, no features).
    pub fn new(name: &str, state: &[&str], reason: &str) -> Node {
        Node {
            name: name.into(),
            state: state.iter().map(|s| s.to_string()).collect(),
            reason: reason.into(),
            reason_set_by_user: String::new(),
            comment: String::new(),
            features: Vec::new(),
        }
    }

    fn has(&self, flag: &str) -> bool {
        self.state.iter().any(|s| s.eq_ignore_ascii_case(flag))
    }

    /// A job runs or ends there: ALLOCATED, MIXED or COMPLETING. Such a node's pod is not
    /// deleted (its jobs would be lost).
    pub fn is_busy(&self) -> bool {
        self.has("ALLOCATED") || self.has("MIXED") || self.has("COMPLETING")
    }

    /// Marked DRAIN (draining while busy, drained once idle).
    pub fn is_drain(&self) -> bool {
        self.has("DRAIN")
    }

    /// Drained and nothing runs there: its pod may go.
    pub fn is_drained(&self) -> bool {
        self.is_drain() && !self.is_busy()
    }

    /// DOWN.
    pub fn is_down(&self) -> bool {
        self.has("DOWN")
    }

    /// slurmctld cannot reach its slurmd.
    pub fn is_not_responding(&self) -> bool {
        self.has("NOT_RESPONDING")
    }

    /// IDLE with no other meaning flag (not drained, not down).
    pub fn is_idle(&self) -> bool {
        self.has("IDLE") && !self.is_drain() && !self.is_down()
    }

    /// Its drain or down reason was set by the host.
    pub fn reason_is_ours(&self) -> bool {
        self.reason.starts_with(REASON_PREFIX)
    }

    /// The host may change this node's drain state: its reason is the host's or empty, and it
    /// is not a DOWN node slurmctld marked "Not responding" (Slinky's #3: such nodes are left
    /// to Slurm and the admin).
    pub fn host_may_change(&self) -> bool {
        if self.is_down() && (self.is_not_responding() || self.reason.eq_ignore_ascii_case("Not responding"))
        {
            return false;
        }
        self.reason.is_empty() || self.reason_is_ours()
    }

    /// The `SlurmNodeState<State>` pod condition types this node's state maps to, as Slinky
    /// names them (`Idle`, `Allocated`, `Mixed`, `Down`, `Drain`, `Completing`, `NotResponding`,
    /// …), without duplicates.
    pub fn condition_types(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.state {
            let Some(word) = pascal(s) else { continue };
            let t = format!("SlurmNodeState{word}");
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }
}

/// `NOT_RESPONDING` → `NotResponding`; flags that say nothing of the node's health
/// (`DYNAMIC_NORM`, `DYNAMIC_FUTURE`, `CLOUD`, …) map to nothing.
fn pascal(state: &str) -> Option<String> {
    const SHOWN: [&str; 12] = [
        "IDLE",
        "ALLOCATED",
        "MIXED",
        "DOWN",
        "ERROR",
        "FUTURE",
        "DRAIN",
        "COMPLETING",
        "NOT_RESPONDING",
        "FAIL",
        "MAINTENANCE",
        "REBOOT_REQUESTED",
    ];
    let upper = state.to_ascii_uppercase();
    if !SHOWN.contains(&upper.as_str()) {
        return None;
    }
    Some(
        upper
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_string() + &c.as_str().to_ascii_lowercase())
                    .unwrap_or_default()
            })
            .collect(),
    )
}

/// Counts of a set of nodes as NodeSet status shows them (Slinky's: allocated counts mixed too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// IDLE (and not drained or down).
    pub idle: i32,
    /// ALLOCATED or MIXED.
    pub allocated: i32,
    /// DOWN.
    pub down: i32,
    /// DRAIN.
    pub drain: i32,
}

impl Counts {
    /// Count `nodes`.
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Counts {
        let mut c = Counts::default();
        for n in nodes {
            if n.is_idle() {
                c.idle += 1;
            }
            if n.has("ALLOCATED") || n.has("MIXED") {
                c.allocated += 1;
            }
            if n.is_down() {
                c.down += 1;
            }
            if n.is_drain() {
                c.drain += 1;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: &[&str], reason: &str) -> Node {
        Node::new("n", state, reason)
    }

    #[test]
    fn features_are_a_list_or_a_comma_separated_string() -> Result<(), serde_json::Error> {
        let list: Node = serde_json::from_value(serde_json::json!({"name": "a", "features": ["x", "y"]}))?;
        assert_eq!(list.features, ["x", "y"]);
        let text: Node = serde_json::from_value(serde_json::json!({"name": "a", "features": "x,y"}))?;
        assert_eq!(text.features, ["x", "y"]);
        let none: Node = serde_json::from_value(serde_json::json!({"name": "a", "features": null}))?;
        assert!(none.features.is_empty());
        Ok(())
    }

    #[test]
    fn busy_drained_and_ownership() {
        assert!(node(&["MIXED", "DRAIN"], "x").is_busy());
        assert!(node(&["IDLE", "COMPLETING", "DRAIN"], "").is_busy());
        assert!(!node(&["IDLE", "DRAIN"], "x").is_busy());
        assert!(node(&["IDLE", "DRAIN"], "x").is_drained());
        assert!(!node(&["ALLOCATED", "DRAIN"], "x").is_drained());
        assert!(!node(&["IDLE"], "").is_drained());
        assert!(node(&["IDLE", "DRAIN"], "slurm-operator: scale-in").host_may_change());
        assert!(!node(&["IDLE", "DRAIN"], "bad dimm").host_may_change());
        assert!(node(&["IDLE"], "").host_may_change());
        assert!(!node(&["DOWN", "NOT_RESPONDING"], "").host_may_change());
        assert!(!node(&["DOWN"], "Not responding").host_may_change());
    }

    #[test]
    fn condition_types_name_each_state_once() {
        let n = node(&["IDLE", "DRAIN", "DYNAMIC_NORM", "NOT_RESPONDING", "drain"], "");
        assert_eq!(
            n.condition_types(),
            [
                "SlurmNodeStateIdle",
                "SlurmNodeStateDrain",
                "SlurmNodeStateNotResponding"
            ]
        );
    }

    #[test]
    fn counts_follow_slinky() {
        let nodes = [
            node(&["IDLE"], ""),
            node(&["MIXED"], ""),
            node(&["ALLOCATED", "DRAIN"], "x"),
            node(&["IDLE", "DRAIN"], "x"),
            node(&["DOWN", "NOT_RESPONDING"], ""),
        ];
        assert_eq!(
            Counts::of(&nodes),
            Counts {
                idle: 1,
                allocated: 2,
                down: 1,
                drain: 2
            }
        );
    }
}
