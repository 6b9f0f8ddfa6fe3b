//! `sluice-service`: the check service binary.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use sluice_core::descriptors::DescriptorSet;
use sluice_core::rules::{check_toml, RuleSet};
use sluice_service::breaker::BreakerState;
use sluice_service::console::SourceKind;
use sluice_service::edge::{self, Edge};
use sluice_service::listen::{ListenAddr, Listener};
use sluice_service::node::{Node, NodeConfig};
use sluice_service::region::{Region, RegionConfig};
use sluice_service::store::keys::{self, Keys};
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{redact, RedisOptions, RedisStore};
use sluice_service::store::Store;
use sluice_service::{admin, grpc, housekeeping, http, region, rules_source};

/// Every check allocates a few small, short-lived buffers (the parsed request, the rule
/// keys, the JSON answer); mimalloc serves them with less CPU than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sluice check service: answers POST /v1/check with the global rate-limit decision.
///
/// Nodes are stateless; run several over one Redis (or Redis Cluster) to share counters.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// A task other than serving.
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to serve HTTP on: HOST:PORT, or unix:PATH for a Unix domain socket (for a
    /// proxy on the same machine: Nginx's ngx_wasm_module opens a connection per call, and
    /// one over a Unix socket costs less; the file's permissions say who may call).
    #[arg(long, default_value = "127.0.0.1:8081", value_name = "HOST:PORT|unix:PATH")]
    listen: ListenAddr,
    /// Rule file (TOML, see examples/rules.toml); watched and reloaded on change.
    /// Without it the node starts with no rules: every request is allowed. A `.yaml`/`.yml`
    /// file is an envoyproxy/ratelimit configuration instead, for the gRPC API (as
    /// `--descriptors`).
    #[arg(long, value_name = "FILE.toml")]
    rules: Option<PathBuf>,
    /// Let a rules file that holds no rule turn every limit off. Without it, an empty
    /// file (a truncated write, a ConfigMap not mounted yet) or a deleted one keeps the rules
    /// in force and logs a warning.
    #[arg(long)]
    allow_empty_rules: bool,
    /// Serve Envoy's rate limit service API (`envoy.service.ratelimit.v3.RateLimitService`)
    /// and the gRPC health service on this address (HTTP/2; HOST:PORT or unix:PATH).
    #[arg(long, value_name = "HOST:PORT|unix:PATH")]
    grpc_listen: Option<ListenAddr>,
    /// Which gRPC answers carry Sluice's rate-limit headers (`RateLimit`, `RateLimit-Policy`,
    /// `X-RateLimit-*`, `Retry-After`) for Envoy to add to the response: `refusals` (where
    /// `Retry-After` matters), `always`, or `never`. The descriptor statuses carry the
    /// limit and what remains either way; Envoy's `enable_x_ratelimit_headers` turns them
    /// into `X-RateLimit-*` headers itself.
    #[arg(long, value_enum, default_value_t = grpc::AnswerHeaders::Refusals, requires = "grpc_listen")]
    grpc_headers: grpc::AnswerHeaders,
    /// Also serve Envoy's rate limit quota service (RLQS,
    /// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`) on --grpc-listen: Envoy's
    /// `rate_limit_quota` filter gets assignments (token buckets it enforces itself), each a
    /// lease of a leased rule's quota. A bucket id's `rule` entry (or the stream's domain)
    /// names the rule; the entry keyed by the rule's `by` gives the identity. See
    /// examples/envoy-rlqs.yaml.
    #[arg(long, requires = "grpc_listen")]
    rlqs: bool,
    /// What RLQS tells a bucket no leased rule matches: `abandon` (Envoy's own
    /// no_assignment_behavior decides it), `allow` or `deny` (30 s at a time).
    #[arg(long, value_enum, default_value_t = grpc::rlqs::UnknownBuckets::Abandon, requires = "rlqs")]
    rlqs_unknown: grpc::rlqs::UnknownBuckets,
    /// envoyproxy/ratelimit configuration (YAML, one domain per file; repeat for more) that
    /// the gRPC API matches descriptors against; watched and reloaded on change, as
    /// --rules.
    #[arg(long, value_name = "FILE.yaml")]
    descriptors: Vec<PathBuf>,
    /// Counter store: `memory`; one Redis `redis://[USER@]HOST:PORT`; a Redis Cluster
    /// `redis+cluster://[USER@]H1:P1,H2:P2,...`; or the master a set of sentinels names,
    /// `redis+sentinel://[USER@]S1:P1,S2:P2/MASTER`. `rediss` instead of `redis` for TLS.
    /// Give the password with --store-password-file, not in the URL.
    #[arg(long, default_value = "memory", value_name = "URL")]
    store: String,
    /// The prefix of every key and channel this node uses in --store and --global-store
    /// (`PREFIX:{<identity>}:<rule>`, `PREFIX:{rules}`, `PREFIX:rules:changed`,
    /// `PREFIX:violations`): deployments with different prefixes share a Redis without
    /// meeting (their own counters, their own published rules); nodes with the same prefix
    /// share both. 1 to 64 of ASCII letters, digits, `-`, `_`, `.`, `:`.
    #[arg(long, default_value = keys::DEFAULT_PREFIX, value_name = "PREFIX", value_parser = store_prefix)]
    store_prefix: Keys,
    /// TLS to --store: trust only the CAs in this file (PEM) instead of the system's roots.
    #[arg(long, value_name = "FILE.pem")]
    store_ca_file: Option<PathBuf>,
    /// TLS to --store: present this client certificate chain (PEM); needs --store-key.
    #[arg(long, value_name = "FILE.pem", requires = "store_key")]
    store_cert: Option<PathBuf>,
    /// The private key of --store-cert (PEM).
    #[arg(long, value_name = "FILE.pem", requires = "store_cert")]
    store_key: Option<PathBuf>,
    /// File holding --store's password (its first line), for the URL's user or Redis's
    /// `default` user. Read again at every connection attempt: fix the file and the node
    /// connects, no restart needed.
    #[arg(long, value_name = "FILE")]
    store_password_file: Option<PathBuf>,
    /// File holding the sentinels' own password, when they ask for one
    /// (redis+sentinel:// only).
    #[arg(long, value_name = "FILE")]
    store_sentinel_password_file: Option<PathBuf>,
    /// After each decision, wait until this many replicas have it (`WAIT`), so a failover
    /// cannot lose what was admitted; a decision not acknowledged within --store-timeout-ms
    /// fails (the rule's failure policy answers). Costs a replication round trip per
    /// decision: see BENCHMARKS.md.
    #[arg(long, default_value_t = 0, value_name = "N")]
    store_wait_replicas: u32,
    /// Send the checks that reach the node while its call to a Redis shard is in flight
    /// together in the next call, each decided alone and all-or-nothing (a group commit: no
    /// timer, a lone check goes at once). Redis 7 (Functions) only. `false` sends each
    /// check as its own call.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    store_batching: bool,
    /// Run the check as Redis Functions (one library, loaded at connect; Redis 7). `false`
    /// runs it as a script (`EVALSHA`) as on Redis 6, which needs no right to load
    /// functions; a Redis that refuses `FUNCTION LOAD` gets the script anyway.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    store_functions: bool,
    /// Serve the admin API (rules, overrides, violations), health and metrics on this
    /// address, apart from the data API; keep it reachable by operators only. Without it
    /// the node has no admin API. HOST:PORT or unix:PATH.
    #[arg(long, value_name = "HOST:PORT|unix:PATH")]
    admin_listen: Option<ListenAddr>,
    /// File holding the admin API's bearer token; without it the admin API answers 401.
    #[arg(long, value_name = "FILE", requires = "admin_listen")]
    admin_token_file: Option<PathBuf>,
    /// File holding a read-only bearer token for the admin API and the console: it may read
    /// every `GET` endpoint and explain a request, and gets 403 for any change (rules,
    /// overrides, resets). For the people who watch but do not steer.
    #[arg(long, value_name = "FILE", requires = "admin_listen")]
    admin_read_token_file: Option<PathBuf>,
    /// This node's name on the console (`GET /v1/admin/node`); default: the host's name and
    /// the data listener's address.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// File holding the credential the data API asks of callers (/v1/check, /v1/lease,
    /// /v1/wait, /v1/rules and the gRPC rate limit service): give it to the proxies (the
    /// filter's `check.token`). Without it anyone who reaches the listener may spend any
    /// client's quota: only do without on a network only the proxies reach.
    #[arg(long, value_name = "FILE")]
    data_token_file: Option<PathBuf>,
    /// The header that carries the data token: `authorization` as `Bearer <token>`, any
    /// other header as the token alone.
    #[arg(long, default_value = "authorization", value_name = "NAME")]
    token_header: String,
    /// Serve every listener over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE.pem", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE.pem", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Ask every client for a certificate signed by one of these CAs (PEM): mutual TLS.
    #[arg(long, value_name = "FILE.pem", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Longest a client may take to send a request's headers (ms), on a new connection or a
    /// kept-alive one.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// Longest an HTTP/1.1 keep-alive connection may sit idle between requests (ms). The
    /// default (65 minutes) outlasts every common proxy's pool (Envoy's an hour), so the proxy
    /// closes its idle connections first and never sends a check on one the node is closing;
    /// set your proxies' idle timeout for this service below it.
    #[arg(long, default_value_t = edge::IDLE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_ms: u64,
    /// Most connections open at once on each listener; past it, new ones wait.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Most GET /v1/wait calls held at once; past it a wait is refused at once (the proxy
    /// then forwards the shaped request without holding it).
    #[arg(long, default_value_t = 10_000)]
    max_waits: usize,
    /// IPv6 clients are counted by their network of this many bits (`ip` identities); 128
    /// counts each address. IPv4-mapped addresses are counted as IPv4.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u8).range(1..=128))]
    ipv6_prefix: u8,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Longest wait for one store call (ms) before the rule's failure policy applies.
    #[arg(long, default_value_t = 50)]
    store_timeout_ms: u64,
    /// Consecutive store failures that open the circuit breaker.
    #[arg(long, default_value_t = 5)]
    breaker_failures: u32,
    /// How long the open breaker fails fast before a request probes the store again (ms);
    /// a background ping every 100 ms closes it sooner once the store answers.
    #[arg(long, default_value_t = 1000)]
    breaker_cooldown_ms: u64,
    /// Most limit keys held in memory (memory store and fail-open fallback buckets).
    #[arg(long, default_value_t = 1_000_000)]
    max_keys: usize,
    /// How often the node reads the version of the rules published in the store (ms).
    /// Changes are announced over Redis pub/sub and arrive at once; this poll is the safety
    /// net for an announcement lost across a reconnect.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..))]
    rules_poll_ms: u64,
    /// The store that holds the quotas of rules marked `global = true`, shared by every
    /// region (any Redis form --store takes, usually across a WAN: use rediss). This
    /// node then leases its share of each global quota in the background and decides global
    /// rules from it without waiting on the WAN; `--store` is its region's store. Without it,
    /// global rules are decided in `--store` like any other rule.
    #[arg(long, value_name = "URL")]
    global_store: Option<String>,
    /// TLS to --global-store: trust only the CAs in this file (PEM).
    #[arg(long, value_name = "FILE.pem", requires = "global_store")]
    global_store_ca_file: Option<PathBuf>,
    /// TLS to --global-store: present this client certificate chain (PEM).
    #[arg(long, value_name = "FILE.pem", requires_all = ["global_store", "global_store_key"])]
    global_store_cert: Option<PathBuf>,
    /// The private key of --global-store-cert (PEM).
    #[arg(long, value_name = "FILE.pem", requires = "global_store_cert")]
    global_store_key: Option<PathBuf>,
    /// File holding --global-store's password (its first line).
    #[arg(long, value_name = "FILE", requires = "global_store")]
    global_store_password_file: Option<PathBuf>,
    /// This node's region, named in logs and metrics (with --global-store).
    #[arg(long, default_value = "local", requires = "global_store")]
    region: String,
    /// Longest wait for a call to the global store (ms); a failed call counts the global
    /// store as unreachable until it answers again.
    #[arg(long, default_value_t = 1000, requires = "global_store", value_parser = clap::value_parser!(u64).range(1..))]
    global_timeout_ms: u64,
    /// How often the node asks the global store for the leases it needs (ms).
    #[arg(long, default_value_t = 50, requires = "global_store", value_parser = clap::value_parser!(u64).range(1..))]
    global_tick_ms: u64,
    /// A global quota used within this long (ms) keeps a lease of at least one unit between
    /// requests, so a client that comes back now and then is served from the node at once
    /// (0: a quota idle a whole second lets its lease go; its next check waits a WAN round
    /// trip for a new one). Each quota kept costs a lease renewal over the WAN per lease
    /// length.
    #[arg(long, default_value_t = 10_000, requires = "global_store")]
    global_keep_warm_ms: u64,
    /// Checks that may wait at once for a cold global quota's first lease (a new client:
    /// one WAN round trip); past it a cold check is refused and counted
    /// (`sluice_global_checks_total{source="cold_over_cap"}`).
    #[arg(long, default_value_t = 4_096, requires = "global_store")]
    global_max_cold_waits: usize,
}

