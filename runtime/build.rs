//! Compiles the bundled plugins (`plugins/*`) for wasm32-wasip2 and hands their paths to the
//! crate, which embeds them with `include_bytes!`.

include!("wasm_build.rs");

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest.parent().map(Path::to_path_buf).unwrap_or(manifest);
    let out = build_wasm_plugins(
        &workspace,
        &[
            "controller-service",
            "nodeset-pod",
            "controller-children",
            "nodeset-children",
            "restapi-children",
            "loginset-children",
            "accounting-children",
        ],
    );
    for (var, file) in [
        ("SLINKY_BUNDLED_CONTROLLER_SERVICE", "controller_service.wasm"),
        ("SLINKY_BUNDLED_NODESET_POD", "nodeset_pod.wasm"),
        ("SLINKY_BUNDLED_CONTROLLER_CHILDREN", "controller_children.wasm"),
        ("SLINKY_BUNDLED_NODESET_CHILDREN", "nodeset_children.wasm"),
        ("SLINKY_BUNDLED_RESTAPI_CHILDREN", "restapi_children.wasm"),
        ("SLINKY_BUNDLED_LOGINSET_CHILDREN", "loginset_children.wasm"),
        ("SLINKY_BUNDLED_ACCOUNTING_CHILDREN", "accounting_children.wasm"),
    ] {
        let path = out.join(file);
        println!("cargo:rustc-env={var}={}", path.display());
        // Its sha256, as `slinky_runtime::digest` gives it (an unreadable file fails at
        // `include_bytes!` with its path).
        use sha2::Digest as _;
        let digest = std::fs::read(&path)
            .map(|b| hex::encode(sha2::Sha256::digest(&b)))
            .unwrap_or_default();
        println!("cargo:rustc-env={var}_SHA256={digest}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wasm_build.rs");
}
