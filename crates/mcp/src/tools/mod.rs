//! The tools registry and typed dispatch.
//!
//! [`Registry`] is built once per server from the tool tables ([`table`]): the MCP tool
//! list it serves, and for every name a [`ToolKind`] decided then, from the name and the
//! toolset (`e2b_list_sandboxes` is the session list, the merged list or a REST call
//! depending on it). A call looks its kind up, deserialises the arguments into that
//! tool's own struct after checking them against the table (unknown names refused where
//! the tool always refused them, required ones present, JSON types as declared) and runs
//! the tool's handler: [`session`] for the six session tools, [`connector`] for the REST
//! tools. Handlers answer with typed results serialised to the exact JSON the tool
//! tables promise, or a [`ToolFailure`].

mod connector;
mod output;
mod session;
pub(crate) mod table;

use std::collections::HashMap;
use std::sync::Arc;

use berth_client::ClientError;
use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::config::Toolset;
use crate::connections::Connected;
use crate::error::McpError;
use crate::identity::TrustedConnection;
use crate::server::Components;
use table::ToolSpec;

/// Who is calling and in which session.
#[derive(Debug, Clone)]
pub(crate) struct CallContext {
    pub(crate) identity: String,
    /// The connection the request's identity carries, if its server vouches for one.
    pub(crate) trusted: Option<TrustedConnection>,
    pub(crate) session_id: String,
    pub(crate) harness_id: Option<String>,
}

/// Why a tool call did not succeed; each becomes a tool result with `isError: true`.
#[derive(Debug)]
pub(crate) enum ToolFailure {
    /// No connection for this identity: carries the one-time connect link.
    ConnectionRequired { connect_url: String },
    /// The API or envd answered with an error: its body passed through unchanged,
    /// with one sentence saying what it means.
    Api { status: u16, body: Value },
    /// A session tool's sandbox no longer exists (killed, or its end of life came).
    SandboxGone { sandbox_id: String },
    /// Anything else, as a message safe to show (never contains a key).
    Message(String),
}

impl From<ClientError> for ToolFailure {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Api { status, body } => ToolFailure::Api { status, body },
            other => ToolFailure::Message(other.to_string()),
        }
    }
}

impl From<McpError> for ToolFailure {
    fn from(error: McpError) -> Self {
        match error {
            McpError::Client(client) => client.into(),
            other => ToolFailure::Message(other.to_string()),
        }
    }
}

pub(crate) type ToolResult = Result<Value, ToolFailure>;

/// A handler's typed result as the JSON the tool returns.
fn answer<T: Serialize>(result: &T) -> ToolResult {
    serde_json::to_value(result).map_err(|error| ToolFailure::Message(error.to_string()))
}

/// The MCP result of a call: the JSON as structured content and as text; a failure's
/// text starts with its sentence, so an agent reading only text gets it first.
pub(crate) fn call_result(result: ToolResult) -> CallToolResult {
    let (value, failed) = match result {
        Ok(value) => (value, false),
        Err(failure) => (failure_json(failure), true),
    };
    let json = serde_json::to_string(&value).unwrap_or_default();
    let mut result = if failed {
        let sentence = value
            .get("message")
            .or_else(|| value.pointer("/error/message"))
            .and_then(Value::as_str)
            .unwrap_or("The tool call failed.");
        CallToolResult::error(vec![ContentBlock::text(sentence), ContentBlock::text(json)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(json)])
    };
    result.structured_content = Some(value);
    result
}

fn failure_json(failure: ToolFailure) -> Value {
    match failure {
        ToolFailure::ConnectionRequired { connect_url } => json!({
            "connection_required": true,
            "connect_url": connect_url,
            "message": format!(
                "No E2B-compatible API key is connected for this user. Open {connect_url} to \
                 connect one (or run `berth connect`), then retry."
            ),
        }),
        ToolFailure::Api { status, body } => json!({
            "error": { "message": api_error_sentence(status, &body), "status": status, "body": body },
        }),
        ToolFailure::SandboxGone { sandbox_id } => json!({
            "error": {
                "message": format!(
                    "Sandbox {sandbox_id} no longer exists: it was killed or reached the end of \
                     its timeout. Create a new one with e2b_create_sandbox."
                ),
                "sandbox_id": sandbox_id,
                "state": "killed",
                "fix": "e2b_create_sandbox",
            },
        }),
        ToolFailure::Message(message) => json!({ "error": { "message": message } }),
    }
}

