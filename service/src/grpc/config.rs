//! envoyproxy/ratelimit configuration files (YAML), read as they are.

use std::path::Path;

use crate::grpc::descriptors::{DescriptorSet, DomainConfig};

/// Reads one configuration file per domain; the error names the file and, for YAML, the
/// line and column, or the descriptor, and what is wrong.
pub fn load(paths: &[&Path]) -> Result<DescriptorSet, String> {
    let mut configs = Vec::with_capacity(paths.len());
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        configs.push(parse(&text).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    DescriptorSet::new(configs).map_err(|e| e.to_string())
}

/// One configuration's text.
pub fn parse(text: &str) -> Result<DomainConfig, String> {
    serde_norway::from_str(text).map_err(|e| e.to_string())
}

/// Checks one configuration's text (for `sluice-service check-rules`): its count of
/// limits, or what is wrong, each problem starting with its line: a syntax error or wrong
/// value at the parser's line (the parser stops there), else every problem of the tree at
/// its descriptor's `key` line.
pub fn check(text: &str) -> Result<usize, Vec<String>> {
    if is_blank(text) {
        return Ok(0);
    }
    let config: DomainConfig = serde_norway::from_str(text).map_err(|e| {
        let line = e.location().map_or(1, |l| l.line());
        vec![format!("line {line}: {e}")]
    })?;
    let problems = DescriptorSet::problems(vec![config.clone()]);
    if !problems.is_empty() {
        return Err(problems
            .iter()
            .map(|e| format!("line {}: {e}", descriptor_line(text, &e.entries, e.earlier)))
            .collect());
    }
    DescriptorSet::new(vec![config])
        .map(|set| set.len())
        .map_err(|e| vec![e.to_string()])
}

/// The trimmed value of a YAML line `field: value` (also as a list item, `- field: value`),
/// its quotes removed.
fn scalar<'t>(line: &'t str, field: &str) -> Option<&'t str> {
    let line = line.trim_start();
    let line = line.strip_prefix('-').unwrap_or(line).trim_start();
    let value = line.strip_prefix(field)?.strip_prefix(':')?.trim();
    Some(value.trim_matches(|c| c == '"' || c == '\''))
}

/// The 1-based line of the `key` of the descriptor that `entries` lead to in `text`,
/// reading the lines in order (each entry is looked for below the one before it; the last
/// past `earlier` others like it); the `domain` line for none.
fn descriptor_line(text: &str, entries: &[(String, Option<String>)], earlier: usize) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let is_key = |i: usize, key: &str| scalar(lines[i], "key") == Some(key);
    let mut at = lines.iter().position(|l| scalar(l, "domain").is_some()).unwrap_or(0);
    let steps = entries.iter().enumerate().flat_map(|(i, step)| {
        let times = if i + 1 == entries.len() { earlier + 1 } else { 1 };
        std::iter::repeat_n(step, times)
    });
    for (key, value) in steps {
        let from = at + 1;
        let found = match value {
            None => (from..lines.len()).find(|&i| is_key(i, key)),
            // The value's line, under the same item's key: the nearest `key:` above it.
            Some(v) => (from..lines.len())
                .filter(|&i| scalar(lines[i], "value") == Some(v.as_str()))
                .find_map(|i| {
                    (from..=i)
                        .rev()
                        .find(|&j| scalar(lines[j], "key").is_some())
                        .filter(|&j| is_key(j, key))
                }),
        };
        match found {
            Some(i) => at = i,
            None => break,
        }
    }
    at + 1
}

/// Whether `text` holds nothing but blank lines and comments: a file that configures no
/// domain (a truncated write, a ConfigMap being filled), not a syntax error.
pub fn is_blank(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    })
}

/// Whether `path` names a YAML file (`.yaml` or `.yml`).
pub fn is_yaml(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}
