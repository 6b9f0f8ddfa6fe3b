//! Core's JSON reader against serde_json on the same bytes.
//!
//! serde_json reads the document into a [`Tree`] that keeps what core's reader keeps
//! (members in order, repeats included), so that the two can be compared value for value.
//! They must accept the same documents and read the same strings, booleans, integers and
//! nesting, except where core's reader differs on purpose (core/src/json.rs):
//!
//! 1. Depth: core refuses arrays and objects nested deeper than `json::MAX_DEPTH` (32),
//!    so that no input exhausts a proxy worker's stack; serde_json allows 128.
//! 2. Repeated names: core refuses an object that names a member twice (a reader could
//!    not say which one counts); serde_json hands every member to its visitor (and into
//!    a map, keeps the last).
//! 3. Numbers: core keeps a number's text and reads only whole numbers from 0 to
//!    `u64::MAX` from it (`Json::u64`); it never makes a float. serde_json refuses a
//!    number whose magnitude is beyond `f64` (`1e400`) as out of range; core reads it as
//!    a number its `u64` refuses. Floats are not compared (serde_json's are rounded by its
//!    own routine): a number serde_json reads as a float, core's `u64` must refuse.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use sluice_core::json::{self, Json};

/// A JSON value as serde_json reads it, members in document order.
#[derive(Debug)]
enum Tree {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    /// A number serde_json reads as a float: its value is not compared.
    Float,
    String(String),
    Array(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Tree, E> {
        Ok(Tree::U64(n))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Tree, E> {
        Ok(Tree::I64(n))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Float)
    }

    fn visit_str<E>(self, s: &str) -> Result<Tree, E> {
        Ok(Tree::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Tree, E> {
        Ok(Tree::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry()? {
            members.push(member);
        }
        Ok(Tree::Object(members))
    }
}

impl Tree {
    /// How many arrays and objects deep it is (a scalar: 0).
    fn depth(&self) -> usize {
        match self {
            Tree::Array(items) => 1 + items.iter().map(Tree::depth).max().unwrap_or(0),
            Tree::Object(members) => 1 + members.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// Whether an object in it names a member twice.
    fn repeats_a_name(&self) -> bool {
        match self {
            Tree::Array(items) => items.iter().any(Tree::repeats_a_name),
            Tree::Object(members) => {
                let mut names: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
                names.sort_unstable();
                names.windows(2).any(|w| w.first() == w.last()) || members.iter().any(|(_, v)| v.repeats_a_name())
            }
            _ => false,
        }
    }
}

/// Whether core's `ours` reads as serde_json's `theirs` (difference 3 for numbers).
fn same(ours: &Json<'_>, theirs: &Tree) -> bool {
    match (ours, theirs) {
        (Json::Null, Tree::Null) => true,
        (Json::Bool(a), Tree::Bool(b)) => a == b,
        (Json::Number(_), Tree::U64(n)) => ours.u64() == Ok(*n),
        (Json::Number(text), Tree::I64(n)) => ours.u64().is_err() && text.parse::<i64>() == Ok(*n),
        (Json::Number(_), Tree::Float) => ours.u64().is_err(),
        (Json::String(a), Tree::String(b)) => a == b,
        (Json::Array(a), Tree::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y)),
        (Json::Object(a), Tree::Object(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
        }
        _ => false,
    }
}

/// Whether a number in `value` is beyond `f64`'s range (difference 3).
fn has_huge_number(value: &Json<'_>) -> bool {
    match value {
        Json::Number(text) => text.parse::<f64>().is_ok_and(f64::is_infinite),
        Json::Array(items) => items.iter().any(has_huge_number),
        Json::Object(members) => members.iter().any(|(_, v)| has_huge_number(v)),
        _ => false,
    }
}

/// Core's JSON reader against serde_json: the same documents accepted, the same values
/// read, but for the deliberate differences this module's documentation lists.
pub fn json_differential(data: &[u8]) {
    let ours = json::parse(data);
    let theirs: Result<Tree, _> = serde_json::from_slice(data);
    match (&ours, &theirs) {
        (Ok(ours), Ok(theirs)) => {
            assert!(theirs.depth() <= json::MAX_DEPTH, "core read a document too deep");
            assert!(!theirs.repeats_a_name(), "core read a repeated name");
            assert!(
                same(ours, theirs),
                "read differently:\ncore:       {ours:?}\nserde_json: {theirs:?}"
            );
        }
        (Err(e), Ok(theirs)) => assert!(
            theirs.depth() > json::MAX_DEPTH || theirs.repeats_a_name(),
            "core refused what serde_json read ({e}): {theirs:?}"
        ),
        (Ok(ours), Err(e)) => assert!(
            has_huge_number(ours),
            "core read what serde_json refused ({e}): {ours:?}"
        ),
        (Err(_), Err(_)) => {}
    }
}
