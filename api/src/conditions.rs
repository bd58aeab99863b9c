//! Status condition types the host sets (it owns these types on its parents' status; other
//! writers' conditions are kept).

/// The parent is reconciled: its children exist and are available.
pub const READY: &str = "Ready";
/// The spec is invalid or asks for what this host does not support; nothing is changed.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// The builder plugin failed (trap, deadline, refused output, builder error).
pub const BUILDER_FAILED: &str = "BuilderFailed";
/// A NodeSet's Controller does not exist.
pub const CONTROLLER_NOT_FOUND: &str = "ControllerNotFound";
/// A NodeSet's pod create, delete, adoption or release was refused by the API server
/// (like a ReplicaSet's `ReplicaFailure`; reasons `FailedCreate`, `FailedDelete`, …).
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
/// A child other than a pod (a Service, ConfigMap, StatefulSet, PodDisruptionBudget) could
/// not be applied or pruned, or its name is taken by an object the host did not build
/// (reasons `FailedApply`, `FailedDelete`, `NotOwned`). On Controllers and NodeSets.
pub const CHILD_FAILURE: &str = "ChildFailure";
/// A Secret, ConfigMap or Accounting a parent references does not exist (reasons
/// `SecretNotFound`, `SecretKeyNotFound`, `ConfigMapNotFound`, `ConfigMapKeyNotFound`,
/// `AccountingNotFound`): the children that need it wait for it (a Controller whose Accounting
/// is missing still builds, with slurmdbd's default address: slurmctld keeps the records until
/// slurmdbd answers).
pub const REFERENCE_NOT_FOUND: &str = "ReferenceNotFound";
/// A NodeSet's Slurm (its Controller's slurmrestd) could not be asked, or refused what the host
/// asked (reasons `SlurmUnreachable`, `SlurmUnauthorized`, `SlurmNotConfigured`,
/// `SlurmRefused`): no pod that could run a job is deleted while it stands.
pub const SLURM_FAILURE: &str = "SlurmFailure";
/// Whether a `ScheduledUpdate` NodeSet's Slurm maintenance reservation exists (reasons
/// `Scheduled`, `Active`) or why not (`WindowOver`, `NoSlurmNodes`, `NoReplicas`,
/// `NoSlurmrestd`, or the Slurm failure's); absent with another strategy (Slinky's condition).
pub const RESERVATION_CREATED: &str = "ReservationCreated";
/// A BuilderPlugin's version serves (`True`), or why it was refused (`False`, reasons
/// `InvalidSpec`, `InvalidSettings`, `Unverified`, `PullFailed`, `UnknownDigest`,
/// `BadSignature`, `ModuleUnreadable`, `Refused`): the version that served before keeps serving.
pub const LOADED: &str = "Loaded";
/// Set by hosts before `ChildFailure` replaced it (the Controller's Service only); the host
/// clears it.
#[deprecated(note = "replaced by CHILD_FAILURE; the host only clears it")]
pub const SERVICE_FAILURE: &str = "ServiceFailure";
/// A NodeSet's `extraConf` has an item that is not `Key=Value`: none of it reaches slurmd (as
/// in Slinky's manager; its webhook refuses such a NodeSet). The pods are built without it.
pub const EXTRA_CONF_IGNORED: &str = "ExtraConfIgnored";
/// The condition types a NodeSet's status carries from the host.
pub const NODESET: [&str; 9] = [
    EXTRA_CONF_IGNORED,
    READY,
    INVALID_SPEC,
    BUILDER_FAILED,
    CONTROLLER_NOT_FOUND,
    REPLICA_FAILURE,
    CHILD_FAILURE,
    SLURM_FAILURE,
    RESERVATION_CREATED,
];
/// The condition types a Controller's status carries from the host.
pub const CONTROLLER: [&str; 5] = [
    READY,
    INVALID_SPEC,
    BUILDER_FAILED,
    CHILD_FAILURE,
    REFERENCE_NOT_FOUND,
];
