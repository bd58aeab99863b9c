//! The fields whose change would destroy a cluster's state, refused by the API server itself:
//! CRD validation rules (`x-kubernetes-validations`, transition rules comparing with `oldSelf`),
//! which kube-apiserver enforces with no webhook to run (1.28 on: the rules name their field with
//! `fieldPath`). They are the fields Slinky's
//! admission webhook makes immutable (`internal/webhook/*_webhook.go`):
//!
//! * Controller: `clusterName` (slurmctld's StateSaveLocation is named after it: a new name
//!   starts slurmctld without its jobs), `slurmKeyRef` and `jwtKeyRef` (which Secret: every daemon
//!   and token of the cluster authenticates with it), `persistence.enabled` (the StatefulSet's
//!   claim template cannot change) and, while persisted, `persistence.existingClaim`;
//! * NodeSet: `controllerRef` (its pods are nodes of that cluster: another one would delete them
//!   as unregistered) and `volumeClaimTemplates` (a StatefulSet's cannot change either);
//! * LoginSet: `controllerRef`; Accounting: `jwtKeyRef`.
//!
//! A field left unset counts as its default (`''`, persistence on), and so does a `null`
//! reference or `persistence` (a string cannot be compared with `null` in CEL: a `null`
//! `clusterName` stays what it is). A reference may be set where it was empty (a Controller without `jwtKeyRef` is told to set it), never changed
//! once set; `clusterName` may not be set later either (its default is `<namespace>_<name>`,
//! which a rule cannot see). Where a key Secret is named by its
//! older name (`jwtHs256KeyRef`, which Slinky's chart writes), the two names are one field.
//!
//! The rules stay inside the part of CEL the embedded API server evaluates (`has`, `size`,
//! selection, `==`, `!=`, `!`, `&&`, `||`, `?:`), so both servers refuse the same update with the
//! same message.

use schemars::Schema;
use serde_json::{Value, json};

/// One rule on a spec: the CEL, the message the API server answers with, the field it names.
struct Rule {
    rule: String,
    message: &'static str,
    field: &'static str,
}

/// Whether `x.field` is set (present and not `null`: the key references are nullable).
fn set(x: &str, field: &str) -> String {
    format!("(has({x}.{field}) && {x}.{field} != null)")
}

/// `x.field.name`, or `''` where either is unset.
fn name_of(x: &str, field: &str) -> String {
    format!(
        "({} && has({x}.{field}.name) ? {x}.{field}.name : '')",
        set(x, field)
    )
}

/// The JWT key Secret's name under either of its names.
fn jwt_name(x: &str) -> String {
    format!(
        "({} ? {} : {})",
        set(x, "jwtKeyRef"),
        name_of(x, "jwtKeyRef"),
        name_of(x, "jwtHs256KeyRef")
    )
}

/// `name` may be set where it was empty (the host's own advice for a missing reference), and
/// not changed once set.
fn once_set(name: impl Fn(&str) -> String) -> String {
    format!(
        "{} == '' || {} == {}",
        name("oldSelf"),
        name("self"),
        name("oldSelf")
    )
}

/// The JWT key rules of a Controller and an Accounting: one name at a time, and immutable.
fn jwt_rules() -> [Rule; 2] {
    [
        Rule {
            rule: format!(
                "!({} && {})",
                set("self", "jwtKeyRef"),
                set("self", "jwtHs256KeyRef")
            ),
            message: "set jwtKeyRef or its older name jwtHs256KeyRef, not both",
            field: ".jwtHs256KeyRef",
        },
        Rule {
            rule: once_set(jwt_name),
            message: "jwtKeyRef is immutable once set: slurmctld, slurmdbd and slurmrestd sign and check every token with this Secret's key; rotate the key inside the Secret instead",
            field: ".jwtKeyRef",
        },
    ]
}

/// Append `rules` to a spec's schema.
fn add(schema: &mut Schema, rules: impl IntoIterator<Item = Rule>) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let list = object
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = list {
        list.extend(
            rules
                .into_iter()
                .map(|r| json!({"rule": r.rule, "message": r.message, "fieldPath": r.field})),
        );
    }
}

/// `jwtHs256KeyRef`, Slinky's older name of `jwtKeyRef`, kept by the schema (not pruned) so
/// the object means what its author wrote.
fn jwt_alias(schema: &mut Schema) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(mut alias) = props.get("jwtKeyRef").cloned() {
        if let Some(a) = alias.as_object_mut() {
            a.insert(
                "description".into(),
                "Slinky's older name of jwtKeyRef (set one of the two).".into(),
            );
        }
        props.insert("jwtHs256KeyRef".into(), alias);
    }
}

