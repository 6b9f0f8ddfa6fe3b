//! The README's architecture and layout name files, folders and functions that exist.

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
fn the_readme_names_files_and_functions_that_exist() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let start = readme.find("## Architecture").expect("an Architecture section");
    let end = readme[start..]
        .find("\n## Algorithms")
        .map_or(readme.len(), |e| start + e);
    let mut checked = 0;
    for line in readme[start..end].lines().filter(|l| l.starts_with('|')) {
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
                    "README names {} which does not exist",
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
                        "README: {} has no fn {name}",
                        f.display()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} names checked: is the table still there?");
}
