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
        // A copy of this build's own, embedded and hashed: the guests' directory is shared by
        // every profile, and another build could rewrite a file between the hash and
        // `include_bytes!`. Its sha256 is hex, as `slinky_runtime::digest` gives it.
        let copy = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join(file);
        let bytes = std::fs::read(out.join(file)).unwrap_or_else(|e| {
            eprintln!("cannot read the bundled plugin {}: {e}", out.join(file).display());
            std::process::exit(1);
        });
        if let Err(e) = std::fs::write(&copy, &bytes) {
            eprintln!("cannot write {}: {e}", copy.display());
            std::process::exit(1);
        }
        use sha2::Digest as _;
        let digest = hex::encode(sha2::Sha256::digest(&bytes));
        println!("cargo:rustc-env={var}={}", copy.display());
        println!("cargo:rustc-env={var}_SHA256={digest}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wasm_build.rs");
}
