//! The session tools: sandboxes created here are tracked per MCP session (and per
//! identity), their state (id, domain, envd access token, workspace, timeout) is sealed in
//! the vault, and every use renews the lease and the sandbox's own timeout.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use berth_client::{EnvdClient, OutputSink};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::config::{OutputLimits, Toolset};
use crate::connector::{check_args, wire_body};
use crate::output::{line_window, CappedText};
use crate::server::{CallContext, Connected, Mcp, ToolFailure, ToolResult};
use crate::store::{unix_now, SandboxRow};
use crate::tools::ToolSpec;

/// E2B's base template works in the default user's home.
const WORKSPACE_PATH: &str = "/home/user";
const DEFAULT_TEMPLATE: &str = "base";
const SESSION_DEFAULT_TIMEOUT_SECONDS: u64 = 3600;
const CONNECTOR_DEFAULT_TIMEOUT_SECONDS: u64 = 300;
const DEFAULT_EXEC_TIMEOUT_MS: u64 = 300_000;

/// What is kept (sealed) about each sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxState {
    pub(crate) sandbox_id: String,
    pub(crate) domain: Option<String>,
    pub(crate) envd_access_token: Option<String>,
    pub(crate) workspace_path: String,
    pub(crate) timeout_seconds: u64,
}

fn sandbox_context(identity: &str, sandbox_id: &str) -> String {
    format!("sandbox/{identity}/{sandbox_id}")
}

fn string_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    args.get(name).and_then(Value::as_str)
}

fn u64_arg(args: &Map<String, Value>, name: &str) -> Result<Option<u64>, ToolFailure> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| ToolFailure::Message(format!("{name} must be a non-negative integer"))),
    }
}

fn required_str<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolFailure> {
    string_arg(args, name)
        .ok_or_else(|| ToolFailure::Message(format!("missing required parameter {name:?}")))
}

/// Resolves a session-storage path without letting it leave the storage directory.
fn storage_path(root: &Path, relative: &str) -> Result<PathBuf, ToolFailure> {
    let relative = Path::new(relative.trim_start_matches('/'));
    if relative.as_os_str().is_empty()
        || relative
            .components()
            .any(|component| !matches!(component, Component::Normal(_)))
    {
        return Err(ToolFailure::Message(format!(
            "session path {:?} must be a relative path inside session storage",
            relative.display()
        )));
    }
    Ok(root.join(relative))
}

pub(crate) fn safe_storage_path(root: &Path, relative: &str) -> Option<PathBuf> {
    storage_path(root, relative).ok()
}

struct ExecSink {
    stdout: CappedText,
    stderr: CappedText,
}

impl OutputSink for ExecSink {
    fn stdout(&mut self, chunk: &[u8]) {
        self.stdout.push(chunk);
    }
    fn stderr(&mut self, chunk: &[u8]) {
        self.stderr.push(chunk);
    }
}

