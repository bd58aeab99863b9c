//! [`Builder`]: what builds a parent's children, one plugin ([`crate::Plugin`]) or a kind's
//! pipeline of them ([`crate::Pipeline`]), so a caller builds through either the same way.

use k8s_openapi::api::core::v1::{Pod, Service};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi};

use crate::{
    AccountingInputs, BuildContext, Child, ControllerInputs, LoginSetInputs, PluginError, PodIdentity,
};

/// Builds the children of Slinky's parents from copies of them.
///
/// # Guarantees
/// * Every build is a pure function of its inputs: idempotent and safe to cancel (a deadline
///   trap mid-call leaves no partial state), run in a fresh sandbox per plugin call.
/// * What it returns passed the output policy: names, namespaces, selector labels and owner
///   references are the host's, never the plugin's.
///
/// # Errors
/// Each build returns a [`PluginError`] naming the plugin (and, in a pipeline, the step).
pub trait Builder: Send + Sync {
    /// `<name>@<version>`, or a pipeline's `<base> > <step> > …`.
    fn label(&self) -> String;

    /// The component's sha256 (hex), or a pipeline's digest over its steps.
    fn digest(&self) -> &str;

    /// The Controller's Service (`build-service`).
    fn build_service(&self, ctx: &BuildContext, controller: &Controller) -> Result<Service, PluginError>;

    /// One pod of a NodeSet (`build-pod`).
    fn build_pod(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, PluginError>;

    /// A Controller's children besides its Service (`build-controller-children`).
    fn build_controller_children(
        &self,
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, PluginError>;

    /// A NodeSet's children besides its pods (`build-nodeset-children`).
    fn build_nodeset_children(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError>;

    /// A RestApi's children (`build-restapi-children`).
    fn build_restapi_children(
        &self,
        ctx: &BuildContext,
        restapi: &RestApi,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError>;

    /// A LoginSet's children (`build-loginset-children`).
    fn build_loginset_children(
        &self,
        ctx: &BuildContext,
        loginset: &LoginSet,
        controller: &Controller,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<Child>, PluginError>;

    /// An Accounting's children (`build-accounting-children`).
    fn build_accounting_children(
        &self,
        ctx: &BuildContext,
        accounting: &Accounting,
        inputs: &AccountingInputs,
    ) -> Result<Vec<Child>, PluginError>;
}
