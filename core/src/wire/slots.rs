//! Wire types of concurrency slots: what a check's answer says a request holds, and
//! `POST /v1/slots`, which gives slots back when the request ends or renews them while it
//! runs.
//!
//! A slot is named by its rule and the time (unix µs) it was taken or last renewed; the
//! request it belongs to is sent again, so the service finds the same rule and identity as
//! the check did. A caller can only ever give back or renew slots of that identity, and a
//! slot given back twice, or after it expired, frees nothing.

use super::{CheckRequest, WireError};
use crate::json::{self, Json, JsonError};

/// Most slots one `POST /v1/slots` may name for one request (a request matches at most
/// this many rules).
pub const MAX_SLOTS_A_CALL: usize = 64;

/// Most requests one batched `POST /v1/slots` may carry.
pub const MAX_BATCH: usize = 256;

/// Most bytes of a batched `POST /v1/slots` body: the service's body limit there.
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// One concurrency slot a request holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The concurrency rule's name.
    pub rule: String,
    /// When the slot was taken or last renewed, unix µs: its name within the rule.
    pub at: u64,
    /// How long it lives past `at` unless renewed, in milliseconds (the rule's `window`).
    pub window_ms: u64,
}

impl Slot {
    pub(crate) fn write(&self, out: &mut String) {
        let mut o = json::Object::new(out);
        o.str("rule", &self.rule);
        o.u64("at", self.at);
        o.u64("window_ms", self.window_ms);
        o.end();
    }

    pub(crate) fn read(v: &Json<'_>) -> Result<Slot, JsonError> {
        let mut f = v.object()?;
        let slot = Slot {
            rule: f.req("rule", Json::string),
            at: f.req("at", Json::u64),
            window_ms: f.opt("window_ms", Json::u64).unwrap_or(0),
        };
        f.finish_lenient().map(|()| slot)
    }
}

/// `POST /v1/slots` request body: the slots of one request given back (`renew: false`,
/// when the request ended) or renewed (`renew: true`, while it runs).
///
/// `{"request": {"identities": {"user": "42"}, "method": "POST", "path": "/api/generate"},
/// "slots": [{"rule": "generate-in-flight", "at": 1764950400123456}], "renew": false}`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotsRequest {
    /// The request that took them, as it was checked.
    pub request: CheckRequest,
    /// Its slots, as the check's answer named them.
    pub slots: Vec<Slot>,
    /// Renew them rather than give them back.
    pub renew: bool,
}

impl SlotsRequest {
    /// Parses and validates a body of one request; errors name the field.
    pub fn from_json(body: &[u8]) -> Result<SlotsRequest, WireError> {
        let req = json::parse(body)
            .and_then(|doc| SlotsRequest::read(&doc))
            .map_err(|e| WireError(format!("invalid slots request: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    fn read(v: &Json<'_>) -> Result<SlotsRequest, JsonError> {
        let mut f = v.object()?;
        let req = SlotsRequest {
            request: f.req("request", CheckRequest::read),
            slots: f.req("slots", |v| v.each(Slot::read)),
            renew: f.opt("renew", Json::bool).unwrap_or(false),
        };
        f.finish().map(|()| req)
    }

    fn validate(&self) -> Result<(), WireError> {
        self.request.validate()?;
        if self.slots.len() > MAX_SLOTS_A_CALL {
            return Err(WireError(format!(
                "slots: {} given; at most {MAX_SLOTS_A_CALL}",
                self.slots.len()
            )));
        }
        Ok(())
    }

    /// The body as JSON, as [`SlotsRequest::from_json`] reads it.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(160);
        let mut o = json::Object::new(&mut out);
        o.key("request");
        o.out().push_str(&self.request.to_json());
        o.key("slots");
        json::write_each(o.out(), &self.slots, |out, slot| slot.write(out));
        o.bool("renew", self.renew);
        o.end();
        out
    }
}

/// A `POST /v1/slots` body: one request's slots ([`SlotsRequest`]), or several requests'
/// at once, `{"batch": [<SlotsRequest>, ...]}` (at most [`MAX_BATCH`]): a proxy gives back
/// every request that ended since its last tick in one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotsCall {
    /// One request's slots.
    One(SlotsRequest),
    /// Several requests' slots.
    Batch(Vec<SlotsRequest>),
}

impl SlotsCall {
    /// Parses and validates a body; errors name the field (a batch's entry by its index).
    pub fn from_json(body: &[u8]) -> Result<SlotsCall, WireError> {
        let doc = json::parse(body).map_err(|e| WireError(format!("invalid slots request: {e}")))?;
        let batched = matches!(&doc, Json::Object(members) if members.iter().any(|(k, _)| k == "batch"));
        if !batched {
            let req = SlotsRequest::read(&doc).map_err(|e| WireError(format!("invalid slots request: {e}")))?;
            req.validate()?;
            return Ok(SlotsCall::One(req));
        }
        let read = |doc: &Json<'_>| {
            let mut f = doc.object()?;
            let batch = f.req("batch", |v| v.each(SlotsRequest::read));
            f.finish().map(|()| batch)
        };
        let batch = read(&doc).map_err(|e| WireError(format!("invalid slots batch: {e}")))?;
        if batch.len() > MAX_BATCH {
            return Err(WireError(format!("batch: {} given; at most {MAX_BATCH}", batch.len())));
        }
        for (i, req) in batch.iter().enumerate() {
            req.validate().map_err(|e| WireError(format!("batch[{i}]: {}", e.0)))?;
        }
        Ok(SlotsCall::Batch(batch))
    }

