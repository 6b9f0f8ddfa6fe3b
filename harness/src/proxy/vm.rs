//! The worker's VM: a [`Host`] with the streams it holds paused and the calls it has
//! started. The worker calls it directly; nothing here awaits.

use std::collections::HashMap;
use std::net::SocketAddr;

use tokio::sync::oneshot;

use super::calls::{Call, Ended};
use super::{now_ns, Headers, ProxyStats};
use crate::{Flavor, Host, Outcome};

/// What becomes of a request the module has seen.
pub enum Disposition {
    /// Send it upstream with these headers; `stream` waits for the response.
    Forward { stream: u32, headers: Headers },
    /// Answer it with this response (the stream has ended).
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
}

/// A request's first step: decided at once, or paused until the module resumes it.
pub enum Step {
    Now(Disposition),
    Paused {
        stream: u32,
        verdict: oneshot::Receiver<Disposition>,
    },
}

/// A module's VM and what it holds between events.
pub struct Vm {
    host: Host,
    clusters: HashMap<String, Vec<SocketAddr>>,
    /// Paused streams and where their verdict goes.
    waiting: HashMap<u32, oneshot::Sender<Disposition>>,
    /// The last call started (tokens only grow).
    started: u32,
    /// Round-robin position over a cluster's endpoints.
    turn: usize,
    /// Envoy's `xff_num_trusted_hops` (see [`super::envoy`]).
    xff_num_trusted_hops: u32,
    stats: ProxyStats,
}

impl Vm {
    pub fn new(host: Host, clusters: HashMap<String, Vec<SocketAddr>>, xff_num_trusted_hops: u32) -> Vm {
        Vm {
            host,
            clusters,
            waiting: HashMap::new(),
            started: 0,
            turn: 0,
            xff_num_trusted_hops,
            stats: ProxyStats::default(),
        }
    }

    /// When the next tick is due (ns since the epoch), if ticks are on.
    pub fn next_tick_ns(&self) -> Option<u64> {
        self.host.next_tick_ns()
    }

    /// Moves the clock to now and runs the ticks due.
    pub fn fire_ticks(&mut self) {
        self.host.set_clock(now_ns());
        if let Err(e) = self.host.run_due_ticks() {
            tracing::error!("tick failed: {e}");
        }
    }

    /// A request's headers: forward, answer, or hold until the module resumes it.
    pub fn request(&mut self, headers: &Headers, peer: SocketAddr) -> Step {
        let host = &mut self.host;
        let (headers, properties) = match host.flavor() {
            Flavor::Nginx => super::nginx::request_view(headers, peer),
            Flavor::Envoy => {
                let (shown, source) = super::envoy::request_view(headers, peer, self.xff_num_trusted_hops);
                (shown, vec![("source.address".to_owned(), source.into_bytes())])
            }
        };
        let outcome = host.new_stream().and_then(|s| {
            for (path, value) in properties {
                host.set_property(s, &path, value);
            }
            host.request_headers(s, &pairs(&headers), false).map(|o| (s, o))
        });
        match outcome {
            Ok((s, Outcome::Continue)) => {
                let headers = host.stream(s).map(|st| st.request_headers.clone()).unwrap_or_default();
                Step::Now(Disposition::Forward { stream: s, headers })
            }
            Ok((s, Outcome::LocalResponse(r))) => {
                let _ = host.finish_stream(s);
                Step::Now(Disposition::Respond {
                    status: r.status,
                    headers: r.headers,
                    body: r.body,
                })
            }
            Ok((s, Outcome::Pause)) => {
                let (reply, verdict) = oneshot::channel();
                self.waiting.insert(s, reply);
                Step::Paused { stream: s, verdict }
            }
            Err(e) => {
                tracing::error!("module failed on request headers: {e}");
                Step::Now(Disposition::Respond {
                    status: 500,
                    headers: vec![],
                    body: b"wasm module failed\n".to_vec(),
                })
            }
        }
    }