impl Mcp {
    fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.inner.specs_get(name)
    }

    /// The session's tracked sandbox and its sealed state.
    fn tracked(
        &self,
        context: &CallContext,
        sandbox_id: &str,
    ) -> Result<(SandboxRow, SandboxState), ToolFailure> {
        let row = self
            .inner
            .store
            .session_sandbox(&context.identity, &context.session_id, sandbox_id)?
            .filter(|row| row.status != "deleted")
            .ok_or_else(|| {
                ToolFailure::Message(format!(
                    "sandbox {sandbox_id} is not a live sandbox of this session \
                     (see e2b_list_sandboxes)"
                ))
            })?;
        let state = self
            .open_json(&sandbox_context(&context.identity, sandbox_id))?
            .and_then(|value| serde_json::from_value(value).ok())
            .ok_or_else(|| ToolFailure::Message("sandbox state is missing".into()))?;
        Ok((row, state))
    }

    /// A tracked sandbox of this session, ready for use: its state and an envd client
    /// with the identity's connection; the lease (and timeout) is renewed.
    fn use_sandbox(
        &self,
        context: &CallContext,
        sandbox_id: &str,
    ) -> Result<(SandboxState, EnvdClient), ToolFailure> {
        let (_, state) = self.tracked(context, sandbox_id)?;
        let connected = self.require_connection(&context.identity)?;
        self.touch(context, &connected, &state);
        let envd = connected.envd(
            &self.inner.http,
            sandbox_id,
            state.domain.as_deref(),
            state.envd_access_token.clone(),
        );
        Ok((state, envd))
    }

    /// Renews the lease and, in the background, the sandbox's own timeout. The timeout is
    /// re-sent at most every quarter of its length (and at most every minute), so a burst
    /// of calls does not become a burst of API writes.
    fn touch(&self, context: &CallContext, connected: &Connected, state: &SandboxState) {
        let lease_until = unix_now() + self.inner.config.lease.ttl.as_secs() as i64;
        if let Err(error) =
            self.inner
                .store
                .renew_lease(&context.identity, &state.sandbox_id, lease_until)
        {
            tracing::warn!(sandbox_id = %state.sandbox_id, %error, "lease renewal failed");
        }
        let interval = Duration::from_secs((state.timeout_seconds / 4).min(60));
        {
            let mut last_extended = self
                .inner
                .last_extended
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = Instant::now();
            match last_extended.get(&state.sandbox_id) {
                Some(last) if now.duration_since(*last) < interval => return,
                _ => {
                    last_extended.insert(state.sandbox_id.clone(), now);
                }
            }
        }
        let api = connected.api.clone();
        let sandbox_id = state.sandbox_id.clone();
        let timeout = state.timeout_seconds;
        tokio::spawn(async move {
            if let Err(error) = api.set_sandbox_timeout(&sandbox_id, timeout).await {
                tracing::debug!(%sandbox_id, %error, "extending the sandbox timeout failed");
            }
        });
    }

    pub(crate) async fn create_sandbox(
        &self,
        context: &CallContext,
        args: &Map<String, Value>,
    ) -> ToolResult {
        let toolset = self.inner.config.toolset;
        let spec = self
            .spec("e2b_create_sandbox")
            .ok_or_else(|| ToolFailure::Message("tool not served".into()))?;
        check_args(spec, args)?;
        let connected = self.require_connection(&context.identity)?;
        let template = string_arg(args, "template_id")
            .or_else(|| string_arg(args, "template"))
            .unwrap_or(DEFAULT_TEMPLATE)
            .to_owned();
        let default_timeout = match toolset {
            Toolset::Connector => CONNECTOR_DEFAULT_TIMEOUT_SECONDS,
            _ => SESSION_DEFAULT_TIMEOUT_SECONDS,
        };
        let timeout_seconds = match u64_arg(args, "timeout")? {
            Some(timeout) => timeout,
            None => u64_arg(args, "timeout_seconds")?.unwrap_or(default_timeout),
        };
        let title = string_arg(args, "title").map(str::to_owned);

        let mut body = wire_body(spec, args);
        body.insert("templateID".into(), json!(template));
        body.insert("timeout".into(), json!(timeout_seconds));
        body.insert("secure".into(), json!(true));
        if let Some(env_vars) = args.get("env_vars").filter(|value| value.is_object()) {
            body.insert("envVars".into(), env_vars.clone());
        }
        let mut metadata = args
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let ownership = [
            ("berth.session_id", Some(context.session_id.clone())),
            ("berth.agent_id", self.inner.config.agent_id.clone()),
            ("berth.org_id", self.inner.config.org_id.clone()),
            ("berth.harness_id", context.harness_id.clone()),
            ("berth.title", title.clone()),
        ];
        for (key, value) in ownership {
            if let Some(value) = value {
                metadata.insert(key.into(), json!(value));
            }
        }
        body.insert("metadata".into(), Value::Object(metadata));

        let new_sandbox: berth_api::NewSandbox = serde_json::from_value(Value::Object(body))
            .map_err(|error| {
                ToolFailure::Message(format!("invalid sandbox parameters: {error}"))
            })?;
        let created = connected.api.create_sandbox(&new_sandbox).await?;
        let sandbox_id = created.sandbox_id.clone();
        let state = SandboxState {
            sandbox_id: sandbox_id.clone(),
            domain: created.domain.clone(),
            envd_access_token: created.envd_access_token.clone(),
            workspace_path: WORKSPACE_PATH.to_owned(),
            timeout_seconds,
        };
        let now = unix_now();
        self.seal_json(
            &sandbox_context(&context.identity, &sandbox_id),
            &serde_json::to_value(&state).map_err(|e| ToolFailure::Message(e.to_string()))?,
        )?;
        self.inner.store.insert_sandbox(&SandboxRow {
            identity: context.identity.clone(),
            sandbox_id: sandbox_id.clone(),
            session_id: context.session_id.clone(),
            title,
            template: template.clone(),
            status: "running".into(),
            created_at: now,
            lease_expires_at: now + self.inner.config.lease.ttl.as_secs() as i64,
            release_attempts: 0,
        })?;
        // The create call just set the timeout.
        self.inner
            .last_extended
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(sandbox_id.clone(), Instant::now());
        tracing::info!(%sandbox_id, session_id = %context.session_id, "sandbox created via MCP");

        let files_uploaded = self
            .upload_session_files(context, &connected, &state, args)
            .await?;
        let created =
            serde_json::to_value(&created).map_err(|e| ToolFailure::Message(e.to_string()))?;
        Ok(match toolset {
            Toolset::Connector => json!({ "status": 201, "result": created }),
            Toolset::Session | Toolset::All => {
                let mut result = json!({
                    "sandbox_id": sandbox_id,
                    "status": "running",
                    "template": template,
                    "workspace_path": state.workspace_path,
                    "timeout_seconds": timeout_seconds,
                    "files_uploaded": files_uploaded,
                });
                if toolset == Toolset::All {
                    result["sandbox"] = created;
                }
                result
            }
        })
    }

    async fn upload_session_files(
        &self,
        context: &CallContext,
        connected: &Connected,
        state: &SandboxState,
        args: &Map<String, Value>,
    ) -> Result<usize, ToolFailure> {
        let Some(uploads) = args.get("upload_files").and_then(Value::as_array) else {
            return Ok(0);
        };
        let root = self.session_storage_dir(&context.session_id);
        let envd = connected.envd(
            &self.inner.http,
            &state.sandbox_id,
            state.domain.as_deref(),
            state.envd_access_token.clone(),
        );
        for upload in uploads {
            let (Some(session_path), Some(sandbox_path)) = (
                upload.get("session_path").and_then(Value::as_str),
                upload.get("sandbox_path").and_then(Value::as_str),
            ) else {
                return Err(ToolFailure::Message(
                    "each upload_files entry needs session_path and sandbox_path".into(),
                ));
            };
            let source = storage_path(&root, session_path)?;
            let content = tokio::fs::read(&source).await.map_err(|error| {
                ToolFailure::Message(format!(
                    "sandbox {} was created, but session file {session_path:?} could not be \
                     read: {error}",
                    state.sandbox_id
                ))
            })?;
            envd.write_file(sandbox_path, content).await?;
        }
        Ok(uploads.len())
    }

    pub(crate) fn list_session_sandboxes(&self, context: &CallContext) -> ToolResult {
        // Every E2B operation needs the user's own connection, even one answered locally.
        self.require_connection(&context.identity)?;
        let rows = self
            .inner
            .store
            .session_sandboxes(&context.identity, &context.session_id)?;
        let sandboxes: Vec<Value> = rows
            .iter()
            .map(|row| {
                json!({
                    "sandbox_id": row.sandbox_id,
                    "title": row.title,
                    "template": row.template,
                    "status": row.status,
                    "created_at_unix": row.created_at,
                })
            })
            .collect();
        Ok(json!({ "count": sandboxes.len(), "sandboxes": sandboxes }))
    }

    pub(crate) async fn list_sandboxes_merged(
        &self,
        context: &CallContext,
        spec: &ToolSpec,
        args: &Map<String, Value>,
    ) -> ToolResult {
        check_args(spec, args)?;
        let scope = string_arg(args, "scope");
        let has_filters = args
            .iter()
            .any(|(name, value)| name != "scope" && !value.is_null());
        let project = match scope {
            Some("project") => true,
            Some("session") => false,
            Some(other) => {
                return Err(ToolFailure::Message(format!(
                    "scope must be session or project, not {other:?}"
                )))
            }
            None => has_filters,
        };
        if !project {
            return self.list_session_sandboxes(context);
        }
        let mut filters = args.clone();
        filters.remove("scope");
        let listed = self.call_connector(context, spec, &filters).await?;
        let sandboxes = listed["result"].clone();
        let count = sandboxes.as_array().map_or(0, Vec::len);
        let mut result = json!({ "count": count, "sandboxes": sandboxes });
        if let Some(next_token) = listed.get("next_token") {
            result["next_token"] = next_token.clone();
        }
        Ok(result)
    }

    pub(crate) async fn exec(
        &self,
        context: &CallContext,
        args: &Map<String, Value>,
    ) -> ToolResult {
        let sandbox_id = required_str(args, "sandbox_id")?;
        let command = required_str(args, "command")?;
        let timeout_ms = u64_arg(args, "timeout_ms")?.unwrap_or(DEFAULT_EXEC_TIMEOUT_MS);
        let (state, envd) = self.use_sandbox(context, sandbox_id)?;
        let cwd = string_arg(args, "cwd")
            .unwrap_or(&state.workspace_path)
            .to_owned();
        let limits = self.inner.config.output_limits;
        let mut sink = ExecSink {
            stdout: CappedText::new(limits),
            stderr: CappedText::new(limits),
        };
        let request = berth_client::ExecRequest {
            command: command.to_owned(),
            cwd: Some(cwd.clone()),
            envs: Default::default(),
            timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
        };
        let ended = envd.exec(&request, &mut sink).await?;
        let truncated = sink.stdout.truncated() || sink.stderr.truncated();
        let total_lines = sink.stdout.total_lines() + sink.stderr.total_lines();
        let exit_code = ended.exit_code.unwrap_or(-1);
        let mut result = json!({
            "sandbox_id": sandbox_id,
            "cwd": cwd,
            "stdout": sink.stdout.finish(),
            "stderr": sink.stderr.finish(),
            "exit_code": exit_code,
            "success": exit_code == 0 && ended.error.is_none(),
            "truncated": truncated,
            "total_lines": total_lines,
        });
        if let Some(error) = ended.error {
            result["error"] = json!(error.to_string());
        }
        Ok(result)
    }

    pub(crate) async fn read_file(
        &self,
        context: &CallContext,
        args: &Map<String, Value>,
    ) -> ToolResult {
        let sandbox_id = required_str(args, "sandbox_id")?;
        let path = required_str(args, "path")?;
        let offset = u64_arg(args, "offset")?.unwrap_or(0) as usize;
        let limit = u64_arg(args, "limit")?.map(|limit| limit as usize);
        let (_, envd) = self.use_sandbox(context, sandbox_id)?;
        let bytes = envd.read_file(path).await?;
        let window = line_window(&String::from_utf8_lossy(&bytes), offset, limit);
        let mut capped = CappedText::new(OutputLimits {
            max_lines: usize::MAX,
            max_bytes: self.inner.config.output_limits.max_bytes * 4,
        });
        capped.push(window.as_bytes());
        Ok(json!({ "sandbox_id": sandbox_id, "path": path, "content": capped.finish() }))
    }

    pub(crate) async fn write_file(
        &self,
        context: &CallContext,
        args: &Map<String, Value>,
    ) -> ToolResult {
        let sandbox_id = required_str(args, "sandbox_id")?;
        let path = required_str(args, "path")?;
        let content = required_str(args, "content")?;
        let (_, envd) = self.use_sandbox(context, sandbox_id)?;
        envd.write_file(path, content.as_bytes().to_vec()).await?;
        Ok(json!({ "sandbox_id": sandbox_id, "path": path, "success": true }))
    }

    pub(crate) async fn manage_sandbox(
        &self,
        context: &CallContext,
        args: &Map<String, Value>,
    ) -> ToolResult {
        let sandbox_id = required_str(args, "sandbox_id")?;
        let action = required_str(args, "action")?;
        let (_, mut state) = self.tracked(context, sandbox_id)?;
        let connected = self.require_connection(&context.identity)?;
        let store = &self.inner.store;
        match action {
            "pause" => {
                connected.api.pause_sandbox(sandbox_id).await?;
                store.set_status(&context.identity, sandbox_id, "paused", false)?;
            }
            "resume" => {
                if let Some(timeout) = u64_arg(args, "timeout_seconds")? {
                    state.timeout_seconds = timeout;
                }
                let resumed = connected
                    .api
                    .connect_sandbox(sandbox_id, state.timeout_seconds)
                    .await?;
                if let Some(token) = resumed.envd_access_token {
                    state.envd_access_token = Some(token);
                }
                if let Some(domain) = resumed.domain {
                    state.domain = Some(domain);
                }
                self.seal_json(
                    &sandbox_context(&context.identity, sandbox_id),
                    &serde_json::to_value(&state)
                        .map_err(|e| ToolFailure::Message(e.to_string()))?,
                )?;
                store.set_status(&context.identity, sandbox_id, "running", false)?;
                let lease_until = unix_now() + self.inner.config.lease.ttl.as_secs() as i64;
                store.renew_lease(&context.identity, sandbox_id, lease_until)?;
            }
            "delete" => {
                let killed = connected.api.kill_sandbox(sandbox_id).await;
                if killed.is_ok() || matches!(&killed, Err(error) if error.status() == Some(404)) {
                    store.set_status(&context.identity, sandbox_id, "deleted", true)?;
                }
                killed?;
            }
            other => {
                return Err(ToolFailure::Message(format!(
                    "action must be pause, resume or delete, not {other:?}"
                )))
            }
        }
        Ok(json!({ "sandbox_id": sandbox_id, "action": action, "success": true }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_paths_stay_inside_the_root() {
        let root = Path::new("/state/storage");
        assert_eq!(
            storage_path(root, "data/in.csv").unwrap(),
            Path::new("/state/storage/data/in.csv")
        );
        assert_eq!(
            storage_path(root, "/in.csv").unwrap(),
            Path::new("/state/storage/in.csv")
        );
        assert!(storage_path(root, "../secret").is_err());
        assert!(storage_path(root, "a/../../b").is_err());
        assert!(storage_path(root, "").is_err());
    }
}
