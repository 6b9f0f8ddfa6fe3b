//! A small JSON reader and writer for what the filter reads and sends.
//!
//! The filter is a WebAssembly module loaded into every proxy worker; serde_json's
//! generic deserializers were a third of it. This reader parses a document into a [`Json`]
//! tree (strings borrowed from the input unless they hold escapes), and [`Fields`] reads an
//! object field by field, so that each type's decoder is a short function and every error
//! names the field's whole path (`failure.breaker.cooldown_ms: expected an unsigned
//! integer, found a string`). Depth is bounded: no input can exhaust the stack.
//!
//! The wire types of the check and lease calls have this one codec on both sides: the
//! filter writes requests and reads answers with it, the service reads requests and writes
//! answers with it. [`Object`] writes an object member by member.

use std::borrow::Cow;
use std::fmt;

mod members;

pub use members::read_members;

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 32;
/// Up to this many members, an object's names are checked for repeats as they come; past
/// it, once sorted.
const PAIRWISE: usize = 16;
/// Most members of an object read with [`Fields`] (the parser itself takes any number).
pub const MAX_FIELDS: usize = 64;

/// A parsed JSON value. Numbers keep their text: [`Json::u64`] reads them exactly.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as written.
    Number(&'a str),
    /// A string, unescaped.
    String(Cow<'a, str>),
    /// An array.
    Array(Vec<Json<'a>>),
    /// An object's members in document order (keys are unique: a repeated key is refused).
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

/// What is wrong with a document, and where: the path of the field (`a.b[2].c`) or the
/// byte offset of a syntax error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError(Box<Where>);

/// A [`JsonError`]'s parts, boxed: a reader's `Result` stays the size of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Where {
    path: String,
    message: String,
    offset: Option<usize>,
}

impl JsonError {
    /// An error about the value being read; the caller's [`Fields`] adds its path.
    pub fn new(message: impl Into<String>) -> JsonError {
        JsonError(Box::new(Where {
            path: String::new(),
            message: message.into(),
            offset: None,
        }))
    }

    fn at_byte(mut self, offset: usize) -> JsonError {
        self.0.offset = Some(offset);
        self
    }

    /// This error, found inside the member `name` of an object.
    pub fn within(mut self, name: &str) -> JsonError {
        let sep = if self.0.path.is_empty() || self.0.path.starts_with('[') {
            ""
        } else {
            "."
        };
        self.0.path = format!("{name}{sep}{}", self.0.path);
        self
    }

    fn at_index(mut self, i: usize) -> JsonError {
        let sep = if self.0.path.is_empty() || self.0.path.starts_with('[') {
            ""
        } else {
            "."
        };
        self.0.path = format!("[{i}]{sep}{}", self.0.path);
        self
    }

    /// The field's path, empty for the document itself.
    pub fn path(&self) -> &str {
        &self.0.path
    }

    /// Where in the text a syntax error is, in bytes.
    pub fn offset(&self) -> Option<usize> {
        self.0.offset
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Where { path, message, offset } = &*self.0;
        if let Some(at) = offset {
            write!(f, "{message} at byte {at}")
        } else if path.is_empty() {
            f.write_str(message)
        } else {
            write!(f, "{path}: {message}")
        }
    }
}

impl std::error::Error for JsonError {}

/// Parses one JSON document (whitespace around it allowed, nothing else).
pub fn parse(text: &[u8]) -> Result<Json<'_>, JsonError> {
    let text = std::str::from_utf8(text).map_err(|e| JsonError::new("not UTF-8").at_byte(e.valid_up_to()))?;
    let mut p = Parser { text, at: 0 };
    let value = p.value(0)?;
    p.space();
    if p.at < text.len() {
        return Err(p.fail("trailing characters after the document"));
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    /// An error at the current byte; at the end of the text, it says so (a document cut
    /// short is the likeliest cause).
    fn fail(&self, what: &str) -> JsonError {
        let message = if self.at >= self.text.len() {
            format!("{what}, found the end")
        } else {
            what.to_owned()
        };
        JsonError::new(message).at_byte(self.at)
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        self.skip_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    }

    /// Steps over the bytes `is` holds for. The cursor is counted in a local and stored
    /// once: stored at every byte, it made the loops of a scan (most of reading a body) three
    /// times as long in wasm.
    #[inline(always)]
    fn skip_while(&mut self, is: impl Fn(u8) -> bool) -> usize {
        let bytes = self.text.as_bytes();
        let mut at = self.at;
        while bytes.get(at).is_some_and(|&b| is(b)) {
            at += 1;
        }
        let skipped = at - self.at;
        self.at = at;
        skipped
    }

    /// Steps over `b` if it comes next.
    fn eat_byte(&mut self, b: u8) -> bool {
        let found = self.peek() == Some(b);
        self.at += usize::from(found);
        found
    }

    fn eat(&mut self, word: &str) -> bool {
        let found = self.text[self.at..].starts_with(word);
        if found {
            self.at += word.len();
        }
        found
    }

    fn value(&mut self, depth: usize) -> Result<Json<'a>, JsonError> {
        self.space();
        match self.peek() {
            Some(b'{') | Some(b'[') if depth >= MAX_DEPTH => Err(self.fail("nested too deeply")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ if self.eat("true") => Ok(Json::Bool(true)),
            _ if self.eat("false") => Ok(Json::Bool(false)),
            _ if self.eat("null") => Ok(Json::Null),
            None => Err(self.fail("expected a value")),
            _ => Err(self.fail("expected a value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json<'a>, JsonError> {
        self.at += 1;
        self.space();
        if self.eat_byte(b'}') {
            return Ok(Json::Object(Vec::new()));
        }
        // Grown as members come and cut to size at the end (`unique`): a value read is held
        // in about its own size again, never a fixed room a member (which made
        // `[{"a":0},…]` cost 30–60× its bytes).
        let mut members: Vec<(Cow<'a, str>, Json<'a>)> = Vec::new();
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return Err(self.fail("expected a member name"));
            }
            let key = self.string()?;
            if members.len() < PAIRWISE && members.iter().any(|(k, _)| *k == key) {
                return Err(self.fail(&format!("member {key:?} repeated")));
            }
            self.space();
            if !self.eat_byte(b':') {
                return Err(self.fail("expected `:`"));
            }
            let value = self.value(depth)?;
            members.push((key, value));
            self.space();
            if self.eat_byte(b'}') {
                return self.unique(members);
            }
            if !self.eat_byte(b',') {
                return Err(self.fail("expected `,` or `}`"));
            }
        }
    }

    /// `members` as an object, unless a name repeats. A small object's names are compared
    /// as they come ([`PAIRWISE`]); a larger one's are sorted once, so that no body can make
    /// the check quadratic (a 16 KiB check body of 2,700 names would cost milliseconds).
    fn unique(&self, mut members: Vec<(Cow<'a, str>, Json<'a>)>) -> Result<Json<'a>, JsonError> {
        members.shrink_to_fit();
        if members.len() > PAIRWISE {
            let mut names: Vec<&str> = members.iter().map(|(k, _)| k.as_ref()).collect();
            names.sort_unstable();
            if let Some(pair) = names.windows(2).find(|pair| pair.first() == pair.last()) {
                let name = pair.first().copied().unwrap_or_default();
                return Err(self.fail(&format!("member {name:?} repeated")));
            }
        }
        Ok(Json::Object(members))
    }

    fn array(&mut self, depth: usize) -> Result<Json<'a>, JsonError> {
        self.at += 1;
        let mut items = Vec::new();
        self.space();
        if self.eat_byte(b']') {
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.space();
            if self.eat_byte(b']') {
                items.shrink_to_fit();
                return Ok(Json::Array(items));
            }
            if !self.eat_byte(b',') {
                return Err(self.fail("expected `,` or `]`"));
            }
        }
    }

    fn bad_number(&mut self, start: usize) -> JsonError {
        self.at = start;
        self.fail("invalid number")
    }

    fn number(&mut self) -> Result<Json<'a>, JsonError> {
        let start = self.at;
        self.eat_byte(b'-');
        let digits = |p: &mut Parser<'a>| p.skip_while(|b| b.is_ascii_digit());
        let first = self.peek();
        let whole = digits(self);
        if whole == 0 || (first == Some(b'0') && whole > 1) {
            return Err(self.bad_number(start));
        }
        if self.eat_byte(b'.') && digits(self) == 0 {
            return Err(self.bad_number(start));
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if !self.eat_byte(b'+') {
                self.eat_byte(b'-');
            }
            if digits(self) == 0 {
                return Err(self.bad_number(start));
            }
        }
        Ok(Json::Number(&self.text[start..self.at]))
    }

    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.at += 1;
        let start = self.at;
        self.skip_while(|b| b != b'"' && b != b'\\' && b >= 0x20);
        match self.peek() {
            Some(b'"') => {
                self.at += 1;
                Ok(Cow::Borrowed(&self.text[start..self.at - 1]))
            }
            Some(b'\\') => self.escaped(start).map(Cow::Owned),
            Some(_) => Err(self.fail("control character in a string")),
            None => Err(self.fail("unterminated string")),
        }
    }

    /// The rest of a string that holds escapes, from its first backslash.
    fn escaped(&mut self, start: usize) -> Result<String, JsonError> {
        let mut out = String::from(&self.text[start..self.at]);
        loop {
            let rest = &self.text[self.at..];
            let Some(c) = rest.chars().next() else {
                return Err(self.fail("unterminated string"));
            };
            self.at += c.len_utf8();
            match c {
                '"' => return Ok(out),
                '\\' => {
                    let e = self.peek().ok_or_else(|| self.fail("unterminated string"))?;
                    self.at += 1;
                    out.push(match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode()?,
                        _ => return Err(self.fail("invalid escape")),
                    });
                }
                '\0'..='\u{1f}' => return Err(self.fail("control character in a string")),
                c => out.push(c),
            }
        }
    }

    /// The code point of a `\u` escape (after the `u`), joining a surrogate pair.
    fn unicode(&mut self) -> Result<char, JsonError> {
        // Past the four digits only when they are there: an error is at the first of them,
        // never past the end of the text (a `\u` cut short by it).
        let hex = |p: &mut Parser<'a>| {
            let digits = p
                .text
                .get(p.at..p.at + 4)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
            let v = digits.and_then(|h| u32::from_str_radix(h, 16).ok());
            let v = v.ok_or_else(|| p.fail("invalid \\u escape"))?;
            p.at += 4;
            Ok(v)
        };
        let first = hex(self)?;
        let code = if (0xD800..0xDC00).contains(&first) {
            if !self.eat("\\u") {
                return Err(self.fail("unpaired surrogate"));
            }
            let low = hex(self)?;
            if !(0xDC00..0xE000).contains(&low) {
                return Err(self.fail("unpaired surrogate"));
            }
            0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00)
        } else {
            first
        };
        char::from_u32(code).ok_or_else(|| self.fail("unpaired surrogate"))
    }
}

