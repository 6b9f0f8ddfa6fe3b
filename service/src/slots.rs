//! `POST /v1/slots`: a request's concurrency slots given back when it ends, or renewed
//! while it runs.
//!
//! The request is matched again as its check was, so a caller names only slots of the
//! identity it sends: it can give back or renew nothing of another's. A slot is found by
//! its rule and its time; one already given back, or expired, is not found and frees
//! nothing, so a release sent twice cannot free another request's slot.

use futures_util::future::join_all;
use sluice_core::algorithm::Algorithm;
use sluice_core::wire::{Slot, SlotsCall, SlotsRequest, SlotsResponse};

use crate::node::Node;
use crate::store::{within, StoreError};

/// A `POST /v1/slots` body carried out: its answer, one request's or a batch's
/// (`{"batch": [<answer>, ...]}`, in the batch's order). A batch's requests go to the store
/// at once; when one fails, the call fails, and what the others did stands (a release
/// named again is not found, and frees nothing more).
pub async fn call(node: &Node, call: SlotsCall) -> Result<String, StoreError> {
    let canonical = |mut req: SlotsRequest| {
        req.request = crate::check::canonical(req.request, node.config.ipv6_prefix);
        req
    };
    match call {
        SlotsCall::One(req) => Ok(slots(node, &canonical(req)).await?.to_json()),
        SlotsCall::Batch(batch) => {
            let batch: Vec<SlotsRequest> = batch.into_iter().map(canonical).collect();
            let answers = join_all(batch.iter().map(|req| slots(node, req))).await;
            let mut out = String::from("{\"batch\":[");
            for (i, answer) in answers.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&answer?.to_json());
            }
            out.push_str("]}");
            Ok(out)
        }
    }
}

/// Gives back or renews the slots `req` names; the slots held afterwards (renewed ones
/// under their new times). A slot of a rule the request no longer matches, or that is not
/// a concurrency rule, is not found.
pub async fn slots(node: &Node, req: &SlotsRequest) -> Result<SlotsResponse, StoreError> {
    let rules = node.rules();
    let request = &req.request;
    let mut answer = SlotsResponse::default();
    let matching: Vec<_> = rules
        .matching_host(
            &request.identities,
            &request.method,
            request.host.as_deref(),
            &request.path,
        )
        .filter(|(rule, _)| rule.limit.algorithm() == Algorithm::Concurrency)
        .collect();
    for slot in &req.slots {
        let Some(&(rule, identity)) = matching.iter().find(|(rule, _)| rule.name == slot.rule) else {
            node.metrics.slot_not_found();
            continue;
        };
        let key = node.store.keys().limit(&rule.name, identity);
        let limit = rules.limit_for(rule, identity, node.clock.now().instant_ms());
        let at = sluice_core::Micros::new(slot.at);
        let call = node.store.slots(&key, &limit, at, request.cost, req.renew);
        let (found, now) = within(node.config.store_timeout, call).await?;
        if found == 0 {
            node.metrics.slot_not_found();
            continue;
        }
        answer.found += 1;
        node.metrics.slots(req.renew, found);
        if req.renew {
            answer.slots.push(Slot {
                rule: rule.name.clone(),
                at: now.as_u64(),
                window_ms: rule.window_ms,
            });
        }
    }
    Ok(answer)
}
