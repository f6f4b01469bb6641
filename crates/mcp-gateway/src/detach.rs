//! Running the gateway in the background and returning once it serves.
//!
//! The command the SDK runs ([`spawn_and_wait`]) starts this binary again with
//! `--detached`: the config on its stdin (so it is not in the long-lived process's
//! command line), its stderr appended to the log file, its stdout a pipe back to the
//! command. The detached gateway makes itself a session leader ([`Detached::begin`]),
//! starts everything, writes one report to that pipe (`ready <summary>`, or `error` and
//! the message) and points its stdout at `/dev/null` ([`Detached::report`]), which
//! closes the pipe. The command prints the summary and exits 0, or prints the error and
//! exits 1. A detached gateway that dies before reporting closes the pipe with nothing
//! in it; the command then reports the log's new lines.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::GatewayError;

const READY: &str = "ready";
const FAILED: &str = "error";
/// Most of the log shown when the detached gateway died without a report.
const LOG_TAIL_BYTES: u64 = 4096;

/// What the detached gateway reported.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It serves; the summary line.
    Ready(String),
    /// It did not start; the reason.
    Failed(String),
}

/// Starts `<this binary> <args>` detached with `config` on its stdin and its stderr on
/// `log_file`, and waits for its report.
pub fn spawn_and_wait(
    args: &[String],
    config: &str,
    log_file: &Path,
) -> Result<Outcome, GatewayError> {
    let log = open_log(log_file)?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let log_copy = log.try_clone().map_err(GatewayError::Detach)?;
    let (report_read, report_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| GatewayError::Detach(e.into()))?;
    let executable = std::env::current_exe().map_err(GatewayError::Detach)?;
    let mut command = Command::new(executable);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(report_write))
        .stderr(Stdio::from(log_copy));
    let mut child = command.spawn().map_err(GatewayError::Detach)?;
    // The command holds the pipe's write end until dropped: the report's end of file
    // must come from the child alone.
    drop(command);
    if let Some(mut stdin) = child.stdin.take() {
        // A child that died before reading it reports nothing: its log says why.
        if let Err(error) = stdin.write_all(config.as_bytes()) {
            tracing::debug!(%error, "handing the config to the detached gateway");
        }
    }
    let mut report = String::new();
    std::fs::File::from(report_read)
        .read_to_string(&mut report)
        .map_err(GatewayError::Detach)?;
    match parse_report(&report) {
        Some(outcome) => Ok(outcome),
        None => Err(GatewayError::DetachedExited {
            log: log_since(log, log_start),
        }),
    }
}

fn open_log(path: &Path) -> Result<std::fs::File, GatewayError> {
    let failed = |source| GatewayError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o600)
        .open(path)
        .map_err(failed)
}

/// The log's last [`LOG_TAIL_BYTES`] written since `start`.
fn log_since(mut log: std::fs::File, start: u64) -> String {
    let end = log.metadata().map(|m| m.len()).unwrap_or(start);
    let from = start.max(end.saturating_sub(LOG_TAIL_BYTES));
    let mut text = String::new();
    if log.seek(std::io::SeekFrom::Start(from)).is_ok() {
        let _ = log.read_to_string(&mut text);
    }
    text
}

fn parse_report(report: &str) -> Option<Outcome> {
    let (first, rest) = report.split_once('\n').unwrap_or((report, ""));
    match first.split_once(' ').unwrap_or((first, "")) {
        (READY, summary) => Some(Outcome::Ready(summary.to_string())),
        (FAILED, _) => Some(Outcome::Failed(rest.trim_end().to_string())),
        _ => None,
    }
}

/// The detached gateway's side.
pub struct Detached(());

impl Detached {
    /// Leaves the command's session (its terminal and process group) and reads the
    /// config from stdin.
    pub fn begin() -> Result<(Detached, String), GatewayError> {
        rustix::process::setsid().map_err(|e| GatewayError::Detach(e.into()))?;
        let mut config = String::new();
        std::io::stdin()
            .read_to_string(&mut config)
            .map_err(GatewayError::Detach)?;
        Ok((Detached(()), config))
    }

    /// Sends the one report and lets go of the pipe.
    pub fn report(self, outcome: &Outcome) -> Result<(), GatewayError> {
        let text = match outcome {
            Outcome::Ready(summary) => format!("{READY} {summary}\n"),
            Outcome::Failed(reason) => format!("{FAILED}\n{reason}\n"),
        };
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(GatewayError::Detach)?;
        let null = std::fs::File::options()
            .write(true)
            .open("/dev/null")
            .map_err(GatewayError::Detach)?;
        rustix::stdio::dup2_stdout(&null).map_err(|e| GatewayError::Detach(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        assert_eq!(
            parse_report("ready serving 2 MCP server(s)\n"),
            Some(Outcome::Ready("serving 2 MCP server(s)".into()))
        );
        assert_eq!(
            parse_report("error\nserver \"github/a/b\": failed\n--- x ---\nboom\n"),
            Some(Outcome::Failed(
                "server \"github/a/b\": failed\n--- x ---\nboom".into()
            ))
        );
        assert_eq!(parse_report(""), None);
        assert_eq!(parse_report("garbage"), None);
    }

    #[test]
    fn the_log_tail_is_what_was_written_since_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log/gateway.log");
        let mut log = open_log(&path).unwrap();
        log.write_all(b"old run\n").unwrap();
        let start = log.metadata().unwrap().len();
        log.write_all(b"this run\n").unwrap();
        assert_eq!(log_since(open_log(&path).unwrap(), start), "this run\n");
    }
}
