//! `sluice-harness`: run a proxy-wasm module as a small HTTP proxy, without Envoy.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use sluice_harness::abi::LogLevel;
use sluice_harness::proxy::{Proxy, ProxyConfig};
use sluice_harness::{Flavor, Host, HostOptions};

/// A proxy-wasm (ABI 0.2.1) host on wasmtime.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a module in an HTTP/1.1 proxy in front of an upstream.
    Proxy(ProxyArgs),
    /// Start a module with a configuration and report whether it accepts it (the module's own
    /// `proxy_on_configure`, which `nginx -t` does not run): run it before a reload.
    CheckConfig(CheckConfigArgs),
}

#[derive(Parser)]
struct CheckConfigArgs {
    /// The proxy-wasm module (.wasm).
    #[arg(long)]
    wasm: PathBuf,
    /// The plugin configuration file to check (JSON for Sluice's filter).
    #[arg(long)]
    config: PathBuf,
    /// Which proxy's behaviour to imitate.
    #[arg(long, value_enum, default_value_t = HostFlavor::Envoy)]
    host_flavor: HostFlavor,
    /// The nginx.conf the filter will run in: imitates Nginx with the `shm_kv` zones it
    /// declares (without it, the Nginx flavor assumes examples/nginx.conf's zone `sluice`).
    #[arg(long, value_name = "FILE")]
    nginx_conf: Option<PathBuf>,
}

#[derive(Parser)]
struct ProxyArgs {
    /// The proxy-wasm module (.wasm) to run on every request; without one the proxy only
    /// forwards (the baseline for measuring a module's cost).
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// The plugin configuration file given to proxy_on_configure (JSON for Sluice's filter).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to accept HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where requests the module lets through are forwarded.
    #[arg(long, default_value = "127.0.0.1:9000")]
    upstream: SocketAddr,
    /// A cluster the module may call, as NAME=HOST:PORT[,HOST:PORT...] (repeatable), like an
    /// Envoy cluster: calls take its endpoints in turn, and skip one that refuses connections.
    #[arg(long = "cluster", value_name = "NAME=HOST:PORT[,...]")]
    clusters: Vec<String>,
    /// Which proxy's behaviour to imitate.
    #[arg(long, value_enum, default_value_t = HostFlavor::Envoy)]
    host_flavor: HostFlavor,
    /// Address for the admin listener: `GET /stats` reports requests, dispatched calls, the
    /// VM's memory and the module's metrics as JSON (like Envoy's admin port).
    #[arg(long, value_name = "HOST:PORT")]
    admin: Option<SocketAddr>,
    /// Envoy flavour: Envoy's `xff_num_trusted_hops` (with `use_remote_address: true`). The
    /// proxy appends the peer to `x-forwarded-for` and gives the filter, as `source.address`,
    /// the address this many entries from the right of the header as it came (the peer's
    /// with 0, or when the header has no address there), as Envoy does.
    #[arg(long, default_value_t = 0, value_name = "N")]
    xff_num_trusted_hops: u32,
}

#[derive(Clone, Copy, ValueEnum)]
enum HostFlavor {
    Envoy,
    Nginx,
}

