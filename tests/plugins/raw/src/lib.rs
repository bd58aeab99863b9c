//! A builder written against `wit/builder.wit` with wit-bindgen directly, as a plugin in another
//! language would be. It returns, verbatim, the text of the parent's annotation `raw.test/output`
//! (so tests can make it return another kind, invalid JSON, …), and describes itself as building
//! both kinds.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ world: "full-builder", path: "../../../wit" });

    use exports::slinky::builder::{controller_service, nodeset_pod, plugin};
    use slinky::builder::types::{BuildContext, BuildError, BuilderKind, PluginInfo, PodIdentity};

    struct Raw;

    fn output(parent: &str) -> Result<String, BuildError> {
        let v: serde_json::Value =
            serde_json::from_str(parent).map_err(|e| BuildError::InvalidInput(e.to_string()))?;
        v.pointer("/metadata/annotations/raw.test~1output")
            .and_then(|o| o.as_str())
            .map(str::to_string)
            .ok_or_else(|| BuildError::InvalidInput("no raw.test/output annotation".into()))
    }

    impl plugin::Guest for Raw {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: "raw".into(),
                version: "0.0.1".into(),
                kinds: vec![BuilderKind::ControllerService, BuilderKind::NodesetPod],
                contract_version: "0.1.0".into(),
            }
        }
    }

    impl controller_service::Guest for Raw {
        fn build_service(_ctx: BuildContext, controller: String) -> Result<String, BuildError> {
            output(&controller)
        }
    }

    impl nodeset_pod::Guest for Raw {
        fn build_pod(
            _ctx: BuildContext,
            nodeset: String,
            _controller: String,
            _identity: PodIdentity,
        ) -> Result<String, BuildError> {
            output(&nodeset)
        }
    }

    export!(Raw);
}
