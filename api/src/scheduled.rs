//! `updateStrategy.scheduledUpdate`: the maintenance window of a NodeSet whose update strategy is
//! `ScheduledUpdate` (Slinky's `ScheduledUpdateNodeSetStrategy`), checked and turned into the
//! times and flags of its Slurm reservation.
//!
//! # Rules
//! * `startTime` is an RFC 3339 time (as Kubernetes writes a `metav1.Time`); it is required.
//! * `duration` is a Go duration (`30m`, `1h30m`, `90s`; default `30m`) of at least a minute and
//!   at most a year.
//! * `flags` are Slurm reservation flags added to `MAINT` and `IGNORE_JOBS` (always set, as
//!   Slinky), case-insensitive. A recurring flag (`HOURLY`, `DAILY`, `WEEKLY`, `WEEKDAY`,
//!   `WEEKEND`; at most one) makes the window recur as Slurm repeats the reservation: `startTime`
//!   is its first occurrence, each lasts `duration` (no longer than the step between two), and
//!   the window the host works with is the occurrence open now or the next one ([`Window::at`]).
//!   Flags that would make Slurm's reservation differ from the declared window are refused (a
//!   spec problem naming the flag), never ignored: a floating start (`TIME_FLOAT`), another node
//!   selection (`ANY_NODES`, `PART_NODES`, `ALL_NODES`), purging (`PURGE_COMP`), `NO_MAINT`.

use k8s_openapi::jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{NodeSet, UpdateStrategyType, checks::SpecProblem};

/// The default `duration` (Slinky's).
pub const DEFAULT_DURATION: &str = "30m";
/// The flags every maintenance reservation of the host has (Slinky's).
pub const REQUIRED_FLAGS: [&str; 2] = ["MAINT", "IGNORE_JOBS"];
/// The flags a user may add: they leave the reservation one window over the NodeSet's nodes.
pub const ALLOWED_FLAGS: [&str; 8] = [
    "MAINT",
    "IGNORE_JOBS",
    "OVERLAP",
    "FLEX",
    "MAGNETIC",
    "STATIC",
    "USER_DELETE",
    "NO_HOLD_JOBS_AFTER_END",
];
/// The recurring flags (Slurm repeats the reservation) and the step between two occurrences:
/// `WEEKDAY` and `WEEKEND` recur daily, on the days they name (Monday to Friday, Saturday and
/// Sunday; days as slurmctld's clock has them, UTC in Slinky's images).
pub const RECURRING_FLAGS: [(&str, i64); 5] = [
    ("HOURLY", 3600),
    ("DAILY", 86_400),
    ("WEEKLY", 7 * 86_400),
    ("WEEKDAY", 86_400),
    ("WEEKEND", 86_400),
];

/// The shortest window.
pub const MIN_DURATION_SECS: i64 = 60;
/// The longest window (Slurm's "infinite" reservation is a year).
pub const MAX_DURATION_SECS: i64 = 365 * 24 * 3600;

/// Scheduled update parameters: the window in which old pods are replaced, kept as a Slurm
/// maintenance reservation over the NodeSet's nodes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledUpdate {
    /// When the window begins: an RFC 3339 time, e.g. `2025-06-01T02:00:00Z`. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub start_time: Option<String>,
    /// How long the window lasts: a Go duration such as `30m` or `2h` (default `30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "30m"))]
    pub duration: Option<String>,
    /// Slurm reservation flags added to `MAINT` and `IGNORE_JOBS`: `OVERLAP`, `FLEX`,
    /// `MAGNETIC`, `STATIC`, `USER_DELETE` or `NO_HOLD_JOBS_AFTER_END`, and at most one of
    /// `HOURLY`, `DAILY`, `WEEKLY`, `WEEKDAY` or `WEEKEND` for a window that recurs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
}

/// A checked window: Unix seconds and the reservation's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// When it begins (Unix seconds).
    pub start: i64,
    /// When it ends (Unix seconds).
    pub end: i64,
    /// The reservation's flags: upper case, sorted, without duplicates, `MAINT` and
    /// `IGNORE_JOBS` included.
    pub flags: Vec<String>,
    /// Its recurring flag, when it recurs (see [`RECURRING_FLAGS`]).
    pub recurs: Option<&'static str>,
}

impl Window {
    /// The window has begun and not ended at `now` (Unix seconds).
    pub fn is_open(&self, now: i64) -> bool {
        self.start <= now && now < self.end
    }

    /// The window has ended at `now` (a recurring one never has).
    pub fn is_over(&self, now: i64) -> bool {
        self.recurs.is_none() && now >= self.end
    }

