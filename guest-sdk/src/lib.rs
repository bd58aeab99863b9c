//! # slinky-guest-sdk: write builder plugins for slinky-host
//!
//! A *builder* decides what child objects should exist for a Slinky custom resource: the
//! Controller's Service, its other children (the slurmctld StatefulSet, the `slurm.conf`
//! ConfigMap, the internal Service), one pod of a NodeSet, a NodeSet's other children (the
//! workers' Service and PodDisruptionBudget, the SSH ConfigMap), or the children of a RestApi
//! (slurmrestd), a LoginSet (login nodes) or an Accounting (slurmdbd). slinky-host runs builders as
//! WebAssembly components (`wasm32-wasip2`), calls them with **copies** of the objects, and owns
//! everything else (caches, expectations, Secrets, writes). This crate hides the WIT bindings: you
//! implement one small trait per builder kind on typed inputs and export it with
//! [`export_plugin!`].
//!
//! ```no_run
//! use slinky_guest_sdk::{BuildContext, BuildError, NodeSetPodBuilder, PodIdentity, slinky};
//! use slinky_guest_sdk::api::{Controller, NodeSet};
//! use slinky_guest_sdk::k8s_openapi::api::core::v1::Pod;
//!
//! struct MyPods;
//!
//! impl NodeSetPodBuilder for MyPods {
//!     fn build_pod(
//!         ctx: &BuildContext,
//!         nodeset: &NodeSet,
//!         controller: &Controller,
//!         identity: &PodIdentity,
//!     ) -> Result<Pod, BuildError> {
//!         // Start from Slinky's pod, then change what your site needs.
//!         let mut pod = slinky::build_nodeset_pod(ctx, nodeset, controller, identity)?;
//!         pod.metadata.labels.get_or_insert_default().insert("site".into(), "a".into());
//!         Ok(pod)
//!     }
//! }
//!
//! slinky_guest_sdk::export_plugin!(MyPods, kinds = [nodeset_pod]);
//! ```
//!
//! # The rules a builder follows
//! * **Pure.** Same input, same output. The host may call a builder any number of times, in any
//!   order, and cancel a call at its deadline; a call must leave nothing behind. The sandbox has no
//!   file system, network or environment, and its clocks read a fixed instant.
//! * **Output is checked.** The host parses the output as the expected kind and refuses another
//!   apiVersion/kind, another namespace, a name other than the one asked for, or (for pods) missing
//!   selector labels. It sets the owner reference and the builder annotations itself.
//! * **Errors are values.** Return [`BuildError::InvalidInput`] for a bad parent object (say which
//!   field and how to fix it): the host reports it on the parent's status and in an Event. A panic
//!   becomes a trap, which the host also reports, with the panic message.
//!
//! # Testing natively
//! `cargo test -p <your-plugin>` runs without wasm: the traits are plain Rust, and [`testing`]
//! round-trips inputs and outputs through JSON exactly as the host does.

// The generated bindings name this crate by its external name, inside and outside it.
extern crate self as slinky_guest_sdk;

mod builders;
#[cfg(target_arch = "wasm32")]
pub mod bump;
mod child;
pub mod helpers;
pub mod log;
pub mod merge;
pub mod settings;
pub mod slinky;
pub mod testing;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wit;

pub use builders::{
    AccountingChildrenBuilder, ControllerChildrenBuilder, ControllerServiceBuilder, LoginSetChildrenBuilder,
    NodeSetChildrenBuilder, NodeSetPodBuilder, RestApiChildrenBuilder,
};
pub use child::Child;
pub use k8s_openapi;
pub use settings::{NoSettings, Settings, validate_settings};
/// The Slinky custom resource types (Controller, NodeSet, …).
pub use slinky_api as api;
/// The builder contract, shared with the host: [`BuildContext`], [`PodIdentity`], [`BuildError`],
/// the Controller's inputs and [`CONTRACT_VERSION`] (`slinky:builder@0.3.0`), the version this
/// SDK builds plugins against.
pub use slinky_api::contract::{
    AccountingInputs, BuildContext, BuildError, CONTRACT_VERSION, ConfigMapFiles, ControllerInputs,
    LoginSetInputs, PodIdentity,
};

