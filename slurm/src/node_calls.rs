//! The node calls of [`Client`]: the node list (whole, or only when it changed since a time
//! slurmctld gave), and node updates (drain, undrain, resume, down, delete), one node or a
//! host list of them in one request.

use http::Method;
use serde_json::Value;

use crate::{Client, Error, hostlist, node::Node};

/// A node list read with the time of the last one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeList {
    /// Every node, and when slurmctld last changed any (`last_update`, a Unix time), to ask
    /// with next.
    Changed {
        /// Every node.
        nodes: Vec<Node>,
        /// slurmctld's time of its last node change, if the answer gave it.
        last_update: Option<i64>,
    },
    /// Nothing changed since the time asked with (HTTP 304): the last list stands.
    Unchanged,
}

/// A node update: the state to set and its reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeUpdate<'a> {
    /// `DRAIN` with a reason (which should start with [`crate::REASON_PREFIX`]).
    Drain(&'a str),
    /// `UNDRAIN`: the DRAIN flag off (a DOWN node stays down).
    Undrain,
    /// `RESUME`: a DOWN or DRAIN node back to service.
    Resume,
    /// `DOWN` with a reason (jobs on a node that is not down are killed: only for a node
    /// that is DOWN already).
    Down(&'a str),
}

impl NodeUpdate<'_> {
    fn body(self, names: Option<String>) -> Value {
        let (state, reason) = match self {
            NodeUpdate::Drain(r) => ("DRAIN", Some(r)),
            NodeUpdate::Undrain => ("UNDRAIN", None),
            NodeUpdate::Resume => ("RESUME", None),
            NodeUpdate::Down(r) => ("DOWN", Some(r)),
        };
        let mut body = serde_json::json!({ "state": [state] });
        if let Some(r) = reason {
            body["reason"] = r.into();
        }
        if let Some(n) = names {
            body["name"] = n.into();
        }
        body
    }

    fn verb(self) -> &'static str {
        match self {
            NodeUpdate::Drain(_) => "draining",
            NodeUpdate::Undrain => "undraining",
            NodeUpdate::Resume => "resuming",
            NodeUpdate::Down(_) => "marking down",
        }
    }
}

/// slurmctld's `last_update` of an answer: a number (older data parsers) or v0.0.43's
/// `{"set": true, "number": N}`.
fn last_update(value: &Value) -> Option<i64> {
    let v = value.get("last_update")?;
    v.as_i64().or_else(|| {
        (v.get("set").and_then(Value::as_bool) != Some(false))
            .then(|| v.get("number").and_then(Value::as_i64))
            .flatten()
    })
}

impl Client {
    /// Every node (`GET /slurm/<v>/nodes`).
    ///
    /// # Errors
    /// The call failed, or its answer is not a node list.
    pub async fn nodes(&self) -> Result<Vec<Node>, Error> {
        match self.nodes_since(None).await? {
            NodeList::Changed { nodes, .. } => Ok(nodes),
            NodeList::Unchanged => Err(Error::Parse {
                what: "nodes".into(),
                why: "HTTP 304 to a read without update_time".into(),
            }),
        }
    }

    /// The node list if any node changed since `since` (a `last_update` of an earlier list;
    /// `None` reads it whatever): slurmctld answers 304 without a list when nothing did, which
    /// costs it and the host next to nothing.
    ///
    /// slurmrestd 25.05 reads the partitions with the same time and fails the whole call when
    /// the nodes changed and the partitions did not (HTTP 500, "Unable to query partitions"):
    /// such an answer is read again without the time.
    ///
    /// # Errors
    /// The call failed, or its answer is not a node list.
    pub async fn nodes_since(&self, since: Option<i64>) -> Result<NodeList, Error> {
        if let Some(t) = since {
            let path = format!("/nodes?update_time={t}");
            match self.call(Method::GET, "the node list", &path, None).await {
                Ok(Value::Null) => return Ok(NodeList::Unchanged),
                Ok(value) => return node_list(value),
                Err(e @ (Error::Slurm { .. } | Error::Http { .. })) => {
                    tracing::debug!(error = %e, "node list since {t} refused; reading it whole");
                }
                Err(e) => return Err(e),
            }
        }
        let value = self.call(Method::GET, "the node list", "/nodes", None).await?;
        node_list(value)
    }

