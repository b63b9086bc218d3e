//! The OpenAI-compatible server (`examples/serve`) driven over HTTP as a
//! client drives it: started on a free port, answers compared with the same
//! requests run alone through the runner. Skipped with a note when the
//! default model is not in the cache.

mod common;

use futures_util::StreamExt;
use mlx_backend::engine::ModelBundle;
use mlx_backend::kernels::ActivationPrecision;
use mlx_backend::model::LoadOptions;
use mlx_backend::runner::{MlxModelRunner, RunnerConfig};
use mlx_backend::tokenizer::{ChatMessage, Tokenizer};
use mlx_backend::Device;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn model() -> Option<PathBuf> {
    common::runs::cached_default_model()
}

/// The server binary, as `cargo test` builds the examples.
fn serve_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = dir.join("examples").join("serve");
    assert!(path.is_file(), "{} is not built", path.display());
    path
}

/// A running server, killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(serve_binary())
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the server starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_string();
        Server { child, base }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Greedy reference: the request alone through a runner of its own.
struct Reference {
    runner: MlxModelRunner,
    tokenizer: Tokenizer,
    template: mlx_backend::tokenizer::ChatTemplate,
    eos: Vec<u32>,
}

impl Reference {
    /// The runner as the server loads it, with the quantized kernels'
    /// activations `activations`.
    fn new(path: &PathBuf, activations: ActivationPrecision) -> Reference {
        let options = LoadOptions {
            activations,
            ..LoadOptions::for_device(Device::Cpu)
        };
        let b = ModelBundle::load(path, &options, RunnerConfig::default()).unwrap();
        Reference {
            runner: b.runner,
            tokenizer: b.tokenizer,
            template: b.chat_template.unwrap(),
            eos: b.eos_token_ids,
        }
    }

    /// (text, finish reason, completion tokens) of a greedy chat answer.
    fn chat(&mut self, user: &str, max_tokens: usize) -> (String, &'static str, usize) {
        let text = self
            .template
            .render(&[ChatMessage::user(user)], true)
            .unwrap();
        let tok = &self.tokenizer;
        let prompt = tok.encode_with(&text, tok.add_bos_token(), true).unwrap();
        let t = common::runs::solo_greedy(&mut self.runner, 1, &prompt, max_tokens, &self.eos);
        let ended = self.eos.contains(t.last().unwrap());
        let body: Vec<u32> = t
            .iter()
            .copied()
            .filter(|x| !self.eos.contains(x))
            .collect();
        (
            self.tokenizer.decode(&body, true).unwrap(),
            if ended { "stop" } else { "length" },
            t.len(),
        )
    }
}

fn chat_body(user: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// The `data:` payloads of an SSE body, read to its end.
async fn sse(resp: reqwest::Response) -> Vec<String> {
    let mut buf = String::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    parse_sse(&buf)
}

fn parse_sse(buf: &str) -> Vec<String> {
    buf.split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .map(|d| d.trim().to_string())
        })
        .collect()
}

/// A streamed chat answer: text, finish reasons, usage; checks the framing.
fn streamed_chat(events: &[String]) -> (String, Vec<String>, Value) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let mut text = String::new();
    let mut reasons = Vec::new();
    let mut usage = Value::Null;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = u.clone();
        }
        for c in v["choices"].as_array().unwrap() {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(r) = c["finish_reason"].as_str() {
                reasons.push(r.to_string());
            }
        }
    }
    (text, reasons, usage)
}

