//! Exact batching: the checks that reach a node while its call to a shard is in flight go
//! out together in the next call — a group commit, with no timer: a lone check goes at
//! once. Redis decides them in turn in one function call (`lua/check.lua`, `batch`), each
//! all-or-nothing as it would be alone, so batching changes how many calls Redis runs, not
//! what it decides. A batch never mixes cluster slots: each slot has a lane of its own.
//!
//! Each lane is pumped by a task of its own, so a check given up meanwhile (its timeout)
//! cannot leave a lane waiting for ever. A call that fails fails every check in it: each
//! is then answered by its rules' failure policies, as a check alone would be. Each call
//! takes the store's live connection as it is then: a lane kept busy by steady load once
//! held the one it started with, and after a Sentinel failover kept calling the dead master
//! for as long as the load lasted (issue 65's failover test, failing closed, never came back).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwapOption;
use redis::Script;
use tokio::sync::oneshot;

use super::connection::{Connection, Engine};
use super::library::{self, CheckCall};
use crate::store::StoreError;

/// The lanes, by cluster slot (0 on one server).
#[derive(Default)]
pub(super) struct Batcher {
    lanes: Mutex<HashMap<u16, Lane>>,
}

/// One slot's checks waiting for the call in flight to end, and whether one is.
#[derive(Default)]
struct Lane {
    busy: bool,
    waiting: Vec<Waiting>,
}

/// A check waiting for its lane: its call (a `decide`), its rules, where its reply goes.
struct Waiting {
    call: CheckCall,
    rules: usize,
    reply: oneshot::Sender<Result<Vec<i64>, StoreError>>,
}

impl Batcher {
    /// Decides `call` (a `decide` of `rules` rules) in `lane`, alone or with the checks that
    /// come while the lane's call is in flight; its reply as the script's: the time, then
    /// five numbers a rule.
    pub(super) async fn decide(
        self: &Arc<Self>,
        lane: u16,
        live: &Arc<ArcSwapOption<Connection>>,
        script: &Script,
        call: CheckCall,
        rules: usize,
    ) -> Result<Vec<i64>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = lanes.entry(lane).or_default();
            lane.waiting.push(Waiting { call, rules, reply });
            !std::mem::replace(&mut lane.busy, true)
        };
        if start {
            tokio::spawn(self.clone().pump(lane, live.clone(), script.clone()));
        }
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the batch carrying the check was given up".into()))?
    }

    /// Sends the lane's waiting checks, one call at a time, until none waits.
    async fn pump(self: Arc<Self>, lane: u16, live: Arc<ArcSwapOption<Connection>>, script: Script) {
        loop {
            let batch = {
                let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(l) = lanes.get_mut(&lane) else { return };
                if l.waiting.is_empty() {
                    lanes.remove(&lane);
                    return;
                }
                std::mem::take(&mut l.waiting)
            };
            let Some(connection) = live.load_full() else {
                for w in batch {
                    let _ = w
                        .reply
                        .send(Err(StoreError::Unavailable("not connected to Redis".into())));
                }
                continue;
            };
            // One check, or a server without the library's `batch` (a failover to one): each alone.
            if batch.len() == 1 || connection.engine != Engine::Functions {
                for w in batch {
                    let answer = library::run(&connection, &script, &w.call).await;
                    let _ = w.reply.send(answer);
                }
                continue;
            }
            let (call, batch) = together(batch);
            match library::run::<Vec<i64>>(&connection, &script, &call).await {
                Ok(reply) => answer_each(batch, &reply),
                Err(e) => {
                    for w in batch {
                        let _ = w.reply.send(Err(again(&e)));
                    }
                }
            }
        }
    }
}

/// The `batch` call of `checks` (each a `decide`: the clock, the unused `at`, then a value
/// a rule): the clock, how many checks, each one's number of rules, then every rule's
/// value; their keys in turn. Each check's strings move into it (the checks keep their
/// rule counts and reply channels).
fn together(mut checks: Vec<Waiting>) -> (CheckCall, Vec<Waiting>) {
    let mut keys = Vec::with_capacity(checks.iter().map(|w| w.call.keys.len()).sum());
    let mut args = Vec::with_capacity(2 + checks.iter().map(|w| 1 + w.rules).sum::<usize>());
    args.push(String::new());
    args.push(checks.len().to_string());
    args.extend(checks.iter().map(|w| w.rules.to_string()));
    for w in &mut checks {
        keys.append(&mut w.call.keys);
        args.extend(w.call.args.drain(..).skip(2));
    }
    let call = CheckCall {
        op: "batch",
        keys,
        args,
    };
    (call, checks)
}

/// Splits a batch's reply (the time, then five numbers a rule of each check in turn) into
/// each check's own, as it would have had alone.
fn answer_each(batch: Vec<Waiting>, reply: &[i64]) {
    let Some((&at, mut rest)) = reply.split_first() else {
        for w in batch {
            let _ = w
                .reply
                .send(Err(StoreError::Protocol(format!("batch returned {reply:?}"))));
        }
        return;
    };
    for w in batch {
        let own = rest.get(..5 * w.rules);
        rest = rest.get(5 * w.rules..).unwrap_or_default();
        let answer = own
            .map(|own| [&[at][..], own].concat())
            .ok_or_else(|| StoreError::Protocol(format!("batch returned {reply:?}")));
        let _ = w.reply.send(answer);
    }
}

/// The same failure for another check of the batch.
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Protocol(m) => StoreError::Protocol(m.clone()),
        StoreError::Config(m) => StoreError::Config(m.clone()),
    }
}
