//! `sluice-load`: drives load at a check service (HTTP `/v1/check`, or Envoy's rate limit
//! service API over gRPC) or a proxy and prints throughput and latency percentiles; with
//! `--redis-port`, also the `redis-benchmark` ceiling for `EVALSHA` of Sluice's own script
//! at the same concurrency.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::error::Error as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use sluice_core::rules;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// The client of Envoy's rate limit service (compiled from service/proto by `build.rs`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/envoy.rs"));
}
use proto::envoy;

/// Sluice's check script (the service's own file: the ceiling runs what the service runs).
#[path = "../../../service/src/store/lua/check_script.rs"]
mod check_script;

/// Load generator for Sluice: closed-loop (as fast as answers come) or at a fixed rate.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Base URL of the target, e.g. http://127.0.0.1:8081 (service) or :8080 (proxy), or the
    /// service's --grpc-listen address in `grpc` mode (http://127.0.0.1:8089).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    target: String,
    /// What to send: `check` POSTs /v1/check bodies; `get` GETs --path through a proxy;
    /// `grpc` calls Envoy's ShouldRateLimit for --domain with one descriptor,
    /// --descriptor-key = the client's IP (status: OK counts as 2xx, OVER_LIMIT as 429, a
    /// gRPC error from the service as 4xx or 5xx by its code).
    #[arg(long, value_enum, default_value_t = Mode::Check)]
    mode: Mode,
    /// Path for `get` mode.
    #[arg(long, default_value = "/api/hello")]
    path: String,
    /// Domain for `grpc` mode.
    #[arg(long, default_value = "edge")]
    domain: String,
    /// Descriptor key whose value is the client's IP, for `grpc` mode.
    #[arg(long, default_value = "remote_address")]
    descriptor_key: String,
    /// Concurrent keep-alive connections (in `grpc` mode, tonic channels: one HTTP/2
    /// connection each, one call at a time on it).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// How long to run, e.g. 10s or 500ms.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Total requests per second across connections (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Stop after this many requests across connections (0: no count; --duration still
    /// bounds the run).
    #[arg(long, default_value_t = 0)]
    requests: u64,
    /// Distinct client identities to spread requests over (IPs 10.x.y.z; at most 2^24).
    /// Connections take them in turn, so a run sends min(keys, requests) distinct ones.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// The first identity's number: runs with offsets far apart use disjoint identities.
    #[arg(long, default_value_t = 0)]
    key_offset: u64,
    /// A local Redis the target uses: report its script calls per request (from `INFO
    /// commandstats`), and measure redis-benchmark's EVALSHA ceiling on it.
    #[arg(long)]
    redis_port: Option<u16>,
    /// The target's process id: report its CPU time per request (from /proc/PID/stat).
    #[arg(long)]
    pid: Option<u32>,
    /// Skip the redis-benchmark ceiling run (with --redis-port).
    #[arg(long)]
    no_ceiling: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
enum Mode {
    /// POST /v1/check.
    Check,
    /// GET through a proxy.
    Get,
    /// Envoy's rate limit service API.
    Grpc,
}

/// What every connection sends, whoever the client.
struct Workload {
    mode: Mode,
    /// The target's URL.
    target: String,
    /// The target's host:port.
    authority: String,
    path: String,
    domain: String,
    descriptor_key: String,
}

/// A duration as the rule file writes one (`500ms`, `10s`, `1m`; see [`rules::parse_duration`]).
fn parse_duration(s: &str) -> Result<Duration, String> {
    rules::parse_duration(s).map(Duration::from_millis)
}