async fn metric(client: &reqwest::Client, server: &Server, name: &str) -> f64 {
    let text = client
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

const TOPICS: [&str; 8] = [
    "the moon",
    "rivers",
    "a red bicycle",
    "winter mornings",
    "prime numbers",
    "bread",
    "owls",
    "the sea",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_and_not_equal_the_solo_run_and_parameters_work() {
    let Some(path) = model() else { return };
    // A single request at a time runs alone, as the reference does.
    let server = Server::start(&[]);
    let mut reference = Reference::new(&path, LoadOptions::for_device(Device::Cpu).activations);
    let client = reqwest::Client::new();
    let user = "Write one sentence about the moon.";
    let (want, want_reason, want_tokens) = reference.chat(user, 24);

    let v: Value = client
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(user, 24, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want);
    assert_eq!(v["choices"][0]["finish_reason"], want_reason);
    assert_eq!(v["usage"]["completion_tokens"], want_tokens);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        v["usage"]["total_tokens"].as_u64().unwrap(),
        prompt_tokens + want_tokens as u64
    );

    let resp = client
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(user, 24, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (text, reasons, usage) = streamed_chat(&sse(resp).await);
    assert_eq!(text, want);
    assert_eq!(reasons, vec![want_reason]);
    assert_eq!(usage["completion_tokens"], want_tokens);
    // The same prompt again: its prefix comes from the cache.
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // Stop strings: the text before the first one, never any part of it.
    let stop: String = want.chars().skip(10).take(5).collect();
    let mut body = chat_body(user, 24, true);
    body["stop"] = json!([stop, "zzzz"]);
    let resp = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let (text, reasons, _) = streamed_chat(&sse(resp).await);
    assert_eq!(text, want[..want.find(&stop).unwrap()]);
    assert_eq!(reasons, vec!["stop"]);

    // logit_bias bans the greedy first token; logprobs and top_logprobs.
    let mut body = chat_body(user, 3, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v: Value = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 3);
    for c in &content {
        assert!(c["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(c["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(c["top_logprobs"][0]["token"], c["token"]);
    }
    let first = reference
        .tokenizer
        .encode(content[0]["token"].as_str().unwrap(), false)
        .unwrap();
    let mut body = chat_body(user, 3, false);
    body["logit_bias"] = json!({ first[0].to_string(): -100 });
    let v: Value = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        !text.starts_with(content[0]["token"].as_str().unwrap()),
        "{text}"
    );

    // n choices with a seed: reproducible, and every sampling field accepted.
    let mut body = chat_body(user, 12, false);
    body["n"] = json!(3);
    body["seed"] = json!(7);
    body["temperature"] = json!(0.9);
    body["top_p"] = json!(0.95);
    body["top_k"] = json!(40);
    body["min_p"] = json!(0.05);
    body["presence_penalty"] = json!(0.5);
    body["frequency_penalty"] = json!(0.5);
    let a: Value = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b: Value = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(a["choices"].as_array().unwrap().len(), 3);
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(
        a["usage"]["completion_tokens"].as_u64().unwrap(),
        b["usage"]["completion_tokens"].as_u64().unwrap()
    );

    // Text completions: a string or token ids, default max_tokens 16.
    let v: Value = client
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": "The sky is", "temperature": 0, "logprobs": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        16
    );
    let ids = reference.tokenizer.encode("The sky is", false).unwrap();
    let w: Value = client
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": ids, "temperature": 0, "max_tokens": 16}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(w["choices"][0]["text"], v["choices"][0]["text"]);
    let resp = client
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": "The sky is", "temperature": 0, "stream": true}))
        .send()
        .await
        .unwrap();
    let events = sse(resp).await;
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(streamed, v["choices"][0]["text"].as_str().unwrap());

    // Bad requests: OpenAI-style errors naming the field.
    for (body, param) in [
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": 5}),
            Some("temperature"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}),
            Some("top_p"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "n": 0}),
            Some("n"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            Some("max_tokens"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}),
            Some("logit_bias"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999": 1}}),
            Some("prompt"),
        ),
        (json!({"messages": []}), Some("messages")),
        (json!({"messages": "nope"}), None),
    ] {
        let resp = client
            .post(server.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 3);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{v}");
        }
    }
    let resp = client
        .post(server.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let too_long = "word ".repeat(9000);
    let resp = client
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(&too_long, 8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(
        client
            .get(server.url("/nope"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    // Models, health, metrics.
    let v: Value = client
        .get(server.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    let v: Value = client
        .get(server.url("/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["status"], "ok");
    assert!(metric(&client, &server, "mlx_engine_generation_tokens_total").await > 0.0);
    assert!(metric(&client, &server, "mlx_engine_prefix_cache_hit_rate").await > 0.0);
    assert!(
        metric(
            &client,
            &server,
            "mlx_engine_time_to_first_token_seconds_count"
        )
        .await
            > 0.0
    );
    assert_eq!(
        metric(&client, &server, "mlx_engine_running_requests").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_each_equal_their_solo_run() {
    let Some(path) = model() else { return };
    // Exact activations: with the default int16 ones a row of 8+ (AVX2)
    // or 4+ (AVX-512) x rows is rounded per group instead of per word, so
    // a batched request may take the other side of a near tie than alone
    // (`ActivationPrecision::Int16`); exact rows are batch-invariant.
    let server = Server::start(&["--activations", "exact"]);
    let mut reference = Reference::new(&path, ActivationPrecision::Exact);
    let cases: Vec<(String, usize)> = (0..64)
        .map(|i| {
            (
                format!("Write one sentence about {}.", TOPICS[i % 8]),
                6 + (i / 8) * 3,
            )
        })
        .collect();
    let client = reqwest::Client::new();
    let tasks: Vec<_> = cases
        .iter()
        .map(|(user, n)| {
            let (client, url, body) = (
                client.clone(),
                server.url("/v1/chat/completions"),
                chat_body(user, *n, true),
            );
            tokio::spawn(async move {
                let resp = client.post(url).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                sse(resp).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    for ((user, n), events) in cases.iter().zip(&answers) {
        let (text, reasons, usage) = streamed_chat(events);
        let (want, reason, tokens) = reference.chat(user, *n);
        assert_eq!(text, want, "{user} ({n} tokens)");
        assert_eq!(reasons, vec![reason]);
        assert_eq!(usage["completion_tokens"], tokens);
    }
    let client = reqwest::Client::new();
    assert_eq!(
        metric(&client, &server, "mlx_engine_running_requests").await,
        0.0
    );
    assert_eq!(
        metric(&client, &server, "mlx_engine_kv_request_tokens").await,
        0.0
    );
    assert_eq!(
        metric(
            &client,
            &server,
            "mlx_engine_requests_finished_total{finish_reason=\"abort\"}"
        )
        .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_kv() {
    if model().is_none() {
        return;
    }
    let server = Server::start(&[]);
    let client = reqwest::Client::new();
    let mut body = chat_body("Tell me a long story.", 2000, true);
    body["ignore_eos"] = json!(true);
    let resp = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    while parse_sse(&seen).len() < 4 {
        seen.push_str(std::str::from_utf8(&stream.next().await.unwrap().unwrap()).unwrap());
    }
    assert!(metric(&client, &server, "mlx_engine_kv_request_tokens").await > 0.0);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let running = metric(&client, &server, "mlx_engine_running_requests").await;
        let kv = metric(&client, &server, "mlx_engine_kv_request_tokens").await;
        let reserved = metric(&client, &server, "mlx_engine_kv_reserved_tokens").await;
        if running == 0.0 && kv == 0.0 && reserved == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "KV still held: {running} running, {kv} tokens"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(
            &client,
            &server,
            "mlx_engine_requests_finished_total{finish_reason=\"abort\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_give_400_and_503_and_shutdown_ends_open_streams() {
    if model().is_none() {
        return;
    }
    let mut server = Server::start(&[
        "--max-context",
        "128",
        "--max-running",
        "1",
        "--max-waiting",
        "1",
    ]);
    let client = reqwest::Client::new();
    // Over the context: 400 with OpenAI's code.
    let resp = client
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body("Write one sentence about the moon.", 120, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    // One running, one waiting: the next ones get 503.
    let mut body = chat_body("Hi", 20, true);
    body["ignore_eos"] = json!(true);
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..5 {
        let resp = client
            .post(server.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        match resp.status().as_u16() {
            200 => open.push(resp),
            503 => {
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["error"]["code"], "queue_full", "{v}");
                refused += 1;
            }
            s => panic!("status {s}"),
        }
    }
    assert!(refused >= 2, "{refused} refused");
    for resp in open {
        let (_, reasons, _) = streamed_chat(&sse(resp).await);
        assert_eq!(reasons, vec!["length"]);
    }
    // SIGINT with a stream open: it ends with `abort` and [DONE], and the
    // server exits 0.
    let mut body = chat_body("Hi", 90, true);
    body["ignore_eos"] = json!(true);
    let resp = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    while parse_sse(&seen).len() < 2 {
        seen.push_str(std::str::from_utf8(&stream.next().await.unwrap().unwrap()).unwrap());
    }
    let pid = server.child.id() as i32;
    // SAFETY: signals the server process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    while let Some(chunk) = stream.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events = parse_sse(&seen);
    let (_, reasons, _) = streamed_chat(&events);
    assert_eq!(reasons, vec!["abort"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0));
}