/// The binary's tasks besides serving.
#[derive(Subcommand, Debug)]
enum Command {
    /// Checks a rules file as `--rules` reads it (TOML, or envoyproxy/ratelimit YAML for a
    /// `.yaml`/`.yml` file), for CI pipelines: prints a one-line summary and exits 0 when it
    /// is valid; prints every problem with its line and exits 1 when not (a file with no
    /// rule too, unless --allow-empty-rules).
    CheckRules {
        /// The rules file.
        file: PathBuf,
        /// Take a file with no rule as valid (a node started with this flag puts it in force).
        #[arg(long)]
        allow_empty_rules: bool,
    },
    /// Explains a request against a rules file, offline (no node, no store): the canonical
    /// path and identity values the rules read (the path without its query and dot
    /// segments, an IPv6 client grouped by --ipv6-prefix, long values digested), and for
    /// each rule in evaluation order whether it matches and, if not, why (method, host,
    /// tier, path or a missing identity). For the counters' state as well, ask a running
    /// node: POST /v1/admin/explain. Exits 0, or 1 when the file or the request is invalid.
    ///
    /// Example: sluice-service explain --rules examples/rules.toml --path '/api/x?y=1'
    /// --method POST --ip 2001:db8::1 --identity user=alice
    Explain {
        /// The rules file (TOML).
        #[arg(long, value_name = "FILE.toml")]
        rules: PathBuf,
        /// The request's path (a query and dot segments are fine: they are made canonical).
        #[arg(long)]
        path: String,
        /// The request's method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// The request's host (`Host` header), for rules naming `hosts`.
        #[arg(long)]
        host: Option<String>,
        /// The client's address: the `ip` identity.
        #[arg(long)]
        ip: Option<String>,
        /// Another identity, KEY=VALUE (`user=alice`, `api_key=k1`, `tier=free`,
        /// `header:x-team=blue`); repeat for more.
        #[arg(long = "identity", value_name = "KEY=VALUE", value_parser = key_value)]
        identities: Vec<(String, String)>,
        /// IPv6 clients are grouped by their network of this many bits, as the node's flag.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u8).range(1..=128))]
        ipv6_prefix: u8,
    },
}

