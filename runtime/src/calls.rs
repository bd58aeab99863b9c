//! Builder calls: each in a fresh sandbox, one path for every contract version (the version
//! differences stay in [`crate::bindings`]), the output bounded, then checked by the output policy.

use k8s_openapi::api::core::v1::{Pod, Service};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi};
use wasmtime::{Store, component::Instance};

use crate::{
    AccountingInputs, BuildContext, Builder, BuilderKind, Child, ControllerInputs, GuestError,
    LoginSetInputs, MAX_CHILDREN, Plugin, PluginError, PodIdentity,
    bindings::{CallResult, ControllerInputTexts},
    plugin::Code,
    policy,
    sandbox::{CallState, instantiate, log_output, trap_error},
};

/// Largest accepted output object (JSON bytes), like the API server's request limit.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// The calls' names, as errors and logs show them.
const BUILD_SERVICE: &str = "build-service";
const BUILD_POD: &str = "build-pod";
const BUILD_CONTROLLER_CHILDREN: &str = "build-controller-children";
const BUILD_NODESET_CHILDREN: &str = "build-nodeset-children";
const BUILD_RESTAPI_CHILDREN: &str = "build-restapi-children";
const BUILD_LOGINSET_CHILDREN: &str = "build-loginset-children";
const BUILD_ACCOUNTING_CHILDREN: &str = "build-accounting-children";
const VALIDATE_SETTINGS: &str = "validate-settings";

impl Plugin {
    /// Ask the plugin whether it accepts `settings` (JSON text): its `validate-settings` (contract
    /// 0.3.0 on), in a fresh sandbox like a build. Plugins of older contracts take no settings:
    /// only `{}` (or `null`) is accepted for them.
    ///
    /// # Errors
    /// [`PluginError::Refused`] with the plugin's own message when it refuses them; a
    /// [`PluginError`] for a trap, deadline or memory cap.
    pub fn validate_settings(&self, settings: &str) -> Result<(), PluginError> {
        let code = self.code();
        let contract = self.contract();
        let result = self.call(&code, VALIDATE_SETTINGS, |store, instance| {
            crate::bindings::call_validate_settings(store, instance, &code.pre, contract, settings)
                .map(|r| r.map_err(GuestError::InvalidInput))
        });
        match result {
            Err(PluginError::Build {
                plugin,
                error: GuestError::InvalidInput(message),
                ..
            }) => Err(PluginError::Refused {
                plugin,
                reason: format!("its settings are invalid: {message}"),
            }),
            other => other,
        }
    }

