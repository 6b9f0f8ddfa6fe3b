//! Replays the fuzz corpus (`fuzz/corpus/<target>/`, kept small with `cargo fuzz cmin`)
//! through every target on stable Rust: the inputs the fuzzer found interesting, and the
//! ones that once failed, checked on every run of the tests.

use std::path::Path;

#[test]
fn every_target_passes_its_corpus() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, target) in sluice_fuzz::TARGETS {
        let dir = corpus.join(name);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut files: Vec<_> = entries.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>().unwrap();
        files.sort();
        assert!(!files.is_empty(), "{} is empty", dir.display());
        for file in files {
            let data = std::fs::read(&file).unwrap();
            // A failing input names itself: the panic's message is the target's, this its file.
            eprintln!("{name}: {}", file.display());
            target(&data);
        }
    }
}
