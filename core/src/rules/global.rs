//! A rule's global part: one limit across every region, each region leasing its share of
//! the quota from a global store (`global = true`; see `docs/design.md`, Regions).

use super::duration::lease_length;
use super::file::RuleSpec;
use crate::algorithm::Limit;
use crate::time::Micros;

/// How a global rule is shared between regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Global {
    /// How long a region's lease of the quota lasts.
    pub ttl: Micros,
    /// What a region does while the global store cannot be reached.
    pub unreachable: Unreachable,
}

/// A region's policy while the global store cannot be reached (`on_global_unreachable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// Spend what the region holds until its leases end, then deny (`spend`, the default).
    Spend,
    /// Spend what it holds, then decide alone with a share of the limit (`share`:
    /// `global_share` percent of `limit` and `burst`).
    Share {
        /// `global_share`.
        percent: u64,
        /// That share of the rule's own limit.
        limit: Limit,
    },
    /// Deny as soon as a lease call fails (`closed`).
    Closed,
}

impl Unreachable {
    /// The limit a region cut off from the global store decides alone with, for a quota
    /// limited by `limit` (the rule's own, or an override's for that client): `global_share`
    /// percent of it. `None` unless the policy is `share`.
    pub fn share(&self, limit: &Limit) -> Option<Limit> {
        match self {
            Unreachable::Share { percent, limit: own } => Some(share_of(limit, *percent).unwrap_or(*own)),
            Unreachable::Spend | Unreachable::Closed => None,
        }
    }
}

/// The rule's global part, or `None` when it is regional; `Err((field, why))` when a field
/// is wrong or does not belong.
pub(crate) fn global(spec: &RuleSpec, limit: &Limit) -> Result<Option<Global>, (&'static str, String)> {
    if !spec.global {
        let stray = [
            ("global_ttl", spec.global_ttl.is_some()),
            ("on_global_unreachable", spec.on_global_unreachable.is_some()),
            ("global_share", spec.global_share.is_some()),
        ];
        return match stray.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err((
                field,
                "applies to global rules: add global = true, or leave it out".into(),
            )),
            None => Ok(None),
        };
    }
    crate::lease::leasable(limit).map_err(|e| ("global", e.to_string().replace("lease = true", "global = true")))?;
    if spec.shadow {
        return Err((
            "shadow",
            "a global rule cannot be a shadow rule; make it regional to try it out".into(),
        ));
    }
    let ttl = lease_length(spec.global_ttl.as_deref(), "global_ttl")?;
    // A proxy leasing the rule through its region's node is handed units of the node's
    // lease, which its own cannot outlast.
    if spec.lease && lease_length(spec.lease_ttl.as_deref(), "lease_ttl")? > ttl {
        return Err((
            "lease_ttl",
            "a proxy's lease of a global rule comes out of its region's lease: make it no longer than global_ttl"
                .into(),
        ));
    }
    let unreachable = match (spec.on_global_unreachable.as_deref().unwrap_or("spend"), spec.global_share) {
        ("spend", None) => Unreachable::Spend,
        ("closed", None) => Unreachable::Closed,
        ("share", Some(percent @ 1..=100)) => Unreachable::Share {
            percent,
            limit: share_of(limit, percent)?,
        },
        ("share", Some(p)) => return Err(("global_share", format!("must be 1 to 100 (percent of limit), not {p}"))),
        ("share", None) => {
            return Err((
                "global_share",
                "on_global_unreachable = \"share\" needs the percent of limit a cut-off region may admit, e.g. global_share = 25".into(),
            ))
        }
        ("spend" | "closed", Some(_)) => {
            return Err(("global_share", "applies with on_global_unreachable = \"share\"".into()))
        }
        (other, _) => {
            return Err((
                "on_global_unreachable",
                format!("{other:?} is not \"spend\", \"share\" or \"closed\""),
            ))
        }
    };
    Ok(Some(Global { ttl, unreachable }))
}

/// `percent` of `limit` (its limit and its burst, each at least 1), same algorithm and window.
fn share_of(limit: &Limit, percent: u64) -> Result<Limit, (&'static str, String)> {
    let part = |n: u64| (n.saturating_mul(percent) / 100).max(1);
    let burst = if limit.capacity() == limit.limit() {
        0
    } else {
        part(limit.capacity())
    };
    Limit::builder(limit.algorithm(), part(limit.limit()), limit.window())
        .burst(burst)
        .build()
        .map_err(|e| ("global_share", e.to_string()))
}
