//! The builder interfaces a plugin exports, as version-free traits: each contract version's
//! generated types implement them (in the parent module), so a call has one path whatever the
//! version.

use wasmtime::{Store, component::Instance};

use super::CallResult;
use crate::{
    AccountingInputs, BuildContext, ControllerInputs, LoginSetInputs, PodIdentity, sandbox::CallState,
};

/// `build-service` of any contract version.
pub(crate) trait ServiceExport: Send + Sync {
    /// Call it on `instance`.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_service(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        controller: &String,
    ) -> CallResult<String>;
}

/// `build-pod` of any contract version.
pub(crate) trait PodExport: Send + Sync {
    /// Call it on `instance`.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_pod(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
        identity: &PodIdentity,
    ) -> CallResult<String>;
}

/// The JSON texts of a Controller's inputs' objects: its NodeSets and its Accounting.
pub(crate) struct ControllerInputTexts {
    /// `inputs.nodesets`.
    pub(crate) nodesets: Vec<String>,
    /// `inputs.accounting` (contract 0.3.0 on).
    pub(crate) accounting: Option<String>,
}

/// `build-controller-children` (contract 0.2.0 on).
pub(crate) trait ControllerChildrenExport: Send + Sync {
    /// Call it on `instance`; `texts` are the JSON texts of `inputs`' objects.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_controller_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        controller: &String,
        texts: ControllerInputTexts,
        inputs: &ControllerInputs,
    ) -> CallResult<Vec<String>>;
}

/// `build-nodeset-children` (contract 0.2.0 on).
pub(crate) trait NodesetChildrenExport: Send + Sync {
    /// Call it on `instance`.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_nodeset_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
    ) -> CallResult<Vec<String>>;
}

/// `build-restapi-children` (contract 0.3.0 on).
pub(crate) trait RestapiChildrenExport: Send + Sync {
    /// Call it on `instance`.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_restapi_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        restapi: &String,
        controller: &String,
    ) -> CallResult<Vec<String>>;
}

/// `build-loginset-children` (contract 0.3.0 on).
pub(crate) trait LoginsetChildrenExport: Send + Sync {
    /// Call it on `instance`.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_loginset_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        loginset: &String,
        controller: &String,
        inputs: &LoginSetInputs,
    ) -> CallResult<Vec<String>>;
}

/// `build-accounting-children` (contract 0.3.0 on).
pub(crate) trait AccountingChildrenExport: Send + Sync {
    /// Call it on `instance`.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    fn build_accounting_children(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
        ctx: &BuildContext,
        accounting: &String,
        inputs: &AccountingInputs,
    ) -> CallResult<Vec<String>>;
}

/// The builder interfaces a plugin exports, whatever its contract version.
#[derive(Default)]
pub(crate) struct Exports {
    pub(crate) service: Option<Box<dyn ServiceExport>>,
    pub(crate) pod: Option<Box<dyn PodExport>>,
    pub(crate) controller_children: Option<Box<dyn ControllerChildrenExport>>,
    pub(crate) nodeset_children: Option<Box<dyn NodesetChildrenExport>>,
    pub(crate) restapi_children: Option<Box<dyn RestapiChildrenExport>>,
    pub(crate) loginset_children: Option<Box<dyn LoginsetChildrenExport>>,
    pub(crate) accounting_children: Option<Box<dyn AccountingChildrenExport>>,
}
