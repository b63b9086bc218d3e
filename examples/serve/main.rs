//! An OpenAI-compatible HTTP server on the engine (axum + tokio).
//!
//! ```sh
//! cargo run --release --example serve -- [--model M] [--host H] [--port P]
//! ```
//!
//! `POST /v1/chat/completions`, `POST /v1/completions` (streaming by SSE,
//! ending with `data: [DONE]`, or one JSON answer), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text). Prints
//! `listening on http://ADDR` once it accepts connections (with `--port 0`
//! the port the system picked). Ctrl-C or SIGTERM aborts what is in flight,
//! ends every open stream and exits 0. Exit 1: the model failed to load or
//! the address is taken; 2: bad arguments.

mod openai;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use futures_util::stream::{self, Stream, StreamExt};
use mlx_backend::engine::{
    Engine, EngineConfig, EngineError, Event, EventStream, FinishReason, ModelBundle, SampledToken,
    TensorParallelPart, Usage,
};
use mlx_backend::kernels::ActivationPrecision;
use mlx_backend::model::{fetch, LoadOptions};
use mlx_backend::runner::RunnerConfig;
use mlx_backend::Device;
use openai::{ApiError, Plan};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Serve a model over the OpenAI API.
#[derive(Parser, Debug)]
#[command(name = "serve")]
struct Args {
    /// A GGUF file, a model folder or an `org/name` hub id; default:
    /// SmolLM2-135M-Instruct Q4_1, fetched once into the cache.
    #[arg(long, value_name = "PATH|ORG/NAME")]
    model: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model id in answers and /v1/models (default: the file or folder name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Requests admitted at once.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    max_running: u64,
    /// Requests waiting for admission before new ones get 503.
    #[arg(long, default_value_t = 1024)]
    max_waiting: usize,
    /// Prompt tokens prefilled per step beside the decodes.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// KV cache budget in tokens across all requests.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(1..))]
    kv_budget: u64,
    /// Longest context of one request (capped by the model's).
    #[arg(long)]
    max_context: Option<usize>,
    /// Chat completions without max_tokens generate at most this many.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    default_max_tokens: u64,
    /// Recompute every prompt instead of reusing cached prefixes.
    #[arg(long)]
    no_prefix_cache: bool,
    /// The quantized CPU kernels' activations: `exact`, `int16` or `int8`
    /// (default: the device's, `LoadOptions::for_device`). `exact` makes a
    /// request's greedy tokens independent of the batch it runs in; the
    /// default int16 rounds x differently from 4 (AVX-512) or 8 (AVX2)
    /// rows of a batch on.
    #[arg(long)]
    activations: Option<ActivationPrecision>,
    /// Finished requests whose KV the prefix cache keeps at most.
    #[arg(long, default_value_t = 32)]
    prefix_cache_entries: usize,
    /// Split the model over this many tensor-parallel ranks, the group the
    /// environment describes (start the ranks with the `launch` example);
    /// rank 0 serves HTTP, the others follow it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    tp: Option<u32>,
    /// Under `--tp`: seconds to wait for a peer before failing.
    #[arg(long, default_value_t = 60)]
    peer_timeout_secs: u64,
}

struct AppState {
    engine: Engine,
    model: String,
    created: u64,
}

type Shared = Arc<AppState>;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}

/// An engine refusal as an HTTP error.
fn engine_error(e: EngineError) -> ApiError {
    let (status, kind, code, param) = match &e {
        EngineError::QueueFull { .. } => (503, "server_overloaded", Some("queue_full"), None),
        EngineError::ShutDown => (503, "server_shutting_down", None, None),
        EngineError::ContextTooLong { .. } | EngineError::ExceedsKvCapacity { .. } => (
            400,
            "invalid_request_error",
            Some("context_length_exceeded"),
            Some("messages"),
        ),
        EngineError::InvalidParameter { name, .. } => {
            (400, "invalid_request_error", None, Some(*name))
        }
        EngineError::InvalidToken { .. } => (400, "invalid_request_error", None, Some("prompt")),
        e if e.is_client_error() => (400, "invalid_request_error", None, None),
        _ => (500, "internal_error", None, None),
    };
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    ApiError {
        status,
        message,
        kind,
        param: param.map(str::to_string),
        code,
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError {
        status: 400,
        message: format!("invalid JSON body: {e}"),
        kind: "invalid_request_error",
        param: None,
        code: None,
    })
}

/// Submit every request of the plan; on a refusal the ones already
/// submitted are dropped (and so cancelled).
fn submit_all(engine: &Engine, plan: &mut Plan) -> Result<Vec<EventStream>, ApiError> {
    let mut streams = Vec::with_capacity(plan.requests.len());
    for r in plan.requests.drain(..) {
        streams.push(engine.submit(r).map_err(engine_error)?);
    }
    Ok(streams)
}

