//! Pacing against a real server that enforces a token bucket.

mod common;

use std::time::Instant;

use common::Server;
use sluice_client::{bucket_key, Client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_requests_at_50_per_second_burst_10_all_succeed_with_at_most_one_429() {
    let server = Server::start(50, 10).await;
    let client = Client::new().expect("client");
    let url = server.url("/limited");
    let started = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.send(client.get(url)).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        let response = task.await.expect("task").expect("response");
        statuses.push(response.status().as_u16());
        assert_eq!(response.quota().limit, Some(50), "the quota is read on every response");
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(statuses.iter().all(|&s| s == 200), "statuses: {statuses:?}");
    assert!(server.denials() <= 1, "{} 429s", server.denials());
    assert_eq!(server.hits(), 100 + server.denials());
    // The best possible: the burst of 10 at once, the other 90 at 50/s.
    let achieved = 90.0 / elapsed;
    println!(
        "achieved rate: {achieved:.1} req/s beyond the burst = {:.1} % of the allowed 50/s \
         (100 requests in {elapsed:.2} s, {} × 429)",
        achieved / 50.0 * 100.0,
        server.denials()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_joins_its_policy_bucket_once_a_response_names_the_policy() {
    let server = Server::start(50, 10).await;
    let client = Client::new().expect("client");
    let url: reqwest::Url = server.url("/limited?page=1").parse().expect("url");
    let host = bucket_key(&url);
    assert_eq!(client.bucket_for(&url), host);
    let response = client.send(client.get(url.clone())).await.expect("response");
    assert_eq!(response.quota().policy.as_deref(), Some("test"));
    assert_eq!(client.bucket_for(&url), format!("{host} test"));
    let gate: reqwest::Url = server.url("/gate").parse().expect("url");
    assert_eq!(client.bucket_for(&gate), host, "another route keeps the host bucket");
}