    /// The occurrence of a recurring window open at `now`, or the next one (the window itself
    /// when it does not recur). Pure.
    pub fn at(&self, now: i64) -> Window {
        let Some((flag, step)) = self
            .recurs
            .and_then(|r| RECURRING_FLAGS.iter().find(|(f, _)| *f == r).copied())
        else {
            return self.clone();
        };
        let length = self.end - self.start;
        // The latest occurrence begun by `now`, then forward to one that is open or to come
        // and falls on a day the flag names (at most a week of daily steps).
        let first = if now < self.start {
            0
        } else {
            (now - self.start) / step
        };
        for k in first..first + 8 {
            let start = self.start + k * step;
            let day = (start.div_euclid(86_400) + 4) % 7; // 0 = Sunday (1970-01-01 was a Thursday)
            let on_day = match flag {
                "WEEKDAY" => (1..=5).contains(&day),
                "WEEKEND" => day == 0 || day == 6,
                _ => true,
            };
            if on_day && start + length > now {
                return Window {
                    start,
                    end: start + length,
                    ..self.clone()
                };
            }
        }
        self.clone()
    }
}

const FIELD: &str = "spec.updateStrategy.scheduledUpdate";

impl ScheduledUpdate {
    /// The window, or what is wrong with it (each problem naming its field).
    ///
    /// # Errors
    /// A missing or unreadable `startTime`, an unreadable, too short or too long `duration`,
    /// a flag that is not accepted.
    pub fn window(&self) -> Result<Window, Vec<SpecProblem>> {
        let mut problems = Vec::new();
        let start = match self.start_time.as_deref().map(str::trim) {
            None | Some("") => {
                problems.push(SpecProblem::new(
                    format!("{FIELD}.startTime"),
                    "is required when spec.updateStrategy.type is ScheduledUpdate: give the start of the \
                     maintenance window as an RFC 3339 time, e.g. 2025-06-01T02:00:00Z",
                ));
                None
            }
            Some(s) => match s.parse::<Timestamp>() {
                Ok(t) => Some(t.as_second()),
                Err(e) => {
                    problems.push(SpecProblem::new(
                        format!("{FIELD}.startTime"),
                        format!("{s:?} is not an RFC 3339 time ({e}): use e.g. 2025-06-01T02:00:00Z"),
                    ));
                    None
                }
            },
        };
        let text = self
            .duration
            .as_deref()
            .map(str::trim)
            .unwrap_or(DEFAULT_DURATION);
        let secs = match parse_go_duration(text) {
            Ok(d) if !(MIN_DURATION_SECS..=MAX_DURATION_SECS).contains(&d) => {
                problems.push(SpecProblem::new(
                    format!("{FIELD}.duration"),
                    format!("{text:?} is not between 1m and 8760h (a year): give the window's length, e.g. 30m or 2h"),
                ));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(SpecProblem::new(
                    format!("{FIELD}.duration"),
                    format!("{text:?} is not a duration ({e}): use e.g. 30m, 1h30m or 2h"),
                ));
                None
            }
        };
        let mut flags: Vec<String> = REQUIRED_FLAGS.iter().map(|f| f.to_string()).collect();
        let mut recurs: Option<(&'static str, i64)> = None;
        for (i, f) in self.flags.iter().flatten().enumerate() {
            let upper = f.trim().to_ascii_uppercase();
            if let Some(&(flag, step)) = RECURRING_FLAGS.iter().find(|(r, _)| *r == upper) {
                match recurs {
                    Some((other, _)) if other != flag => problems.push(SpecProblem::new(
                        format!("{FIELD}.flags[{i}]"),
                        format!("{f:?}: the window already recurs {other}; give one recurring flag"),
                    )),
                    _ => {
                        recurs = Some((flag, step));
                        flags.push(upper);
                    }
                }
            } else if ALLOWED_FLAGS.contains(&upper.as_str()) {
                flags.push(upper);
            } else {
                problems.push(SpecProblem::new(
                    format!("{FIELD}.flags[{i}]"),
                    format!(
                        "{f:?} is not accepted: the reservation is the declared window over the \
                         NodeSet's nodes (floating, node-selecting and purging flags would change \
                         that); use {}, or one of {}",
                        ALLOWED_FLAGS[2..].join(", "),
                        RECURRING_FLAGS.map(|(f, _)| f).join(", ")
                    ),
                ));
            }
        }
        flags.sort();
        flags.dedup();
        if let (Some((flag, step)), Some(secs)) = (recurs, secs)
            && secs > step
        {
            problems.push(SpecProblem::new(
                format!("{FIELD}.duration"),
                format!("{text:?} is longer than the {step} s between two {flag} windows: shorten it"),
            ));
        }
        match (start, secs) {
            (Some(start), Some(secs)) if problems.is_empty() => Ok(Window {
                start,
                end: start.saturating_add(secs),
                flags,
                recurs: recurs.map(|(f, _)| f),
            }),
            _ => Err(problems),
        }
    }
}

impl NodeSet {
    /// Whether the update strategy is `ScheduledUpdate`.
    pub fn is_scheduled_update(&self) -> bool {
        self.spec
            .update_strategy
            .as_ref()
            .is_some_and(|s| s.type_ == UpdateStrategyType::ScheduledUpdate)
    }

