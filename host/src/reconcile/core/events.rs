//! Events: the one way the host publishes them ([`Events::publish`]), as `events.k8s.io/v1`
//! Events it creates and counts itself.
//!
//! # Guarantees
//! * **One Event for each thing that happened, one for each repeat of it.** An Event identical to
//!   one this host published within the last [`SERIES_TTL`] (same regarding and related object,
//!   type, reason, action and note) is not a new Event: the one published is patched, its `series`
//!   counting the repeats (`count` 2, 3, …, `lastObservedTime`), as client-go's correlator folds
//!   identical Events. An Event that differs in any of these, its note included, is a new Event
//!   with its own note. (kube's `Recorder` keyed its series without the note, so a second
//!   `Created pods: …` on a NodeSet within 6 minutes showed the first one's pods, counted 2.)
//! * **Bounded memory.** The series are remembered by a SHA-256 digest of what identifies them
//!   (not the note itself), at most [`SERIES_LIMIT`] at once, each for [`SERIES_TTL`] after its last
//!   repeat; when full, the one repeated least recently is forgotten (its next repeat is a new
//!   Event). Repeats of one series are published one at a time, so each count is one more.
//! * **Fenced like a write.** An Event is published only while this replica may write
//!   ([`Leadership::fence`]), and its requests are bounded by the writes' timeout
//!   ([`Leadership::write_timeout`]). A follower, or a leader that lost the Lease in the middle of
//!   a pass, publishes nothing (`BuilderChanged` after a plugin reload included).
//! * **Within the API's limits.** kube-apiserver refuses an Event whose note is over 1,024 bytes
//!   (`message: Invalid value: "": can have at most 1024 characters`; Go's `len` counts bytes) or
//!   whose reason or action is over 128. Every note is capped ([`cap_note`]) and lists of names
//!   are written with [`name_list`] (a few names, then "and N more"); an Event's name (its
//!   object's, then a unique timestamp) is at most 253 bytes, a DNS subdomain.
//! * Every Event is counted as a write of verb `event` (`ok`, `not_leader`, `timeout`, `error`);
//!   one the API server refused is also logged as a warning. A failed Event never fails a pass.
//!   A repeat whose Event is gone from the API server (deleted, or expired: kube-apiserver keeps
//!   Events an hour) is published as a new Event.
//!
//! RBAC: `create` and `patch` on `events.k8s.io` `events`, as for kube's `Recorder`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{EventType, Reporter},
};
use sha2::{Digest, Sha256};

use super::{leader::Leadership, writer};
use crate::metrics::WriteMetrics;

/// How long a series is remembered after its last repeat (kube's `Recorder`: 6 minutes).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// The most series remembered at once (client-go's correlator keeps 4,096).
pub const SERIES_LIMIT: usize = 4096;
/// The longest object name kube-apiserver accepts for an Event (a DNS subdomain).
const NAME_LIMIT: usize = 253;

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

/// What identifies a series: a SHA-256 digest of the regarding and related objects, the type,
/// reason, action and note (each field length-prefixed, so no two differing Events share one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key([u8; 32]);