/// `KEY=VALUE`, split at the first `=`.
fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::CheckRules {
        file,
        allow_empty_rules,
    }) = &args.command
    {
        std::process::exit(check_rules(file, *allow_empty_rules));
    }
    if let Some(Command::Explain { .. }) = &args.command {
        std::process::exit(explain(&args));
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (descriptors, yaml_fingerprint) = descriptors(&args)?;
    let (rules, fingerprint) = rules(&args)?;
    let edge = edge(&args)?;
    let store = store(&args)?;
    let config = node_config(&args)?;
    let region = region(&args, &rules).await?;
    let node = Node::in_region(store, rules, config, region);
    match args.rules.as_deref().filter(|_| !rules_are_yaml(&args)) {
        Some(path) => node.console.set_source(SourceKind::File, path.display().to_string()),
        None => node.console.set_source(SourceKind::None, "no --rules file"),
    }
    node.set_descriptors(descriptors);
    start_tasks(&node, &args, fingerprint, yaml_fingerprint);
    serve(node, &args, edge).await
}

/// Whether `--rules` names an envoyproxy/ratelimit YAML file rather than a TOML one.
fn rules_are_yaml(args: &Args) -> bool {
    args.rules.as_deref().is_some_and(grpc::config::is_yaml)
}

/// `check-rules FILE`: the summary on stdout and 0 for a valid file; every problem on
/// stderr, each as `FILE: line N: …`, and 1 otherwise.
fn check_rules(file: &std::path::Path, allow_empty: bool) -> i32 {
    let shown = file.display();
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{shown}: cannot read it: {e}");
            return 1;
        }
    };
    let yaml = grpc::config::is_yaml(file);
    let checked = if yaml {
        grpc::config::check(&text)
    } else {
        check_toml(&text).map_err(|problems| problems.iter().map(ToString::to_string).collect())
    };
    let what = if yaml { "descriptor limits" } else { "rules" };
    match checked {
        Ok(0) if !allow_empty => {
            eprintln!(
                "{shown}: holds no rule, which would turn every limit off (a node keeps the rules in force \
                 unless started with --allow-empty-rules; pass it here too if that is meant)"
            );
            1
        }
        Ok(count) => {
            println!("{shown}: valid, {count} {what}");
            0
        }
        Err(problems) => {
            for problem in &problems {
                eprintln!("{shown}: {problem}");
            }
            eprintln!("{shown}: invalid, {} problem(s)", problems.len());
            1
        }
    }
}