impl<'a> Json<'a> {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    fn expected(&self, what: &str) -> JsonError {
        JsonError::new(format!("expected {what}, found {}", self.kind()))
    }

    /// An object, to read field by field.
    pub fn object(&self) -> Result<Fields<'_, 'a>, JsonError> {
        match self {
            Json::Object(members) if members.len() > MAX_FIELDS => Err(JsonError::new(format!(
                "an object of {} members; the most read is {MAX_FIELDS}",
                members.len()
            ))),
            Json::Object(members) => Ok(Fields {
                members,
                taken: 0,
                error: None,
                asked: [""; ASKED],
                asked_len: 0,
            }),
            other => Err(other.expected("an object")),
        }
    }

    /// An array's items.
    pub fn array(&self) -> Result<&[Json<'a>], JsonError> {
        match self {
            Json::Array(items) => Ok(items),
            other => Err(other.expected("an array")),
        }
    }

    /// Each item of an array read by `read`; an error names the item's index.
    pub fn each<T>(&self, mut read: impl FnMut(&Json<'a>) -> Result<T, JsonError>) -> Result<Vec<T>, JsonError> {
        let items = self.array()?;
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            out.push(read(item).map_err(|e| e.at_index(i))?);
        }
        Ok(out)
    }

    /// A string's text.
    pub fn str(&self) -> Result<&str, JsonError> {
        match self {
            Json::String(s) => Ok(s),
            other => Err(other.expected("a string")),
        }
    }

