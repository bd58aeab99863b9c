//! Fault injection: seeded, so a failing run can be replayed. Rules match a verb and a resource
//! and fire with a probability or a fixed number of times; faults fire before the request is
//! served (nothing changes), or after it (the change is made, the client sees an error, like a
//! timed-out create). Plus added latency, delayed watch delivery, watch delivery held for one
//! resource until released, requests of one verb and resource held before they are served until
//! released, closing watch streams (held ones too) and a forced `410 Gone` on the next watches,
//! or on the next watch of one resource (a relist of that resource alone).

use std::{
    collections::BTreeSet,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::sync::watch;

/// The error a rule injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultError {
    /// 409 Conflict (as if the object changed meanwhile).
    Conflict,
    /// 404 Not Found (as if a read raced a create: the object appears right after).
    NotFound,
    /// 500 Internal Server Error.
    Internal,
    /// 429 Too Many Requests with `Retry-After` seconds.
    TooManyRequests(u64),
    /// 504 Gateway Timeout ("the request timed out"): with `after`, the write still happened.
    Timeout,
    /// 422 Invalid (as if validation refused the object).
    Invalid,
}

/// How often a rule fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Times {
    /// With this probability (0..=1) per matching request.
    Probability(f64),
    /// The next N matching requests.
    Count(u32),
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, or `*`.
    pub verb: String,
    /// A resource plural (`pods`), `pods/status`, or `*`.
    pub resource: String,
    /// The error.
    pub error: FaultError,
    /// How often.
    pub times: Times,
    /// Serve the request first, then fail it.
    pub after: bool,
}

impl FaultRule {
    /// A rule failing `verb` on `resource` before it is served.
    pub fn new(verb: &str, resource: &str, error: FaultError, times: Times) -> Self {
        FaultRule {
            verb: verb.into(),
            resource: resource.into(),
            error,
            times,
            after: false,
        }
    }

    /// The same rule, failing after the request was served.
    pub fn after(mut self) -> Self {
        self.after = true;
        self
    }

    /// Parse `verb:resource:error:times[:after]`, e.g. `create:pods:500:0.2` or
    /// `update:nodesets/status:409:count=5` or `create:pods:timeout:count=3:after`.
    ///
    /// # Errors
    /// What part is malformed.
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        if !(4..=5).contains(&parts.len()) {
            return Err(format!("fault {s:?}: expected verb:resource:error:times[:after]"));
        }
        let error = match parts[2] {
            "409" => FaultError::Conflict,
            "404" => FaultError::NotFound,
            "500" => FaultError::Internal,
            "timeout" | "504" => FaultError::Timeout,
            "422" => FaultError::Invalid,
            e if e.starts_with("429") => {
                FaultError::TooManyRequests(e.strip_prefix("429/").and_then(|r| r.parse().ok()).unwrap_or(1))
            }
            e => {
                return Err(format!(
                    "fault {s:?}: unknown error {e:?} (404, 409, 422, 500, 429[/seconds], timeout)"
                ));
            }
        };
        let times = match parts[3].strip_prefix("count=") {
            Some(n) => Times::Count(n.parse().map_err(|_| format!("fault {s:?}: bad count"))?),
            None => Times::Probability(
                parts[3]
                    .parse()
                    .map_err(|_| format!("fault {s:?}: bad probability"))?,
            ),
        };
        let after = match parts.get(4) {
            None => false,
            Some(&"after") => true,
            Some(x) => return Err(format!("fault {s:?}: unknown flag {x:?}")),
        };
        Ok(FaultRule {
            verb: parts[0].into(),
            resource: parts[1].into(),
            error,
            times,
            after,
        })
    }
}

#[derive(Debug)]
struct State {
    rng: u64,
    rules: Vec<FaultRule>,
    latency: Duration,
    watch_delay: Duration,
    held: BTreeSet<String>,
    /// `verb:resource` of the requests held before they are served.
    held_requests: BTreeSet<String>,
    /// How many requests wait in a hold now.
    waiting: usize,
    gone_next_watches: u32,
    /// Resources whose next watch gets `410 Gone`.
    relists: BTreeSet<String>,
    fired: Vec<(String, String, FaultError)>,
    fired_at: Vec<std::time::Instant>,
}

