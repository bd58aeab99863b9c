//! Guests' log lines (the contract's `log` import, 0.3.0 on): kept per call in the call's store
//! (at most [`LINES_PER_CALL`], each cut to [`LINE_BYTES`]), then written to the host's log with
//! the plugin's name, version, digest and call, under a per-plugin rate limit, and counted by
//! plugin and level (what `/metrics` serves).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::Instant,
};

/// Lines one call may log; the rest are dropped (and counted).
pub const LINES_PER_CALL: usize = 32;
/// Bytes of one line kept (cut at a character boundary).
pub const LINE_BYTES: usize = 1024;
/// Lines a second one plugin may log, on average.
pub const LINES_PER_SECOND: f64 = 50.0;
/// Lines one plugin may log at once after a quiet spell.
pub const BURST: f64 = 200.0;

pub use slinky_api::contract::LogLevel as Level;

/// The lines of one call, bounded.
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    lines: Vec<(Level, String)>,
    dropped: u64,
}

impl CallLog {
    /// Keep a line (cut to [`LINE_BYTES`]), or count it dropped past [`LINES_PER_CALL`].
    pub(crate) fn push(&mut self, level: Level, mut message: String) {
        if self.lines.len() >= LINES_PER_CALL {
            self.dropped += 1;
            return;
        }
        if message.len() > LINE_BYTES {
            let mut end = LINE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        self.lines.push((level, message));
    }
}

/// One plugin's rate limit and counts.
#[derive(Debug)]
struct PluginLog {
    tokens: f64,
    refilled: Instant,
    lines: BTreeMap<Level, u64>,
    dropped: u64,
}

/// What one plugin logged so far (`/metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCounts {
    /// The plugin's name.
    pub plugin: String,
    /// Lines written, by level.
    pub lines: BTreeMap<Level, u64>,
    /// Lines dropped (past a call's cap or the rate limit).
    pub dropped: u64,
}

/// Every plugin's log state on one engine, by plugin name.
#[derive(Debug, Default)]
pub(crate) struct GuestLogs {
    plugins: Mutex<HashMap<String, PluginLog>>,
}

impl GuestLogs {
    /// Write a call's lines to the host's log (within the plugin's rate limit) and count them.
    pub(crate) fn emit(&self, name: &str, label: &str, digest: &str, call: &str, log: CallLog) {
        if log.lines.is_empty() && log.dropped == 0 {
            return;
        }
        let now = Instant::now();
        let mut written = Vec::new();
        let mut guard = match self.plugins.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let state = guard.entry(name.to_string()).or_insert_with(|| PluginLog {
            tokens: BURST,
            refilled: now,
            lines: BTreeMap::new(),
            dropped: 0,
        });
        let elapsed = now.duration_since(state.refilled).as_secs_f64();
        state.tokens = (state.tokens + elapsed * LINES_PER_SECOND).min(BURST);
        state.refilled = now;
        state.dropped += log.dropped;
        for (level, message) in log.lines {
            if state.tokens < 1.0 {
                state.dropped += 1;
                continue;
            }
            state.tokens -= 1.0;
            *state.lines.entry(level).or_default() += 1;
            written.push((level, message));
        }
        drop(guard);
        let digest = digest.get(..12).unwrap_or(digest);
        for (level, line) in written {
            match level {
                Level::Trace => tracing::trace!(plugin = label, digest, call, "guest: {line}"),
                Level::Debug => tracing::debug!(plugin = label, digest, call, "guest: {line}"),
                Level::Info => tracing::info!(plugin = label, digest, call, "guest: {line}"),
                Level::Warn => tracing::warn!(plugin = label, digest, call, "guest: {line}"),
                Level::Error => tracing::error!(plugin = label, digest, call, "guest: {line}"),
            }
        }
    }

    /// What every plugin logged so far, by name.
    pub(crate) fn counts(&self) -> Vec<LogCounts> {
        let guard = match self.plugins.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut out: Vec<LogCounts> = guard
            .iter()
            .map(|(plugin, s)| LogCounts {
                plugin: plugin.clone(),
                lines: s.lines.clone(),
                dropped: s.dropped,
            })
            .collect();
        out.sort_by(|a, b| a.plugin.cmp(&b.plugin));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_keeps_its_first_lines_cut_to_size() {
        let mut log = CallLog::default();
        for i in 0..LINES_PER_CALL + 5 {
            log.push(Level::Info, format!("line {i}"));
        }
        assert_eq!((log.lines.len(), log.dropped), (LINES_PER_CALL, 5));
        let mut long = CallLog::default();
        long.push(Level::Warn, "é".repeat(LINE_BYTES));
        assert!(long.lines[0].1.len() <= LINE_BYTES + '…'.len_utf8());
        assert!(long.lines[0].1.ends_with('…'));
    }

    #[test]
    fn a_flooding_plugin_is_limited_and_counted() {
        let logs = GuestLogs::default();
        let calls = 20; // 20 × 32 lines at once: past the burst.
        for _ in 0..calls {
            let mut log = CallLog::default();
            for _ in 0..LINES_PER_CALL {
                log.push(Level::Debug, "x".into());
            }
            logs.emit("p", "p@1", "0123456789abcdef", "build-pod", log);
        }
        let counts = logs.counts();
        let written = counts[0].lines.get(&Level::Debug).copied().unwrap_or(0);
        assert!(
            (BURST as u64..=BURST as u64 + 5).contains(&written),
            "{written} written"
        );
        assert_eq!(written + counts[0].dropped, (calls * LINES_PER_CALL) as u64);
    }
}
