//! The errors a [`crate::Client`] returns.

use thiserror::Error;

/// Why a request produced no response.
#[derive(Debug, Error)]
pub enum Error {
    /// The bucket's queue already holds as many waiting requests as it may: the request was
    /// not queued (fail fast rather than wait behind an unbounded backlog).
    #[error("queue for bucket {key:?} is full ({capacity} requests waiting)")]
    QueueFull {
        /// The bucket whose queue is full.
        key: String,
        /// The queue's bound.
        capacity: usize,
    },
    /// The request could not be built (bad URL, header or body).
    #[error("invalid request: {0}")]
    Build(#[source] reqwest::Error),
    /// The request failed without a response (connection refused, timeout, …), after any
    /// retries allowed.
    #[error("request failed: {0}")]
    Request(#[source] reqwest::Error),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
