//! Profile the bundled `nodeset-pod` builder inside wasmtime: `BENCH_CALLS` (default 20000)
//! `build-pod` calls on one instance, for `perf`:
//!
//! ```sh
//! SLINKY_HOST_PLUGIN_PERF_MAP=1 perf record -e cpu-clock -o perf.data \
//!     cargo run --release -p slinky-runtime --features bench --example profile_build_pod
//! perf report -i perf.data --sort symbol
//! ```
//!
//! The bundled plugin is stripped: build one with names to profile, e.g.
//! `CARGO_PROFILE_WASM_STRIP=false cargo build -p nodeset-pod --target wasm32-wasip2 --profile wasm
//! --target-dir target/profile` and run with `PLUGIN=target/profile/wasm32-wasip2/wasm/nodeset_pod.wasm`.

#![allow(clippy::expect_used, reason = "a profiling harness aborts on a broken setup")]

include!("../benches/support/example_inputs.rs");

use slinky_runtime::{BuildContext, EngineHandle, Plugin, PluginSource, PodIdentity, RuntimeConfig, bundled};

fn main() -> anyhow::Result<()> {
    let (nodeset, controller) = example_parents()?;
    let n: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let engine = EngineHandle::new(RuntimeConfig::default())?;
    // `PLUGIN=path.wasm` profiles another build (e.g. an unstripped one, whose functions perf names).
    let plugin = match std::env::var_os("PLUGIN") {
        Some(path) => Plugin::load_file(&engine, std::path::Path::new(&path))?,
        None => Plugin::load(&engine, bundled::NODESET_POD, PluginSource::Bundled)?,
    };
    let identity = PodIdentity::for_ordinal(&nodeset, 1, "0123456789");
    let times = plugin.time_build_pod_on_one_instance(
        &BuildContext::default(),
        &serde_json::to_string(&nodeset)?,
        &serde_json::to_string(&controller)?,
        &identity,
        n,
    )?;
    let total: std::time::Duration = times.iter().sum();
    println!("{n} calls, {:.1} µs each", total.as_secs_f64() * 1e6 / n as f64);
    Ok(())
}
