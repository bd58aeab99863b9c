//! Compiles the test plugins (`tests/plugins/*`) and the example plugin (`examples/gpu-plugin`)
//! for wasm32-wasip2.

include!("../runtime/wasm_build.rs");

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest.parent().map(Path::to_path_buf).unwrap_or(manifest);
    let out = build_wasm_plugins(
        &workspace,
        &[
            "hostile",
            "hostile-children",
            "partial-children",
            "raw",
            "raw-v2",
            "gpu-nodeset-pod",
            "site-pod",
        ],
    );
    println!("cargo:rustc-env=SLINKY_TEST_PLUGIN_DIR={}", out.display());
    println!("cargo:rerun-if-changed=build.rs");
}
