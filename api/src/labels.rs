//! The labels of Slinky's components: the selector labels that say which objects are whose, and
//! the full labels built on them.

use std::collections::BTreeMap;

use crate::{Controller, NodeSet, keys};

/// A label or annotation map.
pub type Labels = BTreeMap<String, String>;

/// The `app.kubernetes.io/name` / `component` pair of a Slinky component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// `app.kubernetes.io/name`, e.g. `slurmd`.
    pub name: &'static str,
    /// `app.kubernetes.io/component`, e.g. `worker`.
    pub component: &'static str,
}

/// Controller (slurmctld).
pub const CONTROLLER: Component = Component {
    name: "slurmctld",
    component: "controller",
};
/// RestApi (slurmrestd).
pub const RESTAPI: Component = Component {
    name: "slurmrestd",
    component: "restapi",
};
/// Accounting (slurmdbd).
pub const ACCOUNTING: Component = Component {
    name: "slurmdbd",
    component: "accounting",
};
/// NodeSet (slurmd workers).
pub const WORKER: Component = Component {
    name: "slurmd",
    component: "worker",
};
/// LoginSet.
pub const LOGIN: Component = Component {
    name: "login",
    component: "login",
};

impl Component {
    /// Selector labels: `app.kubernetes.io/name` and `app.kubernetes.io/instance=<instance>`.
    pub fn selector_labels(self, instance: &str) -> Labels {
        Labels::from([
            (keys::LABEL_NAME.to_string(), self.name.to_string()),
            (keys::LABEL_INSTANCE.to_string(), instance.to_string()),
        ])
    }

    /// Full labels: the selector labels plus `app.kubernetes.io/component`.
    pub fn labels(self, instance: &str) -> Labels {
        let mut labels = self.selector_labels(instance);
        labels.insert(keys::LABEL_COMPONENT.to_string(), self.component.to_string());
        labels
    }
}

/// Worker labels: the NodeSet's full labels plus `slinky.slurm.net/cluster=<controller>`.
pub fn worker_labels(nodeset: &str, controller: &str) -> Labels {
    let mut labels = WORKER.labels(nodeset);
    labels.insert(keys::LABEL_CLUSTER.to_string(), controller.to_string());
    labels
}

impl NodeSet {
    /// The selector labels of the NodeSet's pods: `app.kubernetes.io/name=slurmd`,
    /// `app.kubernetes.io/instance=<nodeset>`. A pod without them is not the NodeSet's.
    pub fn selector_labels(&self) -> Labels {
        WORKER.selector_labels(self.metadata.name.as_deref().unwrap_or_default())
    }
}

impl Controller {
    /// The selector labels of the Controller's slurmctld pods (its Service selects them):
    /// `app.kubernetes.io/name=slurmctld`, `app.kubernetes.io/instance=<controller>`.
    pub fn selector_labels(&self) -> Labels {
        CONTROLLER.selector_labels(self.metadata.name.as_deref().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ControllerSpec, NodeSetSpec};

    #[test]
    fn labels_follow_slinky() {
        let l = worker_labels("w", "slurm");
        assert_eq!(
            l.get("app.kubernetes.io/name").map(String::as_str),
            Some("slurmd")
        );
        assert_eq!(
            l.get("app.kubernetes.io/component").map(String::as_str),
            Some("worker")
        );
        assert_eq!(
            l.get("slinky.slurm.net/cluster").map(String::as_str),
            Some("slurm")
        );
        assert_eq!(CONTROLLER.selector_labels("x").len(), 2);
    }

    #[test]
    fn parents_select_their_pods() {
        let ns = NodeSet::new("w", NodeSetSpec::default());
        assert_eq!(ns.selector_labels(), WORKER.selector_labels("w"));
        assert_eq!(
            ns.selector_labels().get(keys::LABEL_INSTANCE).map(String::as_str),
            Some("w")
        );
        let c = Controller::new("slurm", ControllerSpec::default());
        assert_eq!(
            c.selector_labels(),
            Labels::from([
                (keys::LABEL_NAME.to_string(), "slurmctld".to_string()),
                (keys::LABEL_INSTANCE.to_string(), "slurm".to_string()),
            ])
        );
    }
}
