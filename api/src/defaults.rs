//! Defaults of the host's settings that are facts of the API (documented with the CRDs).

use std::time::Duration;

/// Seconds between resync requeues of a healthy Controller or NodeSet (`--resync-seconds`).
pub const RESYNC_SECONDS: u64 = 300;

/// The period of the resync requeue of healthy objects: [`RESYNC_SECONDS`].
pub const RESYNC: Duration = Duration::from_secs(RESYNC_SECONDS);
