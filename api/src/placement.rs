//! Where a DaemonSet-mode NodeSet's pods go: the Kubernetes DaemonSet controller's placement
//! rules (`pkg/controller/daemon`: `NodeShouldRunDaemonPod`), applied to a built pod and a Node.
//!
//! * A pod **should run** on a node when the node's name, labels and taints let it: its
//!   `nodeName` (when set) is the node, its `nodeSelector` and required node affinity match, and
//!   every `NoSchedule` and `NoExecute` taint is tolerated.
//! * A pod **may keep running** where it runs when the same holds for `NoExecute` taints only (a
//!   node tainted `NoSchedule` later keeps its pod).
//! * Like the DaemonSet controller, every pod tolerates what a node's own troubles taint it with
//!   ([`daemon_tolerations`]): not ready, unreachable, disk, memory or PID pressure, and
//!   **unschedulable**: a cordoned node keeps its worker, and a replacement can be made there
//!   (Slinky's #259: its DaemonSet-mode pods lacked these, and a pod deleted on a cordoned node was
//!   never recreated). The host drains the Slurm node of a cordoned Kubernetes node instead.
//! * The pod is bound to its node by a required node affinity on `metadata.name`
//!   ([`pin_to_node`], the DaemonSet controller's `ReplaceDaemonSetPodNodeNameNodeAffinity`),
//!   never by `nodeName`, so the scheduler and priority classes still apply. As there (and in
//!   Slinky), that term replaces the user's required terms, which decided the node's eligibility.

use k8s_openapi::api::core::v1::{
    Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint,
    Toleration,
};

use crate::keys;

/// The tolerations the DaemonSet controller gives every daemon pod (`AddOrUpdateDaemonPodTolerations`).
pub fn daemon_tolerations() -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    };
    vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
}

/// The Slurm node name (and pod hostname) of a DaemonSet-mode pod on `node`: the node's
/// `nodeset.slinky.slurm.net/hostname-override` annotation, else its name up to the first dot
/// (Slinky's `GetDaemonSetPodHostname`).
pub fn hostname_of(node: &Node) -> String {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_HOSTNAME_OVERRIDE))
        .filter(|h| !h.is_empty())
        .cloned()
        .unwrap_or_else(|| name.split('.').next().unwrap_or(name).to_string())
}

/// The node a pod is for: its `nodeName`, else the one name its required node affinity's
/// `matchFields` `metadata.name In` allows (the DaemonSet controller's `GetTargetNodeName`).
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.iter().flatten().find_map(|f| {
            (f.key == "metadata.name" && f.operator == "In")
                .then(|| f.values.as_ref().filter(|v| v.len() == 1).map(|v| v[0].clone()))
                .flatten()
        })
    })
}

/// Bind `pod` to `node` as the DaemonSet controller binds a daemon pod ([`pin_to_node`]) and
/// give it the daemon tolerations ([`add_daemon_tolerations`]).
pub fn place_on_node(pod: &mut Pod, node: &str) {
    let spec = pod.spec.get_or_insert_default();
    pin_to_node(spec, node);
    add_daemon_tolerations(spec);
}

/// The DaemonSet controller's `ReplaceDaemonSetPodNodeNameNodeAffinity`: the required node
/// affinity becomes one term, `matchFields: metadata.name In [node]`, in place of the terms it
/// had (which decided that the node is eligible: they are not needed to schedule it there);
/// preferred terms and pod (anti-)affinity stay. Slinky's DaemonSet-mode pods are bound so.
pub fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.to_string()]),
        }]),
        ..Default::default()
    };
    let node_affinity: &mut NodeAffinity = spec
        .affinity
        .get_or_insert_default()
        .node_affinity
        .get_or_insert_default();
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
}

/// The DaemonSet controller's `AddOrUpdateDaemonPodTolerations`: each daemon toleration replaces
/// a toleration of the same key, operator, value and effect (a `tolerationSeconds` the
/// API server's `DefaultTolerationSeconds` admission added goes: a daemon pod is not evicted from
/// a node that is not ready), or is added. Only additions and `tolerationSeconds` change, which
/// a running pod accepts. Returns whether anything changed.
pub fn add_daemon_tolerations(spec: &mut PodSpec) -> bool {
    let tolerations = spec.tolerations.get_or_insert_default();
    let mut changed = false;
    for t in daemon_tolerations() {
        let same = |o: &Toleration| {
            o.key == t.key && o.operator == t.operator && o.value == t.value && o.effect == t.effect
        };
        match tolerations.iter_mut().find(|o| same(o)) {
            Some(o) if *o == t => {}
            Some(o) => {
                *o = t;
                changed = true;
            }
            None => {
                tolerations.push(t);
                changed = true;
            }
        }
    }
    changed
}

/// Whether the `tolerations` tolerate `taint` (Kubernetes' `Toleration.ToleratesTaint`).
fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = t.key.as_deref().is_none_or(|k| k.is_empty() || k == taint.key);
        let empty_key_exists = t.key.as_deref().is_none_or(str::is_empty);
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            // `Equal` (the default): an empty key needs `Exists`.
            _ => {
                !empty_key_exists && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
        };
        effect_ok && key_ok && value_ok
    })
}

