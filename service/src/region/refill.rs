//! The background task of a node in a region: every tick it asks the global store for the
//! leases its book wants (quotas about to run out, sized to this node's demand) and gives
//! back what idle quotas hold, in one concurrent exchange that never blocks a check. A check
//! waiting for a cold quota's first lease wakes it before its tick.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_core::lease::wire::{LeaseAsk, LeaseRequest, LeaseReturn};
use sluice_core::rules::RuleSet;
use tokio::time::MissedTickBehavior;

use crate::exchange::{exchange, LeaseError};
use crate::node::Node;

/// Keeps `node`'s leases of global quotas filled for as long as it runs; returns at once
/// when the node is not in a region.
pub async fn run(node: Arc<Node>) {
    let Some(region) = node.region.as_ref() else {
        return;
    };
    let mut tick = tokio::time::interval(region.config.tick);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seen = node.rules();
    loop {
        // A cold check waiting for its quota's first lease does not wait for the tick.
        tokio::select! {
            _ = tick.tick() => {}
            () = region.wake.notified() => {}
        }
        let rules = node.rules();
        let now_ms = node.clock.now().instant_ms();
        if !Arc::ptr_eq(&rules, &seen) {
            // The rules changed: start afresh, giving back what the old leases hold.
            region.book().forget_all(now_ms);
            seen = rules.clone();
        }
        if !region.link_up() && !region.probing.swap(true, Ordering::SeqCst) {
            tokio::spawn(probe(node.clone()));
        }
        let (asks, returns) = region.book().due(now_ms);
        if !asks.is_empty() || !returns.is_empty() {
            tokio::spawn(call(node.clone(), rules, asks, returns, now_ms));
        }
    }
}

/// One exchange with the global store; its answer goes to the book.
async fn call(node: Arc<Node>, rules: Arc<RuleSet>, asks: Vec<LeaseAsk>, returns: Vec<LeaseReturn>, asked_at_ms: u64) {
    let Some(region) = node.region.as_ref() else {
        return;
    };
    let req = LeaseRequest { grants: asks, returns };
    let ttl_of = |r: &sluice_core::rules::Rule| r.global.as_ref().map(|g| g.ttl);
    let answer = exchange(&region.global, &rules, asked_at_ms, &req, region.config.timeout, ttl_of).await;
    let now_ms = node.clock.now().instant_ms();
    let c = &region.counters;
    match answer {
        Ok((grants, returned)) => {
            region.book().granted(&req.grants, &grants, asked_at_ms, now_ms);
            region.set_link(true);
            c.calls_ok.fetch_add(1, Ordering::Relaxed);
            c.units_granted
                .fetch_add(grants.iter().map(|g| g.units).sum(), Ordering::Relaxed);
            c.units_returned.fetch_add(returned.iter().sum(), Ordering::Relaxed);
        }
        Err(e) => {
            region.book().failed(&req.grants);
            c.calls_failed.fetch_add(1, Ordering::Relaxed);
            match e {
                LeaseError::Store(e) => {
                    tracing::debug!(error = %e, "lease call to the global store failed");
                    region.set_link(false);
                }
                // A rule stopped being global between the ask and the call: the book is
                // forgotten at the next tick.
                LeaseError::NotLeased(rule) => tracing::debug!(rule, "no longer a global rule"),
            }
        }
    }
    region.landed();
}

/// While the link is down and nothing is asked for (a `closed` rule refuses without asking),
/// a ping tells when the global store answers again.
async fn probe(node: Arc<Node>) {
    let Some(region) = node.region.as_ref() else {
        return;
    };
    if let Ok(Ok(())) = tokio::time::timeout(region.config.timeout, region.global.ping()).await {
        region.set_link(true);
    }
    region.probing.store(false, Ordering::SeqCst);
}
