//! envoyproxy/ratelimit configuration files (YAML), read as they are.

use std::path::Path;

use sluice_core::descriptors::{DescriptorSet, DomainConfig};

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