    /// The requests it carries.
    pub fn requests(&self) -> &[SlotsRequest] {
        match self {
            SlotsCall::One(req) => std::slice::from_ref(req),
            SlotsCall::Batch(batch) => batch,
        }
    }

    /// The requests' slots, as one request's or as a batch: the form [`SlotsCall::from_json`]
    /// reads.
    pub fn to_json(&self) -> String {
        match self {
            SlotsCall::One(req) => req.to_json(),
            SlotsCall::Batch(batch) => {
                let entries: Vec<String> = batch.iter().map(SlotsRequest::to_json).collect();
                batch_body(&entries)
            }
        }
    }

    /// Bodies that carry `requests` in order, each a batch of at most [`MAX_BATCH`] requests
    /// and [`MAX_BATCH_BYTES`] bytes, with how many requests each carries.
    pub fn batches(requests: &[SlotsRequest]) -> Vec<(String, usize)> {
        let mut bodies = Vec::new();
        let mut entries: Vec<String> = Vec::new();
        let mut bytes = 0;
        for req in requests {
            let entry = req.to_json();
            if !entries.is_empty() && (entries.len() == MAX_BATCH || bytes + entry.len() + 16 > MAX_BATCH_BYTES) {
                bodies.push((batch_body(&entries), entries.len()));
                entries.clear();
                bytes = 0;
            }
            bytes += entry.len() + 1;
            entries.push(entry);
        }
        if !entries.is_empty() {
            bodies.push((batch_body(&entries), entries.len()));
        }
        bodies
    }
}

/// `{"batch":[…]}` of the requests' bodies.
fn batch_body(entries: &[String]) -> String {
    let mut out = String::with_capacity(12 + entries.iter().map(|e| e.len() + 1).sum::<usize>());
    out.push_str("{\"batch\":[");
    out.push_str(&entries.join(","));
    out.push_str("]}");
    out
}

/// `POST /v1/slots` answer: the slots the request holds now (a renewal's new times; none
/// after a release), and how many of those named were found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotsResponse {
    /// The slots held after the call: renewed ones under their new times.
    pub slots: Vec<Slot>,
    /// How many of the named slots were still held (the rest had expired or were given
    /// back already).
    pub found: u64,
}