/// One sentence for an error answer: the status in words and the server's own message
/// (E2B's `{code, message}`, or the raw text it sent).
fn api_error_sentence(status: u16, body: &Value) -> String {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|code| code.canonical_reason())
        .unwrap_or("error");
    let detail = body
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| body.as_str())
        .map(str::trim)
        .filter(|text| !text.is_empty());
    let hint = match status {
        401 | 403 => " Check the API key this user connected.",
        404 => " Check the id (list with e2b_list_sandboxes or the matching list tool).",
        409 => " The resource is not in a state that allows this; read its state and retry.",
        429 | 503 => " The server is busy or out of capacity; retry later.",
        _ => "",
    };
    match detail {
        Some(detail) => {
            let detail = detail.trim_end_matches('.');
            format!("The server refused the call with HTTP {status} ({reason}): {detail}.{hint}")
        }
        None => format!("The server refused the call with HTTP {status} ({reason}).{hint}"),
    }
}

/// What a lifecycle REST tool does to the lease table besides renewing the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseEffect {
    /// Only renews the lease of the sandbox named by `sandbox_id`, if it is tracked.
    Renew,
    /// `e2b_kill_sandbox`: the sandbox is gone.
    Delete,
    /// `e2b_pause_sandbox`.
    Pause,
    /// `e2b_connect_sandbox`: running again.
    Resume,
}

/// Which handler serves a tool, decided once per name and toolset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    /// `e2b_create_sandbox` in every toolset (the result's shape depends on it).
    CreateSandbox,
    /// `e2b_list_sandboxes` of the session toolset: this session's sandboxes.
    ListSessionSandboxes,
    /// `e2b_list_sandboxes` of `all`: the session's list or the API's, by `scope`.
    ListSandboxes,
    Exec,
    ReadFile,
    WriteFile,
    ManageSandbox,
    /// A connector tool: one REST call built from its table row.
    Rest(LeaseEffect),
}

impl ToolKind {
    fn of(name: &str, toolset: Toolset) -> ToolKind {
        match (name, toolset) {
            ("e2b_create_sandbox", _) => ToolKind::CreateSandbox,
            ("e2b_list_sandboxes", Toolset::Session) => ToolKind::ListSessionSandboxes,
            ("e2b_list_sandboxes", Toolset::All) => ToolKind::ListSandboxes,
            ("e2b_exec", Toolset::Session | Toolset::All) => ToolKind::Exec,
            ("e2b_read_file", Toolset::Session | Toolset::All) => ToolKind::ReadFile,
            ("e2b_write_file", Toolset::Session | Toolset::All) => ToolKind::WriteFile,
            ("e2b_manage_sandbox", Toolset::Session | Toolset::All) => ToolKind::ManageSandbox,
            ("e2b_kill_sandbox", _) => ToolKind::Rest(LeaseEffect::Delete),
            ("e2b_pause_sandbox", _) => ToolKind::Rest(LeaseEffect::Pause),
            ("e2b_connect_sandbox", _) => ToolKind::Rest(LeaseEffect::Resume),
            _ => ToolKind::Rest(LeaseEffect::Renew),
        }
    }

    /// The tools that have always refused parameters their table does not list. The
    /// other session tools ignore extra arguments, as they always did.
    fn refuses_unknown_parameters(self) -> bool {
        matches!(
            self,
            ToolKind::CreateSandbox | ToolKind::ListSandboxes | ToolKind::Rest(_)
        )
    }
}

struct Entry {
    kind: ToolKind,
    spec: ToolSpec,
}

/// The tools one server offers.
pub(crate) struct Registry {
    toolset: Toolset,
    tools: Arc<Vec<Tool>>,
    entries: HashMap<String, Entry>,
}

impl Registry {
    pub(crate) fn new(toolset: Toolset) -> Self {
        let specs = table::specs_for(toolset);
        let tools = Arc::new(
            specs
                .iter()
                .map(|spec| {
                    let mut tool = table::mcp_tool(spec);
                    let kind = ToolKind::of(&spec.name, toolset);
                    let mut schema = session::output_schema(kind, toolset)
                        .unwrap_or_else(connector::output_schema);
                    open_schemas_as_objects(&mut schema);
                    if let Value::Object(schema) = schema {
                        tool.output_schema = Some(Arc::new(schema));
                    }
                    tool
                })
                .collect(),
        );
        let entries = specs
            .into_iter()
            .map(|spec| {
                let kind = ToolKind::of(&spec.name, toolset);
                (spec.name.clone(), Entry { kind, spec })
            })
            .collect();
        Self {
            toolset,
            tools,
            entries,
        }
    }

    /// The MCP tool list (`tools/list`).
    pub(crate) fn tools(&self) -> &Arc<Vec<Tool>> {
        &self.tools
    }

    pub(crate) fn toolset(&self) -> Toolset {
        self.toolset
    }
}

