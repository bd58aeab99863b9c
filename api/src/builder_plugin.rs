//! The BuilderPlugin kind (`plugins.slinky.slurm.net/v1alpha1`, cluster-scoped): a builder
//! plugin declared in the cluster, with where its module comes from, the builder kinds it serves,
//! its place in their pipelines, its settings and the parents it applies to.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of `BuilderPlugin`.
pub const PLUGINS_GROUP: &str = "plugins.slinky.slurm.net";

/// The order of a step that does not give one.
pub const DEFAULT_ORDER: i32 = 100;
/// The lowest `spec.order` (an `int32`'s).
pub const ORDER_MIN: i64 = i32::MIN as i64;
/// The highest `spec.order` (an `int32`'s).
pub const ORDER_MAX: i64 = i32::MAX as i64;

/// `spec` of a BuilderPlugin: a step added, after the base builder (bundled, or the plugins
/// directory's), to the pipelines of the builder kinds it lists.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "plugins.slinky.slurm.net",
    version = "v1alpha1",
    kind = "BuilderPlugin",
    status = "BuilderPluginStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "bp",
    category = "slurm",
    printcolumn(name = "Kinds", type_ = "string", json_path = ".spec.kinds"),
    printcolumn(name = "Order", type_ = "integer", json_path = ".spec.order"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Plugin", type_ = "string", json_path = ".status.plugin"),
    printcolumn(name = "Digest", type_ = "string", json_path = ".status.shortDigest"),
    printcolumn(name = "Tier", type_ = "string", json_path = ".status.tier"),
    printcolumn(name = "Applies", type_ = "integer", json_path = ".status.appliesToCount"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(
        kube_core = "::kube_core",
        k8s_openapi = "::k8s_openapi",
        schemars = "::schemars",
        serde = "::serde",
        serde_json = "::serde_json"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BuilderPluginSpec {
    /// Where the module (a `wasm32-wasip2` component) comes from: exactly one of `image` or
    /// `configMap`.
    pub module: PluginModule,
    /// The builder kinds it serves (`nodeset-pod`, `controller-service`, `controller-children`,
    /// `nodeset-children`, `restapi-children`, `loginset-children`, `accounting-children`); the
    /// module must build every one.
    pub kinds: Vec<String>,
    /// Its place in each kind's pipeline, after the base builder: lower runs first (default
    /// 100; ties run in name order), an `int32`. Held as an `i64`, so a value the API server let
    /// through before the schema bounded it (it does not enforce `format: int32` on custom
    /// resources) refuses this BuilderPlugin, never the decoding of every BuilderPlugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = ORDER_MIN, "maximum" = ORDER_MAX))]
    pub order: Option<i64>,
    /// Its settings: any JSON, checked by the plugin's `validate-settings` before it serves
    /// with them, and passed to every build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub settings: Option<serde_json::Value>,
    /// The Controllers, NodeSets, RestApis, LoginSets and Accountings it applies to, by their
    /// labels (default: every one). A canary: a new version's BuilderPlugin selects one NodeSet
    /// (`matchLabels: {canary: "true"}`) while the old one's selects the rest
    /// (`{key: canary, operator: DoesNotExist}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Where a BuilderPlugin's module comes from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginModule {
    /// An OCI artifact pinned by digest: `registry/repository@sha256:<hex>` (as `slinky-host plugin
    /// push` prints it). With the host's `--plugin-public-key`, its cosign signature must verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A ConfigMap key holding the component (in `binaryData`, gzipped or not), for air-gapped
    /// sites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapModule>,
    /// The sha256 the component must have (`sha256:<hex>`): required for a ConfigMap's module
    /// (the API server refuses one without it), optional for an image (pinned by its digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A module kept in a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapModule {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The key (default `plugin.wasm`); its value (`binaryData`) may be gzipped (`.wasm.gz`:
    /// a ConfigMap holds at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `status` of a BuilderPlugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuilderPluginStatus {
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Loaded` (this generation serves), `Refused` (this generation was refused; the version
    /// named by `digest`, if any, keeps serving) or `Pending`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The plugin serving for this BuilderPlugin (`name@version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The sha256 of the component serving (`sha256:<hex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Its first 12 hex digits, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_digest: Option<String>,
    /// The contract version it speaks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<String>,
    /// Which compiler made the code it runs: `baseline` (Winch) or `optimized` (Cranelift).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The parents it applies to now (`<Kind> <namespace>/<name>`), at most 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applies_to: Vec<String>,
    /// How many parents it applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applies_to_count: Option<i64>,
    /// The version serving for this BuilderPlugin: the component's digest and the spec it was
    /// loaded with. A refused generation leaves it as it was, and a restarted host loads it
    /// again (from its cache, or the pinned module) when the current spec is refused, so a
    /// restart never drops a step that served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingVersion>,
    /// `Loaded` (True/False, with the reason it was refused): a list map keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The version of a BuilderPlugin that serves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingVersion {
    /// The component's sha256 (`sha256:<hex>`).
    pub digest: String,
    /// The spec it was loaded with.
    pub spec: BuilderPluginSpec,
}

/// `settings` takes any JSON value.
fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}