struct Outcome {
    latencies_us: Vec<u32>,
    by_status: [u64; 6],
    errors: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let uri: hyper::Uri = args.target.parse().context("--target is not a URL")?;
    let authority = uri.authority().context("--target needs host:port")?.to_string();
    eprintln!(
        "sluice-load: {} connections for {:?} against {} ({:?} mode{})",
        args.connections,
        args.duration,
        args.target,
        args.mode,
        if args.rate > 0 {
            format!(", {} req/s", args.rate)
        } else {
            String::new()
        }
    );
    let cpu_before = args.pid.map(cpu_ticks).transpose()?;
    let scripts_before = args.redis_port.map(script_calls).transpose()?;
    let deadline = Instant::now() + args.duration;
    let per_conn_interval =
        (args.rate > 0).then(|| Duration::from_secs_f64(args.connections as f64 / args.rate as f64));
    let workload = Arc::new(Workload {
        mode: args.mode,
        target: args.target.clone(),
        authority,
        path: args.path.clone(),
        domain: args.domain.clone(),
        descriptor_key: args.descriptor_key.clone(),
    });
    let mut tasks = Vec::new();
    for c in 0..args.connections {
        let keys = Keys {
            first: args.key_offset.wrapping_add(c as u64),
            step: args.connections as u64,
            count: args.keys.clamp(1, 1 << 24),
            index: c as u64,
        };
        let quota = share(args.requests, c as u64, args.connections as u64);
        let workload = workload.clone();
        tasks.push(tokio::spawn(async move {
            run_connection(&workload, keys, deadline, per_conn_interval, quota).await
        }));
    }
    let started = Instant::now();
    let mut all = Outcome {
        latencies_us: Vec::new(),
        by_status: [0; 6],
        errors: 0,
    };
    for t in tasks {
        let o = t.await??;
        all.latencies_us.extend(o.latencies_us);
        for (a, b) in all.by_status.iter_mut().zip(o.by_status) {
            *a += b;
        }
        all.errors += o.errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = all.latencies_us.len();
    if n == 0 {
        bail!("no request completed: is {} up?", args.target);
    }
    all.latencies_us.sort_unstable();
    let pct = |p: f64| f64::from(all.latencies_us[((n as f64 * p) as usize).min(n - 1)]) / 1000.0;
    println!("requests      {n} in {elapsed:.2}s, {} errors", all.errors);
    println!("throughput    {:.0} req/s", n as f64 / elapsed);
    println!(
        "latency ms    p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        pct(0.5),
        pct(0.99),
        pct(0.999),
        pct(1.0)
    );
    println!(
        "status        2xx {}  4xx {}  429 {}  5xx {}",
        all.by_status[2], all.by_status[4], all.by_status[0], all.by_status[5]
    );
    if let (Some(pid), Some(before)) = (args.pid, cpu_before) {
        let seconds = (cpu_ticks(pid)? - before) as f64 / ticks_per_second()?;
        println!(
            "target cpu    {:.1} µs per request ({:.2} cores busy)",
            seconds * 1e6 / n as f64,
            seconds / elapsed
        );
    }
    if let (Some(port), Some(before)) = (args.redis_port, scripts_before) {
        let calls = script_calls(port)? - before;
        println!("redis         {:.3} script calls per request", calls as f64 / n as f64);
        if !args.no_ceiling {
            redis_ceiling(port, args.connections)?;
        }
    }
    Ok(())
}

/// User + system CPU time of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("no process {pid}"))?;
    // Fields after the command name (which may hold spaces, so split after its `)`):
    // state is field 3; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("unreadable /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .context("short /proc stat")?
            .parse()
            .context("unreadable /proc stat")
    };
    Ok(field(14)? + field(15)?)
}

fn ticks_per_second() -> anyhow::Result<f64> {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("cannot run getconf")?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK printed no number")
}

/// Check calls (`FCALL`, `EVALSHA`) the Redis on `port` has served since it started (or its
/// last reset).
fn script_calls(port: u16) -> anyhow::Result<u64> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .context("cannot run redis-cli; install redis-tools")?;
    Ok(sluice_testkit::check_calls(&String::from_utf8_lossy(&out.stdout)))
}

/// Connection `c`'s share of `total` requests over `connections`; `u64::MAX` when there is
/// no count.
fn share(total: u64, c: u64, connections: u64) -> u64 {
    if total == 0 {
        return u64::MAX;
    }
    total / connections + u64::from(c < total % connections)
}

/// Which identities one connection sends: `first`, `first + step`, ... modulo `count`.
#[derive(Clone, Copy)]
struct Keys {
    first: u64,
    step: u64,
    count: u64,
    /// The connection's index among `step` connections.
    index: u64,
}

impl Keys {
    /// Where in a shared interval this connection sends: index / connections.
    fn phase(&self) -> f64 {
        self.index as f64 / self.step.max(1) as f64
    }
}