    /// The upstream's response headers, as the module changes them; the stream ends.
    pub fn response(&mut self, stream: u32, headers: Headers) -> Headers {
        let changed = match self.host.response_headers(stream, &pairs(&headers), false) {
            Ok(_) => self
                .host
                .stream(stream)
                .map(|s| s.response_headers.clone())
                .unwrap_or(headers),
            Err(e) => {
                tracing::error!("module failed on response headers: {e}");
                headers
            }
        };
        let _ = self.host.finish_stream(stream);
        changed
    }

    /// The stream's client went away, or its request could not be forwarded.
    pub fn abort(&mut self, stream: u32) {
        self.waiting.remove(&stream);
        let _ = self.host.finish_stream(stream);
    }

    /// A dispatched call ended: its response, the host's own for a call that reached no
    /// endpoint (a failed call too), or a failure (no headers).
    pub fn call_done(&mut self, token: u32, ended: Ended) {
        let result = match ended {
            Ended::Answered(r) => self.host.respond_call(token, r),
            Ended::Unreached(r) => {
                self.stats.calls_failed += 1;
                self.host.respond_call(token, r)
            }
            Ended::Failed => {
                self.stats.calls_failed += 1;
                self.host.fail_call(token)
            }
        };
        if let Err(e) = result {
            tracing::debug!("call {token} not delivered: {e}");
        }
    }

    /// The VM's counters, memory and the module's metrics (requests are the worker's).
    pub fn stats(&mut self) -> ProxyStats {
        let host = &mut self.host;
        self.stats.vm_memory_bytes = host.memory_bytes() as u64;
        self.stats.metrics = host
            .metric_names()
            .into_iter()
            .filter_map(|name| host.metric(&name).map(|v| (name, v)))
            .collect();
        self.stats.clone()
    }

    /// Sends the verdict of every held stream the module resumed or answered since.
    pub fn release_ready(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let host = &mut self.host;
        let ready: Vec<u32> = self
            .waiting
            .keys()
            .copied()
            .filter(|s| {
                host.stream(*s)
                    .is_none_or(|st| st.request_resumes > 0 || st.local_response.is_some())
            })
            .collect();
        for s in ready {
            let Some(reply) = self.waiting.remove(&s) else { continue };
            let Some(st) = host.stream(s) else { continue };
            match &st.local_response {
                Some(r) => {
                    let _ = reply.send(Disposition::Respond {
                        status: r.status,
                        headers: r.headers.clone(),
                        body: r.body.clone(),
                    });
                    let _ = host.finish_stream(s);
                }
                None => {
                    let _ = reply.send(Disposition::Forward {
                        stream: s,
                        headers: st.request_headers.clone(),
                    });
                }
            }
        }
    }

    /// The calls the module dispatched since the last look, with where each goes: Envoy's
    /// take a cluster's endpoints in turn; ngx_wasm_module's go to the `host:port` itself.
    pub fn new_calls(&mut self) -> Vec<Call> {
        let mut out = Vec::new();
        for call in self.host.calls_after(self.started) {
            self.started = call.token;
            self.stats.calls += 1;
            let mut endpoints = match self.host.flavor() {
                Flavor::Envoy => self
                    .clusters
                    .get(&call.upstream)
                    .cloned()
                    .or_else(|| call.upstream.parse().ok().map(|a| vec![a])),
                Flavor::Nginx => None,
            };
            if let Some(endpoints) = endpoints.as_mut().filter(|e| !e.is_empty()) {
                self.turn = self.turn.wrapping_add(1);
                let first = self.turn % endpoints.len();
                endpoints.rotate_left(first);
            }
            out.push(Call { call, endpoints });
        }
        out
    }
}

/// Headers as the host's calls take them.
fn pairs(headers: &Headers) -> Vec<(&str, &[u8])> {
    headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect()
}
