//! A builder written against the frozen contract `slinky:builder@0.1.0` (`wit/builder@0.1.0`)
//! with wit-bindgen directly, as a plugin built before 0.2.0 (or in another language) would be: the
//! host must keep loading and serving it. It describes itself as building both 0.1.0 kinds. When the
//! parent has the annotation `raw.test/output`, it returns that text verbatim (so tests can make it
//! return another kind, invalid JSON, …); with `raw.test/build: minimal` it builds a minimal
//! Service (the Controller's, selecting slurmctld) or pod (the identity asked for, with the
//! NodeSet's selector labels, one `slurmd` container of the NodeSet's `slurmd.image`), labelled
//! `raw.test/built=true`; with neither it returns an invalid-input error.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ world: "full-builder", path: "../../../wit/builder@0.1.0" });

    use exports::slinky::builder::{controller_service, nodeset_pod, plugin};
    use serde_json::{Value, json};
    use slinky::builder::types::{BuildContext, BuildError, BuilderKind, PluginInfo, PodIdentity};

    struct Raw;

    fn parse(json: &str) -> Result<Value, BuildError> {
        serde_json::from_str(json).map_err(|e| BuildError::InvalidInput(e.to_string()))
    }

    /// The annotation's text, if the parent has it.
    fn output(parent: &Value) -> Option<String> {
        parent
            .pointer("/metadata/annotations/raw.test~1output")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// Whether the parent asks for a minimal object.
    fn minimal(parent: &Value) -> Result<(), BuildError> {
        if parent
            .pointer("/metadata/annotations/raw.test~1build")
            .and_then(Value::as_str)
            == Some("minimal")
        {
            return Ok(());
        }
        Err(BuildError::InvalidInput(
            "no raw.test/output or raw.test/build annotation".into(),
        ))
    }

    fn field<'a>(v: &'a Value, pointer: &str) -> &'a str {
        v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
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
            let c = parse(&controller)?;
            if let Some(out) = output(&c) {
                return Ok(out);
            }
            minimal(&c)?;
            let name = field(&c, "/metadata/name");
            Ok(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("{name}-controller"), "labels": {"raw.test/built": "true"}},
                "spec": {"selector": {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": name},
                    "ports": [{"name": "slurmctld", "port": 6817, "targetPort": "slurmctld", "protocol": "TCP"}]}})
            .to_string())
        }
    }

    impl nodeset_pod::Guest for Raw {
        fn build_pod(
            _ctx: BuildContext,
            nodeset: String,
            _controller: String,
            identity: PodIdentity,
        ) -> Result<String, BuildError> {
            let n = parse(&nodeset)?;
            if let Some(out) = output(&n) {
                return Ok(out);
            }
            minimal(&n)?;
            Ok(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": identity.name, "labels": {
                    "app.kubernetes.io/name": "slurmd",
                    "app.kubernetes.io/instance": field(&n, "/metadata/name"),
                    "raw.test/built": "true"}},
                "spec": {"hostname": identity.hostname, "automountServiceAccountToken": false,
                    "containers": [{"name": "slurmd", "image": field(&n, "/spec/slurmd/image")}]}})
            .to_string())
        }
    }

    export!(Raw);
}
