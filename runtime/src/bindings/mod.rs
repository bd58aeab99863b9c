//! The only `bindgen!` of the runtime, and the one place that knows contract versions apart.
//!
//! The host's world (`wit/host/world.wit`) exports every interface of every contract version the
//! runtime loads: `slinky:builder@0.3.0` (`wit/builder@0.3.0`), `slinky:builder@0.2.0` and
//! `slinky:builder@0.1.0` (`wit/builder@0.2.0`, `wit/builder@0.1.0`, frozen). Each version's generated types differ, their shapes do not: the
//! macros below implement one set of version-free traits ([`ServiceExport`], [`PodExport`], …) for
//! the generated types of every version from one body, so a call has one path whatever the
//! version ([`Exports`]).
//!
//! Each exported interface is loaded on its own (`GuestIndices`), so a plugin may export just the
//! builder kinds it implements, of either version.

#![allow(missing_docs, reason = "generated bindings")]

use wasmtime::{
    Store,
    component::{Instance, InstancePre},
};

use crate::{
    AccountingInputs, BuildContext, BuilderKind, Contract, ControllerInputs, GuestError, LoginSetInputs,
    PluginInfo, PodIdentity, sandbox::CallState,
};

wasmtime::component::bindgen!({
    // Older packages first: the host's world refers to all of them.
    path: ["../wit/builder@0.1.0", "../wit/builder@0.2.0", "../wit/builder@0.3.0", "../wit/host"],
    world: "slinky:host-view/host",
});

/// The current contract (`slinky:builder@0.3.0`).
pub mod v3 {
    pub use super::{
        exports::slinky::builder0_3_0::{
            accounting_children, controller_children, controller_service, loginset_children,
            nodeset_children, nodeset_pod, plugin, restapi_children,
        },
        slinky::builder0_3_0::types,
    };
}

/// The second contract (`slinky:builder@0.2.0`), still loaded.
pub mod v2 {
    pub use super::{
        exports::slinky::builder0_2_0::{
            controller_children, controller_service, nodeset_children, nodeset_pod, plugin,
        },
        slinky::builder0_2_0::types,
    };
}

/// The first contract (`slinky:builder@0.1.0`), still loaded.
pub mod v1 {
    pub use super::{
        exports::slinky::builder0_1_0::{controller_service, nodeset_pod, plugin},
        slinky::builder0_1_0::types,
    };
}

/// Run `$body` with `$v` naming the bindings module of `$contract` (`v1`, `v2`, `v3`): one body
/// for every version, for what every version has.
macro_rules! for_contract {
    ($contract:expr, $v:ident => $body:expr) => {
        match $contract {
            Contract::V0_1 => {
                use self::v1 as $v;
                $body
            }
            Contract::V0_2 => {
                use self::v2 as $v;
                $body
            }
            Contract::V0_3 => {
                use self::v3 as $v;
                $body
            }
        }
    };
}

/// Like [`for_contract!`], for what contract 0.2.0 on has (`None` for 0.1.0).
macro_rules! from_v2 {
    ($contract:expr, $v:ident => $body:expr) => {
        match $contract {
            Contract::V0_1 => None,
            Contract::V0_2 => {
                use self::v2 as $v;
                Some($body)
            }
            Contract::V0_3 => {
                use self::v3 as $v;
                Some($body)
            }
        }
    };
}

/// What one call returns: a trap (outer) or the builder's own result.
pub(crate) type CallResult<T> = wasmtime::Result<Result<T, GuestError>>;

mod version_free;
pub(crate) use version_free::{
    AccountingChildrenExport, ControllerChildrenExport, ControllerInputTexts, Exports,
    LoginsetChildrenExport, NodesetChildrenExport, PodExport, RestapiChildrenExport, ServiceExport,
};

/// A version's `controller-inputs` record, from the host's.
trait ControllerInputsOf {
    fn of(texts: ControllerInputTexts, inputs: &ControllerInputs) -> Self;
}

