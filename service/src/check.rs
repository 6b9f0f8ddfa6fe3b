//! Evaluating a check request: every matching rule, all-or-nothing, in one store call.
//!
//! The rules a request matches are decided together ([`crate::decide`]; global rules of a
//! node in a region from its leases, [`crate::region::decide`]); a denial is counted and
//! logged.

use std::borrow::Cow;

use sluice_core::identity::ip_identity;
use sluice_core::rules::Rule;
use sluice_core::time::instant_ms;
use sluice_core::wire::{CheckRequest, CheckResponse, RuleOutcome};

use crate::decide::{decide_limits, refused_for_missing, targets, verdict};
use crate::metrics::{Api, Verdict};
use crate::node::Node;
use crate::violations::Violation;

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
    let now_us = node.clock.now_us();
    let now_ms = instant_ms(now_us);
    let matched: Vec<(&Rule, &str)> = rules
        .matching_host(&req.identities, &req.method, req.host.as_deref(), &req.path)
        .collect();
    if matched.is_empty() {
        return CheckResponse::from_outcomes(&[], now_ms);
    }
    if let Some((rule, _)) = matched.iter().find(|(rule, id)| rule.refuses(id) && !rule.shadow) {
        node.metrics.check(&rule.name, Verdict::Denied);
        node.console
            .record(&rule.name, sluice_core::rules::MISSING, Verdict::Denied, false);
        return refused_for_missing(rule, now_ms);
    }
    let targets = targets(node, &rules, &matched, req.cost, now_ms);
    let (decisions, degraded) = match &node.region {
        Some(region) if matched.iter().any(|(rule, _)| rule.global.is_some()) => {
            crate::region::decide::decide(node, region, &matched, &targets, now_us).await
        }
        _ => {
            let (decisions, degraded) = decide_limits(node, &targets).await;
            (decisions.into_iter().map(Some).collect(), degraded)
        }
    };

    let mut outcomes: Vec<RuleOutcome<'_>> = Vec::with_capacity(matched.len());
    let mut denied_by: Option<(&Rule, &str)> = None;
    for (&(rule, identity), decision) in matched.iter().zip(decisions) {
        // Not counted: a global rule refused the request before this rule was decided.
        let Some(decision) = decision else { continue };
        let verdict = verdict(decision.allowed, rule.shadow);
        node.metrics.check(&rule.name, verdict);
        node.console.record(&rule.name, identity, verdict, degraded);
        node.metrics.near_limit(&rule.name, &decision);
        if verdict == Verdict::Denied && denied_by.is_none() {
            denied_by = Some((rule, identity));
        }
        outcomes.push(RuleOutcome {
            rule: &rule.name,
            window_ms: rule.window_ms,
            shadow: rule.shadow,
            decision,
            degraded,
        });
    }
    if let Some((rule, identity)) = denied_by {
        node.violations.record(Violation {
            rule: rule.name.clone(),
            identity: identity.to_owned(),
            at_ms: now_ms,
            cost: req.cost,
            path: req.path.clone(),
        });
    }
    CheckResponse::from_outcomes(&outcomes, now_ms)
}