/// The Token spec's rules (Slinky's CRD rule and webhook, same messages): a JWT key, by either
/// name, which does not change (name and key) once the Token exists.
pub(crate) fn token(schema: &mut Schema) {
    let key_of = |x: &str| {
        let key = |field: &str| {
            format!(
                "({} && has({x}.{field}.key) ? {x}.{field}.key : '')",
                set(x, field)
            )
        };
        format!(
            "({} ? {} : {})",
            set(x, "jwtKeyRef"),
            key("jwtKeyRef"),
            key("jwtHs256KeyRef")
        )
    };
    add(
        schema,
        [
            Rule {
                rule: format!(
                    "{} || {}",
                    set("self", "jwtKeyRef"),
                    set("self", "jwtHs256KeyRef")
                ),
                message: "jwtKeyRef or jwtHs256KeyRef must be set",
                field: ".jwtKeyRef",
            },
            Rule {
                rule: format!(
                    "{} == {} && {} == {}",
                    jwt_name("self"),
                    jwt_name("oldSelf"),
                    key_of("self"),
                    key_of("oldSelf")
                ),
                message: "the value of JwtKeyRef or JwtHs256KeyRef cannot be modified after deployment",
                field: ".jwtKeyRef",
            },
        ],
    );
}

/// The Controller spec's rules.
pub(crate) fn controller(schema: &mut Schema) {
    jwt_alias(schema);
    let optional = |field: &str| {
        format!("(has(self.{field}) ? self.{field} : '') == (has(oldSelf.{field}) ? oldSelf.{field} : '')")
    };
    let enabled = |x: &str| {
        format!(
            "({} && has({x}.persistence.enabled) ? {x}.persistence.enabled : true)",
            set(x, "persistence")
        )
    };
    let claim = |x: &str| {
        format!(
            "({} && has({x}.persistence.existingClaim) ? {x}.persistence.existingClaim : '')",
            set(x, "persistence")
        )
    };
    let rules = [
        Rule {
            rule: optional("clusterName"),
            message: "clusterName is immutable: slurmctld keeps its state (every job) under the cluster's name, and a new name starts it empty; create a new Controller for a new cluster",
            field: ".clusterName",
        },
        Rule {
            rule: once_set(|x| name_of(x, "slurmKeyRef")),
            message: "slurmKeyRef is immutable once set: every Slurm daemon of the cluster authenticates with this Secret's key; rotate the key inside the Secret instead",
            field: ".slurmKeyRef",
        },
        Rule {
            rule: format!("{} == {}", enabled("self"), enabled("oldSelf")),
            message: "persistence.enabled is immutable: slurmctld's state claim is part of its StatefulSet, which cannot change it; create a new Controller instead",
            field: ".persistence.enabled",
        },
        Rule {
            rule: format!(
                "!{} || {} == {}",
                enabled("self"),
                claim("self"),
                claim("oldSelf")
            ),
            message: "persistence.existingClaim is immutable while persistence is enabled: slurmctld's state (every job) is on that claim; copy the state to a new Controller instead",
            field: ".persistence.existingClaim",
        },
    ];
    add(schema, rules.into_iter().chain(jwt_rules()));
}

/// The NodeSet spec's rules.
pub(crate) fn nodeset(schema: &mut Schema) {
    let count = |x: &str| format!("(has({x}.volumeClaimTemplates) ? size({x}.volumeClaimTemplates) : 0)");
    add(
        schema,
        [
            Rule {
                rule: "oldSelf.controllerRef.name == '' || self.controllerRef == oldSelf.controllerRef"
                    .into(),
                message: "controllerRef is immutable once set: the NodeSet's pods are nodes of that Controller's Slurm cluster; create a new NodeSet for another cluster",
                field: ".controllerRef",
            },
            Rule {
                rule: format!(
                    "{} == {} && (!has(self.volumeClaimTemplates) || !has(oldSelf.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)",
                    count("self"),
                    count("oldSelf")
                ),
                message: "volumeClaimTemplates is immutable: each pod keeps the claims made from them; create a new NodeSet for other claims",
                field: ".volumeClaimTemplates",
            },
        ],
    );
}

/// The LoginSet spec's rules.
pub(crate) fn loginset(schema: &mut Schema) {
    add(
        schema,
        [Rule {
            rule: "(has(oldSelf.controllerRef.name) ? oldSelf.controllerRef.name : '') == '' || self.controllerRef == oldSelf.controllerRef".into(),
            message: "controllerRef is immutable once set: the login pods are configured for that Controller's Slurm cluster; create a new LoginSet for another cluster",
            field: ".controllerRef",
        }],
    );
}

/// The Accounting spec's rules.
pub(crate) fn accounting(schema: &mut Schema) {
    jwt_alias(schema);
    add(schema, jwt_rules());
}

/// The BuilderPlugin CRD's rule on `spec.module`: a ConfigMap module pins its digest (the digest
/// is what its author vouches for; a host with keys also checks its signature). On the spec only:
/// `status.serving` holds specs stored before the rule, and a status write must not fail on
/// them.
pub fn builder_plugin(
    crd: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    for version in &mut crd.spec.versions {
        let Some(module) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("module"))
        else {
            continue;
        };
        module.x_kubernetes_validations.get_or_insert_default().push(
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule {
                rule: format!("!{} || has(self.digest)", set("self", "configMap")),
                message: Some(CONFIG_MAP_PIN.into()),
                field_path: Some(".digest".into()),
                ..Default::default()
            },
        );
    }
}

/// Why a ConfigMap module without a digest is refused.
pub const CONFIG_MAP_PIN: &str = "a ConfigMap module must pin its digest: set spec.module.digest to the component's sha256:<hex> (`sha256sum plugin.wasm`, of the uncompressed component); the digest is what its author vouches for (a host with keys also wants its plugin.wasm.sig)";
