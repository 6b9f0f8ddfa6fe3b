//! What the end-to-end tests run, built from this checkout: the workspace's binaries and the
//! filter's wasm module, each built once per test process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sluice_testkit::wasm_module;

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A workspace binary of the same profile as the running test, built (or brought up to
/// date) once per test process.
///
/// Cargo builds only the test's own package's binaries for a test, so the chain builds the
/// other packages' binaries itself: a clean clone works, and a stale binary is never run.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> → target/<profile>
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target directory")
            .to_path_buf();
        let mut cargo = Command::new(env!("CARGO"));
        // The targets `cargo test` builds: dependencies' features resolve as in the test
        // run's own build (with dev-dependencies), so the binaries and the crates under
        // them are reused as they stand instead of compiled again with other features.
        cargo
            .current_dir(root())
            .args(["build", "--workspace", "--bins", "--tests", "--examples"])
            .env_clear()
            .envs(sluice_testkit::cargo_env());
        if dir.file_name().is_some_and(|profile| profile == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("cannot run cargo");
        assert!(status.success(), "building the chain's binaries failed");
        dir
    });
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing after the build", path.display());
    path
}

/// `sluice_filter.wasm`, built once into target/wasm-modules.
pub fn filter_wasm() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| wasm_module("sluice-filter"))
}
