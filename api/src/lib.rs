//! Slinky custom resources (`slinky.slurm.net/v1beta1`), defined once and shared by the host and
//! the guest SDK, so a builder plugin and the host agree on every field.
//!
//! The shapes follow SchedMD's slurm-operator v1beta1 API. Container, pod-spec and service-spec
//! fields are *wrappers* ([`ContainerWrapper`], [`PodSpecWrapper`], [`ServiceSpecWrapper`]): like
//! Slinky's `preserve-unknown-fields` wrappers, they accept any subset of the core type's fields (a
//! container without a name, a pod spec without containers) and convert to the typed k8s-openapi
//! value on demand.

mod accounting;
mod builder_plugin;
/// Spec checks made before anything is built.
pub mod checks;
/// Per-pod volume claims of a NodeSet and their retention.
pub mod claims;
/// Status condition types the host sets.
pub mod conditions;
/// The builder contract's shared types: build context, pod identity, builder kinds, errors,
/// versions, the Controller inputs and the example inputs.
pub mod contract;
mod controller;
/// Defaults of the host's settings.
pub mod defaults;
/// Why a pass stopped, typed: condition, reason, message, metric label, retry class.
pub mod failure;
/// The hashes of Slinky's `*-hash` annotations.
pub mod hash;
/// The fields a change of which would destroy a cluster's state: CRD rules refuse the change.
mod immutable;
/// The Token kind (a JWT in a Secret).
mod token;
pub use immutable::{CONFIG_MAP_PIN, builder_plugin as builder_plugin_rules};
/// Labels and annotations a builder or the host may set.
pub mod keys;
/// Component labels and the parents' selector labels.
pub mod labels;
mod loginset;
/// Strategic-merge patch keys of the core types' lists.
pub mod merge_keys;
mod nodeset;
/// Owner references of children.
pub mod owners;
/// Where a DaemonSet-mode NodeSet's pods go (the DaemonSet controller's placement rules).
pub mod placement;
/// Pod readiness and ordinal names.
pub mod pods;
/// Kubernetes quantities as numbers.
pub mod quantity;
mod restapi;
/// The maintenance window of a `ScheduledUpdate` NodeSet.
pub mod scheduled;
/// Label selectors as Kubernetes matches and validates them (typed and JSON).
pub mod selectors;
mod spec_parts;
/// Kubernetes' name and value rules.
pub mod validation;
mod wrappers;

pub use accounting::{
    Accounting, AccountingSpec, AccountingStatus, DEFAULT_STORAGE_DATABASE, DEFAULT_STORAGE_PORT,
    SLURMDBD_CONF, SLURMDBD_PORT, StorageConfig, accounting_key,
};
pub use builder_plugin::{
    BuilderPlugin, BuilderPluginSpec, BuilderPluginStatus, ConfigMapModule, DEFAULT_ORDER, ORDER_MAX,
    ORDER_MIN, PLUGINS_GROUP, PluginModule, SETTINGS_MAX_BYTES, SETTINGS_MAX_DEPTH, ServingVersion, Settings,
};
pub use controller::{
    Controller, ControllerSpec, ControllerStatus, ExternalConfig, HighAvailability, MetricEndpoint, Metrics,
    Persistence, ServiceMonitor,
};
pub use loginset::{LOGIN_SSH_PORT, LoginSet, LoginSetSpec, LoginSetStatus, SSH_HOST_KEY_FILES};
pub use nodeset::{
    ControllerReference, KeptDrain, NodeSet, NodeSetSpec, NodeSetStatus, Partition, RollingUpdate,
    ScalingMode, Ssh, UpdateStrategy, UpdateStrategyType,
};
pub use restapi::{RestApi, RestApiSpec, RestApiStatus, SLURMRESTD_PORT, restapi_key};
pub use scheduled::ScheduledUpdate;
pub use spec_parts::{Metadata, PodTemplate, ServiceSpec};
pub use token::{
    TOKEN_LIFETIME_DEFAULT, TOKEN_LIFETIME_MAX, TOKEN_SECRET_KEY, Token, TokenSpec, TokenStatus,
};
pub use wrappers::{ContainerWrapper, PodSpecWrapper, ServiceSpecWrapper, WrapperError};

/// The API group of every Slinky kind.
pub const GROUP: &str = "slinky.slurm.net";
/// The served and stored version.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of every Slinky object.
pub const API_VERSION: &str = "slinky.slurm.net/v1beta1";

/// Whether `value` is its type's default (skips default fields when serializing).
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}
