//! Events: the one way the host publishes them ([`Events::publish`]), through kube's
//! [`Recorder`] (`events.k8s.io/v1`).
//!
//! # Guarantees
//! * **Fenced like a write.** An Event is published only while this replica may write
//!   ([`Leadership::fence`]), and its request is bounded by the writes' timeout
//!   ([`Leadership::write_timeout`]). A follower, or a leader that lost the Lease in the middle of
//!   a pass, publishes nothing (`BuilderChanged` after a plugin reload included).
//! * **Within the API's limits.** kube-apiserver refuses an Event whose note is over 1,024 bytes
//!   (`message: Invalid value: "": can have at most 1024 characters`; Go's `len` counts bytes) or
//!   whose reason or action is over 128. Every note is capped ([`cap_note`]) and lists of names
//!   are written with [`name_list`] (a few names, then "and N more").
//! * Every Event is counted as a write of verb `event` (`ok`, `not_leader`, `timeout`, `error`);
//!   one the API server refused is also logged as a warning. A failed Event never fails a pass.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use super::{Leadership, writer};
use crate::metrics::WriteMetrics;

/// The most bytes kube-apiserver accepts in an Event's note (`NoteLengthLimit`).
pub const NOTE_LIMIT: usize = 1024;
/// The most bytes kube-apiserver accepts in an Event's reason and action.
pub const REASON_LIMIT: usize = 128;
/// How many names [`name_list`] shows before counting the rest.
pub const NAMES_SHOWN: usize = 5;

/// What ends a cut note.
const CUT: &str = " …";

/// `a, b, c, d, e and 7 more`: the first [`NAMES_SHOWN`] names, then how many are left.
pub fn name_list<S: AsRef<str>>(names: &[S]) -> String {
    let shown: Vec<&str> = names.iter().take(NAMES_SHOWN).map(AsRef::as_ref).collect();
    let mut list = shown.join(", ");
    let rest = names.len().saturating_sub(NAMES_SHOWN);
    if rest > 0 {
        list.push_str(&format!(" and {rest} more"));
    }
    list
}

/// `text` cut to at most `limit` bytes at a character boundary (never inside a UTF-8 sequence),
/// ending in ` …` when it was cut.
fn cap(mut text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit.saturating_sub(CUT.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(CUT);
    text
}

/// A note the API server accepts: at most [`NOTE_LIMIT`] bytes, cut at a character boundary and
/// ending in ` …` when longer.
pub fn cap_note(note: String) -> String {
    cap(note, NOTE_LIMIT)
}

/// The Event publisher: fenced, bounded in time, within the API's limits, counted.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    leader: Leadership,
    metrics: Arc<WriteMetrics>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// A publisher reporting as `reporter`, publishing only while `leader` says so, counting into
    /// `metrics`.
    pub fn new(client: Client, reporter: Reporter, leader: Leadership, metrics: Arc<WriteMetrics>) -> Self {
        Events {
            recorder: Recorder::new(client, reporter),
            leader,
            metrics,
        }
    }

    /// Publish an Event on `obj` (about `related`, when given), if this replica may write now
    /// (failures are logged and counted, never returned).
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if let Err(error) = self.leader.fence() {
            self.metrics.record("event", "not_leader");
            tracing::debug!(%error, reason, "Event not published");
            return;
        }
        let ev = Event {
            type_,
            reason: cap(reason.to_string(), REASON_LIMIT),
            note: Some(cap_note(note)),
            action: cap(action.to_string(), REASON_LIMIT),
            secondary: related,
        };
        let r = writer::bounded(
            self.leader.write_timeout(),
            self.recorder.publish(&ev, &obj.object_ref(&())),
        )
        .await;
        self.metrics.record("event", writer::outcome(&r));
        if let Err(error) = r {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_name_a_few_and_count_the_rest() {
        assert_eq!(name_list::<&str>(&[]), "");
        assert_eq!(name_list(&["a", "b"]), "a, b");
        assert_eq!(name_list(&["a", "b", "c", "d", "e"]), "a, b, c, d, e");
        let many: Vec<String> = (0..1000).map(|i| format!("slurm-worker-slinky-{i}")).collect();
        assert_eq!(
            name_list(&many),
            "slurm-worker-slinky-0, slurm-worker-slinky-1, slurm-worker-slinky-2, \
             slurm-worker-slinky-3, slurm-worker-slinky-4 and 995 more"
        );
    }

    #[test]
    fn notes_are_capped_in_bytes_at_a_character_boundary() {
        assert_eq!(cap_note("short".into()), "short");
        let exact = "é".repeat(512);
        assert_eq!(cap_note(exact.clone()), exact, "1024 bytes fit");
        // Two-byte characters: the cut cannot fall inside one.
        let long = format!("x{}", "é".repeat(600));
        let capped = cap_note(long.clone());
        assert!(capped.len() <= NOTE_LIMIT, "{} bytes", capped.len());
        assert!(capped.ends_with(" …"));
        assert!(long.starts_with(capped.trim_end_matches(" …")));
        // Three- and four-byte characters too, at every offset.
        for pad in 0..4 {
            let text = format!("{}{}", "a".repeat(pad), "語🦀".repeat(300));
            let capped = cap_note(text.clone());
            assert!(capped.len() <= NOTE_LIMIT && capped.len() > NOTE_LIMIT - 8);
            assert!(text.starts_with(capped.trim_end_matches(" …")));
        }
        assert_eq!(cap("R".repeat(200), REASON_LIMIT).len(), REASON_LIMIT);
    }
}
