//! `slinky-host version`: the host's version, contract and wasmtime versions, and its bundled
//! plugins' digests.

use super::{OutputFormat, print};

/// What `version` prints: this binary's versions and the digests of the plugins it embeds (the
/// digests a pod's `slinky.slurm.net/builder-digest` annotation shows when the bundled builder
/// built it).
pub fn version_report() -> serde_json::Value {
    let plugins: Vec<serde_json::Value> = crate::plugins::bundled::KINDS
        .iter()
        .map(|&kind| {
            let bytes = crate::plugins::bundled::bundled_bytes(kind);
            serde_json::json!({
                "kind": kind.as_str(),
                "digest": format!("sha256:{}", crate::plugins::digest(bytes)),
                "bytes": bytes.len(),
            })
        })
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "contractVersion": crate::plugins::CONTRACT_VERSION,
        "wasmtime": crate::plugins::WASMTIME_VERSION,
        "bundledPlugins": plugins,
    })
}

/// Print [`version_report`] as `output`.
///
/// # Errors
/// A serializer failure, or stdout closed.
pub fn execute(output: OutputFormat) -> anyhow::Result<()> {
    let report = version_report();
    let text = match output {
        OutputFormat::Yaml => serde_saphyr::to_string(&report)?,
        OutputFormat::Json => serde_json::to_string_pretty(&report)? + "\n",
    };
    print(&text)
}