/// `explain`: which rules of a file a request matches and why the others do not; 1 when
/// the file or the request is invalid.
fn explain(args: &Args) -> i32 {
    let Some(Command::Explain {
        rules,
        path,
        method,
        host,
        ip,
        identities,
        ipv6_prefix,
    }) = &args.command
    else {
        return 1;
    };
    let set = match rules_source::load_file(rules) {
        Ok((set, _)) => set,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let ids: std::collections::BTreeMap<&str, &str> =
        identities.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let body = serde_json::json!({"method": method, "path": path, "host": host, "ip": ip, "identities": ids});
    let serde_json::Value::Object(body) = body else {
        return 1;
    };
    let req = match admin::console::explain_request(body, *ipv6_prefix) {
        Ok(req) => req,
        Err(e) => {
            eprintln!("invalid request: {e}");
            return 1;
        }
    };
    println!("path: {}", req.path);
    if let Some(host) = &req.host {
        println!("host: {host}");
    }
    for (key, value) in &req.identities {
        println!("identity {key}: {value}");
    }
    for (rule, found) in admin::console::explain_matching(&set, &req) {
        match found {
            Ok(identity) => println!(
                "rule {:?}: matches ({}), identity {identity}",
                rule.name,
                rule.conditions()
            ),
            Err(why) => println!("rule {:?}: no match: {why}", rule.name),
        }
    }
    0
}

/// The gRPC API's descriptor files: `--descriptors`, and a `--rules` file in
/// envoyproxy/ratelimit's YAML.
fn yaml_files(args: &Args) -> Vec<PathBuf> {
    let mut files = args.descriptors.clone();
    files.extend(args.rules.clone().filter(|_| rules_are_yaml(args)));
    files
}

/// The gRPC API's descriptor set and the fingerprint of its files, for the watcher.
fn descriptors(args: &Args) -> anyhow::Result<(Arc<DescriptorSet>, u64)> {
    let files = yaml_files(args);
    if args.grpc_listen.is_none() && !files.is_empty() {
        bail!("descriptor files are for the gRPC API: add --grpc-listen HOST:PORT");
    }
    let (descriptors, fingerprint) = rules_source::load_yaml_files(&files).map_err(anyhow::Error::msg)?;
    if !files.is_empty() && descriptors.is_empty() {
        tracing::warn!("the descriptor files hold no limit: every gRPC check is allowed");
    }
    Ok((Arc::new(descriptors), fingerprint))
}

/// The TOML rules file's rules and fingerprint (none without one: every HTTP check allowed).
fn rules(args: &Args) -> anyhow::Result<(RuleSet, u64)> {
    Ok(match &args.rules {
        Some(path) if !rules_are_yaml(args) => {
            let (rules, fingerprint) = rules_source::load_file(path).map_err(anyhow::Error::msg)?;
            if rules.rules().is_empty() {
                tracing::warn!(file = %path.display(), "the rules file holds no rule: every HTTP check is allowed");
            }
            (rules, fingerprint)
        }
        _ if !yaml_files(args).is_empty() => {
            tracing::info!(
                "rules from envoyproxy/ratelimit YAML: the gRPC API decides by them; HTTP checks have no rules and allow all"
            );
            (RuleSet::default(), 0)
        }
        _ => {
            tracing::warn!("no --rules file: every HTTP check is allowed");
            (RuleSet::default(), 0)
        }
    })
}

/// How the listeners take connections: TLS, the connection cap, the header timeout.
fn edge(args: &Args) -> anyhow::Result<Edge> {
    Ok(Edge {
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(edge::tls_acceptor(cert, key, args.tls_client_ca.as_deref())?),
            _ => None,
        },
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        header_timeout: Duration::from_millis(args.header_timeout_ms),
        idle_timeout: Duration::from_millis(args.idle_timeout_ms),
        peer_addresses: false,
    })
}

