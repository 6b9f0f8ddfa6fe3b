//! Retries against a real server: `Retry-After` as a floor, jitter across clients, and
//! which requests may be retried.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use sluice_client::{default_backoff, BackoffPolicy, Client, IDEMPOTENCY_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_1_is_retried_no_earlier_than_1s_later() {
    let server = Server::denying(1).await;
    let client = Client::new().expect("client");
    let response = client
        .send(client.get(server.url("/deny-first")))
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    assert_eq!(response.retries(), 1);
    let log = server.state.log.lock().expect("lock").clone();
    assert_eq!(log.iter().map(|&(_, s)| s).collect::<Vec<_>>(), [429, 200]);
    let waited = log[1].0.duration_since(log[0].0);
    assert!(waited >= Duration::from_secs(1), "retried after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_refused_by_the_same_429_spread_their_retries() {
    const CLIENTS: usize = 50;
    let server = Server::denying(CLIENTS).await;
    let delays = Arc::new(Mutex::new(Vec::new()));
    let backoff = BackoffPolicy {
        base_ms: 2_000,
        max_retries: 1,
        ..default_backoff()
    };
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let delays = Arc::clone(&delays);
            let client = Client::builder()
                .backoff(backoff)
                .on_retry(move |event| delays.lock().expect("lock").push(event.delay))
                .build()
                .expect("client");
            let url = server.url("/deny-first");
            tokio::spawn(async move { client.send(client.get(url)).await })
        })
        .collect();
    for task in tasks {
        let response = task.await.expect("task").expect("response");
        assert_eq!(response.status(), 200);
    }
    let delays = delays.lock().expect("lock").clone();
    assert_eq!(delays.len(), CLIENTS, "every client scheduled one retry");
    let mut slots = [0usize; 40];
    for delay in &delays {
        assert!(*delay >= Duration::from_secs(1), "earlier than Retry-After: {delay:?}");
        assert!(*delay <= Duration::from_secs(3), "beyond floor + base: {delay:?}");
        slots[(delay.as_millis() / 100) as usize] += 1;
    }
    let busiest = slots.iter().copied().max().unwrap_or(0);
    println!("retries per 100 ms slot: {slots:?}");
    assert!(
        busiest <= CLIENTS / 5,
        "{busiest} of {CLIENTS} retries in one 100 ms slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_idempotency_key_is_not_retried() {
    let server = Server::denying(1).await;
    let client = Client::new().expect("client");
    let response = client
        .send(client.post(server.url("/deny-first")))
        .await
        .expect("response");
    assert_eq!(response.status(), 429);
    assert_eq!(response.retries(), 0);
    assert_eq!(response.quota().retry_after_ms, Some(1_000));
    assert_eq!(server.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_with_idempotency_key_is_retried() {
    let server = Server::denying(1).await;
    let client = Client::new().expect("client");
    let request = client
        .post(server.url("/deny-first"))
        .header(IDEMPOTENCY_KEY, "order-42")
        .body("payload");
    let response = client.send(request).await.expect("response");
    assert_eq!(response.status(), 200);
    assert_eq!(response.retries(), 1);
    assert_eq!(server.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_are_retried_only_when_configured() {
    // A port that was just free: nothing listens on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("address"));
    drop(listener);
    let fast = BackoffPolicy {
        base_ms: 1,
        max_retries: 2,
        ..default_backoff()
    };
    for (retry, expected) in [(true, 2), (false, 0)] {
        let scheduled = Arc::new(Mutex::new(0));
        let counter = Arc::clone(&scheduled);
        let client = Client::builder()
            .backoff(fast)
            .retry_connection_errors(retry)
            .on_retry(move |_| *counter.lock().expect("lock") += 1)
            .build()
            .expect("client");
        let outcome = client.send(client.get(&url)).await;
        assert!(matches!(outcome, Err(sluice_client::Error::Request(_))), "{outcome:?}");
        assert_eq!(*scheduled.lock().expect("lock"), expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_stops_retries_when_spent() {
    let server = Server::denying(10).await;
    let client = Client::builder()
        .retry_budget(sluice_client::BudgetConfig {
            ratio: 0.0,
            min_retries: 1,
        })
        .backoff(BackoffPolicy {
            base_ms: 1,
            ..default_backoff()
        })
        .build()
        .expect("client");
    assert_eq!(client.retries_available(), 1);
    let url = server.url("/deny-first");
    let first = client.send(client.get(&url)).await.expect("response");
    assert_eq!(first.retries(), 1, "the one retry the budget holds");
    let second = client.send(client.get(&url)).await.expect("response");
    assert_eq!(second.status(), 429);
    assert_eq!(second.retries(), 0, "no budget left");
    assert_eq!(server.hits(), 3);
}

/// A server that says nothing of its quota: its refusals teach the bucket's pacer its rate,
/// and a refused request goes back to the queue, so the retry budget, here none at all, is
/// not what ends it (issue 66). The retry hook hears each one, with no delay of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_servers_refusals_queue_again_without_the_retry_budget() {
    let server = Server::start(5, 5).await;
    let requeued = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&requeued);
    let client = Client::builder()
        .retry_budget(sluice_client::BudgetConfig {
            ratio: 0.0,
            min_retries: 0,
        })
        .on_retry(move |event| log.lock().expect("lock").push(event.delay))
        .build()
        .expect("client");
    let url = server.url("/silent");
    let sends: Vec<_> = (0..20)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.send(client.get(url)).await.expect("response").status() })
        })
        .collect();
    let mut statuses = Vec::new();
    for send in sends {
        statuses.push(send.await.expect("task"));
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let requeued = requeued.lock().expect("lock").clone();
    assert!(server.denials() > 0, "the server refused some: the path was taken");
    assert_eq!(requeued.len(), server.denials(), "each refusal queued again");
    assert!(requeued.iter().all(|d| d.is_zero()), "{requeued:?}");
    assert_eq!(client.retries_available(), 0);
}
