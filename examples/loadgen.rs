//! A load generator for OpenAI-compatible servers: at each concurrency,
//! that many clients send streaming chat completions back to back, and the
//! run reports requests/s, output tokens/s, time to first token and
//! inter-token latency (p50/p99).
//!
//! ```sh
//! cargo run --release --example serve -- --port 8000 &
//! cargo run --release --example loadgen -- --url http://127.0.0.1:8000 --concurrency 1,8,32,64
//! ```
//!
//! Every request asks for greedy output (`temperature: 0`) of at most
//! `--max-tokens` tokens. Output tokens are the streamed chunks that carry
//! text (one token each on this server and on llama.cpp's); inter-token
//! latency is the gap between two such chunks of one request. Exit 1 when a
//! request fails.

use clap::Parser;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(name = "loadgen")]
struct Args {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Concurrency levels, run in this order.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    concurrency: Vec<usize>,
    /// Requests per client at each level (at least 4 requests in all).
    #[arg(long, default_value_t = 2)]
    requests_per_client: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// The `model` field sent (servers serving one model ignore it).
    #[arg(long, default_value = "default")]
    model: String,
    /// A name for the printed rows.
    #[arg(long, default_value = "server")]
    label: String,
}

const TOPICS: [&str; 16] = [
    "a lighthouse keeper",
    "a lost robot",
    "the first snow",
    "a desert caravan",
    "an old library",
    "a talking cat",
    "a city under the sea",
    "a clockmaker",
    "a mountain village",
    "a night train",
    "a forgotten garden",
    "a young astronomer",
    "a pirate ship",
    "a bakery at dawn",
    "a storm at sea",
    "a chess tournament",
];

/// One request's timings.
struct Sample {
    ttft: Duration,
    gaps: Vec<Duration>,
    tokens: usize,
}

async fn one(client: &reqwest::Client, args: &Args, i: usize) -> Result<Sample, String> {
    let body = json!({
        "model": args.model,
        "messages": [{"role": "user", "content": format!("Write a long story about {}.", TOPICS[i % TOPICS.len()])}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": true,
    });
    let start = Instant::now();
    let resp = client
        .post(format!("{}/v1/chat/completions", args.url))
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("request: {e}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        return Err(format!(
            "status {status}: {}",
            resp.text().await.unwrap_or_default()
        ));
    }
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut times = Vec::new();
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("stream: {e}"))?;
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("bad chunk {data}: {e}"))?;
            if let Some(e) = v.get("error") {
                return Err(format!("error event: {e}"));
            }
            let has_text = v["choices"].as_array().into_iter().flatten().any(|c| {
                c["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            });
            if has_text {
                times.push(now);
            }
        }
    }
    if !done {
        return Err("the stream ended without [DONE]".into());
    }
    let first = *times.first().ok_or("no text streamed")?;
    Ok(Sample {
        ttft: first - start,
        gaps: times.windows(2).map(|w| w[1] - w[0]).collect(),
        tokens: times.len(),
    })
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

async fn level(
    client: &reqwest::Client,
    args: &Arc<Args>,
    concurrency: usize,
) -> Result<(), String> {
    let total = (concurrency * args.requests_per_client).max(4);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, args, next) = (client.clone(), Arc::clone(args), Arc::clone(&next));
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, String>(samples);
                    }
                    samples.push(one(&client, &args, i).await?);
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for w in workers {
        samples.extend(w.await.map_err(|e| e.to_string())??);
    }
    let wall = start.elapsed().as_secs_f64();
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
    let mut gaps: Vec<Duration> = samples
        .iter()
        .flat_map(|s| s.gaps.iter().copied())
        .collect();
    ttft.sort();
    gaps.sort();
    println!(
        "| {} | {concurrency} | {} | {:.2} | {:.1} | {:.0} | {:.0} | {:.1} | {:.1} |",
        args.label,
        samples.len(),
        samples.len() as f64 / wall,
        tokens as f64 / wall,
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99),
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.99),
    );
    Ok(())
}

fn main() {
    let args = Arc::new(Args::parse());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| e.to_string())?;
        // One request first, so no level pays for warm-up.
        one(&client, &args, 0).await?;
        println!("| server | concurrency | requests | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |");
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for &c in &args.concurrency {
            level(&client, &args, c.max(1)).await?;
        }
        Ok::<(), String>(())
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
