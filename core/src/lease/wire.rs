//! `POST /v1/lease`: a proxy asks for leases and gives back what it did not spend, in one
//! call. Times are relative (`expires_in_ms`): the proxy's clock is not the service's.

use serde::{Deserialize, Serialize};

use crate::wire::{WireError, MAX_IDENTITY_BYTES};

/// Grants and returns per call, each, at most.
pub const MAX_LEASE_ITEMS: usize = 64;
/// Units one grant may ask for at most.
pub const MAX_WANT: u64 = 1_000_000;

/// `{"grants": [{"rule": "per-ip", "identity": "203.0.113.9", "want": 50}],
///   "returns": [{"rule": "per-ip", "identity": "203.0.113.9", "lease": 7, "unspent": 12}]}`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Leases asked for.
    #[serde(default)]
    pub grants: Vec<LeaseAsk>,
    /// Leases ending early or at their end, with what they did not spend.
    #[serde(default)]
    pub returns: Vec<LeaseReturn>,
}

/// One lease asked for: up to `want` units of `rule`'s quota for `identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseAsk {
    /// The rule's name.
    pub rule: String,
    /// The identity value the rule limits.
    pub identity: String,
    /// Units wanted, 1..=[`MAX_WANT`].
    pub want: u64,
}

/// What a lease did not spend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseResponse {
    /// The version of the rules the service decided with.
    pub rules_version: u64,
    /// One per ask.
    pub grants: Vec<LeaseGranted>,
    /// Units taken back, one per return.
    pub returned: Vec<u64>,
}

/// A lease granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl LeaseRequest {
    /// Parses and validates a body; the error names what is wrong.
    pub fn from_json(body: &[u8]) -> Result<LeaseRequest, WireError> {
        let req: LeaseRequest =
            serde_json::from_slice(body).map_err(|e| WireError(format!("invalid lease request: {e}")))?;
        req.validate()?;
        Ok(req)
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

#[cfg(test)]
mod tests {
    use super::*;

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
