//! `sluice-service`: the check service binary.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use sluice_core::rules::RuleSet;
use sluice_service::breaker::BreakerState;
use sluice_service::console::SourceKind;
use sluice_service::edge::{self, Edge};
use sluice_service::grpc::descriptors::DescriptorSet;
use sluice_service::listen::{ListenAddr, Listener};
use sluice_service::node::{Node, NodeConfig};
use sluice_service::region::{Region, RegionConfig};
use sluice_service::store::keys::Keys;
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{redact, RedisStore};
use sluice_service::store::Store;
use sluice_service::{admin, grpc, housekeeping, http, region, rules_source, trace};

mod args;
mod commands;
mod environment;

use args::{Args, Command, LogFormat};

/// Every check allocates a few small, short-lived buffers (the parsed request, the rule
/// keys, the JSON answer); mimalloc serves them with less CPU than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Before any flag is read from it: a variable no flag reads would be silently ignored.
    if let Err(e) = environment::check(std::env::vars_os()) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let args = Args::parse();
    if let Some(Command::CheckRules {
        file,
        allow_empty_rules,
    }) = &args.command
    {
        std::process::exit(commands::check_rules(file, *allow_empty_rules));
    }
    if let Some(Command::Explain { .. }) = &args.command {
        std::process::exit(commands::explain(&args));
    }
    // The log is diagnostics: stderr, so that what a command prints on stdout (and what a
    // script captures of it) is never mixed with it.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => log.init(),
        LogFormat::Json => log.json().init(),
    }
    let ran = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(args)));
    // The error and its causes on one line, in the log's format: returned from `main`, it
    // would be printed by its `Debug` form, with a stack trace whenever RUST_BACKTRACE is set.
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (descriptors, yaml_fingerprint) = descriptors(&args)?;
    let (rules, fingerprint) = rules(&args)?;
    let edge = edge(&args)?;
    let store = store(&args)?;
    let mut config = node_config(&args)?;
    let exporting = match &args.otlp_endpoint {
        Some(endpoint) => {
            let (traces, exporting) = trace::otlp(endpoint, &config.node_name)?;
            tracing::info!(%endpoint, "a span per check, exported over OTLP");
            config.traces = traces;
            Some(exporting)
        }
        None => None,
    };
    let region = region(&args, &rules).await?;
    let node = Node::in_region(store, rules, config, region);
    match args.rules.rules.as_deref().filter(|_| !rules_are_yaml(&args)) {
        Some(path) => node.console.set_source(SourceKind::File, path.display().to_string()),
        None => node.console.set_source(SourceKind::None, "no --rules file"),
    }
    node.set_descriptors(descriptors);
    start_tasks(&node, &args, fingerprint, yaml_fingerprint);
    let served = serve(node, &args, edge).await;
    if let Some(exporting) = exporting {
        // Blocks until the last spans are sent, which needs the runtime: off its threads.
        tokio::task::spawn_blocking(move || exporting.shutdown()).await?;
    }
    served
}

/// Whether `--rules` names an envoyproxy/ratelimit YAML file rather than a TOML one.
fn rules_are_yaml(args: &Args) -> bool {
    args.rules.rules.as_deref().is_some_and(grpc::config::is_yaml)
}

/// The gRPC API's descriptor files: `--descriptors`, and a `--rules` file in
/// envoyproxy/ratelimit's YAML.
fn yaml_files(args: &Args) -> Vec<PathBuf> {
    let mut files = args.rules.descriptors.clone();
    files.extend(args.rules.rules.clone().filter(|_| rules_are_yaml(args)));
    files
}

