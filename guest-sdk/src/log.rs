//! Log lines to the host (the contract's `log` import): the host writes them to its own log with
//! the plugin's name, version and digest, and counts them in `/metrics`. At most 32 lines of one
//! call are kept (each cut to 1 KiB), and about 50 a second per plugin: log what helps an
//! operator, not every field.
//!
//! ```
//! slinky_guest_sdk::log::info("3 GPUs requested by the pod template");
//! # let lines = slinky_guest_sdk::testing::logged();
//! # assert_eq!(lines, [(slinky_guest_sdk::log::Level::Info, "3 GPUs requested by the pod template".to_string())]);
//! ```
//!
//! In native tests the lines are kept per thread: [`crate::testing::logged`] returns them.

/// How much a line matters (the contract's type, shared with the host).
pub use slinky_api::contract::LogLevel as Level;

/// Log `message` at `level`.
pub fn log(level: Level, message: &str) {
    imp::log(level, message);
}

/// Log at `trace`.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}

/// Log at `debug`.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Log at `info`.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Log at `warn`.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Log at `error`.
pub fn error(message: &str) {
    log(Level::Error, message);
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;
    use crate::wit::slinky::builder::log::{self as w, Level as W};

    pub(super) fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => W::Trace,
            Level::Debug => W::Debug,
            Level::Info => W::Info,
            Level::Warn => W::Warn,
            Level::Error => W::Error,
        };
        w::log(level, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::cell::RefCell;

    use super::Level;

    thread_local! {
        static LINES: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn log(level: Level, message: &str) {
        LINES.with(|l| l.borrow_mut().push((level, message.to_string())));
    }

    /// The lines this thread logged since the last call, taken out.
    pub(crate) fn take() -> Vec<(Level, String)> {
        LINES.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use imp::take;
