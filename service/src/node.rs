//! One service node's shared state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::grpc::descriptors::DescriptorSet;
use arc_swap::ArcSwap;
use sluice_core::rules::RuleSet;

use crate::breaker::Breaker;
use crate::clock::Clock;
use crate::console::Console;
use crate::metrics::Metrics;
use crate::owed::Owed;
use crate::refusals::Refusals;
use crate::region::Region;
use crate::store::memory::MemoryStore;
use crate::store::Store;
use crate::violations::Violations;

/// Settings of a node beyond its store and rules.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Longest wait for one store call before the rule's failure policy applies.
    pub store_timeout: Duration,
    /// Consecutive store failures that open the breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before probing.
    pub breaker_cooldown: Duration,
    /// Most keys the memory store (and the fallback buckets) hold.
    pub max_keys: usize,
    /// Bearer token of the admin API; `None` disables it.
    pub admin_token: Option<String>,
    /// Bearer token of the admin API that may read but change nothing (`GET`s and
    /// `POST /v1/admin/explain`).
    pub admin_read_token: Option<String>,
    /// The node's name on the console (`GET /v1/admin/node`).
    pub node_name: String,
    /// The credential the data API (check, lease, wait, rules, gRPC) asks of its callers;
    /// `None` serves anyone who can reach the listener.
    pub data_token: Option<String>,
    /// The header that carries `data_token`: `authorization` as `Bearer <token>`, any
    /// other header as the token alone.
    pub token_header: String,
    /// Most `/v1/wait` calls held at once; past it a wait is refused at once (the proxy
    /// forwards the request unheld, as when the call fails).
    pub max_waits: usize,
    /// IPv6 clients (`ip` identities) are counted by their network of this many bits.
    pub ipv6_prefix: u8,
    /// Violations kept.
    pub violations_capacity: usize,
    /// How often the node reads the published rules' version: the safety net under the
    /// store's change announcements, which arrive at once but can be lost across a reconnect.
    pub rules_poll: Duration,
    /// Whether a rules file that holds no rule may put its emptiness in force (every limit
    /// off); by default such a reload is refused and the rules in force stay.
    pub allow_empty_rules: bool,
    /// Most refusals the node remembers ([`crate::refusals`]); 0 asks the store every time.
    pub max_refusals: usize,
    /// Where the spans of checks go ([`crate::trace`]); off by default.
    pub traces: crate::trace::Traces,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            store_timeout: Duration::from_millis(50),
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(1),
            max_keys: 1_000_000,
            admin_token: None,
            admin_read_token: None,
            node_name: "sluice".into(),
            data_token: None,
            token_header: "authorization".into(),
            max_waits: 10_000,
            ipv6_prefix: sluice_core::identity::DEFAULT_IPV6_PREFIX,
            violations_capacity: 10_000,
            rules_poll: Duration::from_millis(250),
            allow_empty_rules: false,
            max_refusals: 100_000,
            traces: crate::trace::Traces::off(),
        }
    }
}

/// Everything a request handler needs, shared by all requests.
pub struct Node {
    /// The counter store.
    pub store: Arc<Store>,
    /// Local buckets that decide fail-open rules while the store is unreachable.
    pub fallback: MemoryStore,
    /// Guards the store.
    pub breaker: Breaker,
    /// Refusals the store made, remembered until its `retry_after`.
    pub refusals: Refusals,
    /// What the fallback admitted while the store was away, to spend in it when it answers.
    pub owed: Owed,
    /// The nodes over this store that renewed their presence lately, this one included
    /// ([`Node::nodes`]).
    nodes: AtomicU64,
    /// This node among them: random, so two nodes of one name are two.
    pub instance: String,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// The denials log.
    pub violations: Violations,
    /// Per-rule rates, top refused identities and the rules' source, for the console.
    pub console: Console,
    /// When the node started, unix ms.
    pub started_at_ms: u64,
    /// The node's clock.
    pub clock: Clock,
    /// Settings.
    pub config: NodeConfig,
    /// The node's region, when it shares global rules with other regions.
    pub region: Option<Region>,
    /// One permit per `/v1/wait` call held ([`NodeConfig::max_waits`]).
    pub waits: Arc<tokio::sync::Semaphore>,
    /// The rules in force and their published version (0 before any was published or
    /// adopted), under one lock: a change is a compare-and-set on the version it read, so the
    /// two must be read together.
    rules: RwLock<(Arc<RuleSet>, u64)>,
    /// The envoyproxy/ratelimit descriptor set the gRPC API decides by (empty without one),
    /// swapped whole when its files are reloaded.
    descriptors: ArcSwap<DescriptorSet>,
    /// How many times the descriptor set was put in force on this node (1 for the files
    /// read at start): the version a YAML reload reports (YAML rules are not published).
    descriptors_version: AtomicU64,
}

