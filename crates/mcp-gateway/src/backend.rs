//! One custom server from clone to a connected MCP client: `git clone <base>/<owner>/<repo>`
//! into `<servers dir>/<owner>/<repo>`, `install_cmd` there, then `run_cmd` spawned with
//! its stdin and stdout as the MCP stdio transport (rmcp client, `initialize`), its stderr
//! copied into the gateway's log and kept (the last lines) for error reports.
//!
//! Commands run through `bash -c` as the gateway's user (root in a sandbox, as the SDKs
//! start it) with the gateway's environment minus its access token, plus the server's
//! `envs`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{Prompt, Resource, ResourceTemplate, Tool};
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::config::CustomServer;
use crate::error::GatewayError;
use crate::TOKEN_ENV;

/// Lines of a server's stderr (or an install's output) kept for error reports.
const TAIL_LINES: usize = 40;
/// How long an exited server's stderr is still read for its error report.
const STDERR_GRACE: Duration = Duration::from_secs(2);

/// Where servers come from and how long they get to answer.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Base URL repositories are cloned from (`https://github.com`): `github/o/r` is
    /// `<base>/o/r`.
    pub git_base: String,
    /// Clones go to `<servers_dir>/<owner>/<repo>`.
    pub servers_dir: PathBuf,
    /// How long a started server gets to answer `initialize`.
    pub init_timeout: Duration,
}

/// What a connected server offers, listed once at start.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub tools: Vec<Tool>,
    /// Present when the server has the resources capability.
    pub resources: Option<(Vec<Resource>, Vec<ResourceTemplate>)>,
    /// Present when the server has the prompts capability.
    pub prompts: Option<Vec<Prompt>>,
}

/// A running server the gateway talks to.
pub struct Upstream {
    /// The config key naming it.
    pub name: String,
    pub peer: Peer<RoleClient>,
    /// Keeps the client's service and the server's process alive as long as this is.
    _alive: Mutex<Box<dyn std::any::Any + Send>>,
}

impl Upstream {
    /// An upstream over `service`, kept alive with `alive` (its process, if any).
    pub fn new(
        name: String,
        service: RunningService<RoleClient, ()>,
        alive: impl std::any::Any + Send,
    ) -> Upstream {
        Upstream {
            name,
            peer: service.peer().clone(),
            _alive: Mutex::new(Box::new((service, alive))),
        }
    }

    /// Lists what the server offers (every page).
    pub async fn list(&self) -> Result<Listing, GatewayError> {
        let failed = |what: &'static str| {
            let server = self.name.clone();
            move |e: rmcp::ServiceError| GatewayError::List {
                server,
                what,
                reason: e.to_string(),
            }
        };
        let capabilities = self
            .peer
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default();
        let tools = match capabilities.tools {
            Some(_) => self.peer.list_all_tools().await.map_err(failed("tools"))?,
            None => Vec::new(),
        };
        let resources = match capabilities.resources {
            Some(_) => Some((
                self.peer
                    .list_all_resources()
                    .await
                    .map_err(failed("resources"))?,
                self.peer
                    .list_all_resource_templates()
                    .await
                    .map_err(failed("resource templates"))?,
            )),
            None => None,
        };
        let prompts = match capabilities.prompts {
            Some(_) => Some(
                self.peer
                    .list_all_prompts()
                    .await
                    .map_err(failed("prompts"))?,
            ),
            None => None,
        };
        Ok(Listing {
            tools,
            resources,
            prompts,
        })
    }
}

/// The last lines of a stream, shared with the task copying it to the log.
#[derive(Clone, Default)]
struct Tail(Arc<Mutex<VecDeque<String>>>);

impl Tail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// The last [`TAIL_LINES`] lines of `bytes`.
fn last_lines(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..].iter().map(|l| format!("{l}\n")).collect()
}

fn describe(status: ExitStatus) -> String {
    match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// `bash -c <script>` in `dir` with the server's environment.
fn shell(server: &CustomServer, script: &str, dir: &Path) -> Command {
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env_remove(TOKEN_ENV)
        .envs(&server.envs)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The clone URL of `server` under `base`.
pub fn clone_url(base: &str, server: &CustomServer) -> String {
    format!(
        "{}/{}/{}",
        base.trim_end_matches('/'),
        server.owner,
        server.repo
    )
}

/// Clones, installs and starts `server`, and connects to it.
pub async fn start(server: &CustomServer, settings: &Settings) -> Result<Upstream, GatewayError> {
    let dir = settings.servers_dir.join(&server.owner).join(&server.repo);
    clone(server, settings, &dir).await?;
    if let Some(install) = &server.install_cmd {
        install_in(server, install, &dir).await?;
    }
    run(server, &dir, settings.init_timeout).await
}

async fn clone(server: &CustomServer, settings: &Settings, dir: &Path) -> Result<(), GatewayError> {
    let directory = |source| GatewayError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    // A clone left by an earlier start is replaced: the repository may have moved on.
    match tokio::fs::remove_dir_all(dir).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(directory(e)),
        _ => {}
    }
    if let Some(parent) = dir.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(directory)?;
    }
    let url = clone_url(&settings.git_base, server);
    let shallow = git_clone(server, &url, dir, true).await?;
    if shallow.status.success() {
        return Ok(());
    }
    // Git's "dumb" HTTP (a repository served as plain files) has no shallow clones.
    let output = if String::from_utf8_lossy(&shallow.stderr).contains("does not support shallow") {
        let _ = tokio::fs::remove_dir_all(dir).await;
        let full = git_clone(server, &url, dir, false).await?;
        if full.status.success() {
            return Ok(());
        }
        full
    } else {
        shallow
    };
    Err(GatewayError::Clone {
        server: server.name.clone(),
        url,
        status: describe(output.status),
        output: last_lines(&output.stderr),
    })
}