    /// Set `update` on every node of `names` in one request (`POST /slurm/<v>/nodes` with their
    /// host list; one node goes to `/node/<name>`). When the server refuses the batch (a node
    /// Slurm refuses, or an older slurmrestd without `POST /nodes`, which is then remembered),
    /// each node is asked alone, so the others are still done. Returns the nodes updated and the
    /// first error (naming the node that failed).
    pub async fn update_nodes(
        &self,
        names: &[String],
        update: NodeUpdate<'_>,
    ) -> (Vec<String>, Option<Error>) {
        let one_by_one = |names: &[String]| {
            let names = names.to_vec();
            async move {
                let (mut done, mut first) = (Vec::new(), None);
                for name in names {
                    match self.update_node(&name, update).await {
                        Ok(()) => done.push(name),
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
                (done, first)
            }
        };
        if names.len() < 2 || !self.batches() {
            return one_by_one(names).await;
        }
        let list = hostlist::compress(names);
        let what = format!("{} nodes {list}", update.verb());
        match self
            .call(
                Method::POST,
                &what,
                "/nodes",
                Some(&update.body(Some(list.clone()))),
            )
            .await
        {
            Ok(_) => return (names.to_vec(), None),
            Err(
                e @ Error::Http {
                    status: 404 | 405, ..
                },
            ) => {
                tracing::info!(error = %e, "slurmrestd takes no batched node updates: asking node by node from now on");
                self.no_batches();
            }
            Err(e @ (Error::Slurm { .. } | Error::Http { .. })) => {
                tracing::debug!(error = %e, "batched node update refused; asking node by node");
            }
            Err(e) => return (Vec::new(), Some(e)),
        }
        one_by_one(names).await
    }

    /// Set `update` on `node` (`POST /slurm/<v>/node/<name>`).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn update_node(&self, node: &str, update: NodeUpdate<'_>) -> Result<(), Error> {
        self.call(
            Method::POST,
            &format!("{} node {node}", update.verb()),
            &format!("/node/{node}"),
            Some(&update.body(None)),
        )
        .await
        .map(drop)
    }

    /// Mark `node` DRAIN with `reason` (which should start with [`crate::REASON_PREFIX`]).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn drain(&self, node: &str, reason: &str) -> Result<(), Error> {
        self.update_node(node, NodeUpdate::Drain(reason)).await
    }

    /// Take the DRAIN flag off `node` (`UNDRAIN`: a DOWN node stays down).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn undrain(&self, node: &str) -> Result<(), Error> {
        self.update_node(node, NodeUpdate::Undrain).await
    }

    /// Return a DOWN or DRAIN `node` to service (`RESUME`).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn resume(&self, node: &str) -> Result<(), Error> {
        self.update_node(node, NodeUpdate::Resume).await
    }

    /// Mark `node` DOWN with `reason` (a node already DOWN keeps its jobs' fate: it has none;
    /// jobs on a node that is not down are killed, so the host sends this only to a DOWN node).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn down(&self, node: &str, reason: &str) -> Result<(), Error> {
        self.update_node(node, NodeUpdate::Down(reason)).await
    }

    /// Delete the record of `node` (a dynamic node whose worker is gone for good).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn delete_node(&self, node: &str) -> Result<(), Error> {
        self.call(
            Method::DELETE,
            &format!("deleting node {node}"),
            &format!("/node/{node}"),
            None,
        )
        .await
        .map(drop)
    }
}

/// The nodes of a node-list answer, and its `last_update`.
fn node_list(mut value: Value) -> Result<NodeList, Error> {
    let last_update = last_update(&value);
    let Some(list) = value.get_mut("nodes").map(Value::take) else {
        return Err(Error::Parse {
            what: "nodes".into(),
            why: "no `nodes` in the answer".into(),
        });
    };
    let nodes = serde_json::from_value(list).map_err(|e| Error::Parse {
        what: "nodes".into(),
        why: e.to_string(),
    })?;
    Ok(NodeList::Changed { nodes, last_update })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_update_is_read_in_every_data_parsers_shape() {
        assert_eq!(last_update(&serde_json::json!({"last_update": 17})), Some(17));
        assert_eq!(
            last_update(&serde_json::json!({"last_update": {"set": true, "infinite": false, "number": 18}})),
            Some(18)
        );
        assert_eq!(
            last_update(&serde_json::json!({"last_update": {"set": false, "number": 0}})),
            None
        );
        assert_eq!(last_update(&serde_json::json!({})), None);
    }

    #[test]
    fn a_batch_names_its_nodes_as_a_host_list() {
        let names = ["slinky-1".to_string(), "slinky-0".into(), "slinky-2".into()];
        let body = NodeUpdate::Drain("slurm-operator: x").body(Some(hostlist::compress(&names)));
        assert_eq!(
            body,
            serde_json::json!({"state": ["DRAIN"], "reason": "slurm-operator: x", "name": "slinky-[0-2]"})
        );
        assert_eq!(
            NodeUpdate::Undrain.body(None),
            serde_json::json!({"state": ["UNDRAIN"]})
        );
    }
}