/// The node's store call timeout.
fn store_timeout(args: &Args) -> Duration {
    Duration::from_millis(args.store_timeout_ms.max(1))
}

/// The counter store: memory, or Redis (connecting in the background).
fn store(args: &Args) -> anyhow::Result<Store> {
    let timeout = store_timeout(args);
    let redis_only = args.store_ca_file.is_some()
        || args.store_cert.is_some()
        || args.store_password_file.is_some()
        || args.store_sentinel_password_file.is_some()
        || args.store_wait_replicas > 0
        || args.store_prefix != Keys::default();
    if args.store == "memory" && redis_only {
        bail!(
            "--store-ca-file, --store-cert, --store-password-file, --store-wait-replicas and --store-prefix are for a Redis --store"
        );
    }
    Ok(if args.store == "memory" {
        Store::Memory(MemoryStore::new(args.max_keys))
    } else {
        // Connects in the background: a node started before Redis serves by each rule's
        // failure policy meanwhile, and /readyz says the store is unreachable.
        let options = RedisOptions {
            ca_file: args.store_ca_file.clone(),
            cert_file: args.store_cert.clone(),
            key_file: args.store_key.clone(),
            password_file: args.store_password_file.clone(),
            sentinel_password_file: args.store_sentinel_password_file.clone(),
            wait_replicas: args.store_wait_replicas,
            keys: args.store_prefix.clone(),
            batching: args.store_batching,
            script_only: !args.store_functions,
            ..RedisOptions::new(timeout.max(Duration::from_millis(500)))
        };
        let store =
            RedisStore::start(&args.store, options).with_context(|| format!("--store {}", redact(&args.store)))?;
        tracing::info!(store = %store.address(), "connecting to Redis in the background");
        Store::Redis(Box::new(store))
    })
}

