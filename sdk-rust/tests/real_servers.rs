//! Pacing against servers we did not write: every server of vectors/servers.json (slowapi,
//! Flask-Limiter, express-rate-limit in each header mode, @fastify/rate-limit; and those that
//! advertise no quota: Django REST framework, slowapi, Flask-Limiter and express-rate-limit
//! with their headers off), started from
//! the libraries `scripts/setup` installs (sdk-python/.venv, sdk-js/node_modules), each sent
//! many requests at once. The server's own counts say how many it refused. One test runs
//! them one after the other, alone (.config/nextest.toml): each measures a rate.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde_json::Value;
use sluice_client::Client;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One server of the list in a process of its own, stopped by closing its standard input.
struct RealServer {
    child: Child,
    url: String,
}

impl RealServer {
    fn start(entry: &Value, spec: &Value) -> RealServer {
        let root = root();
        let kind = entry["kind"].as_str().expect("kind");
        let (command, script) = match entry["runtime"].as_str() {
            Some("python") => (
                root.join("sdk-python/.venv/bin/python"),
                root.join("sdk-python/tests/real_servers.py"),
            ),
            _ => (PathBuf::from("node"), root.join("sdk-js/test/real-servers.mjs")),
        };
        assert!(
            command.components().count() == 1 || command.exists(),
            "{} is missing: run scripts/setup",
            command.display()
        );
        let mut child = Command::new(&command)
            .arg(&script)
            .arg(kind)
            .arg(spec["limit"].to_string())
            .arg(spec["window_s"].to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", command.display()));
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("first line");
        let port: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{kind} did not start: {e}: {line:?}"));
        RealServer {
            child,
            url: format!("http://127.0.0.1:{}", port["port"]),
        }
    }

    async fn stats(&self) -> Value {
        let text = reqwest::get(format!("{}/stats", self.url))
            .await
            .expect("stats")
            .text()
            .await
            .expect("stats body");
        serde_json::from_str(&text).expect("stats JSON")
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        if self.child.wait().is_err() {
            let _ = self.child.kill();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_ends_200_at_the_rate_each_server_allows() {
    let path = root().join("vectors/servers.json");
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("servers.json")).expect("JSON");
    let (limit, window) = (
        spec["limit"].as_f64().expect("limit"),
        spec["window_s"].as_f64().expect("window_s"),
    );
    let requests = spec["requests"].as_u64().expect("requests");
    // Each server with the bounds it is held to: those that advertise their quota, then the
    // silent ones.
    let lists = [&spec, &spec["silent"]];
    let cases = lists.iter().flat_map(|bounds| {
        let servers = bounds["servers"].as_array().expect("servers");
        servers.iter().map(move |entry| (entry, *bounds))
    });
    let mut failures = Vec::new();
    for (entry, bounds) in cases {
        let (max_refused, min_ratio) = (
            bounds["max_refused"].as_f64().expect("max"),
            bounds["min_ratio"].as_f64().expect("min"),
        );
        let kind = entry["kind"].as_str().expect("kind");
        let server = RealServer::start(entry, &spec);
        let client = Client::new().expect("client");
        let started = Instant::now();
        let tasks: Vec<_> = (0..requests)
            .map(|_| {
                let (client, url) = (client.clone(), format!("{}/", server.url));
                tokio::spawn(async move { client.send(client.get(url)).await.map(|r| r.status().as_u16()) })
            })
            .collect();
        let mut statuses = Vec::new();
        for task in tasks {
            statuses.push(task.await.expect("task").expect("response"));
        }
        let span = started.elapsed().as_secs_f64();
        let seen = server.stats().await;
        drop(server);
        let count = |status: &str| seen[status].as_u64().unwrap_or(0);
        let (ok, refused) = (count("200"), count("429"));
        // The 200s over the span from the first send to the last answer, against limit / window.
        let ratio = ok as f64 / span / (limit / window);
        println!("{kind}: {ok} x 200, {refused} x 429 in {span:.2} s: {ratio:.2} of the allowed rate");
        if statuses.iter().any(|&s| s != 200) || ok != requests {
            failures.push(format!("{kind}: statuses {statuses:?}, server saw {seen}"));
        }
        if refused as f64 > max_refused * (ok + refused) as f64 {
            failures.push(format!("{kind}: {refused} refused of {}", ok + refused));
        }
        if span < 5.0 * window {
            failures.push(format!("{kind}: {span:.2} s, not 5 windows"));
        }
        if ratio < min_ratio {
            failures.push(format!("{kind}: {ratio:.2} of the allowed rate (at least {min_ratio})"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