/// The gRPC API's descriptor set and the fingerprint of its files, for the watcher.
fn descriptors(args: &Args) -> anyhow::Result<(Arc<DescriptorSet>, u64)> {
    let files = yaml_files(args);
    if args.grpc.grpc_listen.is_none() && !files.is_empty() {
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
    Ok(match &args.rules.rules {
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
        tls: match (&args.edge.tls_cert, &args.edge.tls_key) {
            (Some(cert), Some(key)) => Some(edge::tls_acceptor(cert, key, args.edge.tls_client_ca.as_deref())?),
            _ => None,
        },
        max_connections: usize::try_from(args.edge.max_connections).unwrap_or(usize::MAX),
        header_timeout: Duration::from_millis(args.edge.header_timeout_ms),
        idle_timeout: Duration::from_millis(args.edge.idle_timeout_ms),
        peer_addresses: false,
    })
}

/// The node's store call timeout.
fn store_timeout(args: &Args) -> Duration {
    Duration::from_millis(args.store.store_timeout_ms.max(1))
}

/// The counter store: memory, or Redis (connecting in the background).
fn store(args: &Args) -> anyhow::Result<Store> {
    let timeout = store_timeout(args);
    let redis_only = args.store.store_ca_file.is_some()
        || args.store.store_cert.is_some()
        || args.store.store_password_file.is_some()
        || args.store.store_sentinel_password_file.is_some()
        || args.store.store_wait_replicas > 0
        || args.store.store_prefix != Keys::default();
    if args.store.store == "memory" && redis_only {
        bail!(
            "--store-ca-file, --store-cert, --store-password-file, --store-wait-replicas and --store-prefix are for a Redis --store"
        );
    }
    Ok(if args.store.store == "memory" {
        Store::Memory(MemoryStore::new(args.store.max_keys))
    } else {
        // Connects in the background: a node started before Redis serves by each rule's
        // failure policy meanwhile, and /readyz says the store is unreachable.
        let options = args.store.redis_options(timeout.max(Duration::from_millis(500)));
        let store = RedisStore::start(&args.store.store, options)
            .with_context(|| format!("--store {}", redact(&args.store.store)))?;
        tracing::info!(store = %store.address(), "connecting to Redis in the background");
        Store::Redis(Box::new(store))
    })
}

/// The node's settings, its tokens read from their files.
fn node_config(args: &Args) -> anyhow::Result<NodeConfig> {
    let admin_token = args
        .admin
        .admin_token_file
        .as_deref()
        .map(|p| secret(p, "admin token"))
        .transpose()?;
    let admin_read_token = args
        .admin
        .admin_read_token_file
        .as_deref()
        .map(|p| secret(p, "admin read token"))
        .transpose()?;
    if admin_read_token.is_some() && admin_read_token == admin_token {
        bail!("--admin-read-token-file holds the admin token: give the read-only token a secret of its own");
    }
    let data_token = args
        .edge
        .data_token_file
        .as_deref()
        .map(|p| secret(p, "data token"))
        .transpose()?;
    if data_token.is_none() {
        tracing::warn!("no --data-token-file: anyone who reaches this node may check and lease any quota");
    }
    Ok(NodeConfig {
        store_timeout: store_timeout(args),
        breaker_failures: args.store.breaker_failures,
        breaker_cooldown: Duration::from_millis(args.store.breaker_cooldown_ms),
        max_keys: args.store.max_keys,
        max_refusals: args.store.max_refusals,
        admin_token,
        admin_read_token,
        node_name: node_name(args),
        data_token,
        token_header: args.edge.token_header.to_ascii_lowercase(),
        max_waits: args.edge.max_waits,
        ipv6_prefix: args.rules.ipv6_prefix,
        rules_poll: Duration::from_millis(args.rules.rules_poll_ms),
        allow_empty_rules: args.rules.allow_empty_rules,
        ..NodeConfig::default()
    })
}

/// `--node-name`, else the host's name and the data listener's address.
fn node_name(args: &Args) -> String {
    if let Some(name) = &args.admin.node_name {
        return name.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host} {}", args.edge.listen)
}

/// The node's region, with `--global-store`: its link to the global store, connected before
/// the node serves when it answers.
async fn region(args: &Args, rules: &RuleSet) -> anyhow::Result<Option<Region>> {
    Ok(match &args.regions.global_store {
        Some(url) => {
            let timeout = Duration::from_millis(args.regions.global_timeout_ms);
            let options = args.regions.redis_options(timeout, args.store.store_prefix.clone());
            let global = RedisStore::start(url, options).with_context(|| format!("--global-store {}", redact(url)))?;
            let url = global.address().to_string();
            // Connected before the node serves when the global store answers, so the first
            // leases go out at once and the link is not reported down for a connect.
            if !answers_within(&global, timeout).await {
                tracing::warn!(global_store = %url, "the global store does not answer yet; global rules follow on_global_unreachable until it does");
            }
            let config = RegionConfig {
                name: args.regions.region.clone(),
                tick: Duration::from_millis(args.regions.global_tick_ms),
                timeout,
                keep_warm: Duration::from_millis(args.regions.global_keep_warm_ms),
                max_cold_waits: args.regions.global_max_cold_waits,
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
    if let Some(path) = args.rules.rules.clone().filter(|_| !rules_are_yaml(args)) {
        tokio::spawn(rules_source::watch_file(node.clone(), path, fingerprint));
    }
    let yaml = yaml_files(args);
    if !yaml.is_empty() {
        tokio::spawn(rules_source::watch_files(node.clone(), yaml, yaml_fingerprint));
    }
    tokio::spawn(rules_source::follow_published(node.clone()));
    tokio::spawn(housekeeping::sweep(node.clone()));
    tokio::spawn(housekeeping::settle_owed(node.clone()));
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
    let listener = bind(&args.edge.listen).await?;
    let admin = match &args.admin.admin_listen {
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
    let grpc_server = match &args.grpc.grpc_listen {
        Some(addr) => {
            let grpc_listener = bind(addr).await?;
            tracing::info!(grpc_listen = %grpc_listener.local_addr()?, "Envoy rate limit service API");
            let limiter = grpc::RateLimiter::on_node(node.clone(), args.grpc.grpc_headers);
            let quota = args.grpc.rlqs.then(|| {
                tracing::info!("Envoy rate limit quota service (RLQS)");
                let limits = grpc::rlqs::Limits::default();
                grpc::rlqs::QuotaService::start(node.clone(), limits, args.grpc.rlqs_unknown, stop.subscribe())
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
