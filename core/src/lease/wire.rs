//! `POST /v1/lease`: a proxy asks for leases and gives back what it did not spend, in one
//! call. Times are relative (`expires_in_ms`): the proxy's clock is not the service's.

use crate::json::{self, Json, JsonError};
use crate::wire::{WireError, MAX_IDENTITY_BYTES};

/// Grants and returns per call, each, at most.
pub const MAX_LEASE_ITEMS: usize = 64;
/// Units one grant may ask for at most.
pub const MAX_WANT: u64 = 1_000_000;

/// `{"grants": [{"rule": "per-ip", "identity": "203.0.113.9", "want": 50}],
///   "returns": [{"rule": "per-ip", "identity": "203.0.113.9", "lease": 7, "unspent": 12}]}`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRequest {
    /// Leases asked for.
    pub grants: Vec<LeaseAsk>,
    /// Leases ending early or at their end, with what they did not spend.
    pub returns: Vec<LeaseReturn>,
}

/// One lease asked for: up to `want` units of `rule`'s quota for `identity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAsk {
    /// The rule's name.
    pub rule: String,
    /// The identity value the rule limits.
    pub identity: String,
    /// Units wanted, 1..=[`MAX_WANT`].
    pub want: u64,
}

/// What a lease did not spend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseReturn {
    /// The rule's name.
    pub rule: String,
    /// The identity value.
    pub identity: String,
    /// The lease's id, as granted.
    pub lease: u64,
    /// Units not spent.
    pub unspent: u64,
}

/// The answer: the leases granted (in the order asked; `units` 0 when none was left) and
/// the units each return took back (never more than its lease still held, nothing once it
/// ended), and the rules' version, so that a proxy knows when to fetch them again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseResponse {
    /// The version of the rules the service decided with.
    pub rules_version: u64,
    /// One per ask.
    pub grants: Vec<LeaseGranted>,
    /// Units taken back, one per return.
    pub returned: Vec<u64>,
}

/// A lease granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGranted {
    /// The lease's id, for its return.
    pub lease: u64,
    /// Units granted: 0 to what was asked.
    pub units: u64,
    /// Milliseconds the lease lasts from when the service granted it.
    pub expires_in_ms: u64,
    /// The rule's limit per window.
    pub limit: u64,
    /// What the quota holds after the grant.
    pub remaining: u64,
    /// Milliseconds until the quota is whole again.
    pub reset_after_ms: u64,
    /// The rule's window in milliseconds.
    pub window_ms: u64,
    /// With 0 units: milliseconds until the quota could grant one again (the refusal's
    /// `retry_after`), so the holder refuses without asking until then; 0 otherwise, and
    /// from a service that does not say (the field is optional on the wire).
    pub retry_after_ms: u64,
}

