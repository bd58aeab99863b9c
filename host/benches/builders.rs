//! Builder call costs: build-pod through Wasm (fresh store + instance per call) vs. the same
//! builder compiled natively, instantiation alone, and compile vs. precompiled load.
//!
//! `cargo bench -p slinky-host --bench builders` (prints figures; no assertions).

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use slinky_api::{Controller, NodeSet};
use slinky_host::{
    Plugin,
    plugins::{BuildContext, EngineHandle, PluginSource, PodIdentity, RuntimeConfig, bundled},
    render::{self, Parent},
};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<F: FnMut()>(n: usize, mut f: F) -> Duration {
    for _ in 0..n.min(50) {
        f(); // warm up
    }
    median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn fmt(d: Duration) -> String {
    format!("{:>9.1} µs", d.as_secs_f64() * 1e6)
}

fn main() -> anyhow::Result<()> {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slurm-cluster.yaml");
    let (mut nodeset, mut controller): (Option<NodeSet>, Option<Controller>) = (None, None);
    for m in render::read_manifests(&[example])? {
        match m.parent {
            Parent::Controller(c) => controller = Some(*c),
            Parent::NodeSet(n) => nodeset = Some(*n),
        }
    }
    let (nodeset, controller) = (
        nodeset.expect("example NodeSet"),
        controller.expect("example Controller"),
    );
    let identity = PodIdentity::for_ordinal(&nodeset, 1, "0123456789");
    let ctx = BuildContext::default();
    let cache = tempfile::tempdir()?;
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeConfig::default()
    };
    let n = 2000;

    // Compile vs. precompiled load (fresh engines so the in-memory cache doesn't count).
    let t = Instant::now();
    let engine = EngineHandle::new(config.clone())?;
    let plugin = Plugin::load(&engine, bundled::NODESET_POD, PluginSource::Bundled)?;
    let compile = t.elapsed();
    let t = Instant::now();
    let engine2 = EngineHandle::new(config.clone())?;
    let reloaded = Plugin::load(&engine2, bundled::NODESET_POD, PluginSource::Bundled)?;
    let precompiled = t.elapsed();
    assert_eq!(
        reloaded.compiled_from(),
        slinky_host::plugins::CompileSource::Disk
    );

    let ns_json = serde_json::to_string(&nodeset)?;
    let ctl_json = serde_json::to_string(&controller)?;
    let instantiate = time(n, || plugin.instantiate_only().expect("instantiate"));
    let wasm_raw = time(n, || {
        plugin
            .build_pod_raw(&ctx, &ns_json, &ctl_json, &identity)
            .expect("build");
    });
    let wasm_full = time(n, || {
        plugin
            .build_pod(&ctx, &nodeset, &controller, &identity)
            .expect("build");
    });
    let sdk_ctx = slinky_guest_sdk::BuildContext::default();
    let sdk_id = slinky_guest_sdk::PodIdentity::for_ordinal(&nodeset, 1, "0123456789");
    let native = time(n, || {
        // The same work as the guest: JSON in, build, JSON out.
        let ns: NodeSet = serde_json::from_str(&ns_json).expect("nodeset");
        let ctl: Controller = serde_json::from_str(&ctl_json).expect("controller");
        let pod = slinky_guest_sdk::slinky::build_nodeset_pod(&sdk_ctx, &ns, &ctl, &sdk_id).expect("build");
        std::hint::black_box(serde_json::to_string(&pod).expect("json"));
    });

    println!(
        "build-pod for the example NodeSet ({n} calls, medians; allocator {:?})",
        engine.allocator()
    );
    println!("  native (JSON in, build, JSON out)        {}", fmt(native));
    println!("  wasm, fresh instance per call            {}", fmt(wasm_raw));
    println!("  wasm + host output policy                {}", fmt(wasm_full));
    println!(
        "  ratio wasm/native                        {:>9.2}x",
        wasm_raw.as_secs_f64() / native.as_secs_f64()
    );
    println!("  instantiate only (new Store + instance)  {}", fmt(instantiate));
    println!("component load ({} KiB):", bundled::NODESET_POD.len() / 1024);
    println!(
        "  compile with cranelift                   {:>9.1} ms",
        compile.as_secs_f64() * 1e3
    );
    println!(
        "  load precompiled artifact                {:>9.1} ms",
        precompiled.as_secs_f64() * 1e3
    );
    Ok(())
}