/// Writes the schema that accepts anything as `{}` instead of `true` (the same in JSON
/// Schema): clients' tool types (the MCP SDKs' own, and the conformance suite's) only
/// accept object schemas for properties.
fn open_schemas_as_objects(schema: &mut Value) {
    match schema {
        Value::Object(map) => map.values_mut().for_each(|inner| {
            if inner == &Value::Bool(true) {
                *inner = json!({});
            } else {
                open_schemas_as_objects(inner);
            }
        }),
        Value::Array(items) => items.iter_mut().for_each(open_schemas_as_objects),
        _ => {}
    }
}

/// Checks `args` against the tool's table row: no unknown names (when `refuse_unknown`),
/// required ones present, JSON types as declared.
pub(crate) fn check_args(
    spec: &ToolSpec,
    args: &Map<String, Value>,
    refuse_unknown: bool,
) -> Result<(), ToolFailure> {
    for (name, value) in args {
        match spec.params.iter().find(|param| &param.name == name) {
            Some(param) if !value.is_null() && !type_matches(&param.json_type, value) => {
                return Err(ToolFailure::Message(format!(
                    "parameter {name:?} must be of type {}",
                    param.json_type
                )));
            }
            Some(_) => {}
            None if refuse_unknown => {
                return Err(ToolFailure::Message(format!("unknown parameter {name:?}")));
            }
            None => {}
        }
    }
    for param in spec.params.iter().filter(|param| param.required) {
        if args.get(&param.name).is_none_or(Value::is_null) {
            return Err(ToolFailure::Message(format!(
                "missing required parameter {:?}",
                param.name
            )));
        }
    }
    Ok(())
}

fn type_matches(json_type: &str, value: &Value) -> bool {
    match json_type {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    }
}

/// A tool's arguments as its own struct, once they passed [`check_args`].
fn parse_args<T: DeserializeOwned>(
    kind: ToolKind,
    spec: &ToolSpec,
    args: &Map<String, Value>,
) -> Result<T, ToolFailure> {
    check_args(spec, args, kind.refuses_unknown_parameters())?;
    serde_json::from_value(Value::Object(args.clone()))
        .map_err(|error| ToolFailure::Message(format!("invalid arguments: {error}")))
}

/// The identity's connection, or the "connection required" failure with a fresh
/// one-time link.
fn require_connection(mcp: &Components, call: &CallContext) -> Result<Connected, ToolFailure> {
    let connections = &mcp.connections;
    if let Some(connected) = connections.for_call(&call.identity, call.trusted.as_ref())? {
        return Ok(connected);
    }
    Err(ToolFailure::ConnectionRequired {
        connect_url: connections.new_connect_link(&call.identity)?,
    })
}