impl LeaseRequest {
    /// Parses and validates a body (unknown fields refused); the error names what is wrong.
    pub fn from_json(body: &[u8]) -> Result<LeaseRequest, WireError> {
        let read = |doc: &Json<'_>| {
            let mut f = doc.object()?;
            let req = LeaseRequest {
                grants: f.opt("grants", |v| v.each(LeaseAsk::read)).unwrap_or_default(),
                returns: f.opt("returns", |v| v.each(LeaseReturn::read)).unwrap_or_default(),
            };
            f.finish().map(|()| req)
        };
        let req = json::parse(body)
            .and_then(|doc| read(&doc))
            .map_err(|e| WireError(format!("invalid lease request: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    /// The request as JSON, as [`LeaseRequest::from_json`] reads it.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(32 + 96 * (self.grants.len() + self.returns.len()));
        let mut o = json::Object::new(&mut out);
        o.key("grants");
        json::write_each(o.out(), &self.grants, |out, g| {
            let mut g_out = json::Object::new(out);
            g_out.str("rule", &g.rule);
            g_out.str("identity", &g.identity);
            g_out.u64("want", g.want);
            g_out.end();
        });
        o.key("returns");
        json::write_each(o.out(), &self.returns, |out, r| {
            let mut r_out = json::Object::new(out);
            r_out.str("rule", &r.rule);
            r_out.str("identity", &r.identity);
            r_out.u64("lease", r.lease);
            r_out.u64("unspent", r.unspent);
            r_out.end();
        });
        o.end();
        out
    }

    /// At most [`MAX_LEASE_ITEMS`] grants and returns; names and identities 1 to
    /// [`MAX_IDENTITY_BYTES`] bytes; `want` in 1..=[`MAX_WANT`].
    pub fn validate(&self) -> Result<(), WireError> {
        if self.grants.len() > MAX_LEASE_ITEMS || self.returns.len() > MAX_LEASE_ITEMS {
            return Err(WireError(format!(
                "invalid lease request: at most {MAX_LEASE_ITEMS} grants and {MAX_LEASE_ITEMS} returns per call"
            )));
        }
        let names = self
            .grants
            .iter()
            .map(|g| (&g.rule, &g.identity))
            .chain(self.returns.iter().map(|r| (&r.rule, &r.identity)));
        for (rule, identity) in names {
            for (what, value) in [("rule", rule), ("identity", identity)] {
                if value.is_empty() || value.len() > MAX_IDENTITY_BYTES {
                    return Err(WireError(format!(
                        "invalid lease request: a {what} must be 1 to {MAX_IDENTITY_BYTES} bytes"
                    )));
                }
            }
        }
        if let Some(g) = self.grants.iter().find(|g| g.want == 0 || g.want > MAX_WANT) {
            return Err(WireError(format!(
                "invalid lease request: want {} for rule {:?}; ask for 1 to {MAX_WANT} units",
                g.want, g.rule
            )));
        }
        Ok(())
    }
}

impl LeaseAsk {
    fn read(v: &Json<'_>) -> Result<LeaseAsk, JsonError> {
        let mut f = v.object()?;
        let ask = LeaseAsk {
            rule: f.req("rule", Json::string),
            identity: f.req("identity", Json::string),
            want: f.req("want", Json::u64),
        };
        f.finish().map(|()| ask)
    }
}

impl LeaseReturn {
    fn read(v: &Json<'_>) -> Result<LeaseReturn, JsonError> {
        let mut f = v.object()?;
        let back = LeaseReturn {
            rule: f.req("rule", Json::string),
            identity: f.req("identity", Json::string),
            lease: f.req("lease", Json::u64),
            unspent: f.req("unspent", Json::u64),
        };
        f.finish().map(|()| back)
    }
}

impl LeaseResponse {
    /// The answer as JSON, as [`LeaseResponse::from_json`] reads it.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(64 + 192 * self.grants.len());
        let mut o = json::Object::new(&mut out);
        o.u64("rules_version", self.rules_version);
        o.key("grants");
        json::write_each(o.out(), &self.grants, |out, g| g.write(out));
        o.key("returned");
        json::write_each(o.out(), &self.returned, |out, n| crate::text::push_u64(out, *n));
        o.end();
        out
    }

    /// Parses the service's answer (unknown fields ignored, for answers from a newer
    /// service); the error names what is wrong.
    pub fn from_json(body: &[u8]) -> Result<LeaseResponse, WireError> {
        let read = |doc: &Json<'_>| {
            let mut f = doc.object()?;
            let answer = LeaseResponse {
                rules_version: f.req("rules_version", Json::u64),
                grants: f.opt("grants", |v| v.each(LeaseGranted::read)).unwrap_or_default(),
                returned: f.opt("returned", |v| v.each(Json::u64)).unwrap_or_default(),
            };
            f.finish_lenient().map(|()| answer)
        };
        json::parse(body)
            .and_then(|doc| read(&doc))
            .map_err(|e| WireError(format!("invalid lease response: {e}")))
    }
}