impl ControllerInputsOf for v2::types::ControllerInputs {
    fn of(texts: ControllerInputTexts, inputs: &ControllerInputs) -> Self {
        Self {
            nodesets: texts.nodesets,
            slurm_key_hash: inputs.slurm_key_hash.clone(),
            jwt_key_hash: inputs.jwt_key_hash.clone(),
            config_maps: inputs
                .config_maps
                .iter()
                .map(|c| v2::types::ConfigMapFiles {
                    name: c.name.clone(),
                    files: c.files.clone(),
                })
                .collect(),
        }
    }
}

impl ControllerInputsOf for v3::types::ControllerInputs {
    fn of(texts: ControllerInputTexts, inputs: &ControllerInputs) -> Self {
        Self {
            nodesets: texts.nodesets,
            slurm_key_hash: inputs.slurm_key_hash.clone(),
            jwt_key_hash: inputs.jwt_key_hash.clone(),
            config_maps: inputs
                .config_maps
                .iter()
                .map(|c| v3::types::ConfigMapFiles {
                    name: c.name.clone(),
                    files: c.files.clone(),
                })
                .collect(),
            accounting: texts.accounting,
        }
    }
}

/// What every contract version has, implemented for the generated types of each from one body.
macro_rules! every_version {
    ($($v:ident),+) => {$(

        impl $v::types::PodIdentity {
            fn from_host(identity: &PodIdentity) -> Self {
                Self {
                    ordinal: identity.ordinal,
                    name: identity.name.clone(),
                    hostname: identity.hostname.clone(),
                    revision: identity.revision.clone(),
                }
            }
        }

        impl From<$v::types::BuildError> for GuestError {
            fn from(e: $v::types::BuildError) -> Self {
                match e {
                    $v::types::BuildError::InvalidInput(m) => GuestError::InvalidInput(m),
                    $v::types::BuildError::Unsupported(m) => GuestError::Unsupported(m),
                    $v::types::BuildError::Internal(m) => GuestError::Internal(m),
                }
            }
        }

        impl From<$v::types::PluginInfo> for PluginInfo {
            fn from(i: $v::types::PluginInfo) -> Self {
                PluginInfo {
                    name: i.name,
                    version: i.version,
                    kinds: i.kinds.into_iter().map(BuilderKind::from).collect(),
                    contract_version: i.contract_version,
                }
            }
        }

        impl ServiceExport for $v::controller_service::GuestIndices {
            fn build_service(
                &self,
                store: &mut Store<CallState>,
                instance: &Instance,
                ctx: &BuildContext,
                controller: &String,
            ) -> CallResult<String> {
                let ctx = $v::types::BuildContext::from_host(ctx);
                let r = self.load(&mut *store, instance)?.call_build_service(store, &ctx, controller)?;
                Ok(r.map_err(GuestError::from))
            }
        }

        impl PodExport for $v::nodeset_pod::GuestIndices {
            fn build_pod(
                &self,
                store: &mut Store<CallState>,
                instance: &Instance,
                ctx: &BuildContext,
                nodeset: &String,
                controller: &String,
                identity: &PodIdentity,
            ) -> CallResult<String> {
                let ctx = $v::types::BuildContext::from_host(ctx);
                let identity = $v::types::PodIdentity::from_host(identity);
                let r = self
                    .load(&mut *store, instance)?
                    .call_build_pod(store, &ctx, nodeset, controller, &identity)?;
                Ok(r.map_err(GuestError::from))
            }
        }
    )+};
}
every_version!(v1, v2, v3);

/// Contracts before 0.3.0 know the cluster domain only: no settings, no pipeline.
macro_rules! context_before_v3 {
    ($($v:ident),+) => {$(
        impl $v::types::BuildContext {
            fn from_host(ctx: &BuildContext) -> Self {
                Self {
                    cluster_domain: ctx.cluster_domain.clone(),
                }
            }
        }
    )+};
}
context_before_v3!(v1, v2);

impl v3::types::BuildContext {
    fn from_host(ctx: &BuildContext) -> Self {
        Self {
            cluster_domain: ctx.cluster_domain.clone(),
            settings: ctx.settings.clone(),
            previous: ctx.previous.clone(),
        }
    }
}

