//! What can be wrong with a rule file.

use thiserror::Error;

/// A rule file or admin change that cannot be used; the message says where and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RulesError {
    /// The text is not valid TOML/JSON or does not have the rule file's shape.
    #[error("line {line}: {message}")]
    Syntax {
        /// 1-based line of the problem (1 when unknown).
        line: usize,
        /// The parser's explanation, e.g. an unknown field and the expected ones.
        message: String,
    },
    /// A rule's field is invalid.
    #[error("rule {rule}: field {field}: {message}")]
    Rule {
        /// The rule's name in quotes, or `#<n>` (1-based) when it has none.
        rule: String,
        /// The field to fix.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// An override is invalid.
    #[error("override #{index} (rule {rule:?}, identity {identity:?}): field {field}: {message}")]
    Override {
        /// 1-based position in the file (0 for one added at run time).
        index: usize,
        /// The rule it names.
        rule: String,
        /// The identity it names.
        identity: String,
        /// The field to fix.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
}