/// The node's settings, its tokens read from their files.
fn node_config(args: &Args) -> anyhow::Result<NodeConfig> {
    let admin_token = args
        .admin_token_file
        .as_deref()
        .map(|p| secret(p, "admin token"))
        .transpose()?;
    let admin_read_token = args
        .admin_read_token_file
        .as_deref()
        .map(|p| secret(p, "admin read token"))
        .transpose()?;
    if admin_read_token.is_some() && admin_read_token == admin_token {
        bail!("--admin-read-token-file holds the admin token: give the read-only token a secret of its own");
    }
    let data_token = args
        .data_token_file
        .as_deref()
        .map(|p| secret(p, "data token"))
        .transpose()?;
    if data_token.is_none() {
        tracing::warn!("no --data-token-file: anyone who reaches this node may check and lease any quota");
    }
    Ok(NodeConfig {
        store_timeout: store_timeout(args),
        breaker_failures: args.breaker_failures,
        breaker_cooldown: Duration::from_millis(args.breaker_cooldown_ms),
        max_keys: args.max_keys,
        admin_token,
        admin_read_token,
        node_name: node_name(args),
        data_token,
        token_header: args.token_header.to_ascii_lowercase(),
        max_waits: args.max_waits,
        ipv6_prefix: args.ipv6_prefix,
        rules_poll: Duration::from_millis(args.rules_poll_ms),
        allow_empty_rules: args.allow_empty_rules,
        ..NodeConfig::default()
    })
}

