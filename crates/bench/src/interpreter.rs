//! The code interpreter through a running berth (or any E2B-compatible endpoint):
//! create a `code-interpreter-v1` sandbox → first `run_code("1+1")` result, the
//! `run_code` round trip, a matplotlib plot round trip, and beside them
//! `commands.run("python3 -c 1")` in the same sandbox (envd's process API: what an
//! agent without the interpreter pays for a Python one-liner).
//!
//! The requests are the SDKs' own: `POST /v2/sandboxes`, `POST /execute` to port 49999
//! through berth's proxy (E2B's sandbox headers) read to the end of its NDJSON stream,
//! envd's `process.Process/Start` via berth-client.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use berth_api::NewSandbox;
use berth_client::{ApiClient, EnvdClient, EnvdEndpoint, ExecRequest, OutputSink};
use futures::StreamExt;

use crate::stats::{ms, Samples};

#[derive(clap::Args)]
pub struct InterpreterArgs {
    /// The API (as `berth up` prints it).
    #[arg(long, env = "E2B_API_URL")]
    api_url: String,
    /// Where sandbox traffic goes (berth: the same listener).
    #[arg(long, env = "E2B_SANDBOX_URL")]
    sandbox_url: String,
    #[arg(long, env = "E2B_API_KEY", hide_env_values = true)]
    api_key: String,
    #[arg(long, default_value = "code-interpreter-v1")]
    template: String,
    /// Sandboxes created for the create → first result measurement.
    #[arg(long, default_value_t = 10)]
    creates: usize,
    /// Round trips per measurement in one sandbox (the plot gets a fifth of them).
    #[arg(long, default_value_t = 100)]
    samples: usize,
}

/// What one `/execute` stream gave.
struct Execution {
    /// Until the first `result` event.
    first_result: Option<Duration>,
    /// Until the stream ended.
    total: Duration,
    results: usize,
    error: Option<String>,
}

struct Bench {
    api: ApiClient,
    http: reqwest::Client,
    sandbox_url: String,
    template: String,
}

impl Bench {
    async fn create(&self) -> Result<berth_api::Sandbox> {
        let request = NewSandbox {
            template_id: self.template.clone(),
            timeout: Some(600),
            ..NewSandbox::default()
        };
        self.api
            .create_sandbox(&request)
            .await
            .with_context(|| format!("creating a {} sandbox", self.template))
    }

    async fn execute(&self, sandbox_id: &str, code: &str) -> Result<Execution> {
        let started = Instant::now();
        let response = self
            .http
            .post(format!("{}/execute", self.sandbox_url))
            .header("E2b-Sandbox-Id", sandbox_id)
            .header("E2b-Sandbox-Port", "49999")
            .json(&serde_json::json!({ "code": code }))
            .send()
            .await
            .context("POST /execute")?;
        if !response.status().is_success() {
            bail!(
                "/execute answered {}: {}",
                response.status(),
                response.text().await.unwrap_or_default()
            );
        }
        let mut execution = Execution {
            first_result: None,
            total: Duration::ZERO,
            results: 0,
            error: None,
        };
        let mut pending = Vec::new();
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            pending.extend_from_slice(&chunk.context("reading /execute")?);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let Ok(event) = serde_json::from_slice::<serde_json::Value>(&line) else {
                    continue;
                };
                match event["type"].as_str() {
                    Some("result") => {
                        execution.results += 1;
                        execution.first_result.get_or_insert(started.elapsed());
                    }
                    Some("error") => {
                        execution.error = Some(format!("{}: {}", event["name"], event["value"]));
                    }
                    _ => {}
                }
            }
        }
        execution.total = started.elapsed();
        if let Some(error) = execution.error.take() {
            bail!("the code failed: {error}");
        }
        Ok(execution)
    }

    fn envd(&self, sandbox: &berth_api::Sandbox) -> EnvdClient {
        EnvdClient::new(
            self.http.clone(),
            &EnvdEndpoint::SandboxUrl(self.sandbox_url.clone()),
            &sandbox.sandbox_id,
            sandbox.envd_access_token.clone(),
        )
    }
}

struct Discard;

impl OutputSink for Discard {
    fn stdout(&mut self, _: &[u8]) {}
    fn stderr(&mut self, _: &[u8]) {}
}

fn record(samples: &mut Samples, result: Result<Duration>) {
    match result {
        Ok(duration) => samples.durations.push(duration),
        Err(error) => {
            samples.failures += 1;
            samples
                .first_error
                .get_or_insert_with(|| format!("{error:#}"));
        }
    }
}

