//! The command line: the flags by concern (each also a `SLUICE_*` environment variable, as
//! containers are configured) and the subcommands.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use sluice_service::edge;
use sluice_service::grpc;
use sluice_service::listen::ListenAddr;
use sluice_service::store::keys::{self, Keys};
use sluice_service::store::redis::RedisOptions;

/// Sluice check service: answers POST /v1/check with the global rate-limit decision.
///
/// Nodes are stateless; run several over one Redis (or Redis Cluster) to share counters.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
pub struct Args {
    /// A task other than serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Log format (the log goes to stderr; RUST_LOG sets its level, default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "SLUICE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Export a span per check (the rule, the decision, the store's time; the caller's W3C
    /// `traceparent` its parent, HTTP and gRPC alike) over OTLP/gRPC to this endpoint, e.g.
    /// http://otel-collector:4317. Off by default. The SDK's variables tune it:
    /// OTEL_TRACES_SAMPLER (default: follow the caller's sampled flag, else sample all),
    /// OTEL_BSP_SCHEDULE_DELAY (ms between batches, default 5000), OTEL_BSP_MAX_QUEUE_SIZE
    /// (spans held at most, default 2048; more are dropped, never waited for).
    #[arg(long, value_name = "URL", env = "SLUICE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    #[command(flatten)]
    pub edge: EdgeArgs,
    #[command(flatten)]
    pub rules: RulesArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub regions: RegionArgs,
}

/// Where the node listens for checks and what its edge admits.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "The data listener and its edge")]
pub struct EdgeArgs {
    /// Address to serve HTTP on: HOST:PORT, or unix:PATH for a Unix domain socket (for a
    /// proxy on the same machine: Nginx's ngx_wasm_module opens a connection per call, and
    /// one over a Unix socket costs less; the file's permissions say who may call).
    #[arg(
        long,
        default_value = "127.0.0.1:8081",
        value_name = "HOST:PORT|unix:PATH",
        env = "SLUICE_LISTEN"
    )]
    pub listen: ListenAddr,
    /// File holding the credential the data API asks of callers (/v1/check, /v1/lease,
    /// /v1/wait, /v1/rules and the gRPC rate limit service): give it to the proxies (the
    /// filter's `check.token`). Without it anyone who reaches the listener may spend any
    /// client's quota: only do without on a network only the proxies reach.
    #[arg(long, value_name = "FILE", env = "SLUICE_DATA_TOKEN_FILE")]
    pub data_token_file: Option<PathBuf>,
    /// The header that carries the data token: `authorization` as `Bearer <token>`, any
    /// other header as the token alone.
    #[arg(
        long,
        default_value = "authorization",
        value_name = "NAME",
        env = "SLUICE_TOKEN_HEADER"
    )]
    pub token_header: String,
    /// Serve every listener over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE.pem", requires = "tls_key", env = "SLUICE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE.pem", requires = "tls_cert", env = "SLUICE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Ask every client for a certificate signed by one of these CAs (PEM): mutual TLS.
    #[arg(long, value_name = "FILE.pem", requires = "tls_cert", env = "SLUICE_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Longest a client may take to send a request's headers (ms), on a new connection or a
    /// kept-alive one.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..), env = "SLUICE_HEADER_TIMEOUT_MS")]
    pub header_timeout_ms: u64,
    /// Longest an HTTP/1.1 keep-alive connection may sit idle between requests (ms). The
    /// default (65 minutes) outlasts every common proxy's pool (Envoy's an hour), so the proxy
    /// closes its idle connections first and never sends a check on one the node is closing;
    /// set your proxies' idle timeout for this service below it.
    #[arg(long, default_value_t = edge::IDLE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..), env = "SLUICE_IDLE_TIMEOUT_MS")]
    pub idle_timeout_ms: u64,
    /// Most connections open at once on each listener; past it, new ones wait.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..), env = "SLUICE_MAX_CONNECTIONS")]
    pub max_connections: u64,
    /// Most GET /v1/wait calls held at once; past it a wait is refused at once (the proxy
    /// then forwards the shaped request without holding it).
    #[arg(long, default_value_t = 10_000, env = "SLUICE_MAX_WAITS")]
    pub max_waits: usize,
}

