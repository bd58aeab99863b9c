//! The generated WIT bindings and the glue between them and the typed traits (wasm32 only).
//! Plugin authors never touch this module: [`crate::export_plugin!`] wires it up.

#![allow(missing_docs, reason = "generated bindings")]

use crate::{
    AccountingChildrenBuilder, AccountingInputs, BuildContext, BuildError, ConfigMapFiles,
    ControllerChildrenBuilder, ControllerInputs, ControllerServiceBuilder, LoginSetChildrenBuilder,
    LoginSetInputs, NodeSetChildrenBuilder, NodeSetPodBuilder, PodIdentity, RestApiChildrenBuilder,
};

#[doc(hidden)]
pub use wit_bindgen::rt as __rt;

wit_bindgen::generate!({
    world: "full-builder",
    // The current package only: the frozen older versions beside it are the host's concern.
    path: "../wit/builder@0.3.0",
    pub_export_macro: true,
    export_macro_name: "__export_full_builder",
    default_bindings_module: "slinky_guest_sdk::wit",
    runtime_path: "slinky_guest_sdk::wit::__rt",
});

use core::mem::ManuallyDrop;

use slinky::builder::types as w;

/// Objects are never dropped in a call: the instance serves one call and is then discarded with
/// its whole memory, so dropping would only walk the objects to free nothing (the bump allocator
/// keeps what it handed out).
fn keep<T>(value: T) -> ManuallyDrop<T> {
    ManuallyDrop::new(value)
}

fn error(e: BuildError) -> w::BuildError {
    match e {
        BuildError::InvalidInput(m) => w::BuildError::InvalidInput(m),
        BuildError::Unsupported(m) => w::BuildError::Unsupported(m),
        BuildError::Internal(m) => w::BuildError::Internal(m),
    }
}

fn context(ctx: w::BuildContext) -> BuildContext {
    BuildContext {
        cluster_domain: ctx.cluster_domain,
        settings: ctx.settings,
        previous: ctx.previous,
    }
}

#[doc(hidden)]
pub fn describe(name: &str, version: &str, kinds: &[w::BuilderKind]) -> w::PluginInfo {
    w::PluginInfo {
        name: name.into(),
        version: version.into(),
        kinds: kinds.to_vec(),
        contract_version: crate::CONTRACT_VERSION.into(),
    }
}

#[doc(hidden)]
pub fn call_service<T: ControllerServiceBuilder>(
    ctx: w::BuildContext,
    controller: String,
) -> Result<String, w::BuildError> {
    let run = || {
        let controller = keep(crate::from_json("Controller", &controller)?);
        crate::to_json(&*keep(T::build_service(&context(ctx), &controller)?))
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn call_pod<T: NodeSetPodBuilder>(
    ctx: w::BuildContext,
    nodeset: String,
    controller: String,
    identity: w::PodIdentity,
) -> Result<String, w::BuildError> {
    let run = || {
        let nodeset = keep(crate::from_json("NodeSet", &nodeset)?);
        let controller = keep(crate::from_json("Controller", &controller)?);
        let identity = PodIdentity {
            ordinal: identity.ordinal,
            name: identity.name,
            hostname: identity.hostname,
            revision: identity.revision,
        };
        crate::to_json(&*keep(T::build_pod(
            &context(ctx),
            &nodeset,
            &controller,
            &identity,
        )?))
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn call_controller_children<T: ControllerChildrenBuilder>(
    ctx: w::BuildContext,
    controller: String,
    inputs: w::ControllerInputs,
) -> Result<Vec<String>, w::BuildError> {
    let run = || {
        let controller = keep(crate::from_json("Controller", &controller)?);
        let inputs = keep(ControllerInputs {
            nodesets: inputs
                .nodesets
                .iter()
                .map(|n| crate::from_json("NodeSet", n))
                .collect::<Result<_, _>>()?,
            slurm_key_hash: inputs.slurm_key_hash,
            jwt_key_hash: inputs.jwt_key_hash,
            config_maps: inputs
                .config_maps
                .into_iter()
                .map(|c| ConfigMapFiles {
                    name: c.name,
                    files: c.files,
                })
                .collect(),
            accounting: inputs
                .accounting
                .as_deref()
                .map(|a| crate::from_json("Accounting", a))
                .transpose()?,
        });
        keep(T::build_controller_children(&context(ctx), &controller, &inputs)?)
            .iter()
            .map(crate::Child::to_json)
            .collect::<Result<Vec<_>, _>>()
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn call_nodeset_children<T: NodeSetChildrenBuilder>(
    ctx: w::BuildContext,
    nodeset: String,
    controller: String,
) -> Result<Vec<String>, w::BuildError> {
    let run = || {
        let nodeset = keep(crate::from_json("NodeSet", &nodeset)?);
        let controller = keep(crate::from_json("Controller", &controller)?);
        keep(T::build_nodeset_children(&context(ctx), &nodeset, &controller)?)
            .iter()
            .map(crate::Child::to_json)
            .collect::<Result<Vec<_>, _>>()
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn call_restapi_children<T: RestApiChildrenBuilder>(
    ctx: w::BuildContext,
    restapi: String,
    controller: String,
) -> Result<Vec<String>, w::BuildError> {
    let run = || {
        let restapi = keep(crate::from_json("RestApi", &restapi)?);
        let controller = keep(crate::from_json("Controller", &controller)?);
        keep(T::build_restapi_children(&context(ctx), &restapi, &controller)?)
            .iter()
            .map(crate::Child::to_json)
            .collect::<Result<Vec<_>, _>>()
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn call_loginset_children<T: LoginSetChildrenBuilder>(
    ctx: w::BuildContext,
    loginset: String,
    controller: String,
    inputs: w::LoginsetInputs,
) -> Result<Vec<String>, w::BuildError> {
    let run = || {
        let loginset = keep(crate::from_json("LoginSet", &loginset)?);
        let controller = keep(crate::from_json("Controller", &controller)?);
        let inputs = LoginSetInputs {
            ssh_host_keys_hash: inputs.ssh_host_keys_hash,
            sssd_conf_hash: inputs.sssd_conf_hash,
        };
        keep(T::build_loginset_children(
            &context(ctx),
            &loginset,
            &controller,
            &inputs,
        )?)
        .iter()
        .map(crate::Child::to_json)
        .collect::<Result<Vec<_>, _>>()
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn call_accounting_children<T: AccountingChildrenBuilder>(
    ctx: w::BuildContext,
    accounting: String,
    inputs: w::AccountingInputs,
) -> Result<Vec<String>, w::BuildError> {
    let run = || {
        let accounting = keep(crate::from_json("Accounting", &accounting)?);
        let inputs = AccountingInputs {
            slurm_key_hash: inputs.slurm_key_hash,
            jwt_key_hash: inputs.jwt_key_hash,
            slurmdbd_conf_hash: inputs.slurmdbd_conf_hash,
        };
        keep(T::build_accounting_children(&context(ctx), &accounting, &inputs)?)
            .iter()
            .map(crate::Child::to_json)
            .collect::<Result<Vec<_>, _>>()
    };
    run().map_err(error)
}

#[doc(hidden)]
pub fn unsupported<T>(kind: &str) -> Result<T, w::BuildError> {
    Err(w::BuildError::Unsupported(format!(
        "this plugin does not build {kind}"
    )))
}
