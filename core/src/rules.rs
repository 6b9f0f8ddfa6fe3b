//! Rules: the TOML rule file, its validation, and matching a request to its rules.
//!
//! A [`RuleSet`] is built once per (re)load: durations are parsed, globs compiled and every
//! rule's [`Limit`](crate::Limit) validated, so that matching a request costs no parsing
//! and no allocation. Errors name the rule and the field to fix.
//!
//! Defaults of the rule file: `path = "*"`, `methods` = every method, no `tier`,
//! `burst = 0` (capacity = `limit`), `failure = "open"`, `shaping = false`,
//! `max_delay = "0ms"` (required, and non-zero, when `shaping = true`; ignored otherwise),
//! `shadow = false`.

#[cfg(feature = "toml")]
mod check;
mod duration;
mod error;
mod file;
mod glob;
mod global;
pub mod host;
mod set;
mod timestamp;
mod validate;

#[cfg(feature = "toml")]
pub use check::{check_toml, Problem};
pub use duration::{format_duration, parse_duration, MAX_DURATION_MS};
pub use error::RulesError;
pub use file::{OverrideSpec, RuleFile, RuleSpec};
pub use glob::Glob;
pub use global::{Global, Unreachable};
pub use set::{Override, RuleSet};
pub use timestamp::{days_from_civil, format_rfc3339, parse_rfc3339, MAX_TIMESTAMP_MS};
pub use validate::{FailureMode, Identity, Mismatch, Rule, WhenMissing, MAX_RULE_NAME_BYTES, MISSING};
