//! Wasm modules of the workspace, built for the tests that run them.

use std::path::PathBuf;
use std::process::Command;

/// The workspace's root directory.
fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds workspace package `package` for wasm32-wasip1 as it ships (`--profile wasm`) and
/// returns the path of its module: the tests run the module the OCI artifact carries. A nested cargo builds it into `target/wasm-modules`, a target directory of its
/// own, so it never waits on the lock of the outer build that runs the test; an up-to-date
/// module costs one no-op cargo run. Callers keep the result for the rest of the process.
///
/// Panics when the build fails, saying how to get the target.
pub fn wasm_module(package: &str) -> PathBuf {
    let root = workspace_root();
    let target = root.join("target").join("wasm-modules");
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "-p", package, "--target", "wasm32-wasip1", "--profile", "wasm"])
        .arg("--target-dir")
        .arg(&target)
        .env_clear()
        .envs(cargo_env())
        .status()
        .expect("cannot run cargo");
    assert!(
        status.success(),
        "building {package} for wasm32-wasip1 failed (is the target installed? run scripts/setup)"
    );
    let file = format!("{}.wasm", package.replace('-', "_"));
    target.join("wasm32-wasip1").join("wasm").join(file)
}

/// The environment for a cargo run from a test: the test's own, less what cargo set for the
/// test's package (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`...). Build scripts watch some of
/// those (ring's does): left in, every build from a test differs from the test runner's
/// own build, and from one test crate to the next, and compiles the crates under them
/// again.
pub fn cargo_env() -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    const PER_PACKAGE: [&str; 7] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
    ];
    std::env::vars_os().filter(|(k, _)| {
        let k = k.to_string_lossy();
        !PER_PACKAGE.iter().any(|p| k.starts_with(p))
    })
}

/// The bytes of [`wasm_module`]`(package)`.
pub fn wasm_module_bytes(package: &str) -> Vec<u8> {
    let path = wasm_module(package);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}