/// One choice's end.
struct ChoiceResult {
    text: String,
    tokens: Vec<SampledToken>,
    reason: FinishReason,
    usage: Usage,
    error: Option<EngineError>,
}

async fn collect(mut s: EventStream) -> ChoiceResult {
    let mut r = ChoiceResult {
        text: String::new(),
        tokens: Vec::new(),
        reason: FinishReason::Abort,
        usage: Usage::default(),
        error: None,
    };
    while let Some(e) = s.next_event().await {
        match e {
            Event::Delta { text, token } => {
                r.text.push_str(&text);
                r.tokens.extend(token);
            }
            Event::Finished(f) => {
                r.reason = f.reason;
                r.usage = f.usage;
                r.error = f.error;
            }
        }
    }
    r
}

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Chat,
    Completions,
}

async fn chat(State(app): State<Shared>, body: Bytes) -> Response {
    let plan = parse::<openai::ChatRequest>(&body).and_then(|r| r.plan());
    respond(app, Api::Chat, plan).await
}

async fn completions(State(app): State<Shared>, body: Bytes) -> Response {
    let plan = parse::<openai::CompletionRequest>(&body).and_then(|r| r.plan());
    respond(app, Api::Completions, plan).await
}

async fn respond(app: Shared, api: Api, plan: Result<Plan, ApiError>) -> Response {
    let mut plan = match plan {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let streams = match submit_all(&app.engine, &mut plan) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let id = format!(
        "{}-{}",
        if api == Api::Chat { "chatcmpl" } else { "cmpl" },
        streams[0].id()
    );
    if plan.stream {
        return stream_response(app, api, id, plan, streams).into_response();
    }
    let results = futures_util::future::join_all(streams.into_iter().map(collect)).await;
    if let Some(e) = results.iter().find_map(|r| r.error.clone()) {
        return engine_error(e).into_response();
    }
    let tok = app.engine.tokenizer();
    let choices: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, r)| match api {
            Api::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": r.text},
                "logprobs": plan.logprobs.then(|| json!({
                    "content": r.tokens.iter().map(|t| openai::chat_logprob(tok, t)).collect::<Vec<_>>()
                })),
                "finish_reason": openai::finish_reason(r.reason),
            }),
            Api::Completions => json!({
                "index": i,
                "text": r.text,
                "logprobs": plan.logprobs.then(|| openai::completion_logprobs(tok, &r.tokens, 0)),
                "finish_reason": openai::finish_reason(r.reason),
            }),
        })
        .collect();
    let usages: Vec<Usage> = results.iter().map(|r| r.usage).collect();
    Json(json!({
        "id": id,
        "object": if api == Api::Chat { "chat.completion" } else { "text_completion" },
        "created": now(),
        "model": app.model,
        "choices": choices,
        "usage": openai::usage_json(&usages),
    }))
    .into_response()
}

