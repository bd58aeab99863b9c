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

use std::time::Instant;

use slinky_api::{Controller, NodeSet};

use slinky_runtime::{
    BuildContext, EngineHandle, Plugin, PluginSource, PodIdentity, RuntimeConfig, Tier, Tiering, bundled,
};

fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// The median time of each contestant over `n` calls, measured in 20 interleaved rounds so that
/// the machine's slow and fast spells (a shared 2-core VM) fall on every contestant alike.
fn interleaved(n: usize, contestants: &mut [&mut dyn FnMut()]) -> Vec<std::time::Duration> {
    const ROUNDS: usize = 20;
    let per_round = n.div_ceil(ROUNDS);
    let mut samples: Vec<Vec<std::time::Duration>> =
        contestants.iter().map(|_| Vec::with_capacity(n)).collect();
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

fn us(d: std::time::Duration) -> f64 {
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

/// The same builder natively behind a loopback HTTP/1.1 webhook (one keep-alive connection): the
/// median round trip of `n` requests carrying the NodeSet, Controller and identity as JSON.
fn webhook(
    n: usize,
    ns_json: &str,
    ctl_json: &str,
    identity: &slinky_guest_sdk::PodIdentity,
) -> std::time::Duration {
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response, body::Incoming, service::service_fn};
    use hyper_util::rt::TokioIo;

    #[derive(serde::Deserialize)]
    struct Hook {
        nodeset: NodeSet,
        controller: Controller,
        ordinal: u32,
        name: String,
        hostname: String,
        revision: String,
    }

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc = service_fn(|req: Request<Incoming>| async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        let hook: Hook = serde_json::from_slice(&body).expect("hook request");
                        let id = slinky_guest_sdk::PodIdentity {
                            ordinal: hook.ordinal,
                            name: hook.name,
                            hostname: hook.hostname,
                            revision: hook.revision,
                        };
                        let pod = slinky_guest_sdk::slinky::build_nodeset_pod(
                            &slinky_guest_sdk::BuildContext::default(),
                            &hook.nodeset,
                            &hook.controller,
                            &id,
                        )
                        .expect("build");
                        let json = serde_json::to_vec(&pod).expect("json");
                        Ok::<_, hyper::Error>(Response::new(Full::new(bytes::Bytes::from(json))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    });
    let body = format!(
        r#"{{"nodeset":{ns_json},"controller":{ctl_json},"ordinal":{},"name":"{}","hostname":"{}","revision":"{}"}}"#,
        identity.ordinal, identity.name, identity.hostname, identity.revision
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut times = Vec::with_capacity(n);
        for i in 0..n + 50 {
            let req = Request::post("/build-pod")
                .header(hyper::header::HOST, "bench")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(bytes::Bytes::from(body.clone())))
                .expect("request");
            let t = Instant::now();
            let resp = sender.send_request(req).await.expect("send");
            let out = resp.into_body().collect().await.expect("body").to_bytes();
            std::hint::black_box(String::from_utf8_lossy(&out).len());
            if i >= 50 {
                times.push(t.elapsed());
            }
        }
        median(times)
    })
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
    let ns_json = serde_json::to_string(&nodeset)?;
    let ctl_json = serde_json::to_string(&controller)?;

    // Compile vs. precompiled load (fresh engines so the in-memory cache doesn't count).
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

    // Native: the same work as the guest (JSON in, build, JSON out).
    let sdk_ctx = slinky_guest_sdk::BuildContext::default();
    let sdk_id = slinky_guest_sdk::PodIdentity::for_ordinal(&nodeset, 1, "0123456789");
    let mut native = || {
        let ns: NodeSet = serde_json::from_str(&ns_json).expect("nodeset");
        let ctl: Controller = serde_json::from_str(&ctl_json).expect("controller");
        let pod = slinky_guest_sdk::slinky::build_nodeset_pod(&sdk_ctx, &ns, &ctl, &sdk_id).expect("build");
        std::hint::black_box(serde_json::to_string(&pod).expect("json"));
    };
    let webhook = webhook(n, &ns_json, &ctl_json, &sdk_id);

    let build_raw = |p: &Plugin| {
        p.build_pod_raw(&ctx, &ns_json, &ctl_json, &identity)
            .expect("build");
    };
    // The default resident size, and the size before it (16 MiB) for comparison.
    let kept = slinky_runtime::DEFAULT_KEEP_RESIDENT;
    let mib16 = 16 << 20;
    let default_kept = format!("pooling, {} MiB kept resident, PAGEMAP_SCAN", kept >> 20);
    let variants = [
        (
            default_kept.as_str(),
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
    ];
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
    // `BENCH_PROFILE=SECONDS`: only fresh-instance calls on the default engine, for `perf record`
    // (with `SLINKY_HOST_PLUGIN_PERF_MAP=1` so the guest's functions have names).
    if let Some(seconds) = std::env::var("BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
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
        return Ok(());
    }
    let mut wasm_calls: Vec<Box<dyn FnMut()>> = loaded
        .iter()
        .map(|(_, _, _, plugin)| {
            let plugin = plugin.clone();
            Box::new(move || build_raw(&plugin)) as Box<dyn FnMut()>
        })
        .collect();
    let mut contestants: Vec<&mut dyn FnMut()> = vec![&mut native];
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

    // Where the time of one fresh-instance call goes (default engine).
    let phases_dir = build_wasm(&workspace, &["phases-guest"]);
    let phases_bytes = std::fs::read(phases_dir.join("phases_guest.wasm"))?;
    let phases = Plugin::load(&engine, &phases_bytes, PluginSource::Bundled)?;
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
    let reused = median(plugin.time_build_pod_on_one_instance(&ctx, &ns_json, &ctl_json, &identity, 20)?);
    let (faults, grows) = fresh_calls(&engine, &plugin, n.min(500), build_raw);
    let d = |a: std::time::Duration, b: std::time::Duration| us(a) - us(b);
    println!("breakdown of a fresh-instance call (default engine; measurement guest `phases`):");
    println!(
        "  instantiate (new Store + instance)                          {:>8.1} µs",
        us(inst)
    );
    println!(
        "  teardown (drop the Store)                                   {:>8.1} µs",
        us(drop_t)
    );
    println!(
        "  an empty call (instantiate, call, teardown)                 {:>8.1} µs",
        us(none_empty)
    );
    println!(
        "  + lowering the NodeSet and Controller JSON                  {:>8.1} µs",
        d(none, none_empty)
    );
    println!(
        "  + guest parsing (serde_json into the typed objects)         {:>8.1} µs",
        d(parse, none)
    );
    println!(
        "  + building the pod                                          {:>8.1} µs",
        d(build, parse)
    );
    println!(
        "  + serialising and lifting the result                        {:>8.1} µs",
        d(full, build)
    );
    println!(
        "  = the whole call (measurement guest)                        {:>8.1} µs",
        us(full)
    );
    println!("  memory: {grows:.1} memory_growing calls and {faults:.1} minor page faults per call");
    println!(
        "  compiled code alone, one reused instance (measurement only) {:>8.1} µs  ({:.2}x native)",
        us(reused),
        us(reused) / us(native)
    );
    println!("component load ({} KiB):", bundled::NODESET_POD.len() / 1024);
    println!(
        "  compile with cranelift                                      {:>8.1} ms",
        compile.as_secs_f64() * 1e3
    );
    println!(
        "  compile with winch (the baseline tier)                      {:>8.1} ms",
        winch_compile.as_secs_f64() * 1e3
    );
    println!(
        "  load precompiled artifact                                   {:>8.1} ms",
        precompiled.as_secs_f64() * 1e3
    );
    Ok(())
}
