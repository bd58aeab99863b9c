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
    /// Its settings: any JSON (at most 64 KiB of it, nested at most 32 levels deep), checked by
    /// the plugin's `validate-settings` before it serves with them, and passed to every build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub settings: Option<Settings>,
    /// The Controllers, NodeSets, RestApis, LoginSets and Accountings it applies to, by their
    /// labels (default: every one). A canary: a new version's BuilderPlugin selects one NodeSet
    /// (`matchLabels: {canary: "true"}`) while the old one's selects the rest
    /// (`{key: canary, operator: DoesNotExist}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Only the parents in these namespaces (default: every namespace), and every one of them the
    /// selector matches. Unlike labels, which whoever may edit a parent controls, a namespace is
    /// the cluster admin's: a step scoped by namespace and without a selector is mandatory there
    /// (a tenant cannot relabel its NodeSets out of a hardening step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub namespaces: Option<Vec<String>>,
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

/// The longest `spec.settings` (its JSON text): longer ones refuse their BuilderPlugin.
pub const SETTINGS_MAX_BYTES: usize = 64 * 1024;
/// The deepest `spec.settings` (objects and arrays within each other): deeper ones refuse their
/// BuilderPlugin.
pub const SETTINGS_MAX_DEPTH: usize = 32;

/// A BuilderPlugin's `spec.settings` as the API server serves it: kept as JSON text and looked
/// into only by [`Settings::checked`]. kube-apiserver stores settings nested thousands of levels
/// deep, while a JSON decoder of the host stops at 128 levels, and a list decodes all or
/// nothing: held as a value, one BuilderPlugin's settings would stop every BuilderPlugin from
/// loading (and the host from starting). Held as text, they refuse only their own.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(transparent)]
pub struct Settings(Box<serde_json::value::RawValue>);

impl PartialEq for Settings {
    fn eq(&self, other: &Settings) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Settings {
    /// The settings' JSON text, as served.
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The settings as a value, within the bounds.
    ///
    /// # Errors
    /// What is wrong with them (too long, too deep), and how to fix it.
    pub fn checked(&self) -> Result<serde_json::Value, String> {
        let text = self.0.get();
        if text.len() > SETTINGS_MAX_BYTES {
            return Err(format!(
                "{} bytes of JSON, more than the {SETTINGS_MAX_BYTES} allowed: keep large data in the plugin, or in a \
                 ConfigMap the pods mount",
                text.len()
            ));
        }
        let depth = json_depth(text);
        if depth > SETTINGS_MAX_DEPTH {
            return Err(format!(
                "nested {depth} levels deep, more than the {SETTINGS_MAX_DEPTH} allowed: flatten them"
            ));
        }
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}

impl From<serde_json::Value> for Settings {
    fn from(value: serde_json::Value) -> Settings {
        // A value always has a JSON text: the default (`null`) is never taken.
        Settings(serde_json::value::to_raw_value(&value).unwrap_or_default())
    }
}

/// How deep the arrays and objects of the JSON text `text` go (strings skipped, escapes
/// included), without a recursive parse.
fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `settings` takes any JSON value.
fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"a":{"a":…1…}}`, `depth` objects deep.
    fn nested(depth: usize) -> String {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    }

    #[test]
    fn settings_deeper_than_the_decoder_goes_refuse_only_their_own_builder_plugin() -> Result<(), String> {
        // A list of two: the first's settings nested 200 deep (kube-apiserver stores them).
        let list = format!(
            r#"{{"items":[{{"metadata":{{"name":"deep"}},"spec":{{"module":{{}},"kinds":["nodeset-pod"],"settings":{}}}}},
                {{"metadata":{{"name":"fine"}},"spec":{{"module":{{}},"kinds":["nodeset-pod"],"settings":{{"gpus":[1, "}}"]}}}}}}]}}"#,
            nested(200)
        );
        #[derive(Deserialize)]
        struct List {
            items: Vec<BuilderPlugin>,
        }
        let list: List =
            serde_json::from_str(&list).map_err(|e| format!("a list with deep settings: {e}"))?;
        let settings = |i: usize| list.items[i].spec.settings.clone().ok_or("no settings");
        let error = settings(0)?.checked().err().ok_or("200 levels pass")?;
        assert!(
            error.contains("nested 200 levels deep, more than the 32 allowed"),
            "{error}"
        );
        let fine = settings(1)?;
        assert_eq!(fine.checked(), Ok(serde_json::json!({"gpus": [1, "}"]})));
        assert_eq!(json_depth(fine.text()), 2, "a brace in a string is not a level");
        assert_eq!(json_depth(r#"["\\\"[", {}]"#), 2, "escapes inside strings");
        let long = Settings::from(serde_json::json!({"x": "a".repeat(SETTINGS_MAX_BYTES)}));
        assert!(long.checked().err().ok_or("too long passes")?.contains("allowed"));
        // It serializes to the text it was.
        let round: Settings = serde_json::from_str(r#"{"b": 1, "a": [true]}"#).map_err(|e| e.to_string())?;
        assert_eq!(
            serde_json::to_string(&round).map_err(|e| e.to_string())?,
            r#"{"b": 1, "a": [true]}"#
        );
        Ok(())
    }
}
