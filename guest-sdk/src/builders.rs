//! The builder traits, one per builder kind: implement the ones your plugin builds and export
//! them with [`crate::export_plugin!`].

use k8s_openapi::api::core::v1::{Pod, Service};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi};

use crate::{
    AccountingInputs, BuildContext, BuildError, Child, ControllerInputs, LoginSetInputs, PodIdentity,
};

/// Builds the Controller's slurmctld Service. Implement it and export with [`crate::export_plugin!`].
///
/// A Service of type LoadBalancer with a site annotation, starting from Slinky's, tested natively
/// with [`crate::testing::call_service`]:
///
/// ```
/// use slinky_guest_sdk::{BuildContext, BuildError, ControllerServiceBuilder, api::Controller, slinky, testing};
/// use slinky_guest_sdk::k8s_openapi::api::core::v1::Service;
///
/// struct LbService;
///
/// impl ControllerServiceBuilder for LbService {
///     fn build_service(ctx: &BuildContext, controller: &Controller) -> Result<Service, BuildError> {
///         let mut svc = slinky::build_controller_service(ctx, controller)?;
///         svc.spec.get_or_insert_default().type_ = Some("LoadBalancer".into());
///         svc.metadata
///             .annotations
///             .get_or_insert_default()
///             .insert("lb.example.com/internal".into(), "true".into());
///         Ok(svc)
///     }
/// }
///
/// let svc = testing::call_service::<LbService>(&testing::example_controller()?)?;
/// assert_eq!(svc.spec.and_then(|s| s.type_).as_deref(), Some("LoadBalancer"));
/// # Ok::<(), BuildError>(())
/// ```
///
/// # Guarantees and caveats
/// The host calls this with a copy of the Controller, in a fresh sandbox per call; the call must
/// be idempotent and safe to cancel (a deadline trap mid-call leaves no partial state).
pub trait ControllerServiceBuilder {
    /// Build the Service for `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid Controller or an unsupported request.
    fn build_service(ctx: &BuildContext, controller: &Controller) -> Result<Service, BuildError>;
}

/// Builds one slurmd pod of a NodeSet. Implement it and export with [`crate::export_plugin!`].
///
/// # Guarantees and caveats
/// The host calls this with copies, in a fresh sandbox per call; the call must be idempotent and
/// safe to cancel. The pod must be named `identity.name` and carry the NodeSet's selector labels.
pub trait NodeSetPodBuilder {
    /// Build pod `identity` of `nodeset`, whose Controller is `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid NodeSet/Controller or an unsupported request.
    fn build_pod(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, BuildError>;
}

/// Builds a Controller's children other than its Service (Slinky's slurmctld StatefulSet,
/// `<controller>-config` and `<controller>-controller-internal`). Implement it and export it
/// with [`crate::export_plugin!`]; [`crate::slinky::build_controller_children`] is Slinky's.
///
/// # Guarantees and caveats
/// The host calls this with copies, in a fresh sandbox per call; the call must be idempotent and
/// safe to cancel. Every object must be in the Controller's namespace and named
/// `<controller>-…`; the host sets owner references and the builder annotations, applies every
/// object, and deletes the objects it built earlier that the list no longer has.
pub trait ControllerChildrenBuilder {
    /// Build the children of `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid Controller or an unsupported request.
    fn build_controller_children(
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, BuildError>;
}

/// Builds a NodeSet's children other than its pods (Slinky's workers' Service and
/// PodDisruptionBudget, shared by the Controller's NodeSets, and the SSH ConfigMap). Implement it
/// and export it with [`crate::export_plugin!`]; [`crate::slinky::build_nodeset_children`] is
/// Slinky's.
///
/// # Guarantees and caveats
/// As [`ControllerChildrenBuilder`]. The objects named `slurm-workers-<controller>` (Service) and
/// `slurm-workers-pdb-<controller>` (PodDisruptionBudget) are shared: the host makes every
/// NodeSet of the Controller their owner. Every other object must be named `<nodeset>-…`.
pub trait NodeSetChildrenBuilder {
    /// Build the children of `nodeset`, whose Controller is `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid NodeSet or an unsupported request.
    fn build_nodeset_children(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError>;
}

/// Builds a RestApi's children (Slinky's slurmrestd Deployment and Service, both
/// `<restapi>-restapi`). Implement it and export it with [`crate::export_plugin!`];
/// [`crate::slinky::build_restapi_children`] is Slinky's.
///
/// # Guarantees and caveats
/// As [`ControllerChildrenBuilder`]: every object must be in the RestApi's namespace and named
/// `<restapi>-…`; the allowed kinds are `apps/v1 Deployment` and `v1 Service`.
pub trait RestApiChildrenBuilder {
    /// Build the children of `restapi`, whose Controller is `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid RestApi or an unsupported request.
    fn build_restapi_children(
        ctx: &BuildContext,
        restapi: &RestApi,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError>;
}

/// Builds a LoginSet's children (Slinky's login Deployment and Service, both `<loginset>`, and
/// the `sshd_config` ConfigMap `<loginset>-ssh-config`). Implement it and export it with
/// [`crate::export_plugin!`]; [`crate::slinky::build_loginset_children`] is Slinky's.
///
/// # Guarantees and caveats
/// As [`ControllerChildrenBuilder`]: the allowed kinds are one `apps/v1 Deployment` and one
/// `v1 Service` named `<loginset>`, and `v1 ConfigMap`s named `<loginset>-…`. The host makes the
/// host keys Secret `<loginset>-ssh-host-keys` itself; `inputs` carries its hash.
pub trait LoginSetChildrenBuilder {
    /// Build the children of `loginset`, whose Controller is `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid LoginSet or an unsupported request.
    fn build_loginset_children(
        ctx: &BuildContext,
        loginset: &LoginSet,
        controller: &Controller,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<Child>, BuildError>;
}

/// Builds an Accounting's children (Slinky's slurmdbd StatefulSet and Service and the
/// `slurmdbd.conf` Secret, all `<accounting>-accounting`). Implement it and export it with
/// [`crate::export_plugin!`]; [`crate::slinky::build_accounting_children`] is Slinky's.
///
/// # Guarantees and caveats
/// As [`ControllerChildrenBuilder`]: the allowed kinds are one `apps/v1 StatefulSet`, one
/// `v1 Service` and one `v1 Secret` (`stringData` only), all named `<accounting>-accounting`. The
/// database password never reaches the builder: write
/// [`crate::api::contract::secret_refs::placeholder`] of `spec.storageConfig.passwordKeyRef`
/// where it goes, and the host puts the value there.
pub trait AccountingChildrenBuilder {
    /// Build the children of `accounting`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid Accounting or an unsupported request.
    fn build_accounting_children(
        ctx: &BuildContext,
        accounting: &Accounting,
        inputs: &AccountingInputs,
    ) -> Result<Vec<Child>, BuildError>;
}
