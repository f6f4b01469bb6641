//! `berth sandbox …`: sandboxes of the key's team through the REST API and envd, against
//! any E2B-compatible endpoint. Tables for people, `--json` (the API's own models) for
//! scripts; `exec` exits with the command's exit code; `shell` is a terminal (see
//! `shell.rs`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use berth_api::{
    LogLevel, NewSandbox, SandboxForkRequest, SandboxLogEntry, SandboxSnapshotRequest, SandboxState,
};
use berth_client::{ExecRequest, LogQuery, OutputSink, SandboxQuery};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::remote::{key_value, print_json, spinner, timestamp, Remote};

/// How often `logs --follow` asks for new lines.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// List the team's running and paused sandboxes.
    #[command(alias = "list")]
    Ls(LsArgs),
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// Run a command (`bash -l -c "<words>"`) and exit with its exit code.
    Exec(ExecArgs),
    /// An interactive login shell in the sandbox (a PTY).
    Shell { sandbox_id: String },
    /// Print the sandbox's logs.
    Logs(LogsArgs),
    /// Kill sandboxes (their files and memory are gone).
    Kill {
        #[arg(required = true)]
        sandbox_ids: Vec<String>,
    },
    /// Pause a sandbox (memory kept unless --no-memory).
    Pause {
        sandbox_id: String,
        /// Keep only the files; it boots afresh on resume.
        #[arg(long)]
        no_memory: bool,
    },
    /// Resume a paused sandbox.
    Resume {
        sandbox_id: String,
        /// Seconds it then lives.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Fork a running sandbox into copies (memory and files) and print their ids.
    Fork {
        sandbox_id: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Seconds the copies live.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Snapshot a sandbox; `berth sandbox create <snapshot>` starts new ones from it.
    Snapshot {
        sandbox_id: String,
        /// Name to create sandboxes from (a snapshot of that name is replaced).
        #[arg(long)]
        name: Option<String>,
        /// Keep only the files.
        #[arg(long)]
        no_memory: bool,
    },
}

#[derive(Args)]
pub struct LsArgs {
    #[arg(long, value_enum)]
    state: Option<StateFilter>,
    /// Only sandboxes carrying this metadata pair (repeatable).
    #[arg(long = "metadata", value_parser = key_value)]
    metadata: Vec<(String, String)>,
}

#[derive(Clone, Copy, ValueEnum)]
enum StateFilter {
    Running,
    Paused,
}

#[derive(Args)]
pub struct CreateArgs {
    /// Template (name, id or snapshot).
    #[arg(default_value = "base")]
    template: String,
    /// Seconds the sandbox lives.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Metadata pair (repeatable).
    #[arg(long = "metadata", value_parser = key_value)]
    metadata: Vec<(String, String)>,
    /// Environment variable of every command (repeatable).
    #[arg(long = "env", value_parser = key_value)]
    envs: Vec<(String, String)>,
    /// Pause instead of kill at the end of the timeout.
    #[arg(long)]
    auto_pause: bool,
    /// No internet access from the sandbox.
    #[arg(long)]
    no_internet: bool,
}

#[derive(Args)]
pub struct ExecArgs {
    sandbox_id: String,
    /// Working directory.
    #[arg(long)]
    cwd: Option<String>,
    /// Environment variable (repeatable).
    #[arg(long = "env", value_parser = key_value)]
    envs: Vec<(String, String)>,
    /// Kill the command after this many seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// The command; its words are joined with spaces and run by bash, as ssh does.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Args)]
pub struct LogsArgs {
    sandbox_id: String,
    /// Lowest level shown.
    #[arg(long, value_enum)]
    level: Option<Level>,
    /// Only lines containing this text.
    #[arg(long)]
    search: Option<String>,
    /// Keep printing new lines until interrupted.
    #[arg(short, long)]
    follow: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl From<Level> for LogLevel {
    fn from(level: Level) -> Self {
        match level {
            Level::Debug => LogLevel::Debug,
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
            Level::Error => LogLevel::Error,
        }
    }
}

/// Runs one verb; the result is the process's exit code.
pub async fn run(remote: &Remote, command: SandboxCommand) -> Result<i32> {
    match command {
        SandboxCommand::Ls(args) => ls(remote, args).await?,
        SandboxCommand::Create(args) => create(remote, args).await?,
        SandboxCommand::Exec(args) => return exec(remote, args).await,
        SandboxCommand::Shell { sandbox_id } => {
            return crate::shell::run(remote, &sandbox_id).await
        }
        SandboxCommand::Logs(args) => logs(remote, args).await?,
        SandboxCommand::Kill { sandbox_ids } => {
            for id in &sandbox_ids {
                remote
                    .client
                    .kill_sandbox(id)
                    .await
                    .map_err(|err| remote.explain(err, &format!("killing sandbox {id}")))?;
                eprintln!("killed {id}");
            }
        }
        SandboxCommand::Pause {
            sandbox_id,
            no_memory,
        } => {
            let bar = spinner(format!("pausing {sandbox_id}"));
            let paused = remote
                .client
                .pause_sandbox_with(&sandbox_id, !no_memory)
                .await;
            bar.finish_and_clear();
            paused.map_err(|err| remote.explain(err, &format!("pausing sandbox {sandbox_id}")))?;
            eprintln!("paused {sandbox_id}");
        }
        SandboxCommand::Resume {
            sandbox_id,
            timeout,
        } => {
            let bar = spinner(format!("resuming {sandbox_id}"));
            let resumed = remote.client.resume_sandbox(&sandbox_id, timeout).await;
            bar.finish_and_clear();
            let sandbox = resumed
                .map_err(|err| remote.explain(err, &format!("resuming sandbox {sandbox_id}")))?;
            if remote.json {
                print_json(&sandbox)?;
            } else {
                eprintln!("resumed {}", sandbox.sandbox_id);
            }
        }
        SandboxCommand::Fork {
            sandbox_id,
            count,
            timeout,
        } => fork(remote, &sandbox_id, count, timeout).await?,
        SandboxCommand::Snapshot {
            sandbox_id,
            name,
            no_memory,
        } => {
            let bar = spinner(format!("snapshotting {sandbox_id}"));
            let request = SandboxSnapshotRequest {
                name,
                memory: Some(!no_memory),
            };
            let made = remote.client.snapshot_sandbox(&sandbox_id, &request).await;
            bar.finish_and_clear();
            let snapshot = made.map_err(|err| {
                remote.explain(err, &format!("snapshotting sandbox {sandbox_id}"))
            })?;
            if remote.json {
                print_json(&snapshot)?;
            } else {
                println!("{}", snapshot.snapshot_id);
            }
        }
    }
    Ok(0)
}

async fn ls(remote: &Remote, args: LsArgs) -> Result<()> {
    let mut query = SandboxQuery {
        metadata: args.metadata,
        state: args.state.map(|state| match state {
            StateFilter::Running => SandboxState::Running,
            StateFilter::Paused => SandboxState::Paused,
        }),
        limit: Some(100),
        ..SandboxQuery::default()
    };
    let mut sandboxes = Vec::new();
    loop {
        let page = remote
            .client
            .query_sandboxes(&query)
            .await
            .map_err(|err| remote.explain(err, "listing sandboxes"))?;
        sandboxes.extend(page.items);
        match page.next_token {
            Some(token) => query.next_token = Some(token),
            None => break,
        }
    }
    if remote.json {
        return print_json(&sandboxes);
    }
    println!(
        "{:<22}  {:<20}  {:<7}  {:>4}  {:>7}  {:<20}  {:<20}  METADATA",
        "ID", "TEMPLATE", "STATE", "CPUS", "MEM MiB", "STARTED", "ENDS"
    );
    for sandbox in &sandboxes {
        let metadata: Vec<String> = sandbox
            .metadata
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        println!(
            "{:<22}  {:<20}  {:<7}  {:>4}  {:>7}  {:<20}  {:<20}  {}",
            sandbox.sandbox_id,
            sandbox.alias.as_deref().unwrap_or(&sandbox.template_id),
            match sandbox.state {
                SandboxState::Running => "running",
                SandboxState::Paused => "paused",
            },
            sandbox.cpu_count,
            sandbox.memory_mb,
            timestamp(sandbox.started_at),
            timestamp(sandbox.end_at),
            metadata.join(",")
        );
    }
    Ok(())
}

async fn create(remote: &Remote, args: CreateArgs) -> Result<()> {
    let new_sandbox = NewSandbox {
        template_id: args.template.clone(),
        timeout: Some(i64::try_from(args.timeout).unwrap_or(i64::MAX)),
        metadata: (!args.metadata.is_empty()).then(|| args.metadata.into_iter().collect()),
        env_vars: (!args.envs.is_empty()).then(|| args.envs.into_iter().collect()),
        auto_pause: args.auto_pause.then_some(true),
        allow_internet_access: args.no_internet.then_some(false),
        ..NewSandbox::default()
    };
    let bar = spinner(format!("creating a sandbox from {}", args.template));
    let created = remote.client.create_sandbox(&new_sandbox).await;
    bar.finish_and_clear();
    let sandbox = created.map_err(|err| {
        remote.explain(
            err,
            &format!("creating a sandbox from template {}", args.template),
        )
    })?;
    if remote.json {
        print_json(&sandbox)?;
    } else {
        println!("{}", sandbox.sandbox_id);
    }
    Ok(())
}

async fn fork(remote: &Remote, sandbox_id: &str, count: u32, timeout: Option<u64>) -> Result<()> {
    let request = SandboxForkRequest {
        count: Some(i64::from(count)),
        timeout: timeout.map(|seconds| i64::try_from(seconds).unwrap_or(i64::MAX)),
    };
    let bar = spinner(format!("forking {sandbox_id} into {count}"));
    let forked = remote.client.fork_sandbox(sandbox_id, &request).await;
    bar.finish_and_clear();
    let results =
        forked.map_err(|err| remote.explain(err, &format!("forking sandbox {sandbox_id}")))?;
    if remote.json {
        return print_json(&results);
    }
    let mut failures = Vec::new();
    for result in &results {
        match (&result.sandbox, &result.error) {
            (Some(sandbox), _) => println!("{}", sandbox.sandbox_id),
            (None, Some(error)) => failures.push(error.message.clone()),
            (None, None) => failures.push("the server gave neither a sandbox nor an error".into()),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(
            "{} of {count} forks failed: {}",
            failures.len(),
            failures.join("; ")
        ))
    }
}

/// Output of `exec --json`.
#[derive(Serialize)]
struct ExecResult {
    stdout: String,
    stderr: String,
    #[serde(rename = "exitCode")]
    exit_code: Option<i32>,
    error: Option<String>,
}

/// Writes output through as it arrives, or keeps it for `--json`.
enum Sink {
    Through,
    Kept { stdout: Vec<u8>, stderr: Vec<u8> },
}

impl OutputSink for Sink {
    fn stdout(&mut self, chunk: &[u8]) {
        match self {
            Sink::Through => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(chunk);
                let _ = out.flush();
            }
            Sink::Kept { stdout, .. } => stdout.extend_from_slice(chunk),
        }
    }

    fn stderr(&mut self, chunk: &[u8]) {
        match self {
            Sink::Through => {
                let _ = std::io::stderr().lock().write_all(chunk);
            }
            Sink::Kept { stderr, .. } => stderr.extend_from_slice(chunk),
        }
    }
}

async fn exec(remote: &Remote, args: ExecArgs) -> Result<i32> {
    let envd = remote.envd(&args.sandbox_id).await?;
    let request = ExecRequest {
        command: args.command.join(" "),
        cwd: args.cwd,
        envs: args.envs.into_iter().collect::<HashMap<_, _>>(),
        timeout_ms: args.timeout.map(|seconds| seconds.saturating_mul(1000)),
    };
    let mut sink = if remote.json {
        Sink::Kept {
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    } else {
        Sink::Through
    };
    let output = envd
        .exec(&request, &mut sink)
        .await
        .map_err(|err| remote.explain(err, &format!("running a command in {}", args.sandbox_id)))?;
    let error = output.error.map(|error| error.to_string());
    if let Sink::Kept { stdout, stderr } = sink {
        print_json(&ExecResult {
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            exit_code: output.exit_code,
            error: error.clone(),
        })?;
    } else if let Some(error) = &error {
        eprintln!("berth: {error}");
    }
    // No exit code (killed, timed out): 255, as ssh reports a lost command.
    Ok(output.exit_code.unwrap_or(255))
}

async fn logs(remote: &Remote, args: LogsArgs) -> Result<()> {
    let mut query = LogQuery {
        level: args.level.map(LogLevel::from),
        search: args.search,
        limit: Some(1000),
        ..LogQuery::default()
    };
    // Lines at the cursor's millisecond already printed: the next page starts at that
    // millisecond again (the cursor is inclusive), so they are skipped by count.
    let mut printed_at_cursor = 0usize;
    loop {
        let page = remote
            .client
            .sandbox_logs(&args.sandbox_id, &query)
            .await
            .map_err(|err| {
                remote.explain(err, &format!("reading the logs of {}", args.sandbox_id))
            })?;
        let mut skip = printed_at_cursor;
        for entry in &page.logs {
            let at_ms = i64::try_from(entry.timestamp.unix_timestamp_nanos() / 1_000_000)
                .unwrap_or(i64::MAX);
            if Some(at_ms) == query.cursor_ms && skip > 0 {
                skip -= 1;
                continue;
            }
            print_log(remote.json, entry)?;
            if Some(at_ms) == query.cursor_ms {
                printed_at_cursor += 1;
            } else {
                query.cursor_ms = Some(at_ms);
                printed_at_cursor = 1;
            }
        }
        if !args.follow {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_INTERVAL).await;
    }
}

/// One log line: `time level message key=value…`, or the API's entry as one JSON line.
fn print_log(json: bool, entry: &SandboxLogEntry) -> Result<()> {
    let line = if json {
        serde_json::to_string(entry).context("encoding JSON")?
    } else {
        let fields: BTreeMap<_, _> = entry.fields.iter().collect();
        let fields: Vec<String> = fields
            .into_iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        format!(
            "{} {:<5} {} {}",
            timestamp(entry.timestamp),
            entry.level.as_str(),
            entry.message,
            fields.join(" ")
        )
        .trim_end()
        .to_owned()
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").context("writing to stdout")?;
    out.flush().context("writing to stdout")
}
