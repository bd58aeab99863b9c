//! Jobs as the host reads them: which nodes run them and when they end, so a scale-in can take the
//! busy node whose jobs end soonest (Slinky's `pod-deadline`).

use std::collections::HashMap;

use serde::Deserialize;

use crate::hostlist;

/// A job as slurmrestd lists it (`GET /slurm/<v>/jobs`), the fields the host reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Job {
    /// Its states (`["RUNNING"]`); older parsers give one string.
    #[serde(default, deserialize_with = "states")]
    pub job_state: Vec<String>,
    /// The nodes it runs on, as a hostlist (`slinky-[0-2]`); empty while pending.
    #[serde(default)]
    pub nodes: String,
    /// When it ends (its start plus its time limit): seconds since the epoch, `None` when it has
    /// no limit or Slurm does not say.
    #[serde(default, deserialize_with = "number")]
    pub end_time: Option<i64>,
    /// Its id.
    #[serde(default)]
    pub job_id: u64,
    /// The partitions it may run in (`slinky`, or a comma-separated list while pending).
    #[serde(default)]
    pub partition: String,
}

/// When a busy node's jobs end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// At this time (seconds since the epoch): the latest end of its jobs.
    At(i64),
    /// One of its jobs has no end (no time limit), or Slurm does not say.
    Unknown,
}

impl Job {
    /// Whether it waits to start (pending, or held: Slurm's state `PENDING`).
    pub fn is_pending(&self) -> bool {
        self.job_state.iter().any(|s| s == "PENDING")
    }

    /// Whether `partition` is one it may run in.
    pub fn in_partition(&self, partition: &str) -> bool {
        self.partition.split(',').any(|p| p.trim() == partition)
    }

    /// Whether it holds its nodes (running, suspended or completing).
    pub fn holds_nodes(&self) -> bool {
        self.job_state
            .iter()
            .any(|s| matches!(s.as_str(), "RUNNING" | "SUSPENDED" | "COMPLETING"))
    }
}

/// Per node, when the jobs holding it end.
pub fn deadlines(jobs: &[Job]) -> HashMap<String, Deadline> {
    let mut out: HashMap<String, Deadline> = HashMap::new();
    for job in jobs.iter().filter(|j| j.holds_nodes()) {
        let Ok(nodes) = hostlist::expand(&job.nodes) else {
            continue;
        };
        for node in nodes {
            let d = match job.end_time {
                Some(t) => Deadline::At(t),
                None => Deadline::Unknown,
            };
            let merged = match (out.get(&node), d) {
                (None, d) => d,
                (Some(Deadline::Unknown), _) | (_, Deadline::Unknown) => Deadline::Unknown,
                (Some(Deadline::At(a)), Deadline::At(b)) => Deadline::At((*a).max(b)),
            };
            out.insert(node, merged);
        }
    }
    out
}

/// A list of states, or one (older data parsers).
fn states<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        List(Vec<String>),
        One(String),
        Nothing(()),
    }
    Ok(match Either::deserialize(d)? {
        Either::List(l) => l,
        Either::One(s) => vec![s],
        Either::Nothing(()) => Vec::new(),
    })
}

/// A number, or slurmrestd's `{"set": …, "infinite": …, "number": …}`: `None` when unset or
/// infinite.
fn number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    struct NoVal {
        #[serde(default)]
        set: bool,
        #[serde(default)]
        infinite: bool,
        #[serde(default)]
        number: i64,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Plain(i64),
        NoVal(NoVal),
        Nothing(()),
    }
    Ok(match Either::deserialize(d)? {
        Either::Plain(n) if n > 0 => Some(n),
        Either::NoVal(v) if v.set && !v.infinite && v.number > 0 => Some(v.number),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_deadline_is_the_latest_end_of_the_jobs_holding_it() -> Result<(), serde_json::Error> {
        let jobs: Vec<Job> = serde_json::from_value(serde_json::json!([
            {"job_state": ["RUNNING"], "nodes": "n-[1-2]", "end_time": {"set": true, "infinite": false, "number": 100}},
            {"job_state": ["RUNNING"], "nodes": "n-2", "end_time": {"set": true, "infinite": false, "number": 300}},
            {"job_state": ["COMPLETING"], "nodes": "n-3", "end_time": 50},
            {"job_state": ["RUNNING"], "nodes": "n-4", "end_time": {"set": true, "infinite": true, "number": 0}},
            {"job_state": ["PENDING"], "nodes": "", "end_time": {"set": true, "infinite": false, "number": 900}},
            {"job_state": "COMPLETED", "nodes": "n-5", "end_time": 10}
        ]))?;
        let d = deadlines(&jobs);
        assert_eq!(d.get("n-1"), Some(&Deadline::At(100)));
        assert_eq!(d.get("n-2"), Some(&Deadline::At(300)), "the latest of its jobs");
        assert_eq!(d.get("n-3"), Some(&Deadline::At(50)));
        assert_eq!(d.get("n-4"), Some(&Deadline::Unknown), "no time limit");
        assert_eq!(d.get("n-5"), None, "a finished job holds nothing");
        assert_eq!(d.len(), 4);
        Ok(())
    }
}