/// Where the rules come from and how requests are read for them.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Rules")]
pub struct RulesArgs {
    /// Rule file (TOML, see examples/rules.toml); watched and reloaded on change.
    /// Without it the node starts with no rules: every request is allowed. A `.yaml`/`.yml`
    /// file is an envoyproxy/ratelimit configuration instead, for the gRPC API (as
    /// `--descriptors`).
    #[arg(long, value_name = "FILE.toml", env = "SLUICE_RULES")]
    pub rules: Option<PathBuf>,
    /// Let a rules file that holds no rule turn every limit off. Without it, an empty
    /// file (a truncated write, a ConfigMap not mounted yet) or a deleted one keeps the rules
    /// in force and logs a warning.
    #[arg(long, env = "SLUICE_ALLOW_EMPTY_RULES")]
    pub allow_empty_rules: bool,
    /// envoyproxy/ratelimit configuration (YAML, one domain per file; repeat for more) that
    /// the gRPC API matches descriptors against; watched and reloaded on change, as
    /// --rules.
    #[arg(long, value_name = "FILE.yaml", env = "SLUICE_DESCRIPTORS")]
    pub descriptors: Vec<PathBuf>,
    /// How often the node reads the version of the rules published in the store (ms).
    /// Changes are announced over Redis pub/sub and arrive at once; this poll is the safety
    /// net for an announcement lost across a reconnect.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..), env = "SLUICE_RULES_POLL_MS")]
    pub rules_poll_ms: u64,
    /// IPv6 clients are counted by their network of this many bits (`ip` identities); 128
    /// counts each address. IPv4-mapped addresses are counted as IPv4.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u8).range(1..=128), env = "SLUICE_IPV6_PREFIX")]
    pub ipv6_prefix: u8,
}

/// Envoy's rate limit service API and its quota service.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Envoy's gRPC APIs: rate limit service and RLQS")]
pub struct GrpcArgs {
    /// Serve Envoy's rate limit service API (`envoy.service.ratelimit.v3.RateLimitService`)
    /// and the gRPC health service on this address (HTTP/2; HOST:PORT or unix:PATH).
    #[arg(long, value_name = "HOST:PORT|unix:PATH", env = "SLUICE_GRPC_LISTEN")]
    pub grpc_listen: Option<ListenAddr>,
    /// Which gRPC answers carry Sluice's rate-limit headers (`RateLimit`, `RateLimit-Policy`,
    /// `X-RateLimit-*`, `Retry-After`) for Envoy to add to the response: `refusals` (where
    /// `Retry-After` matters), `always`, or `never`. The descriptor statuses carry the
    /// limit and what remains either way; Envoy's `enable_x_ratelimit_headers` turns them
    /// into `X-RateLimit-*` headers itself.
    #[arg(long, value_enum, default_value_t = grpc::AnswerHeaders::Refusals, requires = "grpc_listen", env = "SLUICE_GRPC_HEADERS")]
    pub grpc_headers: grpc::AnswerHeaders,
    /// Also serve Envoy's rate limit quota service (RLQS,
    /// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`) on --grpc-listen: Envoy's
    /// `rate_limit_quota` filter gets assignments (token buckets it enforces itself), each a
    /// lease of a leased rule's quota. A bucket id's `rule` entry (or the stream's domain)
    /// names the rule; the entry keyed by the rule's `by` gives the identity. See
    /// examples/envoy-rlqs.yaml.
    #[arg(long, requires = "grpc_listen", env = "SLUICE_RLQS")]
    pub rlqs: bool,
    /// What RLQS tells a bucket no leased rule matches: `abandon` (Envoy's own
    /// no_assignment_behavior decides it), `allow` or `deny` (30 s at a time).
    #[arg(long, value_enum, default_value_t = grpc::rlqs::UnknownBuckets::Abandon, requires = "rlqs", env = "SLUICE_RLQS_UNKNOWN")]
    pub rlqs_unknown: grpc::rlqs::UnknownBuckets,
}