/// The SSE answer: every choice's events merged as they come, then the
/// usage chunk when asked for, then `[DONE]`. Dropping the body (the client
/// went away) drops the event streams, which cancels their requests.
fn stream_response(
    app: Shared,
    api: Api,
    id: String,
    plan: Plan,
    streams: Vec<EventStream>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let created = now();
    let object = if api == Api::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk = {
        let (id, model) = (id.clone(), app.model.clone());
        move |choice: Value| json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    let n = streams.len();
    let per_choice = streams.into_iter().enumerate().map(|(i, s)| {
        stream::unfold((s, false), move |(mut s, done)| async move {
            if done {
                return None;
            }
            let e = s.next_event().await?;
            let finished = matches!(e, Event::Finished(_));
            Some(((i, e), (s, finished)))
        })
        .boxed()
    });
    let merged = stream::select_all(per_choice);
    let app2 = Arc::clone(&app);
    let logprobs = plan.logprobs;
    let include_usage = plan.include_usage;
    let mut usages = vec![Usage::default(); n];
    let mut first = vec![true; n];
    let mut text_offset = vec![0usize; n];
    let body = merged.filter_map(move |(i, e)| {
        let tok = app2.engine.tokenizer().clone();
        let out: Option<Vec<Value>> = match e {
            Event::Delta { text, token } => {
                let token: Vec<SampledToken> = token.into_iter().collect();
                if text.is_empty() && (token.is_empty() || !logprobs) {
                    None
                } else {
                    let mut chunks = Vec::new();
                    match api {
                        Api::Chat => {
                            if std::mem::take(&mut first[i]) {
                                chunks.push(chunk(json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})));
                            }
                            chunks.push(chunk(json!({
                                "index": i,
                                "delta": {"content": text},
                                "logprobs": logprobs.then(|| json!({"content": token.iter().map(|t| openai::chat_logprob(&tok, t)).collect::<Vec<_>>()})),
                                "finish_reason": null,
                            })));
                        }
                        Api::Completions => {
                            let lp = logprobs.then(|| openai::completion_logprobs(&tok, &token, text_offset[i]));
                            text_offset[i] += text.len();
                            chunks.push(chunk(json!({"index": i, "text": text, "logprobs": lp, "finish_reason": null})));
                        }
                    }
                    Some(chunks)
                }
            }
            Event::Finished(f) => {
                usages[i] = f.usage;
                let mut chunks = Vec::new();
                if let Some(err) = f.error {
                    let e = engine_error(err);
                    chunks.push(e.body());
                } else {
                    chunks.push(match api {
                        Api::Chat => chunk(json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": openai::finish_reason(f.reason)})),
                        Api::Completions => chunk(json!({"index": i, "text": "", "logprobs": null, "finish_reason": openai::finish_reason(f.reason)})),
                    });
                }
                if include_usage && usages.iter().all(|u| u.prompt_tokens > 0) {
                    let mut u = chunk(json!(null));
                    u["choices"] = json!([]);
                    u["usage"] = openai::usage_json(&usages);
                    chunks.push(u);
                }
                Some(chunks)
            }
        };
        let events: Vec<Result<SseEvent, Infallible>> = out
            .unwrap_or_default()
            .into_iter()
            .map(|v| Ok(SseEvent::default().data(v.to_string())))
            .collect();
        async move { (!events.is_empty()).then(|| stream::iter(events)) }
    });
    let done = stream::once(async { Ok(SseEvent::default().data("[DONE]")) });
    Sse::new(body.flatten().chain(done))
}

async fn models(State(app): State<Shared>) -> Response {
    Json(json!({"object": "list", "data": [{
        "id": app.model, "object": "model", "created": app.created, "owned_by": "mlx-backend",
        "max_model_len": app.engine.runner_info().max_context,
    }]}))
    .into_response()
}

async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(app): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.engine.render_metrics(),
    )
        .into_response()
}

async fn not_found() -> Response {
    ApiError {
        status: 404,
        message: "no such route".into(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
    .into_response()
}

async fn shutdown_signal(engine: Engine) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("shutting down: aborting requests in flight");
    // Ends every open stream with `abort`, so the connections close and the
    // graceful shutdown below completes.
    let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
}

fn main() {
    let args = Args::parse();
    let tp = args.tp.is_some_and(|n| n > 1);
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        let mut source = e.source();
        while let Some(cause) = source {
            eprintln!("  caused by: {cause}");
            source = cause.source();
        }
        if tp {
            // A thread may be stuck in a collective whose peer is gone.
            mlx_backend::distributed::exit_process(1);
        }
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let path = fetch::resolve(args.model.as_deref())?;
    let model = args.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    // The runner's thread serves on MLX's CPU device: the kernels' fast
    // paths are the CPU's.
    Device::Cpu.set_default()?;
    let runner = RunnerConfig {
        kv_budget_tokens: args.kv_budget as usize,
        max_context: args.max_context,
        ..RunnerConfig::default()
    };
    let config = EngineConfig {
        max_running_requests: args.max_running as usize,
        max_waiting_requests: args.max_waiting,
        prefill_tokens_per_step: args.prefill_chunk as usize,
        default_max_tokens: args.default_max_tokens as usize,
        prefix_cache: !args.no_prefix_cache,
        prefix_cache_max_entries: args.prefix_cache_entries,
        ..EngineConfig::default()
    };
    let mut options = LoadOptions::for_device(Device::Cpu);
    if let Some(a) = args.activations {
        options.activations = a;
    }
    let engine = match args.tp.filter(|&n| n > 1) {
        None => Engine::load(&path, options, runner, config)?,
        Some(n) => {
            let runner = RunnerConfig {
                tensor_parallel: Some(n as usize),
                peer_timeout: std::time::Duration::from_secs(args.peer_timeout_secs),
                ..runner
            };
            match ModelBundle::load_tensor_parallel(&path, &options, runner)? {
                TensorParallelPart::Follower(follower) => {
                    // Ranks other than 0 serve no HTTP: they replay rank 0's steps.
                    follower.follow_then_exit()
                }
                TensorParallelPart::Leader(bundle) => Engine::start(config, move || Ok(*bundle))?,
            }
        }
    };
    let app = Arc::new(AppState {
        engine: engine.clone(),
        model,
        created: now(),
    });
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(app);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| format!("binding {}:{}: {e}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        println!("listening on http://{addr}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown_signal(engine))
            .await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