    /// Call `build-service` and return the raw JSON text, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_service_raw(&self, ctx: &BuildContext, controller: &String) -> Result<String, PluginError> {
        let code = self.code();
        let export = code.exports.service.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::ControllerService))?;
        let out = self.call(&code, BUILD_SERVICE, |store, instance| {
            export.build_service(store, instance, ctx, controller)
        })?;
        self.bounded(BUILD_SERVICE, out)
    }

    /// Call `build-pod` and return the raw JSON text, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_pod_raw(
        &self,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
        identity: &PodIdentity,
    ) -> Result<String, PluginError> {
        let code = self.code();
        let export = code.exports.pod.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::NodesetPod))?;
        let out = self.call(&code, BUILD_POD, |store, instance| {
            export.build_pod(store, instance, ctx, nodeset, controller, identity)
        })?;
        self.bounded(BUILD_POD, out)
    }

    /// Call `build-controller-children` and return the raw JSON texts, with no output policy
    /// applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_controller_children_raw(
        &self,
        ctx: &BuildContext,
        controller: &String,
        inputs: &ControllerInputs,
    ) -> Result<Vec<String>, PluginError> {
        const CALL: &str = BUILD_CONTROLLER_CHILDREN;
        let code = self.code();
        let export = code.exports.controller_children.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::ControllerChildren))?;
        let texts = ControllerInputTexts {
            nodesets: inputs
                .nodesets
                .iter()
                .map(|n| self.input(CALL, n))
                .collect::<Result<Vec<_>, _>>()?,
            accounting: inputs
                .accounting
                .as_ref()
                .map(|a| self.input(CALL, a))
                .transpose()?,
        };
        let out = self.call(&code, CALL, |store, instance| {
            export.build_controller_children(store, instance, ctx, controller, texts, inputs)
        })?;
        self.bounded_list(CALL, out)
    }

    /// Call `build-nodeset-children` and return the raw JSON texts, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_nodeset_children_raw(
        &self,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
    ) -> Result<Vec<String>, PluginError> {
        let code = self.code();
        let export = code.exports.nodeset_children.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::NodesetChildren))?;
        let out = self.call(&code, BUILD_NODESET_CHILDREN, |store, instance| {
            export.build_nodeset_children(store, instance, ctx, nodeset, controller)
        })?;
        self.bounded_list(BUILD_NODESET_CHILDREN, out)
    }

    /// Call `build-restapi-children` and return the raw JSON texts, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_restapi_children_raw(
        &self,
        ctx: &BuildContext,
        restapi: &String,
        controller: &String,
    ) -> Result<Vec<String>, PluginError> {
        let code = self.code();
        let export = code.exports.restapi_children.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::RestapiChildren))?;
        let out = self.call(&code, BUILD_RESTAPI_CHILDREN, |store, instance| {
            export.build_restapi_children(store, instance, ctx, restapi, controller)
        })?;
        self.bounded_list(BUILD_RESTAPI_CHILDREN, out)
    }

    /// Call `build-loginset-children` and return the raw JSON texts, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_loginset_children_raw(
        &self,
        ctx: &BuildContext,
        loginset: &String,
        controller: &String,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<String>, PluginError> {
        let code = self.code();
        let export = code.exports.loginset_children.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::LoginsetChildren))?;
        let out = self.call(&code, BUILD_LOGINSET_CHILDREN, |store, instance| {
            export.build_loginset_children(store, instance, ctx, loginset, controller, inputs)
        })?;
        self.bounded_list(BUILD_LOGINSET_CHILDREN, out)
    }

    /// Call `build-accounting-children` and return the raw JSON texts, with no output policy
    /// applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_accounting_children_raw(
        &self,
        ctx: &BuildContext,
        accounting: &String,
        inputs: &AccountingInputs,
    ) -> Result<Vec<String>, PluginError> {
        let code = self.code();
        let export = code.exports.accounting_children.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::AccountingChildren))?;
        let out = self.call(&code, BUILD_ACCOUNTING_CHILDREN, |store, instance| {
            export.build_accounting_children(store, instance, ctx, accounting, inputs)
        })?;
        self.bounded_list(BUILD_ACCOUNTING_CHILDREN, out)
    }

    /// Time `n` `build-pod` calls made on **one** instance: the compiled code's own speed, without
    /// instantiation, memory faults or teardown. For benchmarks only (the `bench` feature): the
    /// host never reuses an instance (every real call gets a fresh one, so no state survives
    /// between calls).
    ///
    /// # Errors
    /// A [`PluginError`] when a call fails.
    #[cfg(feature = "bench")]
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` by reference"
    )]
    pub fn time_build_pod_on_one_instance(
        &self,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
        identity: &PodIdentity,
        n: usize,
    ) -> Result<Vec<std::time::Duration>, PluginError> {
        let code = self.code();
        let export = code.exports.pod.as_ref();
        let export = export.ok_or_else(|| self.not_a_kind(BuilderKind::NodesetPod))?;
        let label = self.label();
        let limits = self.inner.engine.limits();
        let _slot = self.inner.engine.gate().enter();
        let (mut store, instance) = instantiate(&limits, &code.engine, &code.pre, &label, BUILD_POD)?;
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            store.set_epoch_deadline(limits.deadline_ticks);
            let started = std::time::Instant::now();
            let out = export
                .build_pod(&mut store, &instance, ctx, nodeset, controller, identity)
                .map_err(|e| trap_error(&label, BUILD_POD, e, &store, &limits))?;
            times.push(started.elapsed());
            std::hint::black_box(out.ok());
        }
        Ok(times)
    }

    /// Create a fresh store and instance, then drop them: the time of each (benchmarks only).
    ///
    /// # Errors
    /// A [`PluginError::Trap`] when instantiation traps.
    #[cfg(feature = "bench")]
    pub fn time_instantiation(&self) -> Result<(std::time::Duration, std::time::Duration), PluginError> {
        let started = std::time::Instant::now();
        let made = self.instantiate_for("instantiate")?;
        let instantiated = started.elapsed();
        let started = std::time::Instant::now();
        drop(made);
        Ok((instantiated, started.elapsed()))
    }

    /// Create a fresh store and instance and drop them (benchmarks only).
    ///
    /// # Errors
    /// A [`PluginError::Trap`] when instantiation traps.
    #[cfg(feature = "bench")]
    pub fn instantiate_only(&self) -> Result<(), PluginError> {
        self.instantiate_for("instantiate").map(drop)
    }

    #[cfg(feature = "bench")]
    fn instantiate_for(&self, call: &'static str) -> Result<(Store<CallState>, Instance), PluginError> {
        let code = self.code();
        instantiate(
            &self.inner.engine.limits(),
            &code.engine,
            &code.pre,
            &self.label(),
            call,
        )
    }

    /// `obj` as the JSON text a builder receives.
    pub(crate) fn input<T: serde::Serialize>(
        &self,
        call: &'static str,
        obj: &T,
    ) -> Result<String, PluginError> {
        serde_json::to_string(obj).map_err(|e| PluginError::Build {
            plugin: self.label(),
            call,
            error: GuestError::Internal(format!("cannot serialize the input: {e}")),
        })
    }

    /// What the host lets this plugin's output reach past its parent (`--allow`).
    fn allowances(&self) -> &policy::Allowances {
        self.inner.engine.allowances()
    }

    fn not_a_kind(&self, kind: BuilderKind) -> PluginError {
        PluginError::NotAKind {
            plugin: self.label(),
            kind,
        }
    }

    fn rejected(&self, call: &'static str, reason: String) -> PluginError {
        PluginError::Rejected {
            plugin: self.label(),
            call,
            reason,
        }
    }

    /// Run one call in a fresh sandbox; the builder's error becomes [`PluginError::Build`].
    fn call<T>(
        &self,
        code: &Code,
        call: &'static str,
        f: impl FnOnce(&mut Store<CallState>, &Instance) -> CallResult<T>,
    ) -> Result<T, PluginError> {
        let label = self.label();
        let engine = &self.inner.engine;
        let limits = engine.limits();
        let _slot = engine.gate().enter();
        let (mut store, instance) = instantiate(&limits, &code.engine, &code.pre, &label, call)?;
        let result = f(&mut store, &instance);
        engine.count_call(store.data().limits.grows);
        log_output(&label, call, &store);
        let guest_log = std::mem::take(&mut store.data_mut().log);
        engine
            .guest_logs()
            .emit(&self.info().name, &label, self.digest(), call, guest_log);
        let output = result.map_err(|e| trap_error(&label, call, e, &store, &limits))?;
        output.map_err(|error| PluginError::Build {
            plugin: label.clone(),
            call,
            error,
        })
    }

    /// `json`, unless it is larger than an API server accepts.
    fn bounded(&self, call: &'static str, json: String) -> Result<String, PluginError> {
        if json.len() > MAX_OUTPUT_BYTES {
            return Err(self.rejected(
                call,
                format!(
                    "the output is {} bytes, more than the {MAX_OUTPUT_BYTES} allowed",
                    json.len()
                ),
            ));
        }
        Ok(json)
    }

    /// `list`, unless it has too many objects or one is larger than an API server accepts.
    fn bounded_list(&self, call: &'static str, list: Vec<String>) -> Result<Vec<String>, PluginError> {
        if list.len() > MAX_CHILDREN {
            return Err(self.rejected(
                call,
                format!(
                    "the output has {} objects, more than the {MAX_CHILDREN} allowed",
                    list.len()
                ),
            ));
        }
        list.into_iter().map(|json| self.bounded(call, json)).collect()
    }
}

/// Each build serializes copies of its inputs, calls the plugin in a fresh sandbox and applies
/// the output policy.
impl Builder for Plugin {
    fn label(&self) -> String {
        Plugin::label(self)
    }

    fn digest(&self) -> &str {
        Plugin::digest(self)
    }

    /// Build the Controller's Service: serialize a copy, call the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when the output breaks the policy.
    fn build_service(&self, ctx: &BuildContext, controller: &Controller) -> Result<Service, PluginError> {
        let input = self.input(BUILD_SERVICE, controller)?;
        let raw = self.build_service_raw(ctx, &input)?;
        policy::service(&raw, controller, self, self.allowances())
            .map_err(|reason| self.rejected(BUILD_SERVICE, reason))
    }

    /// Build one pod of a NodeSet: serialize copies, call the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when the output breaks the policy.
    fn build_pod(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, PluginError> {
        let ns_json = self.input(BUILD_POD, nodeset)?;
        let ctl_json = self.input(BUILD_POD, controller)?;
        let raw = self.build_pod_raw(ctx, &ns_json, &ctl_json, identity)?;
        policy::pod(&raw, nodeset, controller, identity, self, self.allowances())
            .map_err(|reason| self.rejected(BUILD_POD, reason))
    }

    /// Build a Controller's children besides its Service: serialize copies, call the plugin,
    /// apply the output policy (the host sets owner references and builder annotations).
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    fn build_controller_children(
        &self,
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = BUILD_CONTROLLER_CHILDREN;
        let input = self.input(CALL, controller)?;
        let raw = self.build_controller_children_raw(ctx, &input, inputs)?;
        policy::controller_children(&raw, controller, self, self.allowances())
            .map_err(|reason| self.rejected(CALL, reason))
    }

    /// Build a NodeSet's children besides its pods: serialize copies, call the plugin, apply the
    /// output policy. Shared children come without owner references: the host sets them to
    /// every NodeSet of the Controller (`slinky_api::owners::shared_refs`).
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    fn build_nodeset_children(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = BUILD_NODESET_CHILDREN;
        let ns_json = self.input(CALL, nodeset)?;
        let ctl_json = self.input(CALL, controller)?;
        let raw = self.build_nodeset_children_raw(ctx, &ns_json, &ctl_json)?;
        policy::nodeset_children(&raw, nodeset, self, self.allowances())
            .map_err(|reason| self.rejected(CALL, reason))
    }

    /// Build a RestApi's children (slurmrestd's Deployment and Service): serialize copies, call
    /// the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    fn build_restapi_children(
        &self,
        ctx: &BuildContext,
        restapi: &RestApi,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = BUILD_RESTAPI_CHILDREN;
        let restapi_json = self.input(CALL, restapi)?;
        let ctl_json = self.input(CALL, controller)?;
        let raw = self.build_restapi_children_raw(ctx, &restapi_json, &ctl_json)?;
        policy::restapi_children(&raw, restapi, controller, self, self.allowances())
            .map_err(|reason| self.rejected(CALL, reason))
    }

    /// Build a LoginSet's children (the login Deployment, Service and `sshd_config` ConfigMap):
    /// serialize copies, call the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    fn build_loginset_children(
        &self,
        ctx: &BuildContext,
        loginset: &LoginSet,
        controller: &Controller,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = BUILD_LOGINSET_CHILDREN;
        let login_json = self.input(CALL, loginset)?;
        let ctl_json = self.input(CALL, controller)?;
        let raw = self.build_loginset_children_raw(ctx, &login_json, &ctl_json, inputs)?;
        policy::loginset_children(&raw, loginset, controller, self, self.allowances())
            .map_err(|reason| self.rejected(CALL, reason))
    }

    /// Build an Accounting's children (the slurmdbd StatefulSet, Service and `slurmdbd.conf`
    /// Secret, its secret placeholders still in place: the host resolves them): serialize a
    /// copy, call the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    fn build_accounting_children(
        &self,
        ctx: &BuildContext,
        accounting: &Accounting,
        inputs: &AccountingInputs,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = BUILD_ACCOUNTING_CHILDREN;
        let json = self.input(CALL, accounting)?;
        let raw = self.build_accounting_children_raw(ctx, &json, inputs)?;
        policy::accounting_children(&raw, accounting, self, self.allowances())
            .map_err(|reason| self.rejected(CALL, reason))
    }
}