    /// The maintenance window of a `ScheduledUpdate` NodeSet: `None` for another strategy.
    ///
    /// # Errors
    /// What is wrong with `scheduledUpdate` (see [`ScheduledUpdate::window`]).
    pub fn maintenance_window(&self) -> Option<Result<Window, Vec<SpecProblem>>> {
        if !self.is_scheduled_update() {
            return None;
        }
        let s = self
            .spec
            .update_strategy
            .as_ref()
            .and_then(|s| s.scheduled_update.clone())
            .unwrap_or_default();
        Some(s.window())
    }

    /// The problems of `scheduledUpdate` (none for another strategy).
    pub(crate) fn scheduled_update_problems(&self) -> Vec<SpecProblem> {
        match self.maintenance_window() {
            Some(Err(problems)) => problems,
            _ => Vec::new(),
        }
    }

    /// The name of the NodeSet's Slurm maintenance reservation: `SlurmOperatorMaint-<nodeset>`
    /// (Slinky's).
    pub fn reservation_name(&self) -> String {
        format!(
            "SlurmOperatorMaint-{}",
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

/// A Go duration (`time.ParseDuration`: `300ms`, `1.5h`, `2h45m`, `0`) in whole seconds (a
/// fraction of a second is dropped).
///
/// # Errors
/// What is wrong: a sign, a missing or unknown unit, no number.
pub fn parse_go_duration(s: &str) -> Result<i64, String> {
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err("empty".into());
    }
    if s.starts_with('-') || s.starts_with('+') {
        return Err("a window's length has no sign".into());
    }
    let mut nanos: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("{number:?} has no unit (use ns, us, ms, s, m or h)")),
            other => return Err(format!("unknown unit {other:?} (use ns, us, ms, s, m or h)")),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| format!("{number:?} is too large"))?
        };
        let mut part = whole.checked_mul(scale).ok_or("too large")?;
        let mut divisor: u128 = 1;
        for d in fraction.chars().take(18) {
            divisor *= 10;
            let digit = u128::from(d.to_digit(10).unwrap_or(0));
            part = part.checked_add(digit * scale / divisor).ok_or("too large")?;
        }
        nanos = nanos.checked_add(part).ok_or("too large")?;
        rest = next;
    }
    i64::try_from(nanos / 1_000_000_000).map_err(|_| "too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(start: Option<&str>, duration: Option<&str>, flags: &[&str]) -> ScheduledUpdate {
        ScheduledUpdate {
            start_time: start.map(String::from),
            duration: duration.map(String::from),
            flags: (!flags.is_empty()).then(|| flags.iter().map(|f| f.to_string()).collect()),
        }
    }

    fn fields(r: Result<Window, Vec<SpecProblem>>) -> Vec<String> {
        r.err().unwrap_or_default().into_iter().map(|p| p.field).collect()
    }

    #[test]
    fn go_durations_as_kubernetes_writes_them() {
        assert_eq!(parse_go_duration("30m"), Ok(1800));
        assert_eq!(parse_go_duration("30m0s"), Ok(1800));
        assert_eq!(parse_go_duration("1h30m"), Ok(5400));
        assert_eq!(parse_go_duration("1.5h"), Ok(5400));
        assert_eq!(parse_go_duration("90s"), Ok(90));
        assert_eq!(parse_go_duration("1500ms"), Ok(1));
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert!(parse_go_duration("30").is_err(), "a unit is required");
        assert!(parse_go_duration("30 m").is_err());
        assert!(parse_go_duration("thirty minutes").is_err());
        assert!(parse_go_duration("-30m").is_err());
        assert!(parse_go_duration("1d").is_err(), "Go has no days");
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("99999999999999999999999h").is_err());
    }

    #[test]
    fn the_window_is_start_plus_duration_default_30m() -> Result<(), Vec<SpecProblem>> {
        let w = sched(Some("2025-06-01T02:00:00Z"), None, &[]).window()?;
        assert_eq!(w.start, 1_748_743_200);
        assert_eq!(w.end - w.start, 1800);
        assert_eq!(w.flags, ["IGNORE_JOBS", "MAINT"]);
        let w = sched(
            Some("2025-06-01T04:00:00+02:00"),
            Some("2h"),
            &["flex", "MAINT", "Overlap"],
        )
        .window()?;
        assert_eq!(w.start, 1_748_743_200, "an offset is honoured");
        assert_eq!(w.end - w.start, 7200);
        assert_eq!(w.flags, ["FLEX", "IGNORE_JOBS", "MAINT", "OVERLAP"]);
        assert!(w.is_open(w.start) && w.is_open(w.end - 1));
        assert!(!w.is_open(w.start - 1) && !w.is_open(w.end) && w.is_over(w.end));
        Ok(())
    }

    #[test]
    fn each_problem_names_its_field() {
        assert_eq!(
            fields(sched(None, None, &[]).window()),
            ["spec.updateStrategy.scheduledUpdate.startTime"]
        );
        assert_eq!(
            fields(sched(Some("tomorrow at 2"), Some("2 hours"), &[]).window()),
            [
                "spec.updateStrategy.scheduledUpdate.startTime",
                "spec.updateStrategy.scheduledUpdate.duration"
            ]
        );
        assert_eq!(
            fields(sched(Some("2025-06-01T02:00:00Z"), Some("30s"), &[]).window()),
            ["spec.updateStrategy.scheduledUpdate.duration"],
            "shorter than a minute"
        );
        assert_eq!(
            fields(
                sched(
                    Some("2025-06-01T02:00:00Z"),
                    None,
                    &["FLEX", "DAILY", "TIME_FLOAT", "hourly"]
                )
                .window()
            ),
            [
                "spec.updateStrategy.scheduledUpdate.flags[2]",
                "spec.updateStrategy.scheduledUpdate.flags[3]"
            ],
            "a floating start; a second recurring flag"
        );
        assert_eq!(
            fields(sched(Some("2025-06-01T02:00:00Z"), Some("2h"), &["HOURLY"]).window()),
            ["spec.updateStrategy.scheduledUpdate.duration"],
            "longer than an hour, hourly"
        );
    }

    #[test]
    fn a_recurring_window_is_the_occurrence_open_now_or_the_next() -> Result<(), Vec<SpecProblem>> {
        // Sunday 2025-06-01 02:00 UTC, 30 minutes.
        let first = 1_748_743_200;
        let daily = sched(Some("2025-06-01T02:00:00Z"), None, &["daily"]).window()?;
        assert_eq!(daily.recurs, Some("DAILY"));
        assert!(daily.flags.contains(&"DAILY".to_string()));
        assert!(
            !daily.is_over(first + 10 * 86_400),
            "a recurring window is never over"
        );
        let at = |w: &Window, now: i64| {
            let o = w.at(now);
            (o.start - first, o.end - o.start)
        };
        assert_eq!(at(&daily, first - 5), (0, 1800), "before the first: the first");
        assert_eq!(at(&daily, first + 60), (0, 1800), "open now");
        assert_eq!(at(&daily, first + 1800), (86_400, 1800), "just ended: the next");
        assert_eq!(at(&daily, first + 3 * 86_400 + 100), (3 * 86_400, 1800));
        let hourly = sched(Some("2025-06-01T02:00:00Z"), Some("10m"), &["HOURLY"]).window()?;
        assert_eq!(at(&hourly, first + 7 * 3600 + 601), (8 * 3600, 600));
        // WEEKDAY skips Saturday and Sunday: from Sunday the 1st, Monday the 2nd; from Friday
        // the 6th after its window, Monday the 9th.
        let weekday = sched(Some("2025-06-01T02:00:00Z"), None, &["WEEKDAY"]).window()?;
        assert_eq!(at(&weekday, first - 5), (86_400, 1800));
        assert_eq!(at(&weekday, first + 5 * 86_400 + 1800), (8 * 86_400, 1800));
        let weekend = sched(Some("2025-06-01T02:00:00Z"), None, &["WEEKEND"]).window()?;
        assert_eq!(
            at(&weekend, first + 1800),
            (6 * 86_400, 1800),
            "Sunday, then Saturday the 7th"
        );
        let once = sched(Some("2025-06-01T02:00:00Z"), None, &[]).window()?;
        assert_eq!(
            at(&once, first + 86_400),
            (0, 1800),
            "a one-off window stays itself"
        );
        Ok(())
    }
}
