//! The client-side queue: its bound and cancellation.

mod common;

use common::{eventually, Server};
use sluice_client::{bucket_key, Client, Error};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_fails_fast_and_a_dropped_waiter_frees_its_place() {
    let server = Server::start(50, 10).await;
    let client = Client::builder()
        .max_in_flight(1)
        .queue_capacity(2)
        .build()
        .expect("client");
    let url = server.url("/gate");
    let key = bucket_key(&url.parse().expect("url"));
    let spawn = |client: &Client| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { client.send(client.get(url)).await })
    };

    // One in flight (held by the server), two waiting: the queue is full.
    let first = spawn(&client);
    eventually("the first request reaches the server", || server.hits() == 1).await;
    let second = spawn(&client);
    let third = spawn(&client);
    eventually("two requests wait", || client.queued(&key) == 2).await;
    let refused = client.send(client.get(&url)).await;
    assert!(
        matches!(&refused, Err(Error::QueueFull { capacity: 2, key: k }) if *k == key),
        "{refused:?}"
    );

    // Dropping a waiting future gives its place up: another request fits again.
    third.abort();
    assert!(third.await.is_err_and(|e| e.is_cancelled()));
    eventually("the cancelled request leaves the queue", || client.queued(&key) == 1).await;
    let fourth = spawn(&client);
    eventually("the new request waits", || client.queued(&key) == 2).await;
    assert!(matches!(
        client.send(client.get(&url)).await,
        Err(Error::QueueFull { .. })
    ));

    // Released, the queued requests complete; the cancelled one never reached the server.
    server.state.gate.add_permits(10);
    for task in [first, second, fourth] {
        let response = task.await.expect("task").expect("response");
        assert_eq!(response.status(), 200);
    }
    assert_eq!(server.hits(), 3);
    assert_eq!(client.queued(&key), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_buckets_are_forgotten_past_the_bound_and_busy_ones_kept() {
    let server = Server::start(1_000, 1_000).await;
    let client = Client::builder()
        .queue(sluice_client::QueueConfig {
            max_buckets: 8,
            max_in_flight: Some(1),
            ..Default::default()
        })
        .build()
        .expect("client");
    // One request held in flight on its own bucket.
    let held = {
        let client = client.clone();
        let url = server.url("/gate");
        tokio::spawn(async move { client.send_keyed("busy", client.get(url)).await })
    };
    eventually("the held request reaches the server", || server.hits() == 1).await;
    // Fifty more buckets, one request each: the client keeps at most eight.
    for i in 0..50 {
        let key = format!("route-{i}");
        let response = client.send_keyed(&key, client.get(server.url("/limited"))).await;
        assert_eq!(response.expect("response").status(), 200);
        assert!(
            client.buckets() <= 8,
            "{} buckets after {} routes",
            client.buckets(),
            i + 1
        );
    }
    // The busy bucket, the least recently used, was kept: it still counts its request in
    // flight, so another request of it waits (one in flight at most) until that one ends.
    let second = {
        let client = client.clone();
        let url = server.url("/limited");
        tokio::spawn(async move { client.send_keyed("busy", client.get(url)).await })
    };
    eventually("the second request waits behind the held one", || {
        client.queued("busy") == 1
    })
    .await;
    server.state.gate.add_permits(1);
    assert_eq!(held.await.expect("task").expect("response").status(), 200);
    assert_eq!(second.await.expect("task").expect("response").status(), 200);
    assert!(client.buckets() <= 8);
}