async fn run_connection(
    workload: &Workload,
    keys: Keys,
    deadline: Instant,
    interval: Option<Duration>,
    quota: u64,
) -> anyhow::Result<Outcome> {
    let mut conn = Conn::open(workload).await?;
    let mut out = Outcome {
        latencies_us: Vec::with_capacity(100_000),
        by_status: [0; 6],
        errors: 0,
    };
    // At a fixed rate, connections are staggered over one interval: a smooth arrival
    // stream rather than every connection sending at the same instant.
    let mut next = Instant::now() + interval.map_or(Duration::ZERO, |iv| iv.mul_f64(keys.phase()));
    let mut i = keys.first;
    let mut sent = 0;
    while Instant::now() < deadline && sent < quota {
        sent += 1;
        let mut started = Instant::now();
        if let Some(iv) = interval {
            let due = next;
            next += iv;
            if started < due {
                // On time: wait for it. The timer's own lateness (up to its 1 ms tick) is
                // the tool's, not the target's, so latency counts from the wake-up.
                tokio::time::sleep_until(due.into()).await;
                started = Instant::now();
            } else {
                // Behind, because an answer came late: latency counts from when the request
                // was due, so a stall shows in every request it delayed.
                started = due;
            }
        }
        let key = i % keys.count;
        i = i.wrapping_add(keys.step);
        let ip = format!("10.{}.{}.{}", key >> 16 & 255, key >> 8 & 255, key & 255);
        match conn.send(workload, &ip).await? {
            Sent::Answer(slot) => {
                out.latencies_us
                    .push(started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                out.by_status[slot] += 1;
            }
            Sent::Failed => out.errors += 1,
            Sent::Closed => {
                out.errors += 1;
                break;
            }
        }
    }
    Ok(out)
}

/// One connection of the load: an HTTP/1.1 keep-alive connection, or a tonic channel (its
/// own HTTP/2 connection).
enum Conn {
    Http(SendRequest<Full<Bytes>>),
    Grpc(RateLimitServiceClient<Channel>),
}

/// What one request got.
/// Whether the first 5xx answer was printed (stderr, once a run).
static FIRST_5XX_SAID: AtomicBool = AtomicBool::new(false);

enum Sent {
    /// An answer, by its slot in [`Outcome::by_status`] (0 for 429).
    Answer(usize),
    /// No answer: the request failed on the way.
    Failed,
    /// No answer, and the connection can send no more.
    Closed,
}

impl Conn {
    async fn open(workload: &Workload) -> anyhow::Result<Conn> {
        if workload.mode == Mode::Grpc {
            let channel = Endpoint::from_shared(workload.target.clone())
                .context("--target is not a URL")?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("cannot connect to {}", workload.target))?;
            return Ok(Conn::Grpc(RateLimitServiceClient::new(channel)));
        }
        let authority = &workload.authority;
        let stream = TcpStream::connect(authority)
            .await
            .with_context(|| format!("cannot connect to {authority}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Conn::Http(sender))
    }

    /// Sends one request for the client at `ip` and waits for its answer.
    async fn send(&mut self, workload: &Workload, ip: &str) -> anyhow::Result<Sent> {
        match self {
            Conn::Http(sender) => {
                let req = http_request(workload, ip)?;
                if sender.ready().await.is_err() {
                    // The server closed the connection after its last answer (Nginx's
                    // `keepalive_requests`, `Connection: close`): open another, as wrk does.
                    let Ok(Conn::Http(fresh)) = Conn::open(workload).await else {
                        return Ok(Sent::Closed);
                    };
                    *sender = fresh;
                    if sender.ready().await.is_err() {
                        return Ok(Sent::Closed);
                    }
                }
                Ok(match sender.send_request(req).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
                        if status >= 500 && !FIRST_5XX_SAID.swap(true, Ordering::Relaxed) {
                            // What a proxy says of its own 5xx names the cause (Envoy's
                            // "upstream connect error or disconnect/reset…").
                            let body = body.map(|b| String::from_utf8_lossy(&b[..b.len().min(300)]).into_owned());
                            eprintln!("first 5xx: {status} {}", body.unwrap_or_default().replace('\n', " "));
                        }
                        Sent::Answer(if status == 429 {
                            0
                        } else {
                            usize::from(status / 100).min(5)
                        })
                    }
                    Err(_) => Sent::Failed,
                })
            }
            Conn::Grpc(client) => Ok(should_rate_limit(client, workload, ip).await),
        }
    }
}

