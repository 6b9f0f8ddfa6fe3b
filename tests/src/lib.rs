//! End-to-end tests of Sluice (in `tests/`) and the `sluice-load` load tool (`src/bin`).
