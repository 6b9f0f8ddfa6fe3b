//! Rate-limit response headers: formatting what the filter sends, parsing what the SDKs read.
//!
//! Formatting follows docs/design.md exactly (`X-RateLimit-*`, IETF `RateLimit` and
//! `RateLimit-Policy`, `Retry-After` on denials, and the 429 JSON body). Parsing reads those
//! and what real APIs send; it never fails and never panics: a malformed value is ignored.

mod format;

pub use format::{
    denial_body, expose_headers, format_headers, retry_after_secs, write_denial_body, write_headers, HeaderBuf,
    HeaderMode, Quota, EXPOSE_HEADERS,
};
