//! The Accounting: slurmdbd's StatefulSet, Service and `slurmdbd.conf` Secret
//! (`accounting-children` builder), through the generic component pass
//! ([`crate::reconcile::component`]). Controllers that reference an Accounting take its address
//! for their `AccountingStorage*` lines ([`crate::reconcile::controller`]).
//!
//! # Guarantees
//! * The builder gets a copy of the Accounting and hashes of its key Secrets and of its stored
//!   `slurmdbd.conf`: never a Secret's data. The database password is written into
//!   `slurmdbd.conf` here, by the host, where the builder placed the placeholder of
//!   `spec.storageConfig.passwordKeyRef` (the output policy lets it place no other Secret value).
//!   A password with a line break is refused (`InvalidSpec`): it would add lines to the file.
//! * A missing key or password Secret (or key) is `ReferenceNotFound`: the children wait (the
//!   existing ones stay), retried with backoff.
//! * A changed `slurmdbd.conf` rolls slurmdbd: its hash is on the pod template, and a pass that
//!   writes a new one comes back within a second to apply the template that carries it. A new
//!   Accounting's StatefulSet waits for that pass (slurmdbd starts once, on its configuration;
//!   Slinky's starts before its Secret exists, then rolls).
//! * slurmdbd's StatefulSet goes with the Accounting (or when it turns external), never because a
//!   build left it out.

use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use serde_json::Value;
use slinky_api::{
    Accounting, AccountingStatus, checks,
    contract::{AccountingInputs, MissingReference, secret_hash, secret_refs, secret_value},
    failure::Failure,
};

use super::{
    component::{Component, ComponentContext, Prepared},
    core::{Error, apply::ChildSync, caches::Caches},
};
use crate::plugins::{BuildContext, Builder as _, BuilderKind, Child, ChildKind, Pipeline, PluginError};

/// What an Accounting's children are made of: the builder's inputs and the database password.
pub(crate) struct Inputs {
    builder: AccountingInputs,
    password: Option<String>,
}

impl Component for Accounting {
    const BUILDER: BuilderKind = BuilderKind::AccountingChildren;
    // Its Secret is not cached: it goes with the Accounting.
    const CHILD_KINDS: &'static [ChildKind] = &[ChildKind::Service, ChildKind::StatefulSet];
    type Inputs = Inputs;

    fn spec_problem(&self) -> Option<String> {
        checks::summary(&self.spec_problems())
    }

    async fn inputs(
        &self,
        ctx: &ComponentContext,
        _: &mut ChildSync<'_, Self>,
    ) -> Result<Result<Inputs, Option<Failure>>, Error> {
        Ok(read_inputs(ctx, self).await?.map_err(Some))
    }

    fn build(
        &self,
        builder: &Pipeline,
        ctx: &BuildContext,
        inputs: &Inputs,
    ) -> Result<Vec<Child>, PluginError> {
        builder.build_accounting_children(ctx, self, &inputs.builder)
    }

    fn prepare(&self, children: Vec<Child>, inputs: &Inputs) -> Result<Prepared, Failure> {
        let stored_hash = &inputs.builder.slurmdbd_conf_hash;
        let mut children =
            with_secret_values(children, self, inputs.password.as_deref()).map_err(Failure::invalid_spec)?;
        let new_conf = children
            .iter()
            .filter(|c| c.kind == ChildKind::Secret)
            .any(|c| hash_of(c) != *stored_hash);
        // No slurmdbd.conf stored yet: slurmdbd waits for it (its pod would not mount, and would
        // roll once the hash of the new Secret is known).
        if stored_hash.is_empty() && new_conf {
            children.retain(|c| c.kind != ChildKind::StatefulSet);
        }
        Ok(Prepared {
            children,
            come_back_soon: new_conf,
        })
    }

    fn kept(&self) -> &'static [ChildKind] {
        if self.spec.external {
            &[]
        } else {
            &[ChildKind::StatefulSet]
        }
    }

    fn readiness(&self, caches: &Caches) -> Option<String> {
        if self.spec.external {
            return Some("external: slurmdbd runs elsewhere".into());
        }
        let key = ObjectRef::new(&self.accounting_key()).within(&self.namespace().unwrap_or_default());
        let sts = caches.children.statefulsets.get(&key)?;
        let ready = sts.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        Some(format!("slurmdbd {ready}/1 ready"))
    }

    fn status_after(&self, _: &Self, conditions: Vec<Condition>, _: &Caches) -> AccountingStatus {
        AccountingStatus {
            observed_generation: self.metadata.generation,
            conditions,
        }
    }
}

