//! `process_*`: the standard process metrics, read from `/proc/self` at each scrape.

use std::fmt;

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{counters, gauges};

/// `process_*`: CPU time, memory, file descriptors and start time, read from `/proc/self`
/// (Linux; nothing elsewhere); help texts have no final period: the encoder adds one.
#[derive(Debug)]
pub(super) struct ProcessCollector;

/// Linux reports CPU time in USER_HZ, which is 100 on every architecture it supports.
const USER_HZ: f64 = 100.0;

#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    start_time: f64,
    open_fds: u64,
    max_fds: u64,
}

fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command (which may contain spaces), from field 3 on.
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15, starttime 22, vsize 23 (1-based, so 11, 12, 19, 20 here).
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(0);
    Some(ProcessStats {
        cpu_seconds: (num(11) + num(12)) as f64 / USER_HZ,
        virtual_bytes: num(20),
        resident_bytes: rss_kib * 1024,
        start_time: boot as f64 + num(19) as f64 / USER_HZ,
        open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
        max_fds,
    })
}

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(p) = process_stats() else {
            return Ok(());
        };
        counters(
            &mut e,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            [(Vec::new(), p.cpu_seconds)],
        )?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                p.start_time,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                p.max_fds as f64,
            ),
        ] {
            gauges(&mut e, name, help, [(Vec::new(), value)])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_stats_are_read_from_proc() {
        let Some(p) = process_stats() else {
            return; // not Linux
        };
        assert!(
            p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes,
            "{p:?}"
        );
        assert!(p.open_fds > 0 && p.max_fds >= p.open_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        assert!(p.start_time > now - 3600.0 && p.start_time <= now + 1.0, "{p:?}");
    }
}
