//! A measurement guest for the builders benchmark: the bundled `nodeset-pod` builder's work, split
//! into phases so the benchmark can time each inside the sandbox (the guest itself has no clock).
//! `build-pod` stops after the phase named by the identity's `revision`:
//!
//! | revision | work done |
//! |---|---|
//! | `phase:none` | nothing (the cost of a call: instantiation, argument lowering, lifting) |
//! | `phase:parse` | parse the NodeSet and the Controller (what `export_plugin!` does first) |
//! | `phase:build` | … and build the pod (`slinky::build_nodeset_pod`) |
//! | anything else | … and serialise it, returning the JSON (exactly what the bundled plugin does) |
//!
//! It links the same SDK, allocator and build profile as the bundled plugins.

#![cfg_attr(
    target_arch = "wasm32",
    allow(
        unsafe_code,
        reason = "wit-bindgen's generated exports declare unsafe ABI functions"
    )
)]

slinky_guest_sdk::use_bump_allocator!();

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ world: "nodeset-pod-builder", path: "../../../wit/builder@0.3.0" });

    use exports::slinky::builder::{nodeset_pod, plugin};
    use slinky::builder::types::{BuildContext, BuildError, BuilderKind, PluginInfo, PodIdentity};
    use slinky_guest_sdk::api::{Controller, NodeSet};

    struct Phases;

    impl plugin::Guest for Phases {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: "phases".into(),
                version: "0.0.1".into(),
                kinds: vec![BuilderKind::NodesetPod],
                contract_version: slinky_guest_sdk::CONTRACT_VERSION.into(),
            }
        }

        fn validate_settings(_settings: String) -> Result<(), String> {
            Ok(())
        }
    }

    fn invalid(e: impl std::fmt::Display) -> BuildError {
        BuildError::InvalidInput(e.to_string())
    }

    impl nodeset_pod::Guest for Phases {
        fn build_pod(
            ctx: BuildContext,
            nodeset: String,
            controller: String,
            identity: PodIdentity,
        ) -> Result<String, BuildError> {
            let phase = identity.revision.clone();
            if phase == "phase:none" {
                return Ok(String::new());
            }
            let nodeset: NodeSet = serde_json::from_str(&nodeset).map_err(invalid)?;
            let controller: Controller = serde_json::from_str(&controller).map_err(invalid)?;
            if phase == "phase:parse" {
                std::hint::black_box((&nodeset, &controller));
                return Ok(String::new());
            }
            let ctx = slinky_guest_sdk::BuildContext {
                cluster_domain: ctx.cluster_domain,
                ..Default::default()
            };
            let identity = slinky_guest_sdk::PodIdentity {
                ordinal: identity.ordinal,
                name: identity.name,
                hostname: identity.hostname,
                revision: identity.revision,
            };
            let pod = slinky_guest_sdk::slinky::build_nodeset_pod(&ctx, &nodeset, &controller, &identity)
                .map_err(invalid)?;
            if phase == "phase:build" {
                std::hint::black_box(&pod);
                return Ok(String::new());
            }
            serde_json::to_string(&pod).map_err(|e| BuildError::Internal(e.to_string()))
        }
    }

    export!(Phases);
}
