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