/// The hash of a built Secret's data, as Slinky hashes the stored one.
fn hash_of(child: &Child) -> String {
    serde_json::from_value::<Secret>(child.object.clone())
        .map(|s| secret_hash(&s))
        .unwrap_or_default()
}

/// What the builder needs (the key hashes and the stored `slurmdbd.conf`'s) and the database
/// password, read from the API by name; or the first missing reference.
async fn read_inputs(ctx: &ComponentContext, a: &Accounting) -> Result<Result<Inputs, Failure>, Error> {
    let ns = a.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.core.client.clone(), &ns);
    if a.spec.external {
        return Ok(Ok(Inputs {
            builder: AccountingInputs::default(),
            password: None,
        }));
    }
    let mut secrets = std::collections::BTreeMap::new();
    for r in a.key_secret_refs() {
        if !secrets.contains_key(&r.name)
            && let Some(s) = api.get_opt(&r.name).await?
        {
            secrets.insert(r.name.clone(), s);
        }
    }
    let stored = api.get_opt(&a.accounting_key()).await?;
    let (builder, missing) = AccountingInputs::gather(a, |name| secrets.get(name), stored.as_ref());
    let waits = |m: &MissingReference| {
        Failure::reference_not_found(
            m.reason(),
            format!(
                "{}: slurmdbd's StatefulSet and its configuration wait for it",
                m.describe(&ns)
            ),
        )
    };
    if let Some(m) = missing.first() {
        return Ok(Err(waits(m)));
    }
    let pass = &a.spec.storage_config.password_key_ref;
    const FIELD: &str = "spec.storageConfig.passwordKeyRef";
    let Some(secret) = api.get_opt(&pass.name).await? else {
        return Ok(Err(waits(&MissingReference::Secret {
            field: FIELD,
            name: pass.name.clone(),
        })));
    };
    let Some(value) = secret_value(&secret, &pass.key) else {
        return Ok(Err(waits(&MissingReference::SecretKey {
            field: FIELD,
            name: pass.name.clone(),
            key: pass.key.clone(),
        })));
    };
    Ok(Ok(Inputs {
        builder,
        password: Some(String::from_utf8_lossy(&value).into_owned()),
    }))
}

/// `children` with each Secret's placeholders replaced by the database password and its
/// `stringData` moved into `data` (as the API server stores it, so a steady state compares
/// equal); `Err` with the `InvalidSpec` message when the password cannot be placed.
fn with_secret_values(
    mut children: Vec<Child>,
    a: &Accounting,
    password: Option<&str>,
) -> Result<Vec<Child>, String> {
    let pass = &a.spec.storage_config.password_key_ref;
    for child in children.iter_mut().filter(|c| c.kind == ChildKind::Secret) {
        let Some(obj) = child.object.as_object_mut() else {
            continue;
        };
        let string_data = obj.remove("stringData").unwrap_or(Value::Null);
        let mut data = serde_json::Map::new();
        for (key, text) in string_data.as_object().into_iter().flatten() {
            let text = text.as_str().unwrap_or_default();
            let resolved = secret_refs::resolve(text, |r| {
                if r.name == pass.name && r.key == pass.key {
                    password
                        .map(String::from)
                        .ok_or_else(|| "no password was read".to_string())
                } else {
                    Err(format!(
                        "Secret {}/{} is not the Accounting's to place",
                        r.name, r.key
                    ))
                }
            })
            .map_err(|e| format!("spec.storageConfig.passwordKeyRef: {e}"))?;
            data.insert(key.clone(), Value::String(base64_encode(resolved.as_bytes())));
        }
        obj.insert("data".into(), Value::Object(data));
        obj.entry("type")
            .or_insert_with(|| Value::String("Opaque".into()));
    }
    Ok(children)
}

fn base64_encode(bytes: &[u8]) -> String {
    serde_json::to_value(ByteString(bytes.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}
