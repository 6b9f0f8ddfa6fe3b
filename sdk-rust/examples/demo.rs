//! Sends N requests through the demo stack's proxy (which admits 5 requests per 10 s per
//! IP) and prints, for each, the status, the quota left and how long it waited.
//!
//! ```text
//! cargo run -p sluice-client --example demo -- [N] [URL]
//! ```
//!
//! Defaults: N = 8, URL = http://127.0.0.1:8080/api/hello.

use std::time::Instant;

use sluice_client::Client;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u32 = match args.next() {
        Some(arg) => arg.parse().map_err(|e| format!("N must be a number: {e}"))?,
        None => 8,
    };
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080/api/hello".to_owned());

    let client = Client::builder()
        .on_retry(|event| {
            let status = event.status.map_or("connection error".to_owned(), |s| s.to_string());
            println!("    {status}: retry {} in {} ms", event.retry, event.delay.as_millis());
        })
        .build()?;

    let started = Instant::now();
    for i in 1..=n {
        let sent = Instant::now();
        let response = client.send(client.get(&url)).await?;
        let quota = response.quota();
        let show = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        println!(
            "#{i:<3} {}  remaining {}/{}  reset in {} ms  waited {} ms  retries {}",
            response.status(),
            show(quota.remaining),
            show(quota.limit),
            show(quota.reset_after_ms),
            sent.elapsed().as_millis(),
            response.retries(),
        );
    }
    println!("{n} requests in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