impl LeaseGranted {
    fn write(&self, out: &mut String) {
        let mut o = json::Object::new(out);
        o.u64("lease", self.lease);
        o.u64("units", self.units);
        o.u64("expires_in_ms", self.expires_in_ms);
        o.u64("limit", self.limit);
        o.u64("remaining", self.remaining);
        o.u64("reset_after_ms", self.reset_after_ms);
        o.u64("window_ms", self.window_ms);
        o.u64("retry_after_ms", self.retry_after_ms);
        o.end();
    }

    fn read(v: &Json<'_>) -> Result<LeaseGranted, JsonError> {
        let mut f = v.object()?;
        let granted = LeaseGranted {
            lease: f.req("lease", Json::u64),
            units: f.req("units", Json::u64),
            expires_in_ms: f.req("expires_in_ms", Json::u64),
            limit: f.req("limit", Json::u64),
            remaining: f.req("remaining", Json::u64),
            reset_after_ms: f.req("reset_after_ms", Json::u64),
            window_ms: f.req("window_ms", Json::u64),
            retry_after_ms: f.opt("retry_after_ms", Json::u64).unwrap_or(0),
        };
        f.finish_lenient().map(|()| granted)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// What the filter writes the service reads, and what the service answers the
        /// filter reads; serde_json, an independent reader, reads both as the same.
        #[test]
        fn both_directions_round_trip(
            asks in prop::collection::vec(("(?s).{1,20}", "(?s).{1,20}", 1..=MAX_WANT), 0..4),
            returns in prop::collection::vec(("(?s).{1,20}", "(?s).{1,20}", any::<u64>(), any::<u64>()), 0..4),
            granted in prop::collection::vec(any::<[u64; 8]>(), 0..4),
            returned in prop::collection::vec(any::<u64>(), 0..4),
            rules_version in any::<u64>(),
        ) {
            let request = LeaseRequest {
                grants: asks.into_iter().map(|(rule, identity, want)| LeaseAsk { rule, identity, want }).collect(),
                returns: returns
                    .into_iter()
                    .map(|(rule, identity, lease, unspent)| LeaseReturn { rule, identity, lease, unspent })
                    .collect(),
            };
            let text = request.to_json();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(v["grants"].as_array().map(Vec::len), Some(request.grants.len()));
            for (g, ask) in v["grants"].as_array().into_iter().flatten().zip(&request.grants) {
                prop_assert_eq!(g["identity"].as_str(), Some(ask.identity.as_str()));
            }
            prop_assert_eq!(LeaseRequest::from_json(text.as_bytes()), Ok(request));
            let answer = LeaseResponse {
                rules_version,
                grants: granted
                    .into_iter()
                    .map(|[lease, units, expires_in_ms, limit, remaining, reset_after_ms, window_ms, retry_after_ms]| {
                        LeaseGranted { lease, units, expires_in_ms, limit, remaining, reset_after_ms, window_ms, retry_after_ms }
                    })
                    .collect(),
                returned,
            };
            let text = answer.to_json();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(v["rules_version"].as_u64(), Some(answer.rules_version));
            prop_assert_eq!(v["returned"].as_array().map(Vec::len), Some(answer.returned.len()));
            prop_assert_eq!(LeaseResponse::from_json(text.as_bytes()), Ok(answer));
        }
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let cases = [
            (r#"{"grants": [{"rule": "r", "identity": "i", "want": 0}]}"#, "want 0"),
            (
                r#"{"grants": [{"rule": "", "identity": "i", "want": 1}]}"#,
                "a rule must be",
            ),
            (
                r#"{"returns": [{"rule": "r", "identity": "i", "lease": 1}]}"#,
                "returns[0].unspent: required but missing",
            ),
            (r#"{"grants": [], "colour": 1}"#, "unknown field `colour`"),
            (r#"[1]"#, "invalid lease request"),
        ];
        for (body, says) in cases {
            let e = LeaseRequest::from_json(body.as_bytes()).unwrap_err();
            assert!(e.to_string().contains(says), "{body}: {e}");
        }
        let ok = LeaseRequest::from_json(br#"{"grants": [{"rule": "r", "identity": "i", "want": 5}]}"#).unwrap();
        assert_eq!(ok.grants[0].want, 5);
    }
}
