//! The binary starts and describes itself (this file also makes cargo build the binary that the
//! workspace's end-to-end tests in `tests/` run).

use std::process::Command;

#[test]
fn help_lists_the_commands() {
    let out = Command::new(env!("CARGO_BIN_EXE_slinky-host"))
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run slinky-host: {e}"));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["render", "plugin"] {
        assert!(text.contains(cmd), "--help does not mention {cmd}:\n{text}");
    }
}

#[test]
fn version_reports_the_bundled_plugins_digests() {
    let out = Command::new(env!("CARGO_BIN_EXE_slinky-host"))
        .args(["version", "-o", "json"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run slinky-host: {e}"));
    assert!(out.status.success());
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("version -o json: {e}"));
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["contractVersion"], slinky_host::plugins::CONTRACT_VERSION);
    for (i, kind) in slinky_host::plugins::bundled::KINDS.iter().enumerate() {
        let bytes = slinky_host::plugins::bundled::bundled_bytes(*kind);
        assert_eq!(v["bundledPlugins"][i]["kind"], kind.as_str());
        assert_eq!(
            v["bundledPlugins"][i]["digest"],
            format!("sha256:{}", slinky_host::plugins::digest(bytes))
        );
    }
}

#[test]
fn run_logs_at_info_by_default_and_help_has_examples() {
    let dir = std::env::temp_dir().join(format!("slinky-cli-{}", std::process::id()));
    let kubeconfig = dir.join("kubeconfig");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_slinky-host"))
            .args([
                "run",
                "--embedded",
                "--run-for-seconds",
                "1",
                "--http-addr",
                "127.0.0.1:0",
            ])
            .args(["--admin-addr", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("SLINKY_HOST_LOG_LEVEL")
            .output()
            .unwrap_or_else(|e| panic!("cannot run slinky-host: {e}"))
    };
    let default = run(&[]);
    let stderr = String::from_utf8_lossy(&default.stderr);
    assert!(default.status.success(), "{stderr}");
    assert!(stderr.contains("INFO"), "run logs at info by default:\n{stderr}");
    let quiet = run(&["--log-level", "warn"]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("INFO"));
    let _ = std::fs::remove_dir_all(&dir);
    let help = Command::new(env!("CARGO_BIN_EXE_slinky-host"))
        .args(["run", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run slinky-host: {e}"));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Examples:"));
}