/// Exports a type as a slinky-host builder plugin.
///
/// List the builder kinds the type implements, in any order: `controller_service`
/// ([`ControllerServiceBuilder`]), `nodeset_pod` ([`NodeSetPodBuilder`]), `controller_children`
/// ([`ControllerChildrenBuilder`]), `nodeset_children` ([`NodeSetChildrenBuilder`]),
/// `restapi_children` ([`RestApiChildrenBuilder`]), `loginset_children`
/// ([`LoginSetChildrenBuilder`]) and `accounting_children` ([`AccountingChildrenBuilder`]). The
/// plugin's name and version are the crate's (`CARGO_PKG_NAME`, `CARGO_PKG_VERSION`);
/// `describe()` reports them with the kinds and [`CONTRACT_VERSION`]. On native targets the macro
/// expands to nothing, so `cargo test` works.
///
/// ```text
/// slinky_guest_sdk::export_plugin!(MyPods, kinds = [nodeset_pod]);
/// slinky_guest_sdk::export_plugin!(Both, kinds = [controller_service, nodeset_pod]);
/// slinky_guest_sdk::export_plugin!(Site, kinds = [controller_children, nodeset_children]);
/// slinky_guest_sdk::export_plugin!(Gpu, kinds = [nodeset_pod], settings = GpuSettings);
/// ```
///
/// Without `settings = …` the plugin takes none ([`NoSettings`]): the host refuses it with
/// any `spec.settings` but `{}`. With it, the host asks the plugin to parse and
/// [`Settings::validate`] its settings before it serves with them.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty, kinds = [$($kind:ident),+ $(,)?] $(,)?) => {
        $crate::__export_plugin!($ty, [$($kind),+], $crate::NoSettings);
    };
    ($ty:ty, kinds = [$($kind:ident),+ $(,)?], settings = $settings:ty $(,)?) => {
        $crate::__export_plugin!($ty, [$($kind),+], $settings);
    };
}

