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
