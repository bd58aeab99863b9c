//! A Python environment for the tests that check our output with other projects' own code: the
//! official Prometheus client's text and OpenMetrics parsers, the ORAS client (oras-py), `cryptography` (cosign 3's signature format made a second way), and Helm (the `helm-python-sdk`
//! wheel embeds Helm's Go code, so `helm lint` and `helm template` run for real without a helm
//! binary, which no package registry here ships). Created once per target directory, from PyPI,
//! with pinned versions.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

/// What the environment holds.
const REQUIREMENTS: &[&str] = &[
    "helm-python-sdk==0.2.2",
    "prometheus-client==0.26.0",
    "oras==0.2.43",
    "cryptography==48.0.0",
];

fn env_dir() -> PathBuf {
    crate::cache_dir()
        .parent()
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
        .join("py-env")
}

/// The environment's `python`, creating the environment first when needed (`python3 -m venv`,
/// then `pip install` of the pinned packages; about 100 MB from PyPI, once).
///
/// # Errors
/// `python3` is missing, or the packages cannot be installed (no network to PyPI).
pub fn python() -> Result<PathBuf> {
    let dir = env_dir();
    let python = dir.join("bin").join("python");
    let marker = dir.join(format!("ready-{}", REQUIREMENTS.join("+")));
    if marker.exists() {
        return Ok(python);
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // One creator at a time across test binaries; the others wait for its marker.
    let lock = dir.with_extension("lock");
    let started = Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(_) => break,
            Err(_) if marker.exists() => return Ok(python),
            Err(_) => {
                let stale = std::fs::metadata(&lock)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600));
                if stale {
                    let _ = std::fs::remove_file(&lock);
                }
                ensure!(
                    started.elapsed() < Duration::from_secs(900),
                    "waited 15 minutes for another test to create {}",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    // A waiter that got the lock just after its creator finished finds the marker: the
    // environment others are using now is never removed and made again under them (a test's
    // import failed midway: "No module named 'attrs'").
    let result = if marker.exists() {
        Ok(())
    } else {
        create(&dir, &python, &marker)
    };
    let _ = std::fs::remove_file(&lock);
    result.map(|()| python)
}

fn create(dir: &Path, python: &Path, marker: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let out = Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir)
        .output()
        .context("cannot run python3 (install Python 3 with its venv module)")?;
    ensure!(
        out.status.success(),
        "python3 -m venv failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(REQUIREMENTS)
        .output()
        .context("cannot run pip")?;
    if !out.status.success() {
        bail!(
            "pip install {} failed (is PyPI reachable?): {}",
            REQUIREMENTS.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(marker, b"")?;
    Ok(())
}

/// Run `tests/python/<script>` with `args` in the environment: its stdout as JSON.
///
/// # Errors
/// The environment cannot be made, or the script failed (its stderr is in the error).
pub fn run_json(script: &str, args: &[&str]) -> Result<serde_json::Value> {
    let python = python()?;
    let path = crate::workspace().join("tests").join("python").join(script);
    let out = Command::new(&python)
        .arg(&path)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", path.display()))?;
    ensure!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).with_context(|| format!("{script} printed no JSON"))
}