    /// A string, owned.
    pub fn string(&self) -> Result<String, JsonError> {
        self.str().map(str::to_owned)
    }

    /// `true` or `false`.
    pub fn bool(&self) -> Result<bool, JsonError> {
        match self {
            Json::Bool(b) => Ok(*b),
            other => Err(other.expected("true or false")),
        }
    }

    /// A whole number from 0 to `u64::MAX`, exactly.
    pub fn u64(&self) -> Result<u64, JsonError> {
        match self {
            Json::Number(n) => n
                .parse::<u64>()
                .map_err(|_| JsonError::new(format!("expected an unsigned integer, found {n}"))),
            other => Err(other.expected("an unsigned integer")),
        }
    }

    /// A whole number that fits `T` (`u32`, `u8`, `usize`...).
    pub fn uint<T: TryFrom<u64>>(&self) -> Result<T, JsonError> {
        let n = self.u64()?;
        T::try_from(n).map_err(|_| JsonError::new(format!("{n} is too large")))
    }
}

/// An object being read field by field. A decoder reads every field, then [`Fields::finish`]
/// refuses a field nobody took or gives the first error met (a field of the wrong type, a
/// required one missing). Reading on after an error keeps each decoder one straight list of
/// fields, and the filter small: an early return from the middle of a struct literal
/// costs a copy of its clean-up code per field.
pub struct Fields<'j, 'a> {
    members: &'j [(Cow<'a, str>, Json<'a>)],
    /// Bit `i`: member `i` was taken.
    taken: u64,
    error: Option<JsonError>,
    /// The names asked for, present or not (the first [`ASKED`]): the fields this object may
    /// have, for the error on an unknown one. A reader declares each field once, by asking.
    asked: [&'static str; ASKED],
    asked_len: usize,
}

/// Field names a [`Fields`] remembers for its error on an unknown field.
const ASKED: usize = 32;

impl<'j, 'a> Fields<'j, 'a> {
    /// The field `name`, if present (`null` counts as absent).
    pub fn take(&mut self, name: &'static str) -> Option<&'j Json<'a>> {
        if let Some(slot) = self.asked.get_mut(self.asked_len) {
            *slot = name;
            self.asked_len += 1;
        }
        let i = self.members.iter().position(|(k, _)| k == name)?;
        self.taken |= 1 << i;
        Some(&self.members[i].1).filter(|v| **v != Json::Null)
    }

