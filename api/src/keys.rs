//! Labels and annotations a builder or the host may set (Slinky's `well_known.go`).

/// `app.kubernetes.io/name`: a selector label.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: a selector label (the CR name).
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/component`: added to the selector labels in the full labels.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// The Slurm cluster a worker pod belongs to (the Controller's name).
pub const LABEL_CLUSTER: &str = "slinky.slurm.net/cluster";
/// Marks the active slurmctld pod.
pub const LABEL_CONTROLLER_ACTIVE: &str = "controller.slinky.slurm.net/active";
/// NodeSet pod label: the pod name.
pub const LABEL_POD_NAME: &str = "nodeset.slinky.slurm.net/pod-name";
/// NodeSet pod label: the ordinal.
pub const LABEL_POD_INDEX: &str = "nodeset.slinky.slurm.net/pod-index";
/// NodeSet pod label: the hostname (the Slurm node name).
pub const LABEL_POD_HOSTNAME: &str = "nodeset.slinky.slurm.net/pod-hostname";
/// NodeSet pod label: the scaling mode the pod was made for.
pub const LABEL_SCALING_MODE: &str = "nodeset.slinky.slurm.net/scaling-mode";
/// NodeSet pod label: protected from disruption while its Slurm node is busy.
pub const LABEL_POD_PROTECT: &str = "nodeset.slinky.slurm.net/pod-protect";
/// NodeSet finalizer of the host: the NodeSet (and so its partition in `slurm.conf`) stays until
/// no job runs on its Slurm nodes (Slinky's #138: slurmctld crashed on job records of nodes a
/// reconfigure removed).
pub const FINALIZER_SLURM_NODES: &str = "nodeset.slinky.slurm.net/slurm-nodes";
/// NodeSet annotation (`"true"`): with no slurmrestd configured any more for a NodeSet that had
/// one, delete its pods without draining them (jobs on them die) instead of waiting for Slurm.
pub const ANNOTATION_DELETE_WITHOUT_DRAIN: &str = "nodeset.slinky.slurm.net/delete-without-drain";
/// NodeSet finalizer (Slinky's): a `ScheduledUpdate` NodeSet stays until its Slurm maintenance
/// reservation is deleted.
pub const FINALIZER_RESERVATION: &str = "nodeset.slinky.slurm.net/reservation";
/// The revision label shared with StatefulSets.
pub const LABEL_REVISION_HASH: &str = "controller-revision-hash";
/// Pod annotation: the Slurm topology spec, read by slurmd through `SLINKY_TOPOLOGY`.
pub const ANNOTATION_TOPOLOGY: &str = "topology.slinky.slurm.net/spec";
/// Node annotation: why the Kubernetes node is cordoned; becomes the drain reason of its worker
/// pods' Slurm nodes.
pub const ANNOTATION_NODE_CORDON_REASON: &str = "nodeset.slinky.slurm.net/node-cordon-reason";
/// Node annotation: the Slurm node name (and pod hostname) of the DaemonSet-mode worker on this
/// Kubernetes node, in place of the node's name up to its first dot.
pub const ANNOTATION_HOSTNAME_OVERRIDE: &str = "nodeset.slinky.slurm.net/hostname-override";
/// Pod annotation: the pod is cordoned (its Slurm node drained).
pub const ANNOTATION_POD_CORDON: &str = "nodeset.slinky.slurm.net/pod-cordon";
/// Pod annotation: the pod's deletion cost (lower goes first on scale-down).
pub const ANNOTATION_POD_DELETION_COST: &str = "nodeset.slinky.slurm.net/pod-deletion-cost";
/// Pod annotation: when the pod's running jobs end (RFC 3339).
pub const ANNOTATION_POD_DEADLINE: &str = "nodeset.slinky.slurm.net/pod-deadline";
/// Pod-template annotation: the hash of the sshd configuration.
pub const ANNOTATION_SSHD_CONF_HASH: &str = "slinky.slurm.net/sshd-conf-hash";
/// Pod-template annotation: the hash of the sssd configuration.
pub const ANNOTATION_SSSD_CONF_HASH: &str = "slinky.slurm.net/sssd-conf-hash";
/// The container `kubectl logs/exec` picks by default.
pub const ANNOTATION_DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
/// slurmctld pod-template annotation: the hash of the Slurm key Secret's data.
pub const ANNOTATION_SLURM_KEY_HASH: &str = "slinky.slurm.net/slurm-key-hash";
/// slurmctld pod-template annotation: the hash of the JWT key Secret's data.
pub const ANNOTATION_JWT_KEY_HASH: &str = "slinky.slurm.net/jwt-key-hash";
/// slurmctld pod-template annotation (without in-place reconfigure): the hash of the
/// `<controller>-config` ConfigMap's data, so a configuration change rolls slurmctld.
pub const ANNOTATION_SLURM_CONFIG_HASH: &str = "slinky.slurm.net/slurm-config-hash";
/// Set by the host on every child it applies: a hash of the object as last applied, so a
/// steady state makes no writes.
pub const ANNOTATION_APPLIED_HASH: &str = "slinky.slurm.net/applied-hash";
/// Set by the host on every child: `<plugin name>@<plugin version>`.
pub const ANNOTATION_BUILDER: &str = "slinky.slurm.net/builder";
/// Set by the host on every child: `sha256:<hex>` of the pipeline that built it (the base
/// builder's component digest alone, or with steps a hash of every component digest and
/// settings, in order).
pub const ANNOTATION_BUILDER_DIGEST: &str = "slinky.slurm.net/builder-digest";
/// The taint on Kubernetes nodes reserved for Slurm workers.
pub const TAINT_WORKER: &str = "nodeset.slinky.slurm.net/worker";