/// Whether one node selector requirement holds for `values` (a label's value, or the node's
/// name for a field), by Kubernetes' operators.
fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    if let Some(op) = crate::selectors::Operator::parse(&r.operator) {
        return op.holds(values, value);
    }
    match r.operator.as_str() {
        "Gt" => value
            .and_then(number)
            .zip(values.first().and_then(|x| number(x)))
            .is_some_and(|(v, x)| v > x),
        "Lt" => value
            .and_then(number)
            .zip(values.first().and_then(|x| number(x)))
            .is_some_and(|(v, x)| v < x),
        _ => false,
    }
}

/// Whether `term` selects `node` (its label and field requirements all hold; an empty term
/// selects nothing, as in Kubernetes).
fn term_selects(term: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref();
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| requirement_holds(r, (r.key == "metadata.name").then_some(name).flatten()))
}

/// Why a pod of `spec` should not run on `node` (`None`: it should), by the DaemonSet
/// controller's rules; `keep` asks whether one already there may keep running (only `NoExecute`
/// taints count then).
pub fn unfit(spec: &PodSpec, node: &Node, keep: bool) -> Option<String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if let Some(n) = spec
        .node_name
        .as_ref()
        .filter(|n| !n.is_empty() && n.as_str() != name)
    {
        return Some(format!("the pod asks for node {n}"));
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some((k, v)) = spec
        .node_selector
        .iter()
        .flatten()
        .find(|(k, v)| labels.get(*k) != Some(*v))
    {
        return Some(format!("its nodeSelector {k}={v} does not match"));
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(r) = required
        && !r.node_selector_terms.iter().any(|t| term_selects(t, node))
    {
        return Some("its required node affinity does not match".into());
    }
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    tolerations.extend(daemon_tolerations());
    let untolerated = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoExecute" || (!keep && t.effect == "NoSchedule"))
        .find(|t| !tolerates(&tolerations, t));
    untolerated.map(|t| {
        format!(
            "its taint {}{}:{} is not tolerated",
            t.key,
            t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default(),
            t.effect
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap_or_default()
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap_or_default()
    }

    #[test]
    fn selectors_affinity_and_taints_decide_where_a_daemon_pod_runs() {
        let gpu = node(serde_json::json!({"metadata": {"name": "gpu-1.example.org",
            "labels": {"accel": "gpu", "rack": "7"}},
            "spec": {"taints": [{"key": "dedicated", "value": "hpc", "effect": "NoSchedule"}]}}));
        let plain = spec(serde_json::json!({"containers": [{"name": "slurmd"}]}));
        assert_eq!(
            unfit(&plain, &gpu, false).as_deref(),
            Some("its taint dedicated=hpc:NoSchedule is not tolerated")
        );
        assert_eq!(
            unfit(&plain, &gpu, true),
            None,
            "a NoSchedule taint keeps a pod already there"
        );
        let tolerant = spec(serde_json::json!({"containers": [{"name": "slurmd"}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "hpc"}],
            "nodeSelector": {"accel": "gpu"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "rack", "operator": "Gt", "values": ["5"]}]}]}}}}));
        assert_eq!(unfit(&tolerant, &gpu, false), None);
        let cpu = node(serde_json::json!({"metadata": {"name": "cpu-1", "labels": {"rack": "9"}}}));
        assert_eq!(
            unfit(&tolerant, &cpu, false).as_deref(),
            Some("its nodeSelector accel=gpu does not match")
        );
        let cordoned = node(
            serde_json::json!({"metadata": {"name": "c"}, "spec": {"unschedulable": true,
            "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                       {"key": "evict", "effect": "NoExecute"}]}}),
        );
        assert_eq!(
            unfit(&plain, &cordoned, true).as_deref(),
            Some("its taint evict:NoExecute is not tolerated"),
            "cordoned is tolerated, a NoExecute taint is not"
        );
        assert_eq!(hostname_of(&gpu), "gpu-1");
        let mut over = gpu.clone();
        over.metadata.annotations =
            Some([(keys::ANNOTATION_HOSTNAME_OVERRIDE.to_string(), "g1".to_string())].into());
        assert_eq!(hostname_of(&over), "g1");
    }

    #[test]
    fn a_placed_pod_targets_only_its_node_and_tolerates_its_troubles_for_ever() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": [{"name": "s"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300},
                            {"key": "dedicated", "operator": "Equal", "value": "hpc"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "accel", "operator": "In", "values": ["gpu"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["old"]}]}]}}}}}))
        .unwrap_or_default();
        place_on_node(&mut pod, "n1");
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
        let terms = pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.clone())
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .map(|r| r.node_selector_terms)
            .unwrap_or_default();
        assert_eq!(
            serde_json::to_value(&terms).unwrap_or_default(),
            serde_json::json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
            "one term naming the node, as the DaemonSet controller makes it"
        );
        let mut spec = pod.spec.unwrap_or_default();
        let tolerations = spec.tolerations.clone().unwrap_or_default();
        assert_eq!(tolerations.len(), daemon_tolerations().len() + 1);
        assert_eq!(
            tolerations[0],
            daemon_tolerations()[0],
            "its 300 s are gone, in place"
        );
        assert_eq!(
            tolerations[1].key.as_deref(),
            Some("dedicated"),
            "the user's stays"
        );
        assert!(!add_daemon_tolerations(&mut spec), "nothing more to add");
        let mut bare = Pod::default();
        place_on_node(&mut bare, "n2");
        assert_eq!(target_node(&bare).as_deref(), Some("n2"));
    }
}
