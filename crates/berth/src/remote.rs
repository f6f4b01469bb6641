//! What every REST-talking verb shares (`berth sandbox|template|volume|secret …`): which
//! endpoint and key to use, `--json` output, and turning a failed call into an error
//! that says what to do next.
//!
//! The endpoint is any E2B-compatible API. Without `--api-url`/`E2B_API_URL` it is the
//! local `berth up` of `--state-dir` (the URL it recorded in `<state>/api-url` when it
//! started), else `http://127.0.0.1:3000`.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use berth_client::{ApiClient, ClientError, EnvdClient, EnvdEndpoint};
use clap::Args;
use serde::Serialize;

/// The file `berth up` records its clients' URL in, under its state dir.
pub const API_URL_FILE: &str = "api-url";

/// Where the API listens when nothing says otherwise.
const FALLBACK_API_URL: &str = "http://127.0.0.1:3000";

#[derive(Args, Clone)]
pub struct ApiArgs {
    /// The API to talk to [default: the local `berth up` of --state-dir, else
    /// http://127.0.0.1:3000].
    #[arg(long, env = "E2B_API_URL", global = true)]
    api_url: Option<String>,
    /// API key of the team (as `berth up` printed it, or from `berth keys create`).
    #[arg(long, env = "E2B_API_KEY", hide_env_values = true, global = true)]
    api_key: Option<String>,
    /// Where envd traffic goes (header routing) [default: the API URL, or
    /// `49983-<id>.<domain>` when the API names a sandbox domain].
    #[arg(long, env = "E2B_SANDBOX_URL", global = true)]
    sandbox_url: Option<String>,
    /// Print the API's JSON instead of a table (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
}

/// A configured connection to one E2B-compatible API.
pub struct Remote {
    pub client: ApiClient,
    sandbox_url: Option<String>,
    pub json: bool,
}

impl Remote {
    pub fn connect(args: &ApiArgs, state_dir: &Path) -> Result<Remote> {
        let api_url = match &args.api_url {
            Some(url) => url.clone(),
            None => local_api_url(state_dir),
        };
        let Some(api_key) = args.api_key.as_deref().filter(|key| !key.is_empty()) else {
            return Err(anyhow!(
                "no API key: pass --api-key or export E2B_API_KEY (the key `berth up` printed \
                 on its first run, or a new one from `berth keys create`)"
            ));
        };
        let client = ApiClient::new(&api_url, api_key).context("making the API client")?;
        Ok(Remote {
            client,
            sandbox_url: args.sandbox_url.clone(),
            json: args.json,
        })
    }

    /// A client for the envd of a running sandbox, with its access token.
    pub async fn envd(&self, sandbox_id: &str) -> Result<EnvdClient> {
        let detail = self
            .client
            .get_sandbox(sandbox_id)
            .await
            .map_err(|err| self.explain(err, &format!("looking up sandbox {sandbox_id}")))?;
        if detail.state == berth_api::SandboxState::Paused {
            return Err(anyhow!(
                "sandbox {sandbox_id} is paused: resume it first with `berth sandbox resume \
                 {sandbox_id}`"
            ));
        }
        let endpoint = match (&self.sandbox_url, &detail.domain) {
            (Some(url), _) => EnvdEndpoint::SandboxUrl(url.clone()),
            (None, Some(domain)) if !domain.is_empty() => EnvdEndpoint::Domain(domain.clone()),
            (None, _) => EnvdEndpoint::SandboxUrl(self.client.base_url().to_owned()),
        };
        Ok(EnvdClient::new(
            self.client.http().clone(),
            &endpoint,
            sandbox_id,
            detail.envd_access_token,
        ))
    }

    /// Turns a failed call into an error naming what failed and what to do about it;
    /// `doing` says what was attempted ("killing sandbox x").
    pub fn explain(&self, error: ClientError, doing: &str) -> anyhow::Error {
        let url = self.client.base_url();
        let hint = match &error {
            ClientError::Api { status: 401, .. } | ClientError::Api { status: 403, .. } => {
                format!(
                    "the API at {url} refused the key: pass the team's key with --api-key or \
                     E2B_API_KEY (`berth keys create` makes one)"
                )
            }
            ClientError::Api { status: 404, .. } => {
                "not found for this key's team: `berth sandbox ls`, `berth template ls`, \
                 `berth volume ls` and `berth secret ls` list what it has"
                    .to_owned()
            }
            ClientError::Api { status: 409, .. } => {
                "the object is not in a state that allows this (see `berth sandbox ls`)".to_owned()
            }
            ClientError::Api { status: 429, .. } => {
                "the team is over a limit: kill or pause sandboxes, or ask the operator".to_owned()
            }
            ClientError::Api { status, .. } if *status >= 500 => {
                format!("the server failed; its log (`berth up`'s stderr) says why (HTTP {status})")
            }
            ClientError::Transport(_) => format!(
                "cannot reach the API at {url}: is `berth up` running there? Point --api-url \
                 or E2B_API_URL at it"
            ),
            _ => String::new(),
        };
        let message = match &error {
            ClientError::Api { status, body } => {
                let text = body
                    .get("message")
                    .and_then(|message| message.as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| body.to_string());
                format!("{doing}: HTTP {status}: {text}")
            }
            other => format!("{doing}: {other}"),
        };
        if hint.is_empty() {
            anyhow!(message)
        } else {
            anyhow!("{message}\n  hint: {hint}")
        }
    }
}

/// The URL the local `berth up` of `state_dir` recorded, else the default listener's.
fn local_api_url(state_dir: &Path) -> String {
    std::fs::read_to_string(state_dir.join(API_URL_FILE))
        .ok()
        .map(|text| text.trim().to_owned())
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| FALLBACK_API_URL.to_owned())
}

/// Records the URL clients reach `berth up` at, for the CLI's default (write, fsync,
/// rename: a reader never sees half a URL).
pub fn record_api_url(state_dir: &Path, url: &str) -> Result<()> {
    let path = state_dir.join(API_URL_FILE);
    let staging = state_dir.join(format!(".{API_URL_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&staging)?;
        std::io::Write::write_all(&mut file, format!("{url}\n").as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&staging, &path)
    };
    write().with_context(|| format!("writing {}", path.display()))
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).context("encoding JSON")?
    );
    Ok(())
}

/// Parses `KEY=VALUE` (metadata, env vars).
pub fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// A spinner on stderr for one long call (drawn only on a terminal).
pub fn spinner(message: String) -> indicatif::ProgressBar {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message(message);
    spinner
}

/// RFC 3339 without fractions, for tables.
pub fn timestamp(at: time::OffsetDateTime) -> String {
    at.replace_nanosecond(0)
        .unwrap_or(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_need_a_key_and_keep_later_equals_signs() {
        assert_eq!(key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(key_value("a="), Ok(("a".into(), String::new())));
        assert!(key_value("=b").is_err());
        assert!(key_value("ab").is_err());
    }

    #[test]
    fn the_local_url_is_the_recorded_one_else_the_default() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(local_api_url(dir.path()), FALLBACK_API_URL);
        record_api_url(dir.path(), "http://127.0.0.1:4321").unwrap();
        assert_eq!(local_api_url(dir.path()), "http://127.0.0.1:4321");
    }
}