/// The fault-injection handle (shared by the server and tests).
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
    close_watches: watch::Sender<u64>,
    released: watch::Sender<u64>,
}

/// A decision for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The error to return.
    pub error: FaultError,
    /// Whether to serve the request first.
    pub after: bool,
}

impl Faults {
    /// No faults, RNG seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Faults {
            state: Mutex::new(State {
                rng: seed ^ 0x9E37_79B9_7F4A_7C15,
                rules: Vec::new(),
                latency: Duration::ZERO,
                watch_delay: Duration::ZERO,
                held: BTreeSet::new(),
                held_requests: BTreeSet::new(),
                waiting: 0,
                gone_next_watches: 0,
                relists: BTreeSet::new(),
                fired: Vec::new(),
                fired_at: Vec::new(),
            }),
            close_watches: watch::channel(0).0,
            released: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Re-seed the RNG (replays the same decisions for the same request sequence).
    pub fn reseed(&self, seed: u64) {
        self.lock().rng = seed ^ 0x9E37_79B9_7F4A_7C15;
    }

    /// Add a rule.
    pub fn add(&self, rule: FaultRule) {
        self.lock().rules.push(rule);
    }

    /// Remove every rule and reset latency and delays.
    pub fn clear(&self) {
        let mut s = self.lock();
        s.rules.clear();
        s.latency = Duration::ZERO;
        s.watch_delay = Duration::ZERO;
        s.gone_next_watches = 0;
        s.relists.clear();
        s.held.clear();
        s.held_requests.clear();
        drop(s);
        self.released.send_modify(|n| *n += 1);
    }

    /// Add latency to every request.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// The added latency.
    pub fn latency(&self) -> Duration {
        self.lock().latency
    }

    /// Delay every watch event by this much (caches lag behind writes).
    pub fn set_watch_delay(&self, delay: Duration) {
        self.lock().watch_delay = delay;
    }

    /// The watch delivery delay.
    pub fn watch_delay(&self) -> Duration {
        self.lock().watch_delay
    }

    /// Hold every watch event of `resource` (a plural, `pods`) until [`Faults::release_watch`]:
    /// a cache that has not seen an object yet, for as long as a test needs, not a guessed delay.
    pub fn hold_watch(&self, resource: &str) {
        self.lock().held.insert(resource.to_string());
    }

    /// Deliver the held events of `resource`, in order, and stop holding it.
    pub fn release_watch(&self, resource: &str) {
        self.lock().held.remove(resource);
        self.released.send_modify(|n| *n += 1);
    }

