//! Logging setup: `tracing` to stderr, as text or JSON, filtered by `RUST_LOG` or `--log-level`.

use tracing_subscriber::{EnvFilter, fmt};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Install the global subscriber. `RUST_LOG` wins over `level` when set. Colours only when
/// stderr is a terminal (a log file or a container's log has none).
pub fn init(level: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
