//! Not a crate of the workspace: two files of a folder that import each other through
//! `super::`, which `scripts/check-imports` must report (scripts/test runs it on this folder
//! and expects it to fail).
mod store;