/// `--node-name`, else the host's name and the data listener's address.
fn node_name(args: &Args) -> String {
    if let Some(name) = &args.node_name {
        return name.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host} {}", args.listen)
}

/// The node's region, with `--global-store`: its link to the global store, connected before
/// the node serves when it answers.
async fn region(args: &Args, rules: &RuleSet) -> anyhow::Result<Option<Region>> {
    Ok(match &args.global_store {
        Some(url) => {
            let timeout = Duration::from_millis(args.global_timeout_ms);
            let options = RedisOptions {
                ca_file: args.global_store_ca_file.clone(),
                cert_file: args.global_store_cert.clone(),
                key_file: args.global_store_key.clone(),
                password_file: args.global_store_password_file.clone(),
                keys: args.store_prefix.clone(),
                ..RedisOptions::new(timeout)
            };
            let global = RedisStore::start(url, options).with_context(|| format!("--global-store {}", redact(url)))?;
            let url = global.address().to_string();
            // Connected before the node serves when the global store answers, so the first
            // leases go out at once and the link is not reported down for a connect.
            if !answers_within(&global, timeout).await {
                tracing::warn!(global_store = %url, "the global store does not answer yet; global rules follow on_global_unreachable until it does");
            }
            let config = RegionConfig {
                name: args.region.clone(),
                tick: Duration::from_millis(args.global_tick_ms),
                timeout,
                keep_warm: Duration::from_millis(args.global_keep_warm_ms),
                max_cold_waits: args.global_max_cold_waits,
            };
            tracing::info!(region = %config.name, global_store = %url, "global rules are leased from the global store");
            Some(Region::new(Store::Redis(Box::new(global)), config))
        }
        None => {
            if rules.rules().iter().any(|r| r.global.is_some()) {
                tracing::warn!(
                    "rules marked global are decided in --store alone: add --global-store to share them across regions"
                );
            }
            None
        }
    })
}

/// The node's background tasks: following the rules file and the published rules,
/// sweeping idle state, probing the store, filling the region's leases.
fn start_tasks(node: &Arc<Node>, args: &Args, fingerprint: u64, yaml_fingerprint: u64) {
    if let Some(path) = args.rules.clone().filter(|_| !rules_are_yaml(args)) {
        tokio::spawn(rules_source::watch_file(node.clone(), path, fingerprint));
    }
    let yaml = yaml_files(args);
    if !yaml.is_empty() {
        tokio::spawn(rules_source::watch_files(node.clone(), yaml, yaml_fingerprint));
    }
    tokio::spawn(rules_source::follow_published(node.clone()));
    tokio::spawn(housekeeping::sweep(node.clone()));
    tokio::spawn(probe_store(node.clone()));
    tokio::spawn(region::refill::run(node.clone()));
}