impl Key {
    fn new(
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
        type_: &str,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Self {
        fn field(h: &mut Sha256, s: &str) {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        fn reference(h: &mut Sha256, r: Option<&ObjectReference>) {
            let Some(r) = r else {
                h.update([0]);
                return;
            };
            h.update([1]);
            for f in [&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid] {
                field(h, f.as_deref().unwrap_or_default());
            }
        }
        let mut h = Sha256::new();
        reference(&mut h, Some(regarding));
        reference(&mut h, related);
        for f in [type_, reason, action, note] {
            field(&mut h, f);
        }
        Key(h.finalize().into())
    }
}

/// The Event published for a series, as far as this host knows.
#[derive(Debug)]
struct Published {
    /// Its name (in the regarding object's namespace).
    name: String,
    /// Its `series.count` (1: published once, no series yet).
    count: i32,
}

/// One remembered series: when it was last published, and its Event (`None` until one was
/// created). Its lock is held while its Event is written, so repeats are counted one at a time.
struct Slot {
    seen: Instant,
    published: Arc<tokio::sync::Mutex<Option<Published>>>,
}

/// The series remembered, and the last timestamp given to an Event's name.
#[derive(Default)]
struct State {
    slots: HashMap<Key, Slot>,
    last_stamp: i128,
}

/// The series cache: at most [`SERIES_LIMIT`] series, each for [`SERIES_TTL`] after its last
/// repeat.
#[derive(Default)]
struct Series {
    state: Mutex<State>,
}

impl Series {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of `key` at `now`: the remembered one (if repeated within [`SERIES_TTL`]) or a
    /// new, empty one, forgetting the expired and, when full, the least recently repeated.
    fn slot(&self, key: Key, now: Instant) -> Arc<tokio::sync::Mutex<Option<Published>>> {
        let mut state = self.lock();
        if let Some(slot) = state.slots.get_mut(&key)
            && now.saturating_duration_since(slot.seen) < SERIES_TTL
        {
            slot.seen = now;
            return slot.published.clone();
        }
        state
            .slots
            .retain(|_, s| now.saturating_duration_since(s.seen) < SERIES_TTL);
        if state.slots.len() >= SERIES_LIMIT
            && let Some(oldest) = state.slots.iter().min_by_key(|(_, s)| s.seen).map(|(k, _)| *k)
        {
            state.slots.remove(&oldest);
        }
        let published = Arc::default();
        state.slots.insert(
            key,
            Slot {
                seen: now,
                published: Arc::clone(&published),
            },
        );
        published
    }

    /// How many series are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// A timestamp for a new Event's name at `now`, in nanoseconds: later than every one given
    /// before, so two Events of one object never share a name.
    fn stamp(&self, now: Timestamp) -> i128 {
        let mut state = self.lock();
        state.last_stamp = now.as_nanosecond().max(state.last_stamp + 1);
        state.last_stamp
    }
}

/// A merge patch of an Event's series.
#[derive(Debug, serde::Serialize)]
struct SeriesPatch {
    series: EventSeries,
}

/// `<object>.<stamp in hex>`, at most [`NAME_LIMIT`] bytes: the object's name cut (at a
/// character boundary, without a trailing `-` or `.`) to leave room for the stamp.
fn event_name(object: &str, stamp: i128) -> String {
    let suffix = format!(".{stamp:x}");
    let room = NAME_LIMIT.saturating_sub(suffix.len());
    let base = object[..object.floor_char_boundary(room)].trim_end_matches(['-', '.']);
    format!("{base}{suffix}")
}

/// The Event publisher: fenced, bounded in time, within the API's limits, counted, one Event per
/// distinct note and a series for its repeats.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Arc<Reporter>,
    series: Arc<Series>,
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
            client,
            reporter: Arc::new(reporter),
            series: Arc::default(),
            leader,
            metrics,
        }
    }

    /// Publish an Event on `obj` (about `related`, when given), if this replica may write now:
    /// a new Event, or a repeat of an identical one counted in its series (failures are logged
    /// and counted, never returned).
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
        let r = writer::bounded(
            self.leader.write_timeout(),
            self.write(
                obj.object_ref(&()),
                related,
                type_,
                cap(reason.to_string(), REASON_LIMIT),
                cap(action.to_string(), REASON_LIMIT),
                cap_note(note),
            ),
        )
        .await;
        self.metrics.record("event", writer::outcome(&r));
        if let Err(error) = r {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }

    /// Patch the series of the identical Event published last, or create a new Event.
    async fn write(
        &self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: String,
        action: String,
        note: String,
    ) -> Result<(), kube::Error> {
        let type_ = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let key = Key::new(&regarding, related.as_ref(), type_, &reason, &action, &note);
        let slot = self.series.slot(key, Instant::now());
        let mut published = slot.lock().await;
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api = Api::<Event>::namespaced(self.client.clone(), &namespace);
        let now = Timestamp::now();
        if let Some(p) = published.as_mut() {
            let count = p.count.saturating_add(1);
            let series = SeriesPatch {
                series: EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                },
            };
            match api
                .patch(&p.name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => {
                    p.count = count;
                    return Ok(());
                }
                // Gone (deleted, or expired): a new Event.
                Err(e) if writer::is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let object = regarding
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.reporter.controller);
        let name = event_name(object, self.series.stamp(now));
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(type_.into()),
            reason: Some(reason),
            action: Some(action),
            note: Some(note),
            regarding: Some(regarding),
            related,
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        };
        api.create(&PostParams::default(), &event).await?;
        *published = Some(Published { name, count: 1 });
        Ok(())
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

    fn reference(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("slinky.slurm.net/v1alpha1".into()),
            kind: Some("NodeSet".into()),
            namespace: Some("slurm".into()),
            name: Some(name.into()),
            uid: Some("u".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_series_is_keyed_by_everything_that_tells_events_apart_the_note_included() {
        let (w, c) = (reference("w"), reference("c"));
        let key = |related: Option<&ObjectReference>, type_, reason, action, note| {
            Key::new(&w, related, type_, reason, action, note)
        };
        let base = key(
            None,
            "Normal",
            "SuccessfulCreate",
            "SuccessfulCreate",
            "Created pods: w-0",
        );
        assert_eq!(
            base,
            key(
                None,
                "Normal",
                "SuccessfulCreate",
                "SuccessfulCreate",
                "Created pods: w-0"
            ),
            "identical Events are one series"
        );
        for other in [
            key(
                None,
                "Normal",
                "SuccessfulCreate",
                "SuccessfulCreate",
                "Created pods: w-1",
            ),
            key(
                Some(&c),
                "Normal",
                "SuccessfulCreate",
                "SuccessfulCreate",
                "Created pods: w-0",
            ),
            key(
                None,
                "Warning",
                "SuccessfulCreate",
                "SuccessfulCreate",
                "Created pods: w-0",
            ),
            key(
                None,
                "Normal",
                "SuccessfulDelete",
                "SuccessfulCreate",
                "Created pods: w-0",
            ),
            key(None, "Normal", "SuccessfulCreate", "Create", "Created pods: w-0"),
            Key::new(
                &c,
                None,
                "Normal",
                "SuccessfulCreate",
                "SuccessfulCreate",
                "Created pods: w-0",
            ),
        ] {
            assert_ne!(base, other);
        }
        // Length-prefixed: moving bytes from one field to the next is another key.
        assert_ne!(
            key(None, "Normal", "ab", "c", "n"),
            key(None, "Normal", "a", "bc", "n")
        );
    }

    #[tokio::test]
    async fn series_are_remembered_for_their_ttl_and_at_most_the_limit() {
        let series = Series::default();
        let t0 = Instant::now();
        let key = |i: usize| Key::new(&reference(&format!("w{i}")), None, "Normal", "R", "A", "n");
        *series.slot(key(0), t0).lock().await = Some(Published {
            name: "w0.1".into(),
            count: 1,
        });
        // A repeat within the TTL finds the series (and renews it) …
        let later = t0 + SERIES_TTL - Duration::from_secs(1);
        assert!(series.slot(key(0), later).lock().await.is_some());
        assert!(series.slot(key(0), later + SERIES_TTL / 2).lock().await.is_some());
        // … one after it starts a new one.
        assert!(series.slot(key(0), later + SERIES_TTL * 2).lock().await.is_none());
        // Never more than the limit: the least recently repeated goes first.
        let t1 = later + SERIES_TTL * 2;
        for i in 1..=SERIES_LIMIT + 10 {
            series.slot(key(i), t1 + Duration::from_millis(i as u64));
        }
        assert_eq!(series.len(), SERIES_LIMIT);
        // The expired are forgotten when a new series comes.
        series.slot(key(0), t1 + SERIES_TTL * 3);
        assert_eq!(series.len(), 1);
    }

    #[test]
    fn event_names_are_unique_valid_and_fit_the_limit() {
        let series = Series::default();
        let now = Timestamp::now();
        let (a, b) = (series.stamp(now), series.stamp(now));
        assert!(b > a, "one instant, two names");
        assert_ne!(event_name("w", a), event_name("w", b));
        assert_eq!(event_name("w", 255), "w.ff");
        let long = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        let name = event_name(&long, a);
        assert!(name.len() <= NAME_LIMIT, "{} bytes", name.len());
        assert!(!name.contains("-."), "no label ends in '-': {name}");
        assert!(name.starts_with(&"a".repeat(235)));
    }
}