/// Runs tool `name`; `None` when this server offers no such tool.
pub(crate) async fn dispatch(
    mcp: &Components,
    call: &CallContext,
    name: &str,
    args: Map<String, Value>,
) -> Option<ToolResult> {
    let Entry { kind, spec } = mcp.registry.entries.get(name)?;
    let kind = *kind;
    let result = async {
        match kind {
            ToolKind::CreateSandbox => {
                let parsed = parse_args(kind, spec, &args)?;
                session::create_sandbox(mcp, call, spec, parsed, &args).await
            }
            ToolKind::ListSessionSandboxes => session::list_session_sandboxes(mcp, call),
            ToolKind::ListSandboxes => {
                check_args(spec, &args, kind.refuses_unknown_parameters())?;
                session::list_sandboxes(mcp, call, spec, args).await
            }
            ToolKind::Exec => session::exec(mcp, call, parse_args(kind, spec, &args)?).await,
            ToolKind::ReadFile => {
                session::read_file(mcp, call, parse_args(kind, spec, &args)?).await
            }
            ToolKind::WriteFile => {
                session::write_file(mcp, call, parse_args(kind, spec, &args)?).await
            }
            ToolKind::ManageSandbox => {
                session::manage_sandbox(mcp, call, parse_args(kind, spec, &args)?).await
            }
            ToolKind::Rest(effect) => connector::call(mcp, call, spec, effect, &args).await,
        }
    }
    .await;
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_name_gets_its_kind_once() {
        let kinds = |toolset| {
            let registry = Registry::new(toolset);
            assert_eq!(registry.tools().len(), registry.entries.len());
            registry
                .entries
                .iter()
                .map(|(name, entry)| (name.clone(), entry.kind))
                .collect::<HashMap<_, _>>()
        };
        let session = kinds(Toolset::Session);
        assert_eq!(session.len(), 6);
        assert_eq!(
            session["e2b_list_sandboxes"],
            ToolKind::ListSessionSandboxes
        );
        assert_eq!(session["e2b_manage_sandbox"], ToolKind::ManageSandbox);
        let connector = kinds(Toolset::Connector);
        assert_eq!(connector.len(), 38);
        assert_eq!(connector["e2b_create_sandbox"], ToolKind::CreateSandbox);
        assert_eq!(
            connector["e2b_list_sandboxes"],
            ToolKind::Rest(LeaseEffect::Renew)
        );
        assert_eq!(
            connector["e2b_kill_sandbox"],
            ToolKind::Rest(LeaseEffect::Delete)
        );
        let all = kinds(Toolset::All);
        assert_eq!(all.len(), 42);
        assert_eq!(all["e2b_list_sandboxes"], ToolKind::ListSandboxes);
        assert_eq!(all["e2b_exec"], ToolKind::Exec);
        assert_eq!(
            all["e2b_connect_sandbox"],
            ToolKind::Rest(LeaseEffect::Resume)
        );
        let rest = all
            .values()
            .filter(|kind| matches!(kind, ToolKind::Rest(_)))
            .count();
        assert_eq!(rest, 36, "all but the two shared names are REST tools");
    }

    #[test]
    fn arguments_are_checked_against_the_table_then_typed() {
        let registry = Registry::new(Toolset::Session);
        let exec = &registry.entries["e2b_exec"];
        let args = |value: Value| value.as_object().unwrap().clone();
        let parsed: session::ExecArgs = parse_args(
            exec.kind,
            &exec.spec,
            &args(json!({"sandbox_id": "i1", "command": "ls", "timeout_ms": null, "extra": 1})),
        )
        .unwrap();
        assert_eq!(parsed.command, "ls");
        assert_eq!(parsed.timeout_ms, None);
        let missing = parse_args::<session::ExecArgs>(
            exec.kind,
            &exec.spec,
            &args(json!({"sandbox_id": "i1"})),
        )
        .unwrap_err();
        assert!(
            matches!(&missing, ToolFailure::Message(m) if m == "missing required parameter \"command\""),
            "{missing:?}"
        );
        let negative = parse_args::<session::ExecArgs>(
            exec.kind,
            &exec.spec,
            &args(json!({"sandbox_id": "i1", "command": "ls", "timeout_ms": -1})),
        )
        .unwrap_err();
        assert!(
            matches!(&negative, ToolFailure::Message(m) if m.starts_with("invalid arguments")),
            "{negative:?}"
        );
        let create = &registry.entries["e2b_create_sandbox"];
        let unknown = parse_args::<session::CreateSandboxArgs>(
            create.kind,
            &create.spec,
            &args(json!({"bogus": true})),
        )
        .unwrap_err();
        assert!(
            matches!(&unknown, ToolFailure::Message(m) if m == "unknown parameter \"bogus\""),
            "{unknown:?}"
        );
    }

    #[test]
    fn every_tool_has_an_object_output_schema_without_boolean_subschemas() {
        for toolset in [Toolset::Session, Toolset::Connector, Toolset::All] {
            for tool in Registry::new(toolset).tools().iter() {
                let schema = tool.output_schema.as_ref().expect("an output schema");
                assert_eq!(schema["type"], "object", "{}", tool.name);
                let text = serde_json::to_string(schema).unwrap();
                assert!(!text.contains(":true"), "{}: {text}", tool.name);
            }
        }
    }

    #[test]
    fn failures_keep_their_result_shapes() {
        let api = call_result(Err(ToolFailure::Api {
            status: 404,
            body: json!({"code": 404, "message": "nope"}),
        }));
        assert_eq!(api.is_error, Some(true));
        assert_eq!(
            api.structured_content.unwrap(),
            json!({"error": {"status": 404, "body": {"code": 404, "message": "nope"},
                "message": "The server refused the call with HTTP 404 (Not Found): nope. Check the \
                            id (list with e2b_list_sandboxes or the matching list tool)."}})
        );
        let first = api.content[0].as_text().unwrap().text.clone();
        assert!(
            first.starts_with("The server refused the call with HTTP 404"),
            "{first}"
        );
        let raw = api_error_sentence(502, &json!("bad gateway\n"));
        assert_eq!(
            raw,
            "The server refused the call with HTTP 502 (Bad Gateway): bad gateway."
        );
        let link = call_result(Err(ToolFailure::ConnectionRequired {
            connect_url: "http://x/mcp/connect/t".into(),
        }));
        let content = link.structured_content.unwrap();
        assert_eq!(content["connection_required"], json!(true));
        assert_eq!(content["connect_url"], "http://x/mcp/connect/t");
        let ok = call_result(Ok(json!({"a": 1})));
        assert_eq!(ok.is_error, Some(false));
    }
}
