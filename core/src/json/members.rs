//! A document's top object read member by member as the text comes, each value handed over
//! as it is parsed: no tree of the object itself, no lookup of its fields. For the answer the
//! filter reads on every checked request (`CheckResponse::from_json`), where building and
//! searching the object's members cost a sixth of the reading (4,800 of 28,000 wasm
//! instructions an answer; BENCHMARKS-LOG.md). A member's value that is an array or an
//! object is still parsed whole, as [`super::parse`] would.

use std::borrow::Cow;

use super::{Json, JsonError, Parser, MAX_FIELDS};

/// Reads `text`, one JSON object, handing each member to `member(name, value)` in document
/// order; `null` members are handed over as they are. The object is refused as
/// [`super::parse`] and [`Json::object`] would refuse it: malformed, nested too deeply, a
/// name repeated, more than [`MAX_FIELDS`] members, not an object. The first error
/// `member` returns ends the reading with it.
pub fn read_members<'a>(
    text: &'a [u8],
    mut member: impl FnMut(&str, Json<'a>) -> Result<(), JsonError>,
) -> Result<(), JsonError> {
    let text = std::str::from_utf8(text).map_err(|e| JsonError::new("not UTF-8").at_byte(e.valid_up_to()))?;
    let mut p = Parser { text, at: 0 };
    p.space();
    if p.peek() != Some(b'{') {
        // Whatever it is, it is not an object: the tree says what it is, or what is wrong.
        return Err(match super::parse(text.as_bytes()) {
            Ok(doc) => doc.expected("an object"),
            Err(e) => e,
        });
    }
    p.at += 1;
    p.space();
    let mut names: Vec<Cow<'a, str>> = Vec::new();
    if !p.eat_byte(b'}') {
        loop {
            p.space();
            if p.peek() != Some(b'"') {
                return Err(p.fail("expected a member name"));
            }
            let name = p.string()?;
            if names.contains(&name) {
                return Err(p.fail(&format!("member {name:?} repeated")));
            }
            if names.len() == MAX_FIELDS {
                return Err(JsonError::new(format!(
                    "an object of more than {MAX_FIELDS} members; the most read is {MAX_FIELDS}"
                )));
            }
            p.space();
            if !p.eat_byte(b':') {
                return Err(p.fail("expected `:`"));
            }
            let value = p.value(1)?;
            member(&name, value)?;
            names.push(name);
            p.space();
            if p.eat_byte(b'}') {
                break;
            }
            if !p.eat_byte(b',') {
                return Err(p.fail("expected `,` or `}`"));
            }
        }
    }
    p.space();
    if p.at < text.len() {
        return Err(p.fail("trailing characters after the document"));
    }
    Ok(())
}