/// Call `validate-settings(settings)` on `instance` (contract 0.3.0 on): `Ok(Err(message))`
/// when the plugin refuses them. Older contracts have no settings: only `{}` is accepted.
pub(crate) fn call_validate_settings(
    store: &mut Store<CallState>,
    instance: &Instance,
    pre: &InstancePre<CallState>,
    contract: Contract,
    settings: &str,
) -> wasmtime::Result<Result<(), String>> {
    match contract {
        Contract::V0_3 => {
            let guest = v3::plugin::GuestIndices::new(pre)?.load(&mut *store, instance)?;
            guest.call_validate_settings(store, &settings.to_string())
        }
        Contract::V0_1 | Contract::V0_2 => Ok(crate::contract::no_settings(contract, settings)),
    }
}

impl From<v1::types::BuilderKind> for BuilderKind {
    fn from(k: v1::types::BuilderKind) -> Self {
        match k {
            v1::types::BuilderKind::ControllerService => BuilderKind::ControllerService,
            v1::types::BuilderKind::NodesetPod => BuilderKind::NodesetPod,
        }
    }
}

impl From<v2::types::BuilderKind> for BuilderKind {
    fn from(k: v2::types::BuilderKind) -> Self {
        match k {
            v2::types::BuilderKind::ControllerService => BuilderKind::ControllerService,
            v2::types::BuilderKind::NodesetPod => BuilderKind::NodesetPod,
            v2::types::BuilderKind::ControllerChildren => BuilderKind::ControllerChildren,
            v2::types::BuilderKind::NodesetChildren => BuilderKind::NodesetChildren,
        }
    }
}

impl From<v3::types::BuilderKind> for BuilderKind {
    fn from(k: v3::types::BuilderKind) -> Self {
        match k {
            v3::types::BuilderKind::ControllerService => BuilderKind::ControllerService,
            v3::types::BuilderKind::NodesetPod => BuilderKind::NodesetPod,
            v3::types::BuilderKind::ControllerChildren => BuilderKind::ControllerChildren,
            v3::types::BuilderKind::NodesetChildren => BuilderKind::NodesetChildren,
            v3::types::BuilderKind::RestapiChildren => BuilderKind::RestapiChildren,
            v3::types::BuilderKind::LoginsetChildren => BuilderKind::LoginsetChildren,
            v3::types::BuilderKind::AccountingChildren => BuilderKind::AccountingChildren,
        }
    }
}

/// What contract 0.2.0 on has, implemented for the generated types of each from one body.
macro_rules! from_v2_on {
    ($($v:ident),+) => {$(
impl ControllerChildrenExport for $v::controller_children::GuestIndices {
    fn build_controller_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        controller: &String,
        texts: ControllerInputTexts,
        inputs: &ControllerInputs,
    ) -> CallResult<Vec<String>> {
        let ctx = $v::types::BuildContext::from_host(ctx);
        let inputs = <$v::types::ControllerInputs as ControllerInputsOf>::of(texts, inputs);
        let r = self
            .load(&mut *store, instance)?
            .call_build_controller_children(store, &ctx, controller, &inputs)?;
        Ok(r.map_err(GuestError::from))
    }
}

impl NodesetChildrenExport for $v::nodeset_children::GuestIndices {
    fn build_nodeset_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
    ) -> CallResult<Vec<String>> {
        let ctx = $v::types::BuildContext::from_host(ctx);
        let r = self
            .load(&mut *store, instance)?
            .call_build_nodeset_children(store, &ctx, nodeset, controller)?;
        Ok(r.map_err(GuestError::from))
    }
}
    )+};
}
from_v2_on!(v2, v3);

impl RestapiChildrenExport for v3::restapi_children::GuestIndices {
    fn build_restapi_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        restapi: &String,
        controller: &String,
    ) -> CallResult<Vec<String>> {
        let ctx = v3::types::BuildContext::from_host(ctx);
        let r = self
            .load(&mut *store, instance)?
            .call_build_restapi_children(store, &ctx, restapi, controller)?;
        Ok(r.map_err(GuestError::from))
    }
}

impl LoginsetChildrenExport for v3::loginset_children::GuestIndices {
    fn build_loginset_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        loginset: &String,
        controller: &String,
        inputs: &LoginSetInputs,
    ) -> CallResult<Vec<String>> {
        let ctx = v3::types::BuildContext::from_host(ctx);
        let inputs = v3::types::LoginsetInputs {
            ssh_host_keys_hash: inputs.ssh_host_keys_hash.clone(),
            sssd_conf_hash: inputs.sssd_conf_hash.clone(),
        };
        let r = self
            .load(&mut *store, instance)?
            .call_build_loginset_children(store, &ctx, loginset, controller, &inputs)?;
        Ok(r.map_err(GuestError::from))
    }
}

