//! Checking a TOML rule file for a CI pipeline: every problem, each with its line.
//!
//! [`RuleSet::from_toml`] stops at the first problem and names a rule and a field; this
//! reads the file once more with the span of every field kept (`toml::Spanned`), checks
//! each rule on its own, and gives every problem the line of the field it names (the
//! table's first field when the field is absent). Overrides are checked once the rules are
//! valid (they name rules), the first problem only.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::file::RuleFile;
use super::set::line_of;
use super::validate::{rule_label, validate_rule};
use super::{RuleSet, RulesError};

/// One problem of a rule file and its line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {error}")]
pub struct Problem {
    /// 1-based line of the field the problem is about.
    pub line: usize,
    /// What is wrong.
    pub error: RulesError,
}

/// A table's fields with their places in the text.
type Fields = BTreeMap<String, Spanned<Value>>;

/// The file's tables as fields with spans, for the lines of problems.
#[derive(Deserialize, Default)]
struct Spans {
    #[serde(default)]
    rule: Vec<Fields>,
    #[serde(default, rename = "override")]
    overrides: Vec<Fields>,
}

/// Checks the TOML rule file `text`: the number of rules when it is valid, else every
/// problem found, in file order, each with its line.
pub fn check_toml(text: &str) -> Result<usize, Vec<Problem>> {
    let error = match RuleSet::from_toml(text) {
        Ok(set) => return Ok(set.rules().len()),
        Err(e) => e,
    };
    if let RulesError::Syntax { line, .. } = error {
        return Err(vec![Problem { line, error }]);
    }
    // The text parsed once already: neither read below can fail.
    let file: RuleFile = toml::from_str(text).unwrap_or_default();
    let spans: Spans = toml::from_str(text).unwrap_or_default();
    let line = |tables: &[Fields], index: usize, field: &str| {
        let table = tables.get(index);
        let at = table.and_then(|t| t.get(field)).map(|s| s.span().start);
        let first = table.and_then(|t| t.values().map(|s| s.span().start).min());
        line_of(text, at.or(first).unwrap_or(0))
    };
    let mut problems = Vec::new();
    for (i, spec) in file.rules.iter().enumerate() {
        let duplicate = file.rules[..i].iter().any(|r| r.name == spec.name);
        let error = match validate_rule(spec, i) {
            Err(e) => e,
            Ok(_) if duplicate => RulesError::Rule {
                rule: rule_label(spec, i),
                field: "name",
                message: "another rule has the same name; names must be unique".into(),
            },
            Ok(_) => continue,
        };
        let field = match &error {
            RulesError::Rule { field, .. } => *field,
            _ => "name",
        };
        let line = line(&spans.rule, i, field);
        problems.push(Problem { line, error });
    }
    if problems.is_empty() {
        // The rules are valid: the problem is an override's.
        let (index, field) = match &error {
            RulesError::Override { index, field, .. } => (index.saturating_sub(1), *field),
            _ => (0, "rule"),
        };
        let line = line(&spans.overrides, index, field);
        problems.push(Problem { line, error });
    }
    Err(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        "[[rule]]\nname = \"a\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n";

    #[test]
    fn a_valid_file_gives_its_count_of_rules() {
        assert_eq!(
            check_toml(&format!("{GOOD}\n{}", GOOD.replace("\"a\"", "\"b\""))),
            Ok(2)
        );
    }

    #[test]
    fn every_semantic_problem_is_given_with_the_line_of_its_field() {
        let text = format!(
            "{GOOD}\n{}\n{}\n{}",
            GOOD.replace("limit = 5", "limit = 0").replace("\"a\"", "\"zero\""),
            GOOD.replace("fixed_window", "fixed_windows")
                .replace("\"a\"", "\"alg\""),
            GOOD,
        );
        let problems = check_toml(&text).unwrap_err();
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [12, 18, 23], "{problems:?}");
        assert!(problems[2].to_string().contains("same name"), "{}", problems[2]);
    }

    #[test]
    fn a_bad_override_is_given_with_its_line() {
        let text = format!("{GOOD}\n[[override]]\nrule = \"a\"\nidentity = \"x\"\nlimit = 1\nuntil = \"soon\"\n");
        let problems = check_toml(&text).unwrap_err();
        assert_eq!(
            problems.iter().map(|p| p.line).collect::<Vec<_>>(),
            [12],
            "{problems:?}"
        );
    }
}
