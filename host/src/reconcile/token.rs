//! The Token kind: a JWT for a Slurm user, signed with the JWT key its `jwtKeyRef` names (the
//! Secret slurmctld reads as `jwt.key`), written into a Secret and refreshed before it expires,
//! as Slinky's token controller does, for tools that read it (slurm-exporter, slurm-bridge).
//!
//! # Rules
//! * The Secret is `spec.secretRef` (default `<token>-jwt-<username>`, key `SLURM_JWT`), owned by
//!   the Token (deleting the Token deletes it; Slinky hangs it on the key Secret, where it
//!   outlives its Token), labelled and annotated as the Token (but `last-applied`).
//! * A token is issued when the Secret has none that the key verifies for the user and the
//!   lifetime asked, and, with `refresh` (the default), once 80 % of its life has passed; it
//!   lives `lifetime` (default 15 minutes). Without `refresh` the Secret is immutable and the one
//!   token is never replaced: once it expires `Ready` says so (delete the Secret for a new one).
//! * The host never lists or watches Secrets: the Token is looked at again at its refresh time
//!   and at least every [`RECHECK`], which also follows a key rotated in its Secret (the old
//!   token no longer verifies, a new one is issued) and a Secret deleted by hand.
//! * `status.issuedAt` is the token's `iat`; `Ready` says whose token is where and until when.
//!   A spec that cannot be served is `InvalidSpec`, a key Secret or key that does not exist
//!   `ReferenceNotFound` (retried with backoff), a write the API server refuses `ChildFailure`;
//!   each with a Warning Event.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller as KubeController, controller::Action, events::EventType, watcher},
};
use serde_json::{Value, json};
use slinky_api::{Token, TokenStatus, checks, conditions, owners::controller_ref};
use slinky_slurm::jwt;

use super::core::{Error, context::Core, status::ConditionChanges, writer};
use crate::plugins::ChildKind;

/// The longest a Token waits before it is looked at again.
pub const RECHECK: Duration = Duration::from_secs(60);

/// The Token reconciler's context.
pub struct TokenContext {
    /// What every reconciler shares.
    pub core: Arc<Core>,
}

impl super::HasCore for TokenContext {
    fn core(&self) -> &Core {
        &self.core
    }
}

/// Whether the Token CRD is served (a cluster whose CRDs predate it runs without Tokens).
pub(super) async fn served(client: &Client) -> bool {
    match Api::<Token>::all(client.clone())
        .list(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => true,
        Err(e) if writer::is_not_found(&e) || writer::is_not_served(&e) => {
            tracing::info!("no Token CRD in the cluster: Tokens are not served (apply `slinky-host crds`)");
            false
        }
        Err(e) => {
            tracing::warn!(error = %writer::message(&e), "cannot list Tokens: they are not served (grant list and watch on tokens.slinky.slurm.net)");
            false
        }
    }
}

/// The Token queue: its own watch (one namespace, or every namespace filtered by the host's).
pub(super) fn queue(client: &Client, one_namespace: Option<&str>) -> KubeController<Token> {
    let api = match one_namespace {
        Some(ns) => Api::<Token>::namespaced(client.clone(), ns),
        None => Api::<Token>::all(client.clone()),
    };
    KubeController::new(api, watcher::Config::default())
}

/// Why the Token's Secret holds no good token.
enum Failed {
    /// The API server refused a read or a write: retried with backoff.
    Api(kube::Error),
    /// Nothing the host may do helps (an immutable Secret): looked at again later.
    Stuck(String),
}

/// What one look at a Token found.
enum Found {
    /// The Secret holds a token good until `refresh` (a time, seconds since the epoch).
    Good {
        claims: jwt::Claims,
        refresh: u64,
        issued: bool,
    },
    /// Without `refresh`: the one token has expired.
    Expired(jwt::Claims),
}

