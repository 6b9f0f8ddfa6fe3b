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
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct LeaseRequest {
    /// Leases asked for.
    #[cfg_attr(feature = "serde", serde(default))]
    pub grants: Vec<LeaseAsk>,
    /// Leases ending early or at their end, with what they did not spend.
    #[cfg_attr(feature = "serde", serde(default))]
    pub returns: Vec<LeaseReturn>,
}

/// One lease asked for: up to `want` units of `rule`'s quota for `identity`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
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
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
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
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
    /// Parses and validates a body; the error names what is wrong. (With the `serde`
    /// feature: the service's.)
    #[cfg(feature = "serde")]
    pub fn from_json(body: &[u8]) -> Result<LeaseRequest, WireError> {
        let req: LeaseRequest =
            serde_json::from_slice(body).map_err(|e| WireError(format!("invalid lease request: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    /// The request as JSON, for the service's [`LeaseRequest::from_json`].
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\"grants\":[");
        for (i, g) in self.grants.iter().enumerate() {
            out.push_str(if i == 0 { "{\"rule\":" } else { ",{\"rule\":" });
            json::write_str(&mut out, &g.rule);
            out.push_str(",\"identity\":");
            json::write_str(&mut out, &g.identity);
            out.push_str(&format!(",\"want\":{}}}", g.want));
        }
        out.push_str("],\"returns\":[");
        for (i, r) in self.returns.iter().enumerate() {
            out.push_str(if i == 0 { "{\"rule\":" } else { ",{\"rule\":" });
            json::write_str(&mut out, &r.rule);
            out.push_str(",\"identity\":");
            json::write_str(&mut out, &r.identity);
            out.push_str(&format!(",\"lease\":{},\"unspent\":{}}}", r.lease, r.unspent));
        }
        out.push_str("]}");
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

impl LeaseResponse {
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
        /// filter reads: each side's codec against the other's.
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
            prop_assert_eq!(LeaseRequest::from_json(request.to_json().as_bytes()), Ok(request));
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
            let text = serde_json::to_vec(&answer).unwrap();
            prop_assert_eq!(LeaseResponse::from_json(&text), Ok(answer));
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
                "missing field `unspent`",
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