impl From<HostFlavor> for Flavor {
    fn from(flavor: HostFlavor) -> Flavor {
        match flavor {
            HostFlavor::Envoy => Flavor::Envoy,
            HostFlavor::Nginx => Flavor::Nginx,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // The log goes to stderr: stdout is what a command prints (check-config's verdict).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let ran = match Cli::parse().command {
        Command::Proxy(args) => proxy(args).await,
        Command::CheckConfig(args) => check_config(&args),
    };
    // The error and its causes on one line: returned from `main`, it would be printed by its
    // `Debug` form, with a stack trace whenever RUST_BACKTRACE is set.
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the module on a host of the chosen flavor with the configuration; an error carries
/// what the module logged about it.
fn check_config(args: &CheckConfigArgs) -> anyhow::Result<()> {
    let wasm = std::fs::read(&args.wasm).with_context(|| format!("cannot read the module {}", args.wasm.display()))?;
    let config = std::fs::read(&args.config)
        .with_context(|| format!("cannot read the configuration {}", args.config.display()))?;
    let mut options = HostOptions {
        flavor: args.host_flavor.into(),
        ..HostOptions::default()
    };
    if let Some(path) = &args.nginx_conf {
        let conf = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        options.flavor = Flavor::Nginx;
        options.shm_kv = shm_kv_zones(&conf);
    }
    let mut host = Host::new(&wasm, options).context("the module does not load")?;
    if let Err(e) = host.start(b"", &config) {
        let said: Vec<&str> = host
            .logs()
            .iter()
            .filter(|l| l.level >= LogLevel::Warn)
            .map(|l| l.message.as_str())
            .collect();
        bail!("{} is refused ({e}): {}", args.config.display(), said.join("; "));
    }
    // Some hosts refuse at the first request what the configuration names (ngx_wasm_module
    // traps on a call to an upstream it cannot parse): send one through.
    if let Err(e) = one_request(&mut host) {
        bail!(
            "{} is accepted, but the module fails on a request on this host: {e}",
            args.config.display()
        );
    }
    if !host.host_errors().is_empty() {
        bail!(
            "{} is accepted, but this host logs errors about the module's calls: {}",
            args.config.display(),
            host.host_errors().join("; ")
        );
    }
    println!(
        "{}: configuration accepted by {}",
        args.config.display(),
        args.wasm.display()
    );
    for said in host.logs().iter().filter(|l| l.level >= LogLevel::Warn) {
        println!("  but the module says: {}", said.message);
    }
    Ok(())
}

/// The zones an nginx.conf declares with `shm_kv NAME SIZE [eviction=...];` (comments left
/// out).
fn shm_kv_zones(conf: &str) -> Vec<String> {
    let text: String = conf
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut words = text
        .split(|c: char| c.is_whitespace() || c == ';' || c == '{' || c == '}')
        .filter(|w| !w.is_empty());
    let mut zones = Vec::new();
    while let Some(word) = words.next() {
        if word == "shm_kv" {
            zones.extend(words.next().map(str::to_owned));
        }
    }
    zones
}

/// Sends `GET /` through the module and ends it: its calls fail, as with no upstream.
fn one_request(host: &mut Host) -> Result<(), sluice_harness::HarnessError> {
    let stream = host.new_stream()?;
    host.set_property(stream, "source.address", "192.0.2.1:4242");
    let headers = [(":method", "GET"), (":path", "/"), (":authority", "check-config")];
    host.request_headers(stream, &headers, true)?;
    for call in host.pending_calls() {
        host.fail_call(call.token)?;
    }
    if host.stream(stream).is_some() {
        host.finish_stream(stream)?;
    }
    Ok(())
}

/// The `proxy` command.
async fn proxy(args: ProxyArgs) -> anyhow::Result<()> {
    if args.wasm.is_none() && args.config.is_some() {
        bail!("--config configures a module: give the module with --wasm too");
    }
    let wasm = match &args.wasm {
        Some(path) => Some(std::fs::read(path).with_context(|| format!("cannot read the module {}", path.display()))?),
        None => None,
    };
    let module = args
        .wasm
        .as_ref()
        .map_or("none (forwarding only)".to_owned(), |p| p.display().to_string());
    let plugin_config = match &args.config {
        Some(p) => std::fs::read(p).with_context(|| format!("cannot read the configuration {}", p.display()))?,
        None => Vec::new(),
    };
    let mut clusters = HashMap::new();
    for c in &args.clusters {
        let Some((name, addr)) = c.split_once('=') else {
            bail!("--cluster {c:?}: write it as NAME=HOST:PORT")
        };
        let endpoints = addr
            .split(',')
            .map(|a| {
                a.trim()
                    .parse::<SocketAddr>()
                    .with_context(|| format!("--cluster {c:?}: {a:?} is not HOST:PORT"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        clusters.insert(name.to_owned(), endpoints);
    }
    let flavor = args.host_flavor.into();
    if flavor == Flavor::Nginx && !clusters.is_empty() {
        bail!("--cluster is Envoy's: ngx_wasm_module calls the `host:port` the module names (set check.cluster to it)");
    }
    let config = ProxyConfig {
        wasm,
        plugin_config,
        upstream: args.upstream,
        clusters,
        flavor,
        admin: args.admin,
        xff_num_trusted_hops: args.xff_num_trusted_hops,
    };
    // The module first: once the port accepts, the proxy is ready.
    let proxy = Proxy::start(config).await.context("the module did not start")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}; is another process using it?", args.listen))?;
    tracing::info!(listen = %args.listen, upstream = %args.upstream, %module, admin = ?args.admin, "sluice-harness proxy ready");
    tokio::select! {
        r = proxy.serve(listener) => r.context("the proxy stopped")?,
        _ = tokio::signal::ctrl_c() => tracing::info!("stopped"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shm_kv_zones;

    #[test]
    fn zones_are_read_from_an_nginx_conf() {
        let conf = "wasm {\n  module sluice /x.wasm;\n  shm_kv sluice 4m eviction=none;\n  # shm_kv old 1m;\n  shm_kv * 1m;\n}\nhttp { }";
        assert_eq!(shm_kv_zones(conf), ["sluice", "*"]);
        assert!(shm_kv_zones("wasm { module sluice /x.wasm; }").is_empty());
    }
}