/// Reconcile one Token.
///
/// # Errors
/// A failure to read or write that is retried with the object's backoff.
pub async fn reconcile(token: Arc<Token>, ctx: Arc<TokenContext>) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    let ns = token.namespace().unwrap_or_default();
    if !core.serves(&ns) || token.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if !core.leader.may_write() {
        return Ok(Action::requeue(RECHECK));
    }
    let mut changes = ConditionChanges::new(token.metadata.generation);
    for t in [
        conditions::INVALID_SPEC,
        conditions::REFERENCE_NOT_FOUND,
        conditions::CHILD_FAILURE,
    ] {
        changes.clear(t);
    }
    if let Some(problem) = checks::summary(&token.spec_problems()) {
        changes.set(conditions::INVALID_SPEC, true, "InvalidSpec", problem.clone());
        changes.set(conditions::READY, false, "InvalidSpec", problem.clone());
        core.event(token.as_ref(), EventType::Warning, "InvalidSpec", problem)
            .await;
        write_status(core, &token, &changes, None).await?;
        return Ok(Action::await_change());
    }
    let key = match signing_key(core, &token, &ns).await? {
        Ok(key) => key,
        Err((reason, message)) => {
            changes.set(conditions::REFERENCE_NOT_FOUND, true, reason, message.clone());
            changes.set(conditions::READY, false, reason, message.clone());
            core.event(token.as_ref(), EventType::Warning, reason, message.clone())
                .await;
            write_status(core, &token, &changes, None).await?;
            return Ok(Action::requeue(
                core.backoff.failure(&super::core::backoff::key(token.as_ref())),
            ));
        }
    };
    let found = match sync_secret(core, &token, &ns, &key).await {
        Ok(found) => found,
        Err(failed) => {
            let (name, _) = token.secret();
            let message = match &failed {
                Failed::Api(e) => format!("cannot write Secret {ns}/{name}: {}", writer::message(e)),
                Failed::Stuck(m) => m.clone(),
            };
            changes.set(conditions::CHILD_FAILURE, true, "FailedWrite", message.clone());
            changes.set(conditions::READY, false, "FailedWrite", message.clone());
            core.event(token.as_ref(), EventType::Warning, "FailedWrite", message)
                .await;
            write_status(core, &token, &changes, None).await?;
            return match failed {
                Failed::Api(e) => Err(e.into()),
                Failed::Stuck(_) => Ok(Action::requeue(RECHECK)),
            };
        }
    };
    core.backoff.success(&super::core::backoff::key(token.as_ref()));
    let (name, secret_key) = token.secret();
    let now = jwt::now_secs();
    let (claims, after) = match found {
        Found::Good {
            claims,
            refresh,
            issued,
        } => {
            let message = format!(
                "a token for {} in Secret {name}, key {secret_key}, expires at {}{}",
                claims.sun,
                rfc3339(claims.exp),
                if token.refreshes() {
                    format!(", refreshed at {}", rfc3339(refresh))
                } else {
                    " (not refreshed)".into()
                }
            );
            changes.set(conditions::READY, true, "TokenIssued", message);
            if issued {
                tracing::info!(token = %token.name_any(), %ns, secret = %name, "issued a token");
            }
            let wait = Duration::from_secs(refresh.saturating_sub(now).max(1));
            (claims, wait.min(RECHECK))
        }
        Found::Expired(claims) => {
            let message = format!(
                "the token in Secret {name} expired at {} and refresh is false: delete the Secret to issue a new one",
                rfc3339(claims.exp)
            );
            changes.set(conditions::READY, false, "TokenExpired", message);
            (claims, RECHECK)
        }
    };
    write_status(core, &token, &changes, Some(claims.iat)).await?;
    Ok(Action::requeue(after))
}

/// The key the Token is signed with, or why there is none (reason, message).
async fn signing_key(
    core: &Core,
    token: &Token,
    ns: &str,
) -> Result<Result<Vec<u8>, (&'static str, String)>, Error> {
    let Some(r) = token.jwt_ref() else {
        return Ok(Err(("SecretNotFound", "no jwtKeyRef".into())));
    };
    let secret = Api::<Secret>::namespaced(core.client.clone(), ns)
        .get_opt(&r.name)
        .await?;
    let Some(secret) = secret else {
        return Ok(Err((
            "SecretNotFound",
            format!("Secret {ns}/{} (jwtKeyRef) does not exist", r.name),
        )));
    };
    match secret.data.as_ref().and_then(|d| d.get(&r.key)) {
        Some(v) if !v.0.is_empty() => Ok(Ok(v.0.clone())),
        _ => Ok(Err((
            "SecretKeyNotFound",
            format!("Secret {ns}/{} (jwtKeyRef) has no key {:?}", r.name, r.key),
        ))),
    }
}