/// `POST /v1/check` for the client at `ip`, or `GET --path` from it through a proxy.
fn http_request(workload: &Workload, ip: &str) -> anyhow::Result<Request<Full<Bytes>>> {
    let builder = Request::builder().header("host", &workload.authority);
    Ok(if workload.mode == Mode::Check {
        builder
            .method(Method::POST)
            .uri("/v1/check")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                r#"{{"identities":{{"ip":"{ip}"}},"method":"GET","path":"/api/load"}}"#
            ))))?
    } else {
        builder
            .uri(workload.path.as_str())
            .header("x-forwarded-for", ip)
            .body(Full::new(Bytes::new()))?
    })
}

/// One `ShouldRateLimit` call: the workload's domain, one descriptor with the client's IP.
async fn should_rate_limit(client: &mut RateLimitServiceClient<Channel>, workload: &Workload, ip: &str) -> Sent {
    let request = RateLimitRequest {
        domain: workload.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: workload.descriptor_key.clone(),
                value: ip.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    match client.should_rate_limit(request).await {
        Ok(answer) => Sent::Answer(match Code::try_from(answer.into_inner().overall_code) {
            Ok(Code::Ok) => 2,
            Ok(Code::OverLimit) => 0,
            _ => 5,
        }),
        // A status the client made from a transport error carries that error; one the
        // service sent does not.
        Err(status) if status.source().is_some() => Sent::Failed,
        Err(status) => Sent::Answer(grpc_error_slot(status.code())),
    }
}

/// The HTTP class of a gRPC error the service sent: 4xx for the caller's faults (as gRPC's
/// HTTP mapping has them), 5xx for the rest.
fn grpc_error_slot(code: tonic::Code) -> usize {
    use tonic::Code as C;
    match code {
        C::InvalidArgument
        | C::NotFound
        | C::AlreadyExists
        | C::PermissionDenied
        | C::FailedPrecondition
        | C::OutOfRange
        | C::Unimplemented
        | C::Unauthenticated => 4,
        _ => 5,
    }
}

/// Loads Sluice's check into the local Redis, as the script and as the Function library,
/// and runs redis-benchmark on each: one token-bucket rule per call, 10,000 keys.
fn redis_ceiling(port: u16, connections: usize) -> anyhow::Result<()> {
    let cli = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .context("cannot run redis-cli; install redis-tools")?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let sha = cli(&["SCRIPT", "LOAD", &check_script::check_script()])?;
    if sha.len() != 40 {
        bail!("SCRIPT LOAD failed: {sha}");
    }
    let library = cli(&["FUNCTION", "LOAD", "REPLACE", &check_script::check_library()])?;
    let name = check_script::library_name();
    if library != name {
        bail!("FUNCTION LOAD failed: {library}");
    }
    // The driver's arguments (lua/check.lua): the clock (Redis's), the unused `at`, then one
    // rule's value: token_bucket, not a shadow, cost 1, 1,000,000 a second.
    let args = ["", "0", "token_bucket:0:1:1000000:1000000:1:1"];
    let key = "sluice:{__rand_int__}:bench:tb";
    let sample = cli(&[&["EVALSHA", &sha, "1", "sluice:{0}:bench:tb", "decide"][..], &args[..]].concat())?;
    if sample.lines().nth(1).is_none_or(|allowed| allowed != "1") {
        bail!("the check script did not admit the benchmark's call: {sample}");
    }
    for (name, call) in [
        (
            "EVALSHA",
            [&["EVALSHA", &sha, "1", key, "decide"][..], &args[..]].concat(),
        ),
        (
            "FCALL",
            [&["FCALL", &format!("{name}_decide"), "1", key][..], &args[..]].concat(),
        ),
    ] {
        let out = Command::new("redis-benchmark")
            .args(["-p", &port.to_string(), "-c", &connections.to_string()])
            .args(["-n", "200000", "-r", "10000", "-q"])
            .args(&call)
            .output()
            .context("cannot run redis-benchmark; install redis-tools")?;
        // redis-benchmark redraws its progress line with `\r`: the last one is the result.
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result = stdout
            .rsplit('\r')
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no output");
        let result = result.rsplit(": ").next().unwrap_or(result);
        println!("redis-benchmark {name} ceiling ({connections} clients): {result}");
    }
    Ok(())
}