/// Install the bump allocator (`bump::Bump`) as the global allocator of a wasm32 guest (does nothing elsewhere).
/// [`crate::export_plugin!`] does this already.
#[macro_export]
macro_rules! use_bump_allocator {
    () => {
        #[cfg(target_arch = "wasm32")]
        #[global_allocator]
        static __SLINKY_BUMP: $crate::bump::Bump = $crate::bump::Bump::new();
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __export_plugin {
    ($ty:ty, [$($kind:ident),+], $settings:ty) => {
        $crate::use_bump_allocator!();

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::wit::exports::slinky::builder as __exports;
            use $crate::wit::slinky::builder::types as __types;

            struct __SlinkyPlugin;

            impl __exports::plugin::Guest for __SlinkyPlugin {
                fn describe() -> __types::PluginInfo {
                    $crate::wit::describe(
                        env!("CARGO_PKG_NAME"),
                        env!("CARGO_PKG_VERSION"),
                        &[$($crate::__kind!($kind)),+],
                    )
                }

                fn validate_settings(settings: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::validate_settings::<$settings>(&settings)
                }
            }

            impl __exports::controller_service::Guest for __SlinkyPlugin {
                fn build_service(
                    ctx: __types::BuildContext,
                    controller: ::std::string::String,
                ) -> ::std::result::Result<::std::string::String, __types::BuildError> {
                    $crate::__if_kind!(controller_service in [$($kind)+]
                        { $crate::wit::call_service::<$ty>(ctx, controller) }
                        else { $crate::wit::unsupported("controller-service") })
                }
            }

            impl __exports::nodeset_pod::Guest for __SlinkyPlugin {
                fn build_pod(
                    ctx: __types::BuildContext,
                    nodeset: ::std::string::String,
                    controller: ::std::string::String,
                    identity: __types::PodIdentity,
                ) -> ::std::result::Result<::std::string::String, __types::BuildError> {
                    $crate::__if_kind!(nodeset_pod in [$($kind)+]
                        { $crate::wit::call_pod::<$ty>(ctx, nodeset, controller, identity) }
                        else { $crate::wit::unsupported("nodeset-pod") })
                }
            }

            impl __exports::controller_children::Guest for __SlinkyPlugin {
                fn build_controller_children(
                    ctx: __types::BuildContext,
                    controller: ::std::string::String,
                    inputs: __types::ControllerInputs,
                ) -> ::std::result::Result<::std::vec::Vec<::std::string::String>, __types::BuildError> {
                    $crate::__if_kind!(controller_children in [$($kind)+]
                        { $crate::wit::call_controller_children::<$ty>(ctx, controller, inputs) }
                        else { $crate::wit::unsupported("controller-children") })
                }
            }

            impl __exports::nodeset_children::Guest for __SlinkyPlugin {
                fn build_nodeset_children(
                    ctx: __types::BuildContext,
                    nodeset: ::std::string::String,
                    controller: ::std::string::String,
                ) -> ::std::result::Result<::std::vec::Vec<::std::string::String>, __types::BuildError> {
                    $crate::__if_kind!(nodeset_children in [$($kind)+]
                        { $crate::wit::call_nodeset_children::<$ty>(ctx, nodeset, controller) }
                        else { $crate::wit::unsupported("nodeset-children") })
                }
            }

            impl __exports::restapi_children::Guest for __SlinkyPlugin {
                fn build_restapi_children(
                    ctx: __types::BuildContext,
                    restapi: ::std::string::String,
                    controller: ::std::string::String,
                ) -> ::std::result::Result<::std::vec::Vec<::std::string::String>, __types::BuildError> {
                    $crate::__if_kind!(restapi_children in [$($kind)+]
                        { $crate::wit::call_restapi_children::<$ty>(ctx, restapi, controller) }
                        else { $crate::wit::unsupported("restapi-children") })
                }
            }

            impl __exports::loginset_children::Guest for __SlinkyPlugin {
                fn build_loginset_children(
                    ctx: __types::BuildContext,
                    loginset: ::std::string::String,
                    controller: ::std::string::String,
                    inputs: __types::LoginsetInputs,
                ) -> ::std::result::Result<::std::vec::Vec<::std::string::String>, __types::BuildError> {
                    $crate::__if_kind!(loginset_children in [$($kind)+]
                        { $crate::wit::call_loginset_children::<$ty>(ctx, loginset, controller, inputs) }
                        else { $crate::wit::unsupported("loginset-children") })
                }
            }

            impl __exports::accounting_children::Guest for __SlinkyPlugin {
                fn build_accounting_children(
                    ctx: __types::BuildContext,
                    accounting: ::std::string::String,
                    inputs: __types::AccountingInputs,
                ) -> ::std::result::Result<::std::vec::Vec<::std::string::String>, __types::BuildError> {
                    $crate::__if_kind!(accounting_children in [$($kind)+]
                        { $crate::wit::call_accounting_children::<$ty>(ctx, accounting, inputs) }
                        else { $crate::wit::unsupported("accounting-children") })
                }
            }

    $crate::wit::__export_full_builder!(__SlinkyPlugin with_types_in $crate::wit);
        };
    };
}

/// The WIT builder kind of a kind name in `export_plugin!` (an unknown name does not compile).
#[doc(hidden)]
#[macro_export]
macro_rules! __kind {
    (controller_service) => {
        $crate::wit::slinky::builder::types::BuilderKind::ControllerService
    };
    (nodeset_pod) => {
        $crate::wit::slinky::builder::types::BuilderKind::NodesetPod
    };
    (controller_children) => {
        $crate::wit::slinky::builder::types::BuilderKind::ControllerChildren
    };
    (nodeset_children) => {
        $crate::wit::slinky::builder::types::BuilderKind::NodesetChildren
    };
    (restapi_children) => {
        $crate::wit::slinky::builder::types::BuilderKind::RestapiChildren
    };
    (loginset_children) => {
        $crate::wit::slinky::builder::types::BuilderKind::LoginsetChildren
    };
    (accounting_children) => {
        $crate::wit::slinky::builder::types::BuilderKind::AccountingChildren
    };
}

/// `$yes` when the kind is among the listed kinds, else `$no`.
#[doc(hidden)]
#[macro_export]
macro_rules! __if_kind {
    (controller_service in [controller_service $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (nodeset_pod in [nodeset_pod $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (controller_children in [controller_children $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (nodeset_children in [nodeset_children $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (restapi_children in [restapi_children $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (loginset_children in [loginset_children $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (accounting_children in [accounting_children $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    ($kind:ident in [$first:ident $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => {
        $crate::__if_kind!($kind in [$($rest)*] { $($yes)* } else { $($no)* })
    };
    ($kind:ident in [] { $($yes:tt)* } else { $($no:tt)* }) => { $($no)* };
}

/// The children the pipeline's previous step built (`*-children` kinds), parsed; empty for the
/// first step. A step keeps every one of them (the host refuses a step that leaves one out) and
/// may change them or add its own.
///
/// # Errors
/// [`BuildError::InvalidInput`] when one does not parse as a child kind.
pub fn previous_children(ctx: &BuildContext) -> Result<Vec<Child>, BuildError> {
    ctx.previous.iter().map(|json| Child::from_json(json)).collect()
}

/// Serialize a built object for the host, or an internal error.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String, BuildError> {
    serde_json::to_string(value).map_err(|e| BuildError::Internal(format!("cannot serialize output: {e}")))
}

/// Parse an input object sent by the host.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Result<T, BuildError> {
    serde_json::from_str(json).map_err(|e| BuildError::InvalidInput(format!("cannot parse the {what}: {e}")))
}