/// Read the Token's Secret and issue a token into it when it needs one.
async fn sync_secret(core: &Core, token: &Token, ns: &str, key: &[u8]) -> Result<Found, Failed> {
    let (name, secret_key) = token.secret();
    let lifetime = token.lifetime().unwrap_or(slinky_api::TOKEN_LIFETIME_DEFAULT);
    let live = Api::<Secret>::namespaced(core.client.clone(), ns)
        .get_opt(&name)
        .await
        .map_err(Failed::Api)?;
    let now = jwt::now_secs();
    let held = live
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get(&secret_key))
        .and_then(|v| std::str::from_utf8(&v.0).ok().map(str::to_string))
        .and_then(|t| jwt::verify(key, &t))
        .filter(|c| c.sun == token.spec.username && c.exp.saturating_sub(c.iat) == lifetime.as_secs());
    let refresh_at = |c: &jwt::Claims| c.exp.saturating_sub(lifetime.as_secs() / 5);
    match (&held, token.refreshes()) {
        (Some(c), true) if now < refresh_at(c) && owned(live.as_ref(), token) => {
            return Ok(Found::Good {
                claims: c.clone(),
                refresh: refresh_at(c),
                issued: false,
            });
        }
        (Some(c), false) if now < c.exp => {
            return Ok(Found::Good {
                claims: c.clone(),
                refresh: c.exp,
                issued: false,
            });
        }
        (Some(c), false) => return Ok(Found::Expired(c.clone())),
        // An immutable Secret that holds no token of the Token's: it cannot change.
        (None, _) if live.as_ref().and_then(|s| s.immutable) == Some(true) => {
            return Err(Failed::Stuck(format!(
                "Secret {ns}/{name} is immutable and holds no token for {} signed with the current key and lifetime: delete it for a new one",
                token.spec.username
            )));
        }
        _ => {}
    }
    let id = format!("{}-{now}", token.uid().unwrap_or_default());
    let value = jwt::issue(key, &token.spec.username, now, lifetime, &id);
    let secret = desired_secret(token, ns, &name, &secret_key, &value);
    let rv = live.as_ref().and_then(|s| s.resource_version());
    core.writer
        .apply_child(ChildKind::Secret, &secret, rv)
        .await
        .map_err(Failed::Api)?;
    // The claims just signed (what `jwt::issue` writes).
    let claims = jwt::Claims {
        iat: now,
        exp: now.saturating_add(lifetime.as_secs()),
        sun: token.spec.username.clone(),
    };
    Ok(Found::Good {
        refresh: if token.refreshes() {
            refresh_at(&claims)
        } else {
            claims.exp
        },
        claims,
        issued: true,
    })
}

/// Whether `secret` is the Token's own (owned by it): a Secret another made (Slinky's, owned by
/// the key Secret) is taken over by the next token issued into it.
fn owned(secret: Option<&Secret>, token: &Token) -> bool {
    secret.is_some_and(|s| {
        s.owner_references()
            .iter()
            .any(|o| o.uid == token.uid().unwrap_or_default())
    })
}

/// The Secret holding `value`, as the host applies it.
fn desired_secret(token: &Token, ns: &str, name: &str, key: &str, value: &str) -> Value {
    let mut annotations: BTreeMap<String, String> = token.annotations().clone();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let data = serde_json::to_value(k8s_openapi::ByteString(value.as_bytes().to_vec())).unwrap_or_default();
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": token.labels(), "annotations": annotations,
            "ownerReferences": controller_ref(token).into_iter().collect::<Vec<_>>(),
        },
        "type": "Opaque",
        "data": {key: data},
    });
    if !token.refreshes() {
        secret["immutable"] = true.into();
    }
    secret
}

/// Write the Token's status: the conditions, and `issuedAt` when a token is held.
async fn write_status(
    core: &Core,
    token: &Token,
    changes: &ConditionChanges,
    iat: Option<u64>,
) -> Result<(), Error> {
    let issued_at = iat
        .and_then(|s| Timestamp::from_second(i64::try_from(s).ok()?).ok())
        .map(Time);
    super::core::status::write(core, token, changes, |t: &Token, conditions| TokenStatus {
        issued_at: issued_at
            .clone()
            .or_else(|| t.status.as_ref().and_then(|s| s.issued_at.clone())),
        observed_generation: t.metadata.generation,
        conditions,
    })
    .await
}

fn rfc3339(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}