/// The counter store and what the node does when it fails.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Counter store")]
pub struct StoreArgs {
    /// Counter store: `memory`; one Redis `redis://[USER@]HOST:PORT`; a Redis Cluster
    /// `redis+cluster://[USER@]H1:P1,H2:P2,...`; or the master a set of sentinels names,
    /// `redis+sentinel://[USER@]S1:P1,S2:P2/MASTER`. `rediss` instead of `redis` for TLS.
    /// Give the password with --store-password-file, not in the URL.
    #[arg(long, default_value = "memory", value_name = "URL", env = "SLUICE_STORE")]
    pub store: String,
    /// The prefix of every key and channel this node uses in --store and --global-store
    /// (`PREFIX:{<identity>}:<rule>`, `PREFIX:{rules}`, `PREFIX:rules:changed`,
    /// `PREFIX:violations`): deployments with different prefixes share a Redis without
    /// meeting (their own counters, their own published rules); nodes with the same prefix
    /// share both. 1 to 64 of ASCII letters, digits, `-`, `_`, `.`, `:`.
    #[arg(long, default_value = keys::DEFAULT_PREFIX, value_name = "PREFIX", value_parser = store_prefix, env = "SLUICE_STORE_PREFIX")]
    pub store_prefix: Keys,
    /// TLS to --store: trust only the CAs in this file (PEM) instead of the system's roots.
    #[arg(long, value_name = "FILE.pem", env = "SLUICE_STORE_CA_FILE")]
    pub store_ca_file: Option<PathBuf>,
    /// TLS to --store: present this client certificate chain (PEM); needs --store-key.
    #[arg(long, value_name = "FILE.pem", requires = "store_key", env = "SLUICE_STORE_CERT")]
    pub store_cert: Option<PathBuf>,
    /// The private key of --store-cert (PEM).
    #[arg(long, value_name = "FILE.pem", requires = "store_cert", env = "SLUICE_STORE_KEY")]
    pub store_key: Option<PathBuf>,
    /// File holding --store's password (its first line), for the URL's user or Redis's
    /// `default` user. Read again at every connection attempt: fix the file and the node
    /// connects, no restart needed.
    #[arg(long, value_name = "FILE", env = "SLUICE_STORE_PASSWORD_FILE")]
    pub store_password_file: Option<PathBuf>,
    /// File holding the sentinels' own password, when they ask for one
    /// (redis+sentinel:// only).
    #[arg(long, value_name = "FILE", env = "SLUICE_STORE_SENTINEL_PASSWORD_FILE")]
    pub store_sentinel_password_file: Option<PathBuf>,
    /// After each decision, wait until this many replicas have it (`WAIT`), so a failover
    /// cannot lose what was admitted; a decision not acknowledged within --store-timeout-ms
    /// fails (the rule's failure policy answers). Costs a replication round trip per
    /// decision: see BENCHMARKS.md.
    #[arg(long, default_value_t = 0, value_name = "N", env = "SLUICE_STORE_WAIT_REPLICAS")]
    pub store_wait_replicas: u32,
    /// Send the checks that reach the node while its call to a Redis shard is in flight
    /// together in the next call, each decided alone and all-or-nothing (a group commit: no
    /// timer, a lone check goes at once). Redis 7 (Functions) only. `false` sends each
    /// check as its own call.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL", env = "SLUICE_STORE_BATCHING")]
    pub store_batching: bool,
    /// Run the check as Redis Functions (one library, loaded at connect; Redis 7). `false`
    /// runs it as a script (`EVALSHA`) as on Redis 6, which needs no right to load
    /// functions; a Redis that refuses `FUNCTION LOAD` gets the script anyway.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL", env = "SLUICE_STORE_FUNCTIONS")]
    pub store_functions: bool,
    /// Longest wait for one store call (ms) before the rule's failure policy applies.
    #[arg(long, default_value_t = 50, env = "SLUICE_STORE_TIMEOUT_MS")]
    pub store_timeout_ms: u64,
    /// Consecutive store failures that open the circuit breaker.
    #[arg(long, default_value_t = 5, env = "SLUICE_BREAKER_FAILURES")]
    pub breaker_failures: u32,
    /// How long the open breaker fails fast before a request probes the store again (ms);
    /// a background ping every 100 ms closes it sooner once the store answers.
    #[arg(long, default_value_t = 1000, env = "SLUICE_BREAKER_COOLDOWN_MS")]
    pub breaker_cooldown_ms: u64,
    /// Most limit keys held in memory (memory store and fail-open fallback buckets).
    #[arg(long, default_value_t = 1_000_000, env = "SLUICE_MAX_KEYS")]
    pub max_keys: usize,
    /// Most refusals the node remembers: a limit the store refused is refused here, without
    /// a store call, until the store's retry_after (a reset, an override or a rules change
    /// ends it sooner); 0 asks the store every time.
    #[arg(long, default_value_t = 100_000, env = "SLUICE_MAX_REFUSALS")]
    pub max_refusals: usize,
}