    /// Wait while watch events of `resource` are held.
    pub async fn while_held(&self, resource: &str) {
        let mut rx = self.released.subscribe();
        while self.lock().held.contains(resource) {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Hold every `verb` request of `resource` (`create`, `pods`; writes: create, update, patch,
    /// delete) before it is served, its body read, until [`Faults::release_requests`]: a write in
    /// flight for as long as a test needs. A request whose client gives up (closes the
    /// connection) meanwhile is never served.
    pub fn hold_requests(&self, verb: &str, resource: &str) {
        self.lock().held_requests.insert(format!("{verb}:{resource}"));
    }

    /// Serve the held `verb` requests of `resource` (those whose client still waits) and stop
    /// holding them.
    pub fn release_requests(&self, verb: &str, resource: &str) {
        self.lock().held_requests.remove(&format!("{verb}:{resource}"));
        self.released.send_modify(|n| *n += 1);
    }

    /// How many requests wait in a hold now (a request whose client gave up no longer counts).
    pub fn waiting_requests(&self) -> usize {
        self.lock().waiting
    }

    /// Wait while `verb` requests of `resource` are held (counted in
    /// [`Faults::waiting_requests`] until this returns or is dropped).
    pub async fn while_request_held(&self, verb: &str, resource: &str) {
        struct Waiting<'a>(&'a Faults);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                let mut s = self.0.lock();
                s.waiting = s.waiting.saturating_sub(1);
            }
        }
        let key = format!("{verb}:{resource}");
        let mut rx = self.released.subscribe();
        {
            let mut s = self.lock();
            if !s.held_requests.contains(&key) {
                return;
            }
            s.waiting += 1;
        }
        let _waiting = Waiting(self);
        while self.lock().held_requests.contains(&key) {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Close every open watch stream now, held ones too (their held events are never sent, as
    /// with a broken connection).
    pub fn close_watches(&self) {
        self.close_watches.send_modify(|n| *n += 1);
    }

    /// A receiver that changes when watches must close.
    pub fn watch_closer(&self) -> watch::Receiver<u64> {
        self.close_watches.subscribe()
    }

    /// Answer the next `n` watch requests with `410 Gone`.
    pub fn force_gone(&self, n: u32) {
        self.lock().gone_next_watches = n;
    }

    /// Make the clients of `resource` (a plural, `pods`) relist: close every open watch stream
    /// (held ones too; the others resume where they were) and answer the next watch of
    /// `resource` with `410 Gone`. Unlike [`Faults::force_gone`], no other resource's watch gets
    /// the `410`, however the reconnects are ordered.
    pub fn force_relist(&self, resource: &str) {
        self.lock().relists.insert(resource.to_string());
        self.close_watches();
    }

    /// Whether this watch of `resource` must get 410 (consumes one).
    pub fn take_gone(&self, resource: &str) -> bool {
        let mut s = self.lock();
        if s.gone_next_watches > 0 {
            s.gone_next_watches -= 1;
            true
        } else {
            s.relists.remove(resource)
        }
    }

    /// When each fault of [`Faults::fired`] fired (how a test sees a client's retry delays).
    pub fn fired_at(&self) -> Vec<std::time::Instant> {
        self.lock().fired_at.clone()
    }

    /// How many faults fired, and which (verb, resource, error), in order.
    pub fn fired(&self) -> Vec<(String, String, FaultError)> {
        self.lock().fired.clone()
    }

    fn next(state: &mut State) -> f64 {
        // xorshift64*
        let mut x = state.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Decide for one request.
    pub fn decide(&self, verb: &str, resource: &str) -> Option<Decision> {
        let mut s = self.lock();
        for i in 0..s.rules.len() {
            let rule = s.rules[i].clone();
            let verb_ok = rule.verb == "*" || rule.verb == verb;
            let base = resource.split('/').next().unwrap_or(resource);
            let res_ok = rule.resource == "*"
                || rule.resource == resource
                || (rule.resource == base && !resource.contains('/'));
            if !verb_ok || !res_ok {
                continue;
            }
            let fire = match rule.times {
                Times::Count(0) => false,
                Times::Count(n) => {
                    s.rules[i].times = Times::Count(n - 1);
                    true
                }
                Times::Probability(p) => Self::next(&mut s) < p,
            };
            if fire {
                s.fired.push((verb.to_string(), resource.to_string(), rule.error));
                s.fired_at.push(std::time::Instant::now());
                return Some(Decision {
                    error: rule.error,
                    after: rule.after,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_replay_from_the_seed() {
        let run = |seed| {
            let f = Faults::new(seed);
            f.add(FaultRule::new(
                "create",
                "pods",
                FaultError::Internal,
                Times::Probability(0.3),
            ));
            (0..200)
                .map(|_| f.decide("create", "pods").is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let hits = run(7).iter().filter(|h| **h).count();
        assert!((30..90).contains(&hits), "{hits} of 200 at p=0.3");
    }

    #[test]
    fn a_forced_relist_is_of_its_resource_only() {
        let f = Faults::new(1);
        let closer = f.watch_closer();
        f.force_relist("pods");
        assert!(closer.has_changed().unwrap_or(false), "the open watches close");
        assert!(!f.take_gone("services"), "other resources resume where they were");
        assert!(f.take_gone("pods"));
        assert!(!f.take_gone("pods"), "one 410");
    }

    #[test]
    fn counts_and_parsing() -> Result<(), String> {
        let f = Faults::new(1);
        f.add(FaultRule::parse("update:nodesets/status:409:count=2")?);
        assert!(
            f.decide("update", "nodesets").is_none(),
            "the main resource is not the subresource"
        );
        assert!(f.decide("update", "nodesets/status").is_some());
        assert!(f.decide("update", "nodesets/status").is_some());
        assert!(f.decide("update", "nodesets/status").is_none());
        let r = FaultRule::parse("create:pods:timeout:count=1:after")?;
        assert!(r.after && r.error == FaultError::Timeout);
        assert!(FaultRule::parse("create:pods:418:1").is_err());
        Ok(())
    }
}
