//! Slurm reservations as slurmrestd lists them (`GET /slurm/<v>/reservations/`, the fields the
//! host reads; the same in data parsers v0.0.41 to v0.0.43) and as the host asks for one
//! (`POST /slurm/v0.0.43/reservation`: a `reservation_desc_msg`, which only v0.0.43 accepts).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::hostlist::{self, HostlistError};

/// One reservation of `GET /slurm/<version>/reservations/`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Reservation {
    /// Its name.
    pub name: String,
    /// When it begins (Unix seconds; `None` when unset).
    #[serde(default, deserialize_with = "no_val")]
    pub start_time: Option<i64>,
    /// When it ends (Unix seconds; `None` when unset or infinite).
    #[serde(default, deserialize_with = "no_val")]
    pub end_time: Option<i64>,
    /// Its flags, e.g. `["MAINT", "IGNORE_JOBS", "SPEC_NODES"]`.
    #[serde(default)]
    pub flags: Vec<String>,
    /// Its nodes as a host list (`slinky-[0-2]`).
    #[serde(default)]
    pub node_list: String,
    /// The users allowed to use it, comma-separated.
    #[serde(default)]
    pub users: String,
}

impl Reservation {
    /// Its nodes, expanded from [`Reservation::node_list`].
    ///
    /// # Errors
    /// Slurm's host list cannot be read.
    pub fn nodes(&self) -> Result<Vec<String>, HostlistError> {
        hostlist::expand(&self.node_list)
    }

    /// It has begun and not ended at `now` (Unix seconds), by the times Slurm reports.
    pub fn is_active(&self, now: i64) -> bool {
        self.start_time.is_some_and(|s| s <= now) && self.end_time.is_none_or(|e| now < e)
    }

    /// It has `flag` (case-insensitive).
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f.eq_ignore_ascii_case(flag))
    }
}

/// A Slurm "number with flags" (`{"set": true, "infinite": false, "number": 1}`), or a plain
/// number (older parsers): `None` when unset or infinite.
fn no_val<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) => {
            let set = o.get("set").and_then(Value::as_bool).unwrap_or(true);
            let infinite = o.get("infinite").and_then(Value::as_bool).unwrap_or(false);
            if set && !infinite {
                o.get("number").and_then(Value::as_i64)
            } else {
                None
            }
        }
        _ => None,
    })
}

/// What the host asks of a reservation: created with every field, updated with the fields that
/// changed (an unset field is left as Slurm has it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationRequest {
    /// Its name.
    pub name: String,
    /// When it begins (Unix seconds).
    pub start_time: Option<i64>,
    /// When it ends (Unix seconds).
    pub end_time: Option<i64>,
    /// Flags to set.
    pub flags: Vec<String>,
    /// The users allowed to use it.
    pub users: Vec<String>,
    /// Its nodes (names; sent as one compressed host list).
    pub nodes: Option<Vec<String>>,
}

impl ReservationRequest {
    /// The `reservation_desc_msg` body of v0.0.43.
    pub fn body(&self) -> Value {
        let time = |t: i64| json!({"set": true, "infinite": false, "number": t});
        let mut body = json!({ "name": self.name });
        if let Some(t) = self.start_time {
            body["start_time"] = time(t);
        }
        if let Some(t) = self.end_time {
            body["end_time"] = time(t);
        }
        if !self.flags.is_empty() {
            body["flags"] = json!(self.flags);
        }
        if !self.users.is_empty() {
            body["users"] = json!(self.users);
        }
        if let Some(nodes) = &self.nodes {
            body["node_list"] = json!([hostlist::compress(nodes)]);
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_reservation_is_read_with_its_numbers_with_flags() -> Result<(), serde_json::Error> {
        let r: Reservation = serde_json::from_value(json!({
            "name": "SlurmOperatorMaint-slinky",
            "start_time": {"set": true, "infinite": false, "number": 100},
            "end_time": {"set": true, "infinite": false, "number": 1900},
            "flags": ["MAINT", "IGNORE_JOBS", "SPEC_NODES"],
            "node_list": "slinky-[0-1]",
            "users": "slurm",
            "watts": {"set": false, "infinite": false, "number": 0}
        }))?;
        assert_eq!((r.start_time, r.end_time), (Some(100), Some(1900)));
        assert_eq!(r.nodes().unwrap_or_default(), ["slinky-0", "slinky-1"]);
        assert!(r.has_flag("maint") && !r.has_flag("FLEX"));
        assert!(!r.is_active(99) && r.is_active(100) && r.is_active(1899) && !r.is_active(1900));
        let open: Reservation = serde_json::from_value(json!({
            "name": "x", "start_time": 5, "end_time": {"set": true, "infinite": true, "number": 0}
        }))?;
        assert_eq!((open.start_time, open.end_time), (Some(5), None));
        assert!(open.is_active(1_000_000));
        Ok(())
    }

    #[test]
    fn a_request_sends_only_what_it_sets() {
        let create = ReservationRequest {
            name: "SlurmOperatorMaint-w".into(),
            start_time: Some(100),
            end_time: Some(1900),
            flags: vec!["IGNORE_JOBS".into(), "MAINT".into()],
            users: vec!["slurm".into()],
            nodes: Some(vec!["w-0".into(), "w-1".into(), "w-2".into()]),
        };
        assert_eq!(
            create.body(),
            json!({
                "name": "SlurmOperatorMaint-w",
                "start_time": {"set": true, "infinite": false, "number": 100},
                "end_time": {"set": true, "infinite": false, "number": 1900},
                "flags": ["IGNORE_JOBS", "MAINT"],
                "users": ["slurm"],
                "node_list": ["w-[0-2]"]
            })
        );
        let nodes_only = ReservationRequest {
            name: "SlurmOperatorMaint-w".into(),
            nodes: Some(vec!["w-0".into()]),
            ..Default::default()
        };
        assert_eq!(
            nodes_only.body(),
            json!({"name": "SlurmOperatorMaint-w", "node_list": ["w-0"]})
        );
    }
}