/// The admin API and the console.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Admin API and console")]
pub struct AdminArgs {
    /// Serve the admin API (rules, overrides, violations), health and metrics on this
    /// address, apart from the data API; keep it reachable by operators only. Without it
    /// the node has no admin API. HOST:PORT or unix:PATH.
    #[arg(long, value_name = "HOST:PORT|unix:PATH", env = "SLUICE_ADMIN_LISTEN")]
    pub admin_listen: Option<ListenAddr>,
    /// File holding the admin API's bearer token; without it the admin API answers 401.
    #[arg(
        long,
        value_name = "FILE",
        requires = "admin_listen",
        env = "SLUICE_ADMIN_TOKEN_FILE"
    )]
    pub admin_token_file: Option<PathBuf>,
    /// File holding a read-only bearer token for the admin API and the console: it may read
    /// every `GET` endpoint and explain a request, and gets 403 for any change (rules,
    /// overrides, resets). For the people who watch but do not steer.
    #[arg(
        long,
        value_name = "FILE",
        requires = "admin_listen",
        env = "SLUICE_ADMIN_READ_TOKEN_FILE"
    )]
    pub admin_read_token_file: Option<PathBuf>,
    /// This node's name on the console (`GET /v1/admin/node`); default: the host's name and
    /// the data listener's address.
    #[arg(long, value_name = "NAME", env = "SLUICE_NODE_NAME")]
    pub node_name: Option<String>,
}

