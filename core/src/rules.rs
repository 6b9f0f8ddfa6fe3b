//! Rules: the TOML rule file, its validation, and matching a request to its rules.
//!
//! A [`RuleSet`] is built once per (re)load: durations are parsed, globs compiled and every
//! rule's [`Limit`](crate::Limit) validated, so that matching a request costs no parsing
//! and no allocation. Errors name the rule and the field to fix.

mod duration;
mod error;
mod file;
mod glob;
mod set;
mod timestamp;

pub use duration::{format_duration, parse_duration};
pub use error::RulesError;
pub use file::{OverrideSpec, RuleFile, RuleSpec};
pub use glob::Glob;
pub use set::{limit_key, FailureMode, Identity, Override, Rule, RuleSet};
pub use timestamp::{format_rfc3339, parse_rfc3339};