/// Opens the node's listeners and serves until SIGINT or SIGTERM.
async fn serve(node: Arc<Node>, args: &Args, edge: Edge) -> anyhow::Result<()> {
    // Before the ports open: a SIGTERM sent as soon as they accept connections must be caught.
    let shutdown = shutdown()?;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stopping.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let listener = bind(&args.listen).await?;
    let admin = match &args.admin_listen {
        Some(addr) => {
            let admin_listener = bind(addr).await?;
            tracing::info!(admin_listen = %admin_listener.local_addr()?, token = node.config.admin_token.is_some(), "admin API");
            let edge = Edge {
                peer_addresses: true,
                ..edge.clone()
            };
            let (router, stopped) = (admin::router(node.clone()), stopped());
            Some(tokio::spawn(async move {
                edge.serve_http(admin_listener, router, stopped).await
            }))
        }
        None => None,
    };
    let grpc_server = match &args.grpc_listen {
        Some(addr) => {
            let grpc_listener = bind(addr).await?;
            tracing::info!(grpc_listen = %grpc_listener.local_addr()?, "Envoy rate limit service API");
            let limiter = grpc::RateLimiter::on_node(node.clone(), args.grpc_headers);
            let quota = args.rlqs.then(|| {
                tracing::info!("Envoy rate limit quota service (RLQS)");
                let limits = grpc::rlqs::Limits::default();
                grpc::rlqs::QuotaService::start(node.clone(), limits, args.rlqs_unknown, stop.subscribe())
            });
            let serving = grpc::serve(grpc_listener, limiter, quota, edge.clone(), stop.subscribe());
            Some(tokio::spawn(serving))
        }
        None => None,
    };
    tracing::info!(
        listen = %listener.local_addr()?,
        store = node.store.kind(),
        rules = node.rules().rules().len(),
        tls = edge.tls.is_some(),
        data_token = node.config.data_token.is_some(),
        "sluice-service ready"
    );
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    edge.serve_http(listener, http::router(node), stopped()).await;
    if let Some(admin) = admin {
        admin.await?;
    }
    if let Some(server) = grpc_server {
        // HTTP/2 clients (Envoy) keep their connections open: in-flight calls get a moment
        // to finish, then the connections are dropped with the process.
        match tokio::time::timeout(GRPC_GRACE, server).await {
            Ok(done) => done?.context("the gRPC server failed")?,
            Err(_) => tracing::info!(grace = ?GRPC_GRACE, "gRPC connections still open; closing them"),
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// `--store-prefix`: the names under it, or why it cannot be used.
fn store_prefix(prefix: &str) -> Result<Keys, String> {
    Keys::new(prefix).map_err(|e| e.problem.to_owned())
}

/// The secret in file `path` (trimmed), or an error naming the file and what to do.
fn secret(path: &std::path::Path, what: &str) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the {what} file {}", path.display()))?;
    let token = text.trim().to_owned();
    if token.is_empty() {
        bail!("the {what} file {} is empty; put a secret in it", path.display());
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "the {what} in {} must be printable ASCII without spaces",
            path.display()
        );
    }
    Ok(token)
}

/// How long a stopping node waits for gRPC calls in flight once HTTP has stopped.
const GRPC_GRACE: Duration = Duration::from_secs(2);

async fn bind(addr: &ListenAddr) -> anyhow::Result<Listener> {
    Listener::bind(addr).await.with_context(|| match addr {
        ListenAddr::Tcp(_) => format!("cannot listen on {addr}; is another process using it?"),
        ListenAddr::Unix(_) => {
            format!("cannot listen on {addr}; does its directory exist and may this user write there?")
        }
    })
}

/// Whether `store` answers a ping within `timeout` (it connects in the background).
async fn answers_within(store: &RedisStore, timeout: Duration) -> bool {
    let ping = async {
        while store.ping().await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(timeout, ping).await.is_ok()
}

/// While the breaker is open, pings the store every 100 ms and closes the breaker as soon as
/// it answers: recovery then takes a reconnect, not a whole cooldown, and no request is
/// spent as the probe.
async fn probe_store(node: Arc<Node>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        if node.breaker.state() == BreakerState::Closed {
            continue;
        }
        if let Ok(Ok(())) = tokio::time::timeout(node.config.store_timeout, node.store.ping()).await {
            node.breaker.success();
        }
    }
}

/// Resolves on SIGINT or SIGTERM; in-flight requests then finish. The handlers are
/// installed by this call, not by the future's first poll (which axum runs in a task of its
/// own), so no signal is missed once the call has returned.
#[cfg(unix)]
fn shutdown() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
        tracing::info!("shutting down: finishing in-flight requests");
    })
}

/// Resolves on Ctrl-C; in-flight requests then finish.
#[cfg(not(unix))]
fn shutdown() -> anyhow::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down: finishing in-flight requests");
    })
}