impl Node {
    /// A node over `store` with `rules`. Must run inside a tokio runtime.
    pub fn new(store: Store, rules: RuleSet, config: NodeConfig) -> Arc<Node> {
        Node::in_region(store, rules, config, None)
    }

    /// A node over `store` with `rules` that leases the global rules' quotas in `region`
    /// (see [`crate::region`]; start [`crate::region::refill::run`] beside it). Must run
    /// inside a tokio runtime.
    pub fn in_region(store: Store, rules: RuleSet, config: NodeConfig, region: Option<Region>) -> Arc<Node> {
        let store = Arc::new(store);
        let mut metrics = Metrics::default();
        if let Some(region) = &region {
            region.register_metrics(metrics.registry_mut());
        }
        metrics.rules_in_force(&rules, 0);
        Arc::new(Node {
            violations: Violations::start(store.clone(), config.violations_capacity),
            console: Console::default(),
            started_at_ms: crate::console::now_ms(),
            fallback: MemoryStore::new(config.max_keys),
            breaker: Breaker::new(config.breaker_failures, config.breaker_cooldown),
            refusals: Refusals::new(config.max_refusals, config.store_timeout),
            owed: Owed::new(config.max_keys),
            nodes: AtomicU64::new(1),
            instance: format!(
                "{}#{:016x}",
                config.node_name,
                std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id())
            ),
            metrics,
            clock: Clock::default(),
            rules: RwLock::new((Arc::new(rules), 0)),
            descriptors: ArcSwap::from_pointee(DescriptorSet::default()),
            descriptors_version: AtomicU64::new(0),
            waits: Arc::new(tokio::sync::Semaphore::new(config.max_waits)),
            store,
            config,
            region,
        })
    }

    /// How many nodes share the store, this one included: those that renewed their presence
    /// within the last seconds ([`crate::housekeeping`]); 1 over the memory store.
    pub fn nodes(&self) -> u64 {
        self.nodes.load(Ordering::Relaxed).max(1)
    }

    /// Records how many nodes share the store.
    pub fn set_nodes(&self, n: u64) {
        self.nodes.store(n.max(1), Ordering::Relaxed);
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules_in_force().0
    }

    /// The rules in force and the published version they are (0: not published), read
    /// together.
    pub fn rules_in_force(&self) -> (Arc<RuleSet>, u64) {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the rules in force on this node only (they are not the published ones).
    pub fn set_rules(&self, rules: RuleSet) {
        let mut in_force = self.rules.write().unwrap_or_else(|p| p.into_inner());
        self.metrics.rules_in_force(&rules, in_force.1);
        self.console.rules_in_force(&rules);
        in_force.0 = Arc::new(rules);
    }

    /// Puts the published rules of `version` in force.
    pub fn set_published_rules(&self, rules: RuleSet, version: u64) {
        let mut in_force = self.rules.write().unwrap_or_else(|p| p.into_inner());
        self.metrics.rules_in_force(&rules, version);
        self.console.rules_in_force(&rules);
        *in_force = (Arc::new(rules), version);
    }

    /// The descriptor set the gRPC API decides by.
    pub fn descriptors(&self) -> Arc<DescriptorSet> {
        self.descriptors.load_full()
    }

    /// Puts `descriptors` in force for the calls that start from now on; returns the new
    /// local version (1, 2, … in the order of the calls).
    pub fn set_descriptors(&self, descriptors: Arc<DescriptorSet>) -> u64 {
        self.descriptors.store(descriptors);
        self.descriptors_version.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether a data call may go on: no data token is set, or `given` — the value of the
    /// call's [`NodeConfig::token_header`] — carries it. Compared in constant time; a
    /// refusal is counted.
    pub fn authenticated(&self, given: Option<&[u8]>) -> bool {
        let Some(expected) = self.config.data_token.as_deref() else {
            return true;
        };
        let given = match given {
            Some(v) if self.config.token_header.eq_ignore_ascii_case("authorization") => {
                v.strip_prefix(b"Bearer ").unwrap_or_default()
            }
            Some(v) => v,
            None => b"",
        };
        let same = constant_time_eq(given, expected.as_bytes());
        if !same {
            self.metrics.unauthenticated();
        }
        same
    }

    /// The published version of the rules in force (0: not published).
    pub fn rules_version(&self) -> u64 {
        self.rules_in_force().1
    }
}

/// Whether `a` equals `b`, in time that depends on their lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