impl AccountingChildrenExport for v3::accounting_children::GuestIndices {
    fn build_accounting_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        accounting: &String,
        inputs: &AccountingInputs,
    ) -> CallResult<Vec<String>> {
        let ctx = v3::types::BuildContext::from_host(ctx);
        let inputs = v3::types::AccountingInputs {
            slurm_key_hash: inputs.slurm_key_hash.clone(),
            jwt_key_hash: inputs.jwt_key_hash.clone(),
            slurmdbd_conf_hash: inputs.slurmdbd_conf_hash.clone(),
        };
        let r = self
            .load(&mut *store, instance)?
            .call_build_accounting_children(store, &ctx, accounting, &inputs)?;
        Ok(r.map_err(GuestError::from))
    }
}

/// The builder interfaces of `kinds` that the component exports, for `contract`.
///
/// # Errors
/// A kind the contract does not have, or one the component does not export (the message says
/// how to fix it).
pub(crate) fn exports_of(
    pre: &InstancePre<CallState>,
    contract: Contract,
    kinds: &[BuilderKind],
) -> Result<Exports, String> {
    if let Some(kind) = kinds.iter().find(|k| !contract.kinds().contains(k)) {
        return Err(format!(
            "describe() lists {kind}, which contract {contract} does not have: rebuild it against \
             slinky-guest-sdk {}",
            crate::CONTRACT_VERSION
        ));
    }
    let mut exports = Exports::default();
    for &kind in kinds {
        let missing = |e: wasmtime::Error| {
            format!(
                "describe() lists {kind} but the component does not export it ({e:#}): list only the \
                 kinds you implement in `export_plugin!(…, kinds = [...])`"
            )
        };
        match kind {
            BuilderKind::ControllerService => {
                exports.service = Some(for_contract!(contract, v => {
                    Box::new(v::controller_service::GuestIndices::new(pre).map_err(missing)?)
                        as Box<dyn ServiceExport>
                }));
            }
            BuilderKind::NodesetPod => {
                exports.pod = Some(for_contract!(contract, v => {
                    Box::new(v::nodeset_pod::GuestIndices::new(pre).map_err(missing)?) as Box<dyn PodExport>
                }));
            }
            // Contract 0.2.0 on (checked above).
            BuilderKind::ControllerChildren => {
                exports.controller_children = from_v2!(contract, v => {
                    Box::new(v::controller_children::GuestIndices::new(pre).map_err(missing)?)
                        as Box<dyn ControllerChildrenExport>
                });
            }
            BuilderKind::NodesetChildren => {
                exports.nodeset_children = from_v2!(contract, v => {
                    Box::new(v::nodeset_children::GuestIndices::new(pre).map_err(missing)?)
                        as Box<dyn NodesetChildrenExport>
                });
            }
            // Contract 0.3.0 on (checked above).
            BuilderKind::RestapiChildren => {
                exports.restapi_children = Some(Box::new(
                    v3::restapi_children::GuestIndices::new(pre).map_err(missing)?,
                ));
            }
            BuilderKind::LoginsetChildren => {
                exports.loginset_children = Some(Box::new(
                    v3::loginset_children::GuestIndices::new(pre).map_err(missing)?,
                ));
            }
            BuilderKind::AccountingChildren => {
                exports.accounting_children = Some(Box::new(
                    v3::accounting_children::GuestIndices::new(pre).map_err(missing)?,
                ));
            }
        }
    }
    Ok(exports)
}

/// Call `describe()` of `contract` on `instance`.
pub(crate) fn call_describe(
    store: &mut Store<CallState>,
    instance: &Instance,
    pre: &InstancePre<CallState>,
    contract: Contract,
) -> wasmtime::Result<PluginInfo> {
    for_contract!(contract, v => {
        let guest = v::plugin::GuestIndices::new(pre)?.load(&mut *store, instance)?;
        guest.call_describe(store).map(PluginInfo::from)
    })
}