    fn failed(&mut self, name: &str, e: JsonError) {
        if self.error.is_none() {
            self.error = Some(e.within(name));
        }
    }

    /// The field `name` read by `read`, or `None` when absent or unreadable (the error is
    /// kept for [`Fields::finish`]).
    pub fn opt<T>(&mut self, name: &'static str, read: impl FnOnce(&'j Json<'a>) -> Result<T, JsonError>) -> Option<T> {
        let value = self.take(name)?;
        self.read(name, value, read)
    }

    fn read<T>(
        &mut self,
        name: &str,
        value: &'j Json<'a>,
        read: impl FnOnce(&'j Json<'a>) -> Result<T, JsonError>,
    ) -> Option<T> {
        read(value).map_err(|e| self.failed(name, e)).ok()
    }

    /// The field `name` read by `read`; when absent, an error for [`Fields::finish`] and
    /// a placeholder.
    pub fn req<T: Default>(
        &mut self,
        name: &'static str,
        read: impl FnOnce(&'j Json<'a>) -> Result<T, JsonError>,
    ) -> T {
        match self.take(name) {
            Some(value) => self.read(name, value, read).unwrap_or_default(),
            None => {
                self.failed(name, JsonError::new("required but missing"));
                T::default()
            }
        }
    }

    /// An error for a field nobody took (naming the ones the reader asked for: a misspelt
    /// field is likelier the cause than the required one it leaves missing), else the first
    /// error met.
    pub fn finish(self) -> Result<(), JsonError> {
        match (0..self.members.len()).find(|i| self.taken & (1 << i) == 0) {
            Some(i) => Err(JsonError::new(format!(
                "unknown field `{}`, expected one of {}",
                self.members[i].0,
                self.asked[..self.asked_len].join(", ")
            ))),
            None => self.finish_lenient(),
        }
    }

    /// Like [`Fields::finish`], but fields nobody took are ignored (an answer from a newer
    /// service may carry more).
    pub fn finish_lenient(self) -> Result<(), JsonError> {
        self.error.map_or(Ok(()), Err)
    }
}

/// Writes a JSON object into a string, member by member: `{"a":1,"b":"x"}`. A member's
/// value that is not a number, a boolean or a string is written by the caller after
/// [`Object::key`], into [`Object::out`].
pub struct Object<'o> {
    out: &'o mut String,
    empty: bool,
}

impl<'o> Object<'o> {
    /// Opens an object at the end of `out`.
    pub fn new(out: &'o mut String) -> Object<'o> {
        out.push('{');
        Object { out, empty: true }
    }

    /// Starts the member `name`: its value comes next.
    pub fn key(&mut self, name: &str) {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        write_str(self.out, name);
        self.out.push(':');
    }

    /// The string being written, for a value [`Object::key`] started.
    pub fn out(&mut self) -> &mut String {
        self.out
    }

    /// The member `name`: `n`.
    pub fn u64(&mut self, name: &str, n: u64) {
        self.key(name);
        crate::text::push_u64(self.out, n);
    }

    /// The member `name`: `true` or `false`.
    pub fn bool(&mut self, name: &str, b: bool) {
        self.key(name);
        self.out.push_str(if b { "true" } else { "false" });
    }

    /// The member `name`: the string `s`.
    pub fn str(&mut self, name: &str, s: &str) {
        self.key(name);
        write_str(self.out, s);
    }

    /// Closes the object.
    pub fn end(self) {
        self.out.push('}');
    }
}

/// Appends `items` to `out` as a JSON array, each written by `write`.
pub fn write_each<T>(out: &mut String, items: &[T], mut write: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(out, item);
    }
    out.push(']');
}

/// Appends `s` to `out` as a JSON string, quoted and escaped.
pub fn write_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let mut rest = s;
    while let Some(i) = rest.bytes().position(|b| b < 0x20 || b == b'"' || b == b'\\') {
        // `i` is an ASCII byte's index: a character boundary on both sides.
        let (plain, tail) = rest.split_at(i);
        out.push_str(plain);
        let b = tail.as_bytes().first().copied().unwrap_or(b' ');
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            }
        }
        rest = tail.get(1..).unwrap_or("");
    }
    out.push_str(rest);
    out.push('"');
}

#[cfg(test)]
mod tests;
