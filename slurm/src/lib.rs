//! What the host asks of Slurm, through slurmrestd: which slurmctld is the primary, the nodes
//! and their states, drain and undrain. Talking to Slurm is the host's capability; builders
//! never do.
//!
//! * [`Client`]: one per Controller; HS256 JWTs signed with the Controller's key ([`jwt`]), the
//!   newest data parser of [`VERSIONS`] the server offers, a deadline on every call, no cache.
//! * [`Node`]: a node's state as the host reads it (busy, drained, whose drain).
//! * [`Reservation`]: a reservation as Slurm lists it, and [`ReservationRequest`]: one as the
//!   host asks for it (a NodeSet's maintenance window); [`hostlist`] reads and writes their node
//!   lists.

mod client;
pub mod hostlist;
mod job;
pub mod jwt;
mod node;
mod node_calls;
mod reservation;

use std::time::Duration;

pub use client::{Client, DEFAULT_TIMEOUT, Ping, RESERVATION_WRITE_VERSION, VERSIONS, in_control};
pub use job::{Deadline, Job, deadlines};
pub use node::{Counts, Node, REASON_PREFIX};
pub use node_calls::{NodeList, NodeUpdate};
pub use reservation::{Reservation, ReservationRequest};

/// Why a call to slurmrestd did not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The URL is not one the client can call.
    #[error("invalid slurmrestd URL {url:?}: {why}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// No connection or no answer.
    #[error("cannot reach slurmrestd at {url}: {why}")]
    Unreachable {
        /// The server.
        url: String,
        /// The connection error.
        why: String,
    },
    /// No answer within the deadline.
    #[error("slurmrestd at {url} did not answer within {after:?}")]
    Timeout {
        /// The server.
        url: String,
        /// The deadline.
        after: Duration,
    },
    /// The token was refused.
    #[error(
        "slurmrestd at {url} refused the host's token (HTTP {status}{message}): the Controller's \
         jwtKeyRef must hold the key slurmctld reads as jwt.key, and slurm.conf must allow auth/jwt"
    )]
    Unauthorized {
        /// The server.
        url: String,
        /// The HTTP status.
        status: u16,
        /// Slurm's words, `: `-prefixed (empty for a plain 401/403).
        message: String,
    },
    /// None of the data parsers the host reads is served.
    #[error(
        "slurmrestd at {url} serves none of the data parsers v0.0.41 to v0.0.43 (Slurm 24.05 to \
         25.11 serve them): upgrade slurmrestd or point the host at another"
    )]
    NoVersion {
        /// The server.
        url: String,
    },
    /// The server's data parser cannot do what was asked.
    #[error(
        "slurmrestd at {url} speaks data parser {version}, which cannot {what}: that needs {needs} \
         (Slurm 25.05 or later)"
    )]
    Unsupported {
        /// The server.
        url: String,
        /// The data parser it speaks.
        version: &'static str,
        /// What was asked.
        what: String,
        /// The data parser that can.
        needs: &'static str,
    },
    /// Slurm answered with errors.
    #[error("Slurm refused {what}: {message}")]
    Slurm {
        /// What was asked.
        what: String,
        /// Slurm's errors.
        message: String,
    },
    /// An HTTP error without Slurm errors.
    #[error("slurmrestd answered {what} with HTTP {status}: {body}")]
    Http {
        /// What was asked.
        what: String,
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer is not what the data parser describes.
    #[error("cannot read slurmrestd's answer to {what}: {why}")]
    Parse {
        /// What was asked.
        what: String,
        /// The decoding error.
        why: String,
    },
}