async fn git_clone(
    server: &CustomServer,
    url: &str,
    dir: &Path,
    shallow: bool,
) -> Result<std::process::Output, GatewayError> {
    let mut command = Command::new("git");
    command.arg("clone").arg("--quiet");
    if shallow {
        command.arg("--depth=1");
    }
    command
        .arg("--")
        .arg(url)
        .arg(dir)
        .env_remove(TOKEN_ENV)
        // A missing or private repository must fail, not wait for a password.
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
        .output()
        .await
        .map_err(|source| GatewayError::Spawn {
            server: server.name.clone(),
            program: "git".into(),
            source,
        })
}

async fn install_in(server: &CustomServer, script: &str, dir: &Path) -> Result<(), GatewayError> {
    tracing::info!(server = %server.name, "running install_cmd");
    let output = shell(server, script, dir)
        .output()
        .await
        .map_err(|source| GatewayError::Spawn {
            server: server.name.clone(),
            program: "bash (install_cmd)".into(),
            source,
        })?;
    let mut combined = output.stdout.clone();
    combined.extend_from_slice(&output.stderr);
    for line in String::from_utf8_lossy(&combined).lines() {
        eprintln!("[{} install] {line}", server.name);
    }
    if output.status.success() {
        return Ok(());
    }
    Err(GatewayError::Install {
        server: server.name.clone(),
        status: describe(output.status),
        output: last_lines(&combined),
    })
}

async fn run(
    server: &CustomServer,
    dir: &Path,
    init_timeout: Duration,
) -> Result<Upstream, GatewayError> {
    let mut child = shell(server, &server.run_cmd, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| GatewayError::Spawn {
            server: server.name.clone(),
            program: "bash (run_cmd)".into(),
            source,
        })?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(GatewayError::Spawn {
            server: server.name.clone(),
            program: "bash (run_cmd)".into(),
            source: std::io::Error::other("its stdio was not piped"),
        });
    };
    let tail = Tail::default();
    let copying = tokio::spawn({
        let tail = tail.clone();
        let name = server.name.clone();
        async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[{name}] {line}");
                tail.push(line);
            }
        }
    });
    let connected = tokio::time::timeout(init_timeout, ().serve((stdout, stdin))).await;
    let reason = match connected {
        Ok(Ok(service)) => {
            tracing::info!(server = %server.name, "connected");
            return Ok(Upstream::new(server.name.clone(), service, child));
        }
        Ok(Err(error)) => error.to_string(),
        Err(_) => format!("no answer to initialize within {}s", init_timeout.as_secs()),
    };
    let reason = match tokio::time::timeout(STDERR_GRACE, child.wait()).await {
        Ok(Ok(status)) => format!(
            "it exited ({}) before answering initialize",
            describe(status)
        ),
        _ => {
            let _ = child.kill().await;
            reason
        }
    };
    let _ = tokio::time::timeout(STDERR_GRACE, copying).await;
    Err(GatewayError::Initialize {
        server: server.name.clone(),
        reason,
        stderr: tail.text(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_last_lines() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = last_lines(text.as_bytes());
        assert!(tail.starts_with("line 60\n") && tail.ends_with("line 99\n"));
        let shared = Tail::default();
        for i in 0..50 {
            shared.push(format!("l{i}"));
        }
        assert!(shared.text().starts_with("l10\n"));
    }

    #[test]
    fn clone_urls_join_the_base_and_the_repository() {
        let server = crate::config::parse(r#"{"github/acme/echo": {"run_cmd": "x"}}"#)
            .unwrap()
            .remove(0);
        assert_eq!(
            clone_url("https://github.com/", &server),
            "https://github.com/acme/echo"
        );
        assert_eq!(
            clone_url("http://git.test:8080/base", &server),
            "http://git.test:8080/base/acme/echo"
        );
    }
}
