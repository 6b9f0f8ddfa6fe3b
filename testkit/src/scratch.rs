//! A scratch directory removed when the fixture drops, even when the test panics.

use std::path::{Path, PathBuf};

use crate::free_port;

/// A fresh directory under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `sluice-<tag>-<pid>-<n>`; panics (a test fixture) if it cannot.
    pub fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("sluice-{tag}-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        ScratchDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