const PLOT: &str = "import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [1, 4, 9], label='squares')\nplt.title('bench')\nplt.show()";

pub fn run(args: &InterpreterArgs) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(measure(args))
}

async fn measure(args: &InterpreterArgs) -> Result<()> {
    let http = reqwest::Client::new();
    let bench = Bench {
        api: ApiClient::with_http(http.clone(), &args.api_url, &args.api_key),
        http,
        sandbox_url: args.sandbox_url.trim_end_matches('/').to_string(),
        template: args.template.clone(),
    };
    // The first create may build the template (on first use): not part of a sample.
    eprintln!("warming up: one {} sandbox", args.template);
    let warm = bench.create().await?;
    bench.execute(&warm.sandbox_id, "1+1").await?;
    bench.api.kill_sandbox(&warm.sandbox_id).await?;

    let mut create = Samples::default();
    let mut create_to_result = Samples::default();
    for i in 0..args.creates {
        eprintln!("create → first result {}/{}", i + 1, args.creates);
        let started = Instant::now();
        let sandbox = match bench.create().await {
            Ok(sandbox) => sandbox,
            Err(error) => {
                record(&mut create_to_result, Err(error));
                continue;
            }
        };
        create.durations.push(started.elapsed());
        let result = bench
            .execute(&sandbox.sandbox_id, "1+1")
            .await
            .and_then(|e| {
                e.first_result
                    .map(|_| started.elapsed())
                    .context("`1+1` gave no result")
            });
        record(&mut create_to_result, result);
        bench.api.kill_sandbox(&sandbox.sandbox_id).await?;
    }

    let sandbox = bench.create().await?;
    let envd = bench.envd(&sandbox);
    let mut run_code = Samples::default();
    let mut plot = Samples::default();
    let mut command = Samples::default();
    let mut floor = Samples::default();
    let python_c = ExecRequest {
        command: "python3 -c 1".into(),
        cwd: None,
        envs: HashMap::new(),
        timeout_ms: Some(60_000),
    };
    let true_cmd = ExecRequest {
        command: "true".into(),
        ..python_c.clone()
    };
    // Warm every path once (kernel imports matplotlib, connections pooled).
    bench.execute(&sandbox.sandbox_id, PLOT).await?;
    envd.exec(&python_c, &mut Discard).await?;
    for i in 0..args.samples {
        if i % 20 == 0 {
            eprintln!("round trips {i}/{}", args.samples);
        }
        let result = bench
            .execute(&sandbox.sandbox_id, "1+1")
            .await
            .map(|e| e.total);
        record(&mut run_code, result);
        if i % 5 == 0 {
            let result = bench
                .execute(&sandbox.sandbox_id, PLOT)
                .await
                .and_then(|e| {
                    if e.results == 0 {
                        bail!("the plot gave no result");
                    }
                    Ok(e.total)
                });
            record(&mut plot, result);
        }
        let started = Instant::now();
        let result = envd
            .exec(&python_c, &mut Discard)
            .await
            .map(|_| started.elapsed())
            .map_err(anyhow::Error::from);
        record(&mut command, result);
        let started = Instant::now();
        let result = envd
            .exec(&true_cmd, &mut Discard)
            .await
            .map(|_| started.elapsed())
            .map_err(anyhow::Error::from);
        record(&mut floor, result);
    }
    bench.api.kill_sandbox(&sandbox.sandbox_id).await?;

    println!(
        "## Code interpreter ({}, via {})\n",
        args.template, args.api_url
    );
    println!("| measurement | n | p50 | p99 | failures |");
    println!("|---|---:|---:|---:|---:|");
    for (name, samples) in [
        ("create (`POST /v2/sandboxes` returned)", &create),
        (
            "create → first `run_code(\"1+1\")` result",
            &create_to_result,
        ),
        ("`run_code(\"1+1\")` round trip", &run_code),
        ("matplotlib plot round trip (PNG + chart)", &plot),
        ("`commands.run(\"python3 -c 1\")`, same sandbox", &command),
        ("`commands.run(\"true\")` (envd floor)", &floor),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} |",
            samples.durations.len(),
            samples.p50().map_or("-".into(), ms),
            samples.p99().map_or("-".into(), ms),
            samples.failures
        );
        if let Some(error) = &samples.first_error {
            eprintln!("{name}: first failure: {error}");
        }
    }
    Ok(())
}
