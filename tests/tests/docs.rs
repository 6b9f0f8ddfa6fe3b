//! The design's request, step by step, names files, folders and functions that exist.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether `path` exists, a trailing `*.ext` standing for any file of its folder.
fn exists(path: &str) -> bool {
    let full = root().join(path);
    match full.file_name().and_then(|n| n.to_str()) {
        Some(name) if name.starts_with('*') => full.parent().is_some_and(Path::is_dir),
        _ => full.exists(),
    }
}

#[test]
fn the_request_step_by_step_names_files_and_functions_that_exist() {
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    let start = design
        .find("## A request, step by step")
        .expect("a step-by-step section");
    let end = design[start + 1..]
        .find("\n## ")
        .map_or(design.len(), |e| start + 1 + e);
    let mut checked = 0;
    for line in design[start..end].lines().filter(|l| l.starts_with('|')) {
        let mut file: Option<PathBuf> = None;
        for token in line.split('`').skip(1).step_by(2) {
            let token = token.trim_end_matches('/');
            let is_path = token.contains('/') || token.ends_with(".rs") || token.starts_with('.');
            if is_path {
                // A bare file name continues the folder of the previous path (`store/redis.rs`).
                let path = match &file {
                    Some(prev) if !exists(token) => {
                        let base = prev
                            .ancestors()
                            .find(|a| a.join(token).exists() || exists(&a.join(token).to_string_lossy()));
                        base.map_or_else(|| PathBuf::from(token), |b| b.join(token))
                    }
                    _ => PathBuf::from(token),
                };
                assert!(
                    exists(&path.to_string_lossy()),
                    "design.md names {} which does not exist",
                    path.display()
                );
                file = Some(path);
                checked += 1;
            } else if let Some(f) = file.as_ref().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
                let name = token.rsplit("::").next().unwrap_or(token);
                if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
                    let text = std::fs::read_to_string(root().join(f)).expect("named file");
                    assert!(
                        text.contains(&format!("fn {name}")),
                        "design.md: {} has no fn {name}",
                        f.display()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} names checked: is the table still there?");
}

/// The keys the rule file reads in a `[[rule]]` (or `[[override]]`) table, as the reader
/// itself names them when it meets one it does not know.
fn keys_read(table: &str) -> Vec<String> {
    let file = format!(r#"{{"{table}": [{{"no such key": 1}}]}}"#);
    let doc = sluice_core::json::parse(file.as_bytes()).expect("JSON");
    let e = sluice_core::rules::RuleFile::read(&doc).expect_err("an unknown key is refused");
    let message = e.to_string();
    let (_, list) = message.split_once("expected one of ").expect("the keys listed");
    let keys: Vec<String> = list.split(", ").map(|k| k.trim().to_owned()).collect();
    assert!(keys.len() > 3, "{message}");
    keys
}

/// Every key of a rule and of an override is in the rules' reference, docs/design.md's
/// Rules section, as a `key = value` line of its example (so its meaning is written beside
/// it); and `by`'s every kind of identity.
#[test]
fn every_rule_key_is_documented() {
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    let start = design.find("\n## Rules\n").expect("a Rules section");
    let end = design[start + 1..]
        .find("\n## ")
        .map_or(design.len(), |e| start + 1 + e);
    let section = &design[start..end];
    let documented = |key: &str| {
        section
            .lines()
            .any(|l| l.split_once('=').is_some_and(|(k, _)| k.trim() == key))
    };
    for table in ["rule", "override"] {
        for key in keys_read(table) {
            assert!(
                documented(&key),
                "docs/design.md#rules does not document the {table} key {key}"
            );
        }
    }
    for by in [
        "\"ip\"",
        "\"user\"",
        "\"api_key\"",
        "\"tier\"",
        "\"global\"",
        "\"header:<name>\"",
    ] {
        assert!(
            section.contains(by),
            "docs/design.md#rules: by = {by} is not documented"
        );
    }
}

/// Every route of the admin API, with each of its methods, is in docs/service.md.
#[test]
fn every_admin_endpoint_is_documented() {
    let http = std::fs::read_to_string(root().join("service/src/admin/mod.rs")).expect("admin/mod.rs");
    let service = std::fs::read_to_string(root().join("docs/service.md")).expect("docs/service.md");
    let start = http.find("pub fn router").expect("admin::router");
    let end = http[start..].find("\n}\n").map_or(http.len(), |e| start + e);
    let mut checked = 0;
    // Each piece is one route: its path, then its method router, up to the next route
    // (whitespace dropped: rustfmt puts a long route's path on a line of its own).
    let routes: String = http[start..end].split_whitespace().collect();
    for route in routes.split(".route(\"").skip(1) {
        let Some((path, methods)) = route.split_once('"') else {
            continue;
        };
        for (method, call) in [
            ("GET", "get("),
            ("PUT", "put("),
            ("POST", "post("),
            ("DELETE", "delete("),
        ] {
            if path.starts_with("/v1/admin/") && methods.contains(call) {
                assert!(
                    service.contains(&format!("`{method} {path}")),
                    "docs/service.md does not document {method} {path}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} admin endpoints found in admin::router");
}
