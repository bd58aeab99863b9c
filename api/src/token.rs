//! The Token kind: a JWT for a Slurm user, signed with a Controller's JWT key and kept in a
//! Secret (refreshed before it expires), for tools that talk to slurmrestd (slurm-exporter,
//! slurm-bridge). Slinky's `Token` (`api/v1beta1/token_types.go`), field for field.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::SecretKeySelector,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::checks::SpecProblem;

/// `spec` of a Slinky Token.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "slinky.slurm.net",
    version = "v1beta1",
    kind = "Token",
    namespaced,
    status = "TokenStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "tokens",
    shortname = "jwt",
    category = "slurm",
    printcolumn(
        name = "USER",
        type_ = "string",
        json_path = ".spec.username",
        description = "The username issued to the JWT."
    ),
    printcolumn(
        name = "IAT",
        type_ = "date",
        json_path = ".status.issuedAt",
        description = "The JWT Issued At time."
    ),
    printcolumn(name = "AGE", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(
        kube_core = "::kube_core",
        k8s_openapi = "::k8s_openapi",
        schemars = "::schemars",
        serde = "::serde",
        serde_json = "::serde_json"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::immutable::token)]
pub struct TokenSpec {
    /// Slurm `auth/jwt` JWT HS256 key authentication. Deprecated: use jwtKeyRef instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_hs256_key_ref: Option<SecretKeySelector>,
    /// Slurm `auth/jwt` JWT key authentication: the Secret key (in the Token's namespace) the
    /// token is signed with, the one slurmctld reads as `jwt.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_key_ref: Option<SecretKeySelector>,
    /// The username whom the token is created for.
    pub username: String,
    /// The lifetime of the JWT before it expires (a Go duration, default `15m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<String>,
    /// Controls if the JWT will be rotated (default true). If set to false, then the Secret will
    /// be created as immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<bool>,
    /// SecretRef describes how to create the Secret containing the JWT (default: the Secret
    /// `<token>-jwt-<username>`, key `SLURM_JWT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeySelector>,
}

/// `status` of a Token.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenStatus {
    /// IssuedAt indicates the time when the JWT was issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<Time>,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `InvalidSpec`, `ReferenceNotFound`): a list map keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The longest lifetime Slurm takes (`INFINITE - 1` seconds, as Slinky clamps it).
pub const TOKEN_LIFETIME_MAX: Duration = Duration::from_secs(i32::MAX as u64 - 1);
/// The lifetime of a Token that sets none (Slinky's).
pub const TOKEN_LIFETIME_DEFAULT: Duration = Duration::from_secs(15 * 60);
/// The Secret key of the JWT when `secretRef` names none (Slinky's).
pub const TOKEN_SECRET_KEY: &str = "SLURM_JWT";

impl Token {
    /// The JWT key reference: `jwtKeyRef`, else its older name `jwtHs256KeyRef`.
    pub fn jwt_ref(&self) -> Option<&SecretKeySelector> {
        self.spec
            .jwt_key_ref
            .as_ref()
            .or(self.spec.jwt_hs256_key_ref.as_ref())
    }

    /// The Secret the JWT is written to and its key: `secretRef`, else `<token>-jwt-<username>`
    /// and `SLURM_JWT` (Slinky's `SecretRef`).
    pub fn secret(&self) -> (String, String) {
        match &self.spec.secret_ref {
            Some(r) => (r.name.clone(), r.key.clone()),
            None => (
                format!(
                    "{}-jwt-{}",
                    self.metadata.name.as_deref().unwrap_or_default(),
                    self.spec.username
                ),
                TOKEN_SECRET_KEY.to_string(),
            ),
        }
    }

    /// Whether the token is refreshed (`refresh`, default true).
    pub fn refreshes(&self) -> bool {
        self.spec.refresh.unwrap_or(true)
    }

    /// The lifetime (default 15 minutes, at most [`TOKEN_LIFETIME_MAX`]).
    ///
    /// # Errors
    /// A lifetime that is no Go duration, or is zero.
    pub fn lifetime(&self) -> Result<Duration, String> {
        let Some(text) = self.spec.lifetime.as_deref() else {
            return Ok(TOKEN_LIFETIME_DEFAULT);
        };
        let secs = crate::scheduled::parse_go_duration(text)
            .map_err(|e| format!("spec.lifetime {text:?} is no Go duration (like 15m or 24h): {e}"))?;
        if secs <= 0 {
            return Err(format!(
                "spec.lifetime {text:?} is not positive: a token must live at least a second"
            ));
        }
        Ok(Duration::from_secs(secs.unsigned_abs()).min(TOKEN_LIFETIME_MAX))
    }

    /// What is wrong with the spec, before anything is signed.
    pub fn spec_problems(&self) -> Vec<SpecProblem> {
        let mut out = Vec::new();
        let mut problem = |field: &str, message: String| out.push(SpecProblem::new(field, message));
        if self.spec.username.is_empty() {
            problem(
                "spec.username",
                "is empty: name the Slurm user the token is for".into(),
            );
        }
        match self.jwt_ref() {
            None => problem(
                "spec.jwtKeyRef",
                "jwtKeyRef or jwtHs256KeyRef must be set: the Secret key slurmctld reads as jwt.key".into(),
            ),
            Some(r) if r.name.is_empty() || r.key.is_empty() => {
                problem("spec.jwtKeyRef", "needs a name and a key".into())
            }
            Some(_) => {}
        }
        if let Some(r) = &self.spec.secret_ref
            && (r.name.is_empty() || r.key.is_empty())
        {
            problem("spec.secretRef", "needs a name and a key".into());
        }
        let (name, key) = self.secret();
        if let Some(e) = crate::validation::dns1123_subdomain(&name).into_iter().next() {
            problem("spec.secretRef.name", format!("the Secret name {name:?}: {e}"));
        }
        if !key.is_empty()
            && !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            problem(
                "spec.secretRef.key",
                format!("{key:?} is no Secret key (letters, digits, '-', '_' and '.')"),
            );
        }
        if let Err(e) = self.lifetime() {
            problem("spec.lifetime", e);
        }
        out
    }
}
