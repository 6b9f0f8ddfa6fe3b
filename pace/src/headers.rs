//! Reading rate-limit response headers, whichever family a server sends (the filter and the
//! service write theirs with `sluice_core::headers`). Parsing never fails and never panics:
//! a malformed value is ignored.

mod http_date;
mod parse;
mod structured;

pub use parse::{parse_headers, RateLimitInfo, UnitQuota};
