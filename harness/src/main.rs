//! `sluice-harness`: run a proxy-wasm module as a small HTTP proxy, without Envoy.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use sluice_harness::proxy::{Proxy, ProxyConfig};
use sluice_harness::Flavor;

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
}

#[derive(Clone, Copy, ValueEnum)]
enum HostFlavor {
    Envoy,
    Nginx,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let Command::Proxy(args) = Cli::parse().command;
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
    let flavor = match args.host_flavor {
        HostFlavor::Envoy => Flavor::Envoy,
        HostFlavor::Nginx => Flavor::Nginx,
    };
    let config = ProxyConfig {
        wasm,
        plugin_config,
        upstream: args.upstream,
        clusters,
        flavor,
        admin: args.admin,
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