/// A node in one of several regions sharing global limits.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Regions: one limit across regions")]
pub struct RegionArgs {
    /// The store that holds the quotas of rules marked `global = true`, shared by every
    /// region (any Redis form --store takes, usually across a WAN: use rediss). This
    /// node then leases its share of each global quota in the background and decides global
    /// rules from it without waiting on the WAN; `--store` is its region's store. Without it,
    /// global rules are decided in `--store` like any other rule.
    #[arg(long, value_name = "URL", env = "SLUICE_GLOBAL_STORE")]
    pub global_store: Option<String>,
    /// TLS to --global-store: trust only the CAs in this file (PEM).
    #[arg(
        long,
        value_name = "FILE.pem",
        requires = "global_store",
        env = "SLUICE_GLOBAL_STORE_CA_FILE"
    )]
    pub global_store_ca_file: Option<PathBuf>,
    /// TLS to --global-store: present this client certificate chain (PEM).
    #[arg(long, value_name = "FILE.pem", requires_all = ["global_store", "global_store_key"], env = "SLUICE_GLOBAL_STORE_CERT")]
    pub global_store_cert: Option<PathBuf>,
    /// The private key of --global-store-cert (PEM).
    #[arg(
        long,
        value_name = "FILE.pem",
        requires = "global_store_cert",
        env = "SLUICE_GLOBAL_STORE_KEY"
    )]
    pub global_store_key: Option<PathBuf>,
    /// File holding --global-store's password (its first line).
    #[arg(
        long,
        value_name = "FILE",
        requires = "global_store",
        env = "SLUICE_GLOBAL_STORE_PASSWORD_FILE"
    )]
    pub global_store_password_file: Option<PathBuf>,
    /// This node's region, named in logs and metrics (with --global-store).
    #[arg(long, default_value = "local", requires = "global_store", env = "SLUICE_REGION")]
    pub region: String,
    /// Longest wait for a call to the global store (ms); a failed call counts the global
    /// store as unreachable until it answers again.
    #[arg(long, default_value_t = 1000, requires = "global_store", value_parser = clap::value_parser!(u64).range(1..), env = "SLUICE_GLOBAL_TIMEOUT_MS")]
    pub global_timeout_ms: u64,
    /// How often the node asks the global store for the leases it needs (ms).
    #[arg(long, default_value_t = 50, requires = "global_store", value_parser = clap::value_parser!(u64).range(1..), env = "SLUICE_GLOBAL_TICK_MS")]
    pub global_tick_ms: u64,
    /// A global quota used within this long (ms) keeps a lease of at least one unit between
    /// requests, so a client that comes back now and then is served from the node at once
    /// (0: a quota idle a whole second lets its lease go; its next check waits a WAN round
    /// trip for a new one). Each quota kept costs a lease renewal over the WAN per lease
    /// length.
    #[arg(
        long,
        default_value_t = 10_000,
        requires = "global_store",
        env = "SLUICE_GLOBAL_KEEP_WARM_MS"
    )]
    pub global_keep_warm_ms: u64,
    /// Checks that may wait at once for a cold global quota's first lease (a new client:
    /// one WAN round trip); past it a cold check is refused and counted
    /// (`sluice_global_checks_total{source="cold_over_cap"}`).
    #[arg(
        long,
        default_value_t = 4_096,
        requires = "global_store",
        env = "SLUICE_GLOBAL_MAX_COLD_WAITS"
    )]
    pub global_max_cold_waits: usize,
}

impl StoreArgs {
    /// The Redis options of `--store`, calls timing out after `timeout`.
    pub fn redis_options(&self, timeout: Duration) -> RedisOptions {
        RedisOptions {
            ca_file: self.store_ca_file.clone(),
            cert_file: self.store_cert.clone(),
            key_file: self.store_key.clone(),
            password_file: self.store_password_file.clone(),
            sentinel_password_file: self.store_sentinel_password_file.clone(),
            wait_replicas: self.store_wait_replicas,
            keys: self.store_prefix.clone(),
            batching: self.store_batching,
            script_only: !self.store_functions,
            ..RedisOptions::new(timeout)
        }
    }
}

impl RegionArgs {
    /// The Redis options of `--global-store`, its keys under `keys` (the node's prefix).
    pub fn redis_options(&self, timeout: Duration, keys: Keys) -> RedisOptions {
        RedisOptions {
            ca_file: self.global_store_ca_file.clone(),
            cert_file: self.global_store_cert.clone(),
            key_file: self.global_store_key.clone(),
            password_file: self.global_store_password_file.clone(),
            keys,
            ..RedisOptions::new(timeout)
        }
    }
}

/// The binary's tasks besides serving.
#[derive(Subcommand, Debug)]
pub enum Command {
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
pub enum LogFormat {
    Text,
    Json,
}

/// `--store-prefix`: the names under it, or why it cannot be used.
fn store_prefix(prefix: &str) -> Result<Keys, String> {
    Keys::new(prefix).map_err(|e| e.problem.to_owned())
}
