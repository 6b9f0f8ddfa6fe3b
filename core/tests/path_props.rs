//! The canonical path, property-tested against an independent model of how a server reads
//! a path: its segments, each fully percent-decoded, with `.` and `..` resolved, empty
//! segments merged, and whether it ends with `/`.

use proptest::prelude::*;
use sluice_core::path::canonical;

/// What a server serves for `path` (no query): the decoded segments and the trailing slash.
/// Decodes every valid escape of a segment (reserved ones too, but inside the segment: `%2F`
/// is a byte of the segment, not a separator), so two paths with the same view are one
/// resource to a server that decodes the most.
fn server_view(path: &str) -> (Vec<Vec<u8>>, bool) {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let mut segments: Vec<Vec<u8>> = Vec::new();
    let mut trailing = false;
    for raw in path.split('/').skip(usize::from(path.starts_with('/'))) {
        let seg = decode_all(raw);
        trailing = false;
        match seg.as_slice() {
            b"" | b"." => trailing = true,
            b".." => {
                segments.pop();
                trailing = true;
            }
            _ => segments.push(seg),
        }
    }
    (segments, trailing)
}

fn decode_all(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// Paths made of the pieces that matter: slashes, dots, letters, escapes valid and not,
/// reserved and unreserved, upper and lower case.
fn path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_owned()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("%2e".to_owned()),
        Just("%2E".to_owned()),
        Just("%2f".to_owned()),
        Just("%2F".to_owned()),
        Just("%25".to_owned()),
        Just("%".to_owned()),
        Just("%4".to_owned()),
        Just("%zz".to_owned()),
        Just("é".to_owned()),
        "[a-cA-C~_-]{1,3}",
        "%[0-9a-fA-F]{2}",
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    #[test]
    fn idempotent(p in path()) {
        let once = canonical(&p).into_owned();
        prop_assert_eq!(canonical(&once), once.as_str());
    }

    /// The canonical form is the same resource as the path: equal canonical forms are
    /// never two resources a server tells apart.
    #[test]
    fn keeps_what_a_server_reads(p in path()) {
        let c = canonical(&p);
        prop_assert!(c.starts_with('/'));
        prop_assert_eq!(server_view(&c), server_view(&format!("/{p}")), "{} → {}", p, c);
    }

    #[test]
    fn two_paths_merge_only_when_a_server_reads_them_as_one(a in path(), b in path()) {
        if canonical(&a) == canonical(&b) {
            prop_assert_eq!(server_view(&format!("/{a}")), server_view(&format!("/{b}")));
        }
    }
}
