use proptest::prelude::*;

use super::{parse, write_str, Json, JsonError, MAX_DEPTH, MAX_FIELDS};

fn quoted(s: &str) -> String {
    let mut out = String::new();
    write_str(&mut out, s);
    out
}

/// Reads `doc`'s field `name` with `read`, as a decoder does.
fn field<'j, 'a, T: Default>(
    doc: &'j Json<'a>,
    name: &'static str,
    read: impl FnOnce(&'j Json<'a>) -> Result<T, JsonError>,
) -> Result<T, JsonError> {
    let mut f = doc.object()?;
    let value = f.req(name, read);
    f.finish_lenient().map(|()| value)
}

#[test]
fn reads_every_kind_of_value() {
    let doc = parse(br#" {"a": [1, -2.5e3, true, false, null], "b": {"c": "d\n\u00e9\ud83d\ude00"}} "#).unwrap();
    let mut f = doc.object().unwrap();
    let a = f.req("a", |v| v.array().map(<[Json<'_>]>::to_vec));
    assert_eq!(
        a,
        [
            Json::Number("1"),
            Json::Number("-2.5e3"),
            Json::Bool(true),
            Json::Bool(false),
            Json::Null
        ]
    );
    let c = f.req("b", |v| field(v, "c", Json::string));
    assert_eq!(c, "d\né😀");
    f.finish().unwrap();
}

#[test]
fn errors_name_the_whole_path_and_an_unknown_field_comes_first() {
    let doc = parse(br#"{"failure": {"breaker": {"cooldown_ms": "soon"}}}"#).unwrap();
    let e = field(&doc, "failure", |v| {
        field(v, "breaker", |v| field(v, "cooldown_ms", Json::u64))
    })
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "failure.breaker.cooldown_ms: expected an unsigned integer, found a string"
    );
    let doc = parse(br#"{"rule": [{}, {"limit": -5}]}"#).unwrap();
    let e = field(&doc, "rule", |v| v.each(|r| field(r, "limit", Json::u64))).unwrap_err();
    assert_eq!(e.to_string(), "rule[0].limit: required but missing");
    let e = field(&doc, "rule", |v| {
        v.each(|r| {
            let mut f = r.object()?;
            let limit = f.opt("limit", Json::u64);
            f.finish().map(|()| limit)
        })
    })
    .unwrap_err();
    assert_eq!(e.to_string(), "rule[1].limit: expected an unsigned integer, found -5");
    let doc = parse(br#"{"a": "x", "b": 2, "colour": 3}"#).unwrap();
    let mut f = doc.object().unwrap();
    assert_eq!((f.opt("a", Json::u64), f.opt("b", Json::u64)), (None, Some(2)));
    f.take("colour");
    assert_eq!(
        f.finish().unwrap_err().to_string(),
        "a: expected an unsigned integer, found a string"
    );
    let mut f = doc.object().unwrap();
    f.take("a");
    f.take("b");
    let e = f.finish().unwrap_err();
    assert_eq!(e.to_string(), "unknown field `colour`, expected one of a, b");
    assert_eq!(
        Json::Null.object().err().unwrap().to_string(),
        "expected an object, found null"
    );
}

#[test]
fn refuses_what_is_not_json() {
    for (bad, why) in [
        (&b""[..], "expected a value, found the end at byte 0"),
        (b"{", "expected a member name, found the end at byte 1"),
        (b"[1,]", "expected a value at byte 3"),
        (b"01", "invalid number at byte 0"),
        (b"-", "invalid number at byte 0"),
        (b"[1.]", "invalid number at byte 1"),
        (b"1 2", "trailing characters after the document at byte 2"),
        (b"\"a", "unterminated string, found the end at byte 2"),
        (b"\"\\x\"", "invalid escape at byte 3"),
        (b"\"\\ud800\"", "unpaired surrogate at byte 7"),
        (b"\"\\u12", "invalid \\u escape at byte 3"),
        (b"[\"\\u5{\"]", "invalid \\u escape at byte 4"),
        (b"\"\x01\"", "control character in a string at byte 1"),
        (br#"{"a": 1, "a": 2}"#, "member \"a\" repeated at byte 12"),
        (b"\xff", "not UTF-8 at byte 0"),
        (b"nul", "expected a value at byte 0"),
    ] {
        assert_eq!(
            parse(bad).unwrap_err().to_string(),
            why,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn depth_is_bounded_so_no_input_exhausts_the_stack() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(ok.as_bytes()).is_ok());
    let deep = "[".repeat(100_000);
    assert_eq!(
        parse(deep.as_bytes()).unwrap_err().to_string(),
        format!("nested too deeply at byte {MAX_DEPTH}")
    );
}

#[test]
fn numbers_are_read_exactly() {
    assert_eq!(parse(b"18446744073709551615").unwrap().u64(), Ok(u64::MAX));
    assert!(parse(b"18446744073709551616").unwrap().u64().is_err());
    assert!(parse(b"1.0").unwrap().u64().is_err());
    assert_eq!(
        parse(b"300").unwrap().uint::<u8>().unwrap_err().to_string(),
        "300 is too large"
    );
}

#[test]
fn an_object_read_field_by_field_has_at_most_64_members() {
    let members = |n: usize| {
        format!(
            "{{{}}}",
            (0..n).map(|i| format!("\"f{i}\": {i}")).collect::<Vec<_>>().join(",")
        )
    };
    let text = members(MAX_FIELDS);
    let doc = parse(text.as_bytes()).unwrap();
    let mut f = doc.object().unwrap();
    assert_eq!(f.opt("f63", Json::u64), Some(63));
    let e = f.finish().unwrap_err();
    assert_eq!(e.to_string(), "unknown field `f0`, expected one of f63");
    let text = members(MAX_FIELDS + 1);
    let e = parse(text.as_bytes()).unwrap().object().err().unwrap();
    assert_eq!(e.to_string(), "an object of 65 members; the most read is 64");
}

proptest! {
    #[test]
    fn strings_round_trip_with_serde_json(s in any::<String>()) {
        let ours = quoted(&s);
        prop_assert_eq!(parse(ours.as_bytes()).unwrap().string().unwrap(), s.clone());
        prop_assert_eq!(serde_json::from_str::<String>(&quoted(&s)).unwrap(), s.clone());
        let theirs = serde_json::to_string(&s).unwrap();
        prop_assert_eq!(parse(theirs.as_bytes()).unwrap().string().unwrap(), s);
    }

    #[test]
    fn accepts_what_serde_json_accepts(text in "[\\[\\]{}\",:0-9a-z\\\\ .eE+-]{0,24}") {
        let theirs = serde_json::from_str::<serde_json::Value>(&text);
        let ours = parse(text.as_bytes());
        prop_assert_eq!(theirs.is_ok(), ours.is_ok(), "{:?}: {:?}", text, ours);
    }
}

#[test]
fn a_large_object_with_a_repeated_name_is_refused_without_comparing_every_pair() {
    let names: Vec<String> = (0..2_000).map(|i| format!("\"k{i:04}\":0")).collect();
    let unique = format!("{{{}}}", names.join(","));
    assert!(parse(unique.as_bytes()).is_ok());
    let repeated = format!("{{{},\"k0005\":1}}", names.join(","));
    let e = parse(repeated.as_bytes()).unwrap_err().to_string();
    assert!(e.starts_with("member \"k0005\" repeated"), "{e}");
}

/// What is read is held in about its own size: every object's and array's room is cut to
/// what it holds, so many small objects do not each keep a fixed room (issue 65: 30–60× the
/// bytes of `[{"a":0},…]` before).
#[test]
fn objects_and_arrays_hold_no_room_past_what_they_read() {
    fn tight(j: &Json<'_>) -> bool {
        match j {
            Json::Object(members) => members.capacity() == members.len() && members.iter().all(|(_, v)| tight(v)),
            Json::Array(items) => items.capacity() == items.len() && items.iter().all(tight),
            _ => true,
        }
    }
    let many: String = format!("[{}]", vec![r#"{"a":0}"#; 1_000].join(","));
    for text in [
        many.as_str(),
        r#"{"a":{"b":[1,2,3],"c":{"d":null}},"e":[{"f":1},{"g":2,"h":3}]}"#,
        r#"[[],{},[[[1]]]]"#,
    ] {
        let json = parse(text.as_bytes()).expect("valid JSON");
        assert!(tight(&json), "{text:.60}");
    }
}