impl SlotsResponse {
    /// The answer as JSON.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(32 + 64 * self.slots.len());
        let mut o = json::Object::new(&mut out);
        o.key("slots");
        json::write_each(o.out(), &self.slots, |out, slot| slot.write(out));
        o.u64("found", self.found);
        o.end();
        out
    }

    /// Parses an answer leniently.
    pub fn from_json(body: &[u8]) -> Result<SlotsResponse, WireError> {
        let read = |doc: &Json<'_>| {
            let mut f = doc.object()?;
            let answer = SlotsResponse {
                slots: f.opt("slots", |v| v.each(Slot::read)).unwrap_or_default(),
                found: f.opt("found", Json::u64).unwrap_or(0),
            };
            f.finish_lenient().map(|()| answer)
        };
        json::parse(body)
            .and_then(|doc| read(&doc))
            .map_err(|e| WireError(format!("invalid slots answer: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CheckRequest {
        CheckRequest::from_json(br#"{"identities":{"user":"42"},"method":"POST","path":"/api/generate"}"#).unwrap()
    }

    #[test]
    fn a_slots_request_round_trips_and_names_what_is_wrong() {
        let req = SlotsRequest {
            request: request(),
            slots: vec![Slot {
                rule: "gpu".into(),
                at: 1_764_950_400_123_456,
                window_ms: 5_000,
            }],
            renew: true,
        };
        assert_eq!(SlotsRequest::from_json(req.to_json().as_bytes()), Ok(req));
        let bad = |body: &str| SlotsRequest::from_json(body.as_bytes()).unwrap_err().0;
        assert!(bad(r#"{"slots":[]}"#).contains("request"), "{}", bad(r#"{"slots":[]}"#));
        let no_at = r#"{"request":{"identities":{},"method":"GET","path":"/"},"slots":[{"rule":"a"}]}"#;
        assert!(bad(no_at).contains("at"), "{}", bad(no_at));
        let many = format!(
            r#"{{"request":{{"identities":{{}},"method":"GET","path":"/"}},"slots":[{}]}}"#,
            vec![r#"{"rule":"a","at":1}"#; MAX_SLOTS_A_CALL + 1].join(",")
        );
        assert!(bad(&many).contains("at most 64"), "{}", bad(&many));
    }

    #[test]
    fn a_batch_round_trips_and_names_the_entry_that_is_wrong() {
        let one = |user: &str| SlotsRequest {
            request: CheckRequest {
                identities: [("user".to_owned(), user.to_owned())].into(),
                ..request()
            },
            slots: vec![Slot {
                rule: "gpu".into(),
                at: 1,
                window_ms: 0,
            }],
            renew: false,
        };
        let batch = SlotsCall::Batch(vec![one("a"), one("b")]);
        assert_eq!(SlotsCall::from_json(batch.to_json().as_bytes()), Ok(batch.clone()));
        assert_eq!(batch.requests().len(), 2);
        let single = SlotsCall::One(one("a"));
        assert_eq!(SlotsCall::from_json(single.to_json().as_bytes()), Ok(single));
        let bad = |body: &str| SlotsCall::from_json(body.as_bytes()).unwrap_err().0;
        let second_bad =
            r#"{"batch":[{"request":{"identities":{},"method":"GET","path":"/"},"slots":[]},{"slots":[]}]}"#;
        assert!(bad(second_bad).contains("batch[1]"), "{}", bad(second_bad));
        let mixed = r#"{"batch":[],"request":{"identities":{},"method":"GET","path":"/"}}"#;
        assert!(bad(mixed).contains("unknown field `request`"), "{}", bad(mixed));
        let many = format!(r#"{{"batch":[{}]}}"#, vec![one("a").to_json(); MAX_BATCH + 1].join(","));
        assert!(bad(&many).contains("at most 256"), "{}", bad(&many));
    }

    #[test]
    fn batches_hold_at_most_their_count_and_bytes_and_read_back_in_order() {
        let long = format!("/{}", "x".repeat(3_000));
        let requests: Vec<SlotsRequest> = (0..600)
            .map(|i| SlotsRequest {
                request: CheckRequest {
                    identities: [("user".to_owned(), i.to_string())].into(),
                    path: if i % 2 == 0 { long.clone() } else { "/".into() },
                    ..request()
                },
                slots: Vec::new(),
                renew: false,
            })
            .collect();
        let bodies = SlotsCall::batches(&requests);
        assert!(
            bodies.len() > 3,
            "the bytes split them before the count: {}",
            bodies.len()
        );
        let mut read = Vec::new();
        for (body, n) in &bodies {
            assert!(
                body.len() <= MAX_BATCH_BYTES && *n <= MAX_BATCH,
                "{} bytes, {n}",
                body.len()
            );
            let SlotsCall::Batch(batch) = SlotsCall::from_json(body.as_bytes()).unwrap() else {
                panic!("not a batch")
            };
            assert_eq!(batch.len(), *n);
            read.extend(batch);
        }
        assert_eq!(read, requests);
        assert!(SlotsCall::batches(&[]).is_empty());
    }

    #[test]
    fn an_answer_round_trips() {
        let answer = SlotsResponse {
            slots: vec![Slot {
                rule: "gpu".into(),
                at: 7,
                window_ms: 5_000,
            }],
            found: 1,
        };
        assert_eq!(SlotsResponse::from_json(answer.to_json().as_bytes()), Ok(answer));
    }
}
