//! Builder call costs, side by side in one run:
//! * build-pod through Wasm (a fresh store and instance per call, as the host calls it) under each
//!   instance-allocator configuration, against the same builder compiled natively and the same
//!   builder behind a loopback HTTP/JSON webhook (as Metacontroller calls its hooks);
//! * where a Wasm call's time goes: instantiation, argument lowering, the guest's parsing, building
//!   and serialising (timed with a measurement guest that stops after each phase), teardown,
//!   memory growth and page faults, and the compiled code alone on one reused instance;
//! * compiling a component vs loading a precompiled artifact.
//!
//! `cargo bench -p slinky-runtime --features bench --bench builders` (prints figures; no assertions). `BENCH_CALLS`
//! sets the calls per measurement (default 2000); `BENCH_PROFILE=SECONDS` only makes default
//! fresh-instance calls for that long (to run under `perf record`); `BENCH_COMPARE=A.wasm,B.wasm`
//! adds other builds of the pod builder as contestants.

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

include!("support/example_inputs.rs");

include!("../wasm_build.rs");

// The module lives beside this file (`builders/`), this file staying the bench's root.
#[path = "builders/webhook.rs"]
mod webhook;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use slinky_api::{Controller, NodeSet};

use slinky_runtime::{
    BuildContext, EngineHandle, Plugin, PluginSource, PodIdentity, RuntimeConfig, Tier, Tiering, bundled,
};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The median time of each contestant over `n` calls, measured in 20 interleaved rounds so that
/// the machine's slow and fast spells (a shared 2-core VM) fall on every contestant alike.
fn interleaved(n: usize, contestants: &mut [&mut dyn FnMut()]) -> Vec<Duration> {
    const ROUNDS: usize = 20;
    let per_round = n.div_ceil(ROUNDS);
    let mut samples: Vec<Vec<Duration>> = contestants.iter().map(|_| Vec::with_capacity(n)).collect();
    for c in contestants.iter_mut() {
        for _ in 0..n.min(50) {
            c(); // warm up
        }
    }
    for _ in 0..ROUNDS {
        for (c, out) in contestants.iter_mut().zip(samples.iter_mut()) {
            for _ in 0..per_round {
                let t = Instant::now();
                c();
                out.push(t.elapsed());
            }
        }
    }
    samples.into_iter().map(median).collect()
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Minor page faults of this thread so far (Linux), 0 elsewhere.
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(") ")?.1.to_string();
            // minflt is field 10; `rest` starts at field 3.
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Per call: (minor page faults, memory_growing calls).
fn fresh_calls(engine: &EngineHandle, plugin: &Plugin, n: usize, call: impl Fn(&Plugin)) -> (f64, f64) {
    let (calls0, grows0) = (
        engine.stats().calls.load(std::sync::atomic::Ordering::Relaxed),
        engine
            .stats()
            .memory_grows
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let faults0 = minor_faults();
    for _ in 0..n {
        call(plugin);
    }
    let faults = (minor_faults() - faults0) as f64 / n as f64;
    let calls = engine.stats().calls.load(std::sync::atomic::Ordering::Relaxed) - calls0;
    let grows = engine
        .stats()
        .memory_grows
        .load(std::sync::atomic::Ordering::Relaxed)
        - grows0;
    (faults, grows as f64 / calls.max(1) as f64)
}

/// The inputs of every build-pod call: the example's NodeSet and Controller as JSON, the pod's
/// identity and the build context.
struct Inputs {
    ctx: BuildContext,
    identity: PodIdentity,
    ns_json: String,
    ctl_json: String,
}

/// The times of loading the pod builder: compiling it with Cranelift, loading the precompiled
/// artifact, compiling it with Winch.
struct LoadTimes {
    compile: Duration,
    precompiled: Duration,
    winch_compile: Duration,
}

/// Compile vs. precompiled load (fresh engines so the in-memory cache doesn't count). Returns the
/// first engine (`base`) and its pod builder too.
fn load_times(base: &RuntimeConfig) -> anyhow::Result<(Arc<EngineHandle>, Plugin, LoadTimes)> {
    let t = Instant::now();
    let engine = EngineHandle::new(base.clone())?;
    let plugin = Plugin::load(&engine, bundled::NODESET_POD, PluginSource::Bundled)?;
    let compile = t.elapsed();
    let t = Instant::now();
    let engine2 = EngineHandle::new(base.clone())?;
    let reloaded = Plugin::load(&engine2, bundled::NODESET_POD, PluginSource::Bundled)?;
    let precompiled = t.elapsed();
    assert_eq!(reloaded.compiled_from(), slinky_runtime::CompileSource::Disk);
    drop((engine2, reloaded));
    let t = Instant::now();
    let baseline_engine = EngineHandle::new(RuntimeConfig {
        tiering: Tiering::Baseline,
        cache_dir: None,
        ..base.clone()
    })?;
    let baseline = Plugin::load(&baseline_engine, bundled::NODESET_POD, PluginSource::Bundled)?;
    let winch_compile = t.elapsed();
    assert_eq!(baseline.tier(), Tier::Baseline);
    drop((baseline_engine, baseline));
    let times = LoadTimes {
        compile,
        precompiled,
        winch_compile,
    };
    Ok((engine, plugin, times))
}

/// The engine configurations compared, by name: instance allocators and the Winch tier;
/// `default_kept` names the first (the default resident size).
fn variants<'a>(base: &RuntimeConfig, default_kept: &'a str) -> [(&'a str, RuntimeConfig); 7] {
    // The default resident size, and the size before it (16 MiB) for comparison.
    let kept = slinky_runtime::DEFAULT_KEEP_RESIDENT;
    let mib16 = 16 << 20;
    [
        (
            default_kept,
            RuntimeConfig {
                keep_resident: kept,
                pagemap_scan: true,
                ..base.clone()
            },
        ),
        (
            "pooling, 16 MiB kept resident, PAGEMAP_SCAN",
            RuntimeConfig {
                keep_resident: mib16,
                pagemap_scan: true,
                ..base.clone()
            },
        ),
        (
            "pooling, 16 MiB kept resident (memset)",
            RuntimeConfig {
                keep_resident: mib16,
                pagemap_scan: false,
                ..base.clone()
            },
        ),
        (
            "pooling, memory decommitted after each call",
            RuntimeConfig {
                keep_resident: 0,
                pagemap_scan: false,
                ..base.clone()
            },
        ),
        (
            "pooling, kept resident, copy-on-write image off",
            RuntimeConfig {
                keep_resident: mib16,
                pagemap_scan: true,
                memory_init_cow: false,
                ..base.clone()
            },
        ),
        (
            "on-demand allocation",
            RuntimeConfig {
                pooling: false,
                ..base.clone()
            },
        ),
        (
            "Winch code (baseline tier, until Cranelift's is ready)",
            RuntimeConfig {
                tiering: Tiering::Baseline,
                ..base.clone()
            },
        ),
    ]
}

/// A Wasm contestant: its name, whether its engine is the default one, the engine, the pod
/// builder loaded on it.
type Loaded<'a> = (&'a str, bool, Arc<EngineHandle>, Plugin);

/// The pod builder on an engine of each of `variants`, then each `BENCH_COMPARE` build on an
/// engine of `base`.
fn load_contestants<'a>(
    variants: [(&'a str, RuntimeConfig); 7],
    base: &RuntimeConfig,
) -> anyhow::Result<Vec<Loaded<'a>>> {
    let is_default = |c: &RuntimeConfig| {
        let d = RuntimeConfig::default();
        (c.pooling, c.keep_resident, c.pagemap_scan, c.memory_init_cow)
            == (d.pooling, d.keep_resident, d.pagemap_scan, d.memory_init_cow)
            && c.tiering == Tiering::Optimized
    };
    let mut loaded = Vec::new();
    for (name, config) in variants {
        let default = is_default(&config);
        let engine = EngineHandle::new(config)?;
        let plugin = Plugin::load(&engine, bundled::NODESET_POD, PluginSource::Bundled)?;
        loaded.push((name, default, engine, plugin));
    }
    // `BENCH_COMPARE=FILE.wasm[,FILE.wasm…]`: other builds of the pod builder, on the default
    // engine, as extra contestants (to measure a guest-side change against the bundled build).
    for file in std::env::var("BENCH_COMPARE")
        .unwrap_or_default()
        .split(',')
        .filter(|f| !f.is_empty())
    {
        let engine = EngineHandle::new(base.clone())?;
        let plugin = Plugin::load(&engine, &std::fs::read(file)?, PluginSource::Bundled)?;
        let name: &'static str = Box::leak(format!("{file} (default engine)").into_boxed_str());
        loaded.push((name, false, engine, plugin));
    }
    Ok(loaded)
}

/// `BENCH_PROFILE=SECONDS`: only fresh-instance calls on the default engine for `seconds`, for
/// `perf record` (with `SLINKY_HOST_PLUGIN_PERF_MAP=1` so the guest's functions have names).
fn profile(loaded: &[Loaded<'_>], seconds: f64, build_raw: impl Fn(&Plugin)) {
    // The first `BENCH_COMPARE` build if any, else the bundled one.
    let plugin = &loaded
        .iter()
        .find(|l| l.0.ends_with("(default engine)"))
        .or_else(|| loaded.iter().find(|l| l.1))
        .expect("the default variant")
        .3;
    let (started, mut calls) = (Instant::now(), 0u64);
    while started.elapsed().as_secs_f64() < seconds {
        build_raw(plugin);
        calls += 1;
    }
    println!(
        "profile: {calls} calls, {:.1} µs each",
        started.elapsed().as_secs_f64() * 1e6 / calls as f64
    );
}

/// build-pod for the example NodeSet: `native`, the `webhook`'s time and each of `loaded` over
/// `n` calls (interleaved medians; for Wasm also faults and memory growth per call), and the
/// default Wasm engine's ratios to both. Returns the native median.
fn compare<F: Fn(&Plugin) + Copy>(
    n: usize,
    loaded: &[Loaded<'_>],
    native: &mut dyn FnMut(),
    webhook: Duration,
    build_raw: F,
) -> Duration {
    let mut wasm_calls: Vec<Box<dyn FnMut()>> = loaded
        .iter()
        .map(|(_, _, _, plugin)| {
            let plugin = plugin.clone();
            Box::new(move || build_raw(&plugin)) as Box<dyn FnMut()>
        })
        .collect();
    let mut contestants: Vec<&mut dyn FnMut()> = vec![native];
    contestants.extend(wasm_calls.iter_mut().map(|c| c.as_mut() as &mut dyn FnMut()));
    let medians = interleaved(n, &mut contestants);
    let native = medians[0];
    println!("build-pod for the example NodeSet ({n} calls per figure in 20 interleaved rounds, medians)");
    println!(
        "  native (JSON in, build, JSON out)                          {:>8.1} µs",
        us(native)
    );
    println!(
        "  webhook: native builder behind loopback HTTP/JSON           {:>8.1} µs",
        us(webhook)
    );
    println!("  wasm, a fresh store and instance per call, by allocator:      time   faults/call grows/call");
    let mut default_wasm = None;
    for ((name, default, engine, plugin), median) in loaded.iter().zip(&medians[1..]) {
        let (faults, grows) = fresh_calls(engine, plugin, n.min(500), build_raw);
        if *default {
            default_wasm = Some(*median);
        }
        let name = if *default {
            format!("{name} (default)")
        } else {
            name.to_string()
        };
        println!(
            "    {name:<56} {:>8.1} µs {faults:>9.1} {grows:>9.1}",
            us(*median)
        );
    }
    let wasm = default_wasm.expect("a variant ran");
    println!(
        "  ratio wasm/native                                          {:>8.2}x",
        us(wasm) / us(native)
    );
    println!(
        "  ratio wasm/webhook                                         {:>8.2}x",
        us(wasm) / us(webhook)
    );
    native
}

/// Where the time of one fresh-instance call goes: instantiation, teardown, the measurement
/// guest's phases (an empty call, with the arguments lowered, parsed, built, whole), the compiled
/// code alone on one reused instance, and memory growth and page faults per call.
struct Breakdown {
    inst: Duration,
    drop_t: Duration,
    none_empty: Duration,
    none: Duration,
    parse: Duration,
    build: Duration,
    full: Duration,
    reused: Duration,
    faults: f64,
    grows: f64,
}

/// Measures the [`Breakdown`] of a call of `plugin` on `engine` (the default one) over `n`
/// calls, the phases with the measurement guest `phases` (built from `workspace`).
fn measure_breakdown(
    workspace: &Path,
    engine: &Arc<EngineHandle>,
    plugin: &Plugin,
    inputs: &Inputs,
    n: usize,
    build_raw: impl Fn(&Plugin),
) -> anyhow::Result<Breakdown> {
    let Inputs {
        ctx,
        identity,
        ns_json,
        ctl_json,
    } = inputs;
    let phases_dir = build_wasm(workspace, &["phases-guest"]);
    let phases_bytes = std::fs::read(phases_dir.join("phases_guest.wasm"))?;
    let phases = Plugin::load(engine, &phases_bytes, PluginSource::Bundled)?;
    let phase = |revision: &str, ns: String, ctl: String| {
        let id = PodIdentity {
            revision: revision.into(),
            ..identity.clone()
        };
        let (phases, ctx) = (phases.clone(), ctx.clone());
        Box::new(move || {
            phases.build_pod_raw(&ctx, &ns, &ctl, &id).expect("phase call");
        }) as Box<dyn FnMut()>
    };
    let empty = String::from("{}");
    let mut calls = [
        phase("phase:none", empty.clone(), empty),
        phase("phase:none", ns_json.clone(), ctl_json.clone()),
        phase("phase:parse", ns_json.clone(), ctl_json.clone()),
        phase("phase:build", ns_json.clone(), ctl_json.clone()),
        phase("phase:full", ns_json.clone(), ctl_json.clone()),
    ];
    let mut contestants: Vec<&mut dyn FnMut()> =
        calls.iter_mut().map(|c| c.as_mut() as &mut dyn FnMut()).collect();
    let times = interleaved(n, &mut contestants);
    let [none_empty, none, parse, build, full] = [times[0], times[1], times[2], times[3], times[4]];
    let (mut inst, mut drop_t) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (i, d) = plugin.time_instantiation()?;
        inst.push(i);
        drop_t.push(d);
    }
    let (inst, drop_t) = (median(inst), median(drop_t));
    // The guests' bump allocator never frees (an instance serves one call), so a reused instance
    // fills its memory cap after ~30 builds: 20 calls on one instance, measurement only.
    let reused = median(plugin.time_build_pod_on_one_instance(ctx, ns_json, ctl_json, identity, 20)?);
    let (faults, grows) = fresh_calls(engine, plugin, n.min(500), build_raw);
    Ok(Breakdown {
        inst,
        drop_t,
        none_empty,
        none,
        parse,
        build,
        full,
        reused,
        faults,
        grows,
    })
}

/// Prints the [`Breakdown`] (the reused instance's time also against `native`).
fn print_breakdown(b: &Breakdown, native: Duration) {
    let d = |a: Duration, b: Duration| us(a) - us(b);
    println!("breakdown of a fresh-instance call (default engine; measurement guest `phases`):");
    println!(
        "  instantiate (new Store + instance)                          {:>8.1} µs",
        us(b.inst)
    );
    println!(
        "  teardown (drop the Store)                                   {:>8.1} µs",
        us(b.drop_t)
    );
    println!(
        "  an empty call (instantiate, call, teardown)                 {:>8.1} µs",
        us(b.none_empty)
    );
    println!(
        "  + lowering the NodeSet and Controller JSON                  {:>8.1} µs",
        d(b.none, b.none_empty)
    );
    println!(
        "  + guest parsing (serde_json into the typed objects)         {:>8.1} µs",
        d(b.parse, b.none)
    );
    println!(
        "  + building the pod                                          {:>8.1} µs",
        d(b.build, b.parse)
    );
    println!(
        "  + serialising and lifting the result                        {:>8.1} µs",
        d(b.full, b.build)
    );
    println!(
        "  = the whole call (measurement guest)                        {:>8.1} µs",
        us(b.full)
    );
    let Breakdown { faults, grows, .. } = b;
    println!("  memory: {grows:.1} memory_growing calls and {faults:.1} minor page faults per call");
    println!(
        "  compiled code alone, one reused instance (measurement only) {:>8.1} µs  ({:.2}x native)",
        us(b.reused),
        us(b.reused) / us(native)
    );
}

/// Prints the [`LoadTimes`].
fn print_load(load: &LoadTimes) {
    println!("component load ({} KiB):", bundled::NODESET_POD.len() / 1024);
    println!(
        "  compile with cranelift                                      {:>8.1} ms",
        load.compile.as_secs_f64() * 1e3
    );
    println!(
        "  compile with winch (the baseline tier)                      {:>8.1} ms",
        load.winch_compile.as_secs_f64() * 1e3
    );
    println!(
        "  load precompiled artifact                                   {:>8.1} ms",
        load.precompiled.as_secs_f64() * 1e3
    );
}

fn main() -> anyhow::Result<()> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let (nodeset, controller) = example_parents()?;
    let identity = PodIdentity::for_ordinal(&nodeset, 1, "0123456789");
    let ctx = BuildContext::default();
    let n: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let cache = tempfile::tempdir()?;
    // Cranelift before serving: the figures are those of the code plugins run once tiered up.
    let base = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        tiering: Tiering::Optimized,
        ..RuntimeConfig::default()
    };
    let inputs = Inputs {
        ctx,
        identity,
        ns_json: serde_json::to_string(&nodeset)?,
        ctl_json: serde_json::to_string(&controller)?,
    };
    let (ns_json, ctl_json) = (&inputs.ns_json, &inputs.ctl_json);

    let (engine, plugin, load) = load_times(&base)?;

    // Native: the same work as the guest (JSON in, build, JSON out).
    let sdk_ctx = slinky_guest_sdk::BuildContext::default();
    let sdk_id = slinky_guest_sdk::PodIdentity::for_ordinal(&nodeset, 1, "0123456789");
    let mut native = || {
        let ns: NodeSet = serde_json::from_str(ns_json).expect("nodeset");
        let ctl: Controller = serde_json::from_str(ctl_json).expect("controller");
        let pod = slinky_guest_sdk::slinky::build_nodeset_pod(&sdk_ctx, &ns, &ctl, &sdk_id).expect("build");
        std::hint::black_box(serde_json::to_string(&pod).expect("json"));
    };
    let webhook = webhook::webhook(n, ns_json, ctl_json, &sdk_id);

    let build_raw = |p: &Plugin| {
        p.build_pod_raw(&inputs.ctx, ns_json, ctl_json, &inputs.identity)
            .expect("build");
    };
    let kept = slinky_runtime::DEFAULT_KEEP_RESIDENT;
    let default_kept = format!("pooling, {} MiB kept resident, PAGEMAP_SCAN", kept >> 20);
    let loaded = load_contestants(variants(&base, &default_kept), &base)?;
    if let Some(seconds) = std::env::var("BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        profile(&loaded, seconds, build_raw);
        return Ok(());
    }
    let native = compare(n, &loaded, &mut native, webhook, build_raw);

    // Where the time of one fresh-instance call goes (default engine).
    let breakdown = measure_breakdown(&workspace, &engine, &plugin, &inputs, n, build_raw)?;
    print_breakdown(&breakdown, native);
    print_load(&load);
    Ok(())
}
