//! The gate of concurrent calls: at most `max` builder calls run at once per engine; a call
//! waits for a slot, and the waits are counted.

use std::sync::{Mutex, atomic::Ordering};

/// A counting gate: at most `max` plugin calls run at once, on either tier (the pool has that
/// many instance slots; Winch instances, allocated on demand, would otherwise be unbounded).
/// A call past the limit waits (on its blocking thread) for one to end.
#[derive(Debug)]
pub(crate) struct CallGate {
    max: usize,
    busy: Mutex<usize>,
    freed: std::sync::Condvar,
    /// Calls that had to wait for a slot.
    waited: std::sync::atomic::AtomicU64,
}

/// A running call's place in the [`CallGate`], given back when dropped.
pub(crate) struct CallSlot<'a>(&'a CallGate);

impl CallGate {
    pub(super) fn new(max: u32) -> Self {
        CallGate {
            max: max.max(1) as usize,
            busy: Mutex::new(0),
            freed: std::sync::Condvar::new(),
            waited: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Wait for a slot.
    pub(crate) fn enter(&self) -> CallSlot<'_> {
        let mut busy = self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *busy >= self.max {
            self.waited.fetch_add(1, Ordering::Relaxed);
        }
        while *busy >= self.max {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *busy += 1;
        CallSlot(self)
    }

    /// Calls that waited for a slot, since the start.
    pub(crate) fn waited(&self) -> u64 {
        self.waited.load(Ordering::Relaxed)
    }
}

impl Drop for CallSlot<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .0
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *busy = busy.saturating_sub(1);
        self.0.freed.notify_one();
    }
}
