//! A `nodeset-children` builder written against the frozen contract `slinky:builder@0.2.0`
//! (`wit/builder@0.2.0`) with wit-bindgen directly, as a plugin built before 0.3.0 (or in another
//! language) would be: the host must keep loading and serving it. It builds the Controller's
//! shared workers' Service only (selecting the cluster's slurmd pods, port 6818), labelled
//! `raw.test/contract=0.2.0`.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ world: "nodeset-children-builder", path: "../../../wit/builder@0.2.0" });

    use exports::slinky::builder::{nodeset_children, plugin};
    use serde_json::{Value, json};
    use slinky::builder::types::{BuildContext, BuildError, BuilderKind, PluginInfo};

    struct RawV2;

    impl plugin::Guest for RawV2 {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: "raw-v2".into(),
                version: "0.0.2".into(),
                kinds: vec![BuilderKind::NodesetChildren],
                contract_version: "0.2.0".into(),
            }
        }
    }

    impl nodeset_children::Guest for RawV2 {
        fn build_nodeset_children(
            _ctx: BuildContext,
            nodeset: String,
            _controller: String,
        ) -> Result<Vec<String>, BuildError> {
            let n: Value =
                serde_json::from_str(&nodeset).map_err(|e| BuildError::InvalidInput(e.to_string()))?;
            let cluster = n
                .pointer("/spec/controllerRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            Ok(vec![
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": format!("slurm-workers-{cluster}"),
                        "labels": {"raw.test/contract": "0.2.0"}},
                    "spec": {"clusterIP": "None",
                        "selector": {"app.kubernetes.io/name": "slurmd", "slinky.slurm.net/cluster": cluster},
                        "ports": [{"name": "slurmd", "port": 6818, "targetPort": "slurmd", "protocol": "TCP"}]}})
                .to_string(),
            ])
        }
    }

    export!(RawV2);
}
