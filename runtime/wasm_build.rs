// Shared by the build scripts of `slinky-runtime` (bundled plugins) and `slinky-tests` (hostile test
// plugins): compile workspace plugin crates for wasm32-wasip2 with a nested cargo in its own
// target directory, so the outer build's lock is never contended.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// Builds `packages` for wasm32-wasip2 (profile `wasm`) and returns the directory of the `.wasm`
/// files; tells cargo to rerun the build script when guest sources change. Exits the build with
/// the exact fix when the target is missing.
#[allow(dead_code, reason = "included by build scripts, which use it, and the benchmark, which does not")]
fn build_wasm_plugins(workspace: &Path, packages: &[&str]) -> PathBuf {
    let out = build_wasm(workspace, packages);
    for dir in [
        "api",
        "guest-sdk",
        "wit",
        "plugins",
        "tests/plugins",
        "examples/gpu-plugin",
        "Cargo.lock",
        // The `wasm` build profile lives in the workspace manifest.
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    out
}

/// Builds `packages` for wasm32-wasip2 (profile `wasm`, reproducibly) and returns the directory of
/// the `.wasm` files.
fn build_wasm(workspace: &Path, packages: &[&str]) -> PathBuf {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| PathBuf::from(s.trim()))
        .unwrap_or_default();
    if !sysroot.join("lib/rustlib/wasm32-wasip2").is_dir() {
        eprintln!(
            "error: the wasm32-wasip2 target is not installed for {}; the bundled builder plugins \
             need it.\n  fix: rustup target add wasm32-wasip2",
            sysroot.display()
        );
        std::process::exit(1);
    }

    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("wasm-plugins");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--target", "wasm32-wasip2", "--profile", "wasm", "--target-dir"])
        .arg(&target_dir);
    for p in packages {
        cmd.args(["-p", p]);
    }
    // Reproducible guests: the paths of this machine (the source tree, cargo's registry, the
    // target directory) are remapped, so the same source built elsewhere has the same bytes, the
    // same digest, and rolls no pod. (rustc applies the last matching prefix: most specific last.)
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_default();
    let remaps = [
        (cargo_home.as_path(), "/cargo"),
        (workspace, "/slinky"),
        (target_dir.as_path(), "/target"),
    ];
    let mut rustflags: Vec<String> = remaps
        .iter()
        .filter(|(from, _)| !from.as_os_str().is_empty())
        .map(|(from, to)| format!("--remap-path-prefix={}={to}", from.display()))
        .collect();
    // 2 MiB of initial linear memory (the 1 MiB stack, the data, room for a build's heap): a call
    // never grows memory, which would cost the host an mprotect to grow and another to reset the
    // slot. The scaffold's `.cargo/config.toml` sets the same.
    rustflags.push("-Clink-arg=--initial-memory=2097152".into());
    // The outer build's settings are for the host, not the guests.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\u{1f}"));
    let status = cmd.status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("error: building the wasm plugins {packages:?} failed ({s}); see the cargo output above");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("error: cannot run cargo to build the wasm plugins: {e}");
            std::process::exit(1);
        }
    }
    target_dir.join("wasm32-wasip2").join("wasm")
}
