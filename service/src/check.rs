//! Evaluating a check request: every matching rule, all-or-nothing, in one store call.
//!
//! The rules a request matches are decided together ([`crate::decide`]; global rules of a
//! node in a region from its leases, [`crate::region::decide`]); a denial is counted and
//! logged.

use std::borrow::Cow;

use sluice_core::identity::ip_identity;
use sluice_core::rules::{Rule, MISSING};
use sluice_core::wire::{CheckRequest, CheckResponse, RuleOutcome};

use crate::decide::{count, decide_limits, matched, refused_for_missing, settle, slots_held};
use crate::metrics::{Api, Verdict};
use crate::node::Node;

/// `req` as rules are matched against it, whoever sent it: its path canonical
/// (`sluice_core::path`), its `ip` identity grouped by the node's IPv6 prefix
/// (`sluice_core::identity`). What the filter sends is so already, and stays as it is.
pub fn canonical(mut req: CheckRequest, ipv6_prefix: u8) -> CheckRequest {
    if let Cow::Owned(path) = sluice_core::path::canonical(&req.path) {
        req.path = path;
    }
    if let Some(ip) = req.identities.get_mut("ip") {
        if let Cow::Owned(key) = ip_identity(ip, ipv6_prefix) {
            *ip = key;
        }
    }
    req
}

/// Decides a validated request (see [`canonical`] for a caller's request); a request of
/// cost 0 is a peek ([`crate::quota::peek`]).
pub async fn check(node: &Node, req: &CheckRequest) -> CheckResponse {
    if req.cost == 0 {
        return crate::quota::peek(node, req).await;
    }
    let _timer = node.metrics.time_check(Api::Http);
    let rules = node.rules();
    let now = node.clock.now();
    let now_ms = now.instant_ms();
    let found: Vec<(&Rule, &str)> = rules
        .matching_host(&req.identities, &req.method, req.host.as_deref(), &req.path)
        .collect();
    if found.is_empty() {
        return CheckResponse::from_outcomes(&[], now_ms);
    }
    if let Some((rule, _)) = found.iter().find(|(rule, id)| rule.refuses(id) && !rule.shadow) {
        count(node, &rule.name, MISSING, Verdict::Denied, false);
        return refused_for_missing(rule, now_ms);
    }
    let mut matched = matched(node, &rules, found, req.cost, now_ms);
    let degraded = match &node.region {
        Some(region) if matched.iter().any(|m| m.global.is_some()) => {
            crate::region::decide::decide(node, region, &mut matched, now).await
        }
        _ => decide_limits(node, &mut matched).await,
    };
    settle(node, &matched, degraded, &req.path, now_ms);
    let outcomes: Vec<RuleOutcome<'_>> = matched.iter().filter_map(|m| m.outcome(degraded)).collect();
    let mut answer = CheckResponse::from_outcomes(&outcomes, now_ms);
    if answer.allowed {
        answer.slots = slots_held(&matched);
        node.metrics.slots_taken(answer.slots.len() as u64 * req.cost.max(1));
    }
    answer
}
