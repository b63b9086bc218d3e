//! The user-facing examples as a user runs them: the built binaries as
//! subprocesses, with good and bad command lines. Bad input must give a
//! clear message and a non-zero exit (2 for arguments, 1 for the model or
//! the run), never a panic.

use std::ffi::OsStr;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// `cargo test` builds the examples next to the test binaries' folder.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is not built; `cargo test` builds the examples, or run `cargo build --release --examples`",
        path.display()
    );
    path
}

fn run<I, S>(name: &str, args: I, stdin: Option<&str>) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(example(name));
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the example starts");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("the example runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Exit `code`, no panic, and stderr mentioning every one of `needles`.
#[track_caller]
fn assert_fails(o: &Output, code: i32, needles: &[&str]) {
    let (out, err) = text(o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "exit status {:?}\nstdout: {out}\nstderr: {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

fn default_model_cached() -> bool {
    let cached = mlx_backend::model::fetch::default_model_path().is_file();
    if !cached {
        eprintln!("default model not in the cache: run scripts/fetch-default-model.sh");
    }
    cached
}

const QUESTION: &str = "What is the capital of France?";

#[test]
fn generate_help_lists_the_options() {
    let o = run("generate", ["--help"], None);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    for flag in [
        "--model",
        "--prompt",
        "--prompt-file",
        "--max-tokens",
        "--temp",
        "--top-p",
        "--top-k",
        "--min-p",
        "--stop",
        "--batch",
        "--device",
        "--activations",
    ] {
        assert!(out.contains(flag), "--help lacks {flag}: {out}");
    }
}

#[test]
fn generate_rejects_bad_values_with_the_valid_range() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--max-tokens", "-5"], &["--max-tokens", "must be >= 0"]),
        (
            &["--max-tokens", "ten"],
            &["--max-tokens", "not a whole number"],
        ),
        (&["--batch", "0"], &["--batch", "1..=4096"]),
        (&["--top-k", "-1"], &["--top-k", "must be >= 0"]),
        (&["--temp", "-1"], &["--temp", "must be >= 0"]),
        (&["--temp", "nan"], &["--temp", "finite"]),
        (&["--top-p", "0"], &["--top-p", "(0, 1]"]),
        (&["--top-p", "1.5"], &["--top-p", "(0, 1]"]),
        (&["--min-p", "2"], &["--min-p", "[0, 1]"]),
        (&["--stop", ""], &["--stop", "must not be empty"]),
        (&["--device", "tpu"], &["--device"]),
        (
            &["--activations", "fp8"],
            &["--activations", "exact, int16 or int8"],
        ),
        (
            &["--prompt", "a", "--prompt-file", "b"],
            &["cannot be used with"],
        ),
        (&["--no-such-flag"], &["--no-such-flag"]),
    ];
    for (args, needles) in cases {
        let o = run("generate", *args, None);
        assert_fails(&o, 2, needles);
    }
}

#[cfg(unix)]
#[test]
fn generate_takes_non_utf8_arguments_without_panicking() {
    use std::os::unix::ffi::OsStrExt;
    let bad = OsStr::from_bytes(b"caf\xe9");
    let o = run("generate", [OsStr::new("--prompt"), bad], None);
    assert_fails(&o, 2, &["UTF-8"]);
}

#[test]
fn generate_tells_a_missing_path_from_a_hub_id() {
    for spec in [
        "./no/such/model.gguf",
        "no-such-folder/model.gguf",
        "nothing-here",
    ] {
        let o = run("generate", ["--model", spec], None);
        assert_fails(&o, 1, &[spec, "does not exist"]);
    }
}

#[test]
fn generate_reports_the_config_before_the_tokenizer() {
    // Neither folder has a tokenizer.json: the config is the first problem.
    let bad_json = tempfile::Builder::new()
        .prefix("mlx-backend-cli-")
        .tempdir()
        .unwrap();
    std::fs::write(bad_json.path().join("config.json"), "{ not json").unwrap();
    let o = run(
        "generate",
        [OsStr::new("--model"), bad_json.path().as_os_str()],
        None,
    );
    assert_fails(&o, 1, &["config.json"]);

    let unsupported = tempfile::Builder::new()
        .prefix("mlx-backend-cli-")
        .tempdir()
        .unwrap();
    std::fs::write(
        unsupported.path().join("config.json"),
        r#"{"model_type": "mamba", "hidden_size": 64}"#,
    )
    .unwrap();
    let o = run(
        "generate",
        [OsStr::new("--model"), unsupported.path().as_os_str()],
        None,
    );
    assert_fails(&o, 1, &["mamba"]);
    let (_, err) = text(&o);
    assert!(!err.contains("tokenizer"), "{err}");
}

#[test]
fn generate_reports_an_unreadable_prompt_file() {
    let o = run(
        "generate",
        ["--prompt-file", "/no/such/prompt.txt", "--max-tokens", "1"],
        None,
    );
    assert_fails(&o, 1, &["/no/such/prompt.txt"]);
}

#[test]
fn generate_answers_from_stdin_and_never_prints_a_stop_string() {
    if !default_model_cached() {
        return;
    }
    // The known greedy answer: "The capital of France is Paris."
    let o = run(
        "generate",
        ["--prompt", "-", "--max-tokens", "20"],
        Some(QUESTION),
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("The capital of France is Paris."), "{out}");

    let o = run(
        "generate",
        [
            "--prompt",
            QUESTION,
            "--max-tokens",
            "20",
            "--stop",
            "Paris",
        ],
        None,
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let answer = out.split("\n==========").next().unwrap_or_default();
    assert!(answer.contains("The capital of France is"), "{out}");
    assert!(
        !answer.contains("Par"),
        "stop string (or a part) printed: {out}"
    );

    // A prompt file, and a stop string that is split over tokens.
    let dir = tempfile::Builder::new()
        .prefix("mlx-backend-cli-")
        .tempdir()
        .unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, QUESTION).unwrap();
    let o = run(
        "generate",
        [
            OsStr::new("--prompt-file"),
            file.as_os_str(),
            OsStr::new("--stop"),
            OsStr::new("of Fr"),
        ],
        None,
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let answer = out.split("\n==========").next().unwrap_or_default();
    assert_eq!(answer.trim_end(), "The capital", "{out}");
}

#[test]
fn generate_max_tokens_zero_generates_nothing() {
    if !default_model_cached() {
        return;
    }
    let o = run(
        "generate",
        ["--prompt", QUESTION, "--max-tokens", "0"],
        None,
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("Generation: 0 tokens"), "{out}");
    assert!(!out.contains("Paris"), "{out}");
}

#[test]
fn bench_one_batch_reports_load_errors_without_panicking() {
    let o = run(
        "bench_one_batch",
        ["--no-peers", "--model", "./no/such/model.gguf"],
        None,
    );
    assert_fails(&o, 1, &["does not exist"]);
    let o = run("bench_one_batch", ["--repeats", "0"], None);
    assert_fails(&o, 2, &["--repeats"]);
    let o = run("bench_one_batch", ["--decode-batch", "1,x"], None);
    assert_fails(&o, 2, &["--decode-batch"]);
}
