//! Connector tools: each one is a single REST call built from the tool table, and its
//! result is the API's JSON, relayed untouched (connector tools have no model of their
//! own: the table is their schema). Errors from the API come back unchanged.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::table::{ParamLocation, ToolSpec};
use super::{
    answer, check_args, require_connection, CallContext, LeaseEffect, ToolFailure, ToolResult,
};
use crate::server::Components;
use crate::sessions::SandboxStatus;

/// A REST request derived from a tool call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BuiltRequest {
    pub(crate) method: reqwest::Method,
    pub(crate) path: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) body: Option<Value>,
}

/// Sets `value` at a dotted path (`autoResume.enabled`) inside `body`.
fn set_nested(body: &mut Map<String, Value>, dotted: &str, value: Value) {
    match dotted.split_once('.') {
        None => {
            body.insert(dotted.to_owned(), value);
        }
        Some((head, rest)) => {
            let child = body
                .entry(head.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(child) = child {
                set_nested(child, rest, value);
            }
        }
    }
}

fn query_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The JSON body for the tool's body parameters (declared defaults applied).
pub(crate) fn wire_body(spec: &ToolSpec, args: &Map<String, Value>) -> Map<String, Value> {
    let mut body = Map::new();
    for param in &spec.params {
        if param.location != Some(ParamLocation::Body) {
            continue;
        }
        let value = args
            .get(&param.name)
            .filter(|value| !value.is_null())
            .or(param.default.as_ref());
        if let Some(value) = value {
            let wire = param.wire.as_deref().unwrap_or(&param.name);
            set_nested(&mut body, wire, value.clone());
        }
    }
    body
}

pub(crate) fn build_request(
    spec: &ToolSpec,
    args: &Map<String, Value>,
) -> Result<BuiltRequest, ToolFailure> {
    check_args(spec, args, true)?;
    let method = spec
        .method
        .as_deref()
        .unwrap_or("GET")
        .parse::<reqwest::Method>()
        .map_err(|_| ToolFailure::Message("bad method in the tool table".into()))?;
    let mut path = spec.path.clone().unwrap_or_default();
    let mut query = Vec::new();
    let mut has_body_params = false;
    for param in &spec.params {
        let value = args
            .get(&param.name)
            .filter(|value| !value.is_null())
            .or(param.default.as_ref());
        match param.location {
            Some(ParamLocation::Path) => {
                let value = value.map(query_text).unwrap_or_default();
                path = path.replace(
                    &format!("{{{}}}", param.name),
                    &berth_client::encode_segment(&value),
                );
            }
            Some(ParamLocation::Query) => {
                let wire = param.wire.as_deref().unwrap_or(&param.name);
                match value {
                    Some(Value::Array(items)) => {
                        query.extend(items.iter().map(|item| (wire.to_owned(), query_text(item))))
                    }
                    Some(value) => query.push((wire.to_owned(), query_text(value))),
                    None => {}
                }
            }
            Some(ParamLocation::Body) => has_body_params = true,
            None => {}
        }
    }
    let body = has_body_params.then(|| Value::Object(wire_body(spec, args)));
    Ok(BuiltRequest {
        method,
        path,
        query,
        body,
    })
}

/// What a connector tool returns: the API's status and JSON, and its paging cursor. The
/// JSON is the API's own (its shape per tool is what the tool's description names), so
/// the schema leaves `result` open.
#[derive(Serialize, JsonSchema)]
pub(crate) struct RestResult {
    pub(crate) status: u16,
    pub(crate) result: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_token: Option<String>,
}

/// The `outputSchema` of every connector tool.
pub(crate) fn output_schema() -> Value {
    schemars::schema_for!(RestResult).to_value()
}

/// Runs one REST tool and keeps the lease table in step with lifecycle calls.
pub(crate) async fn call(
    mcp: &Components,
    call: &CallContext,
    spec: &ToolSpec,
    effect: LeaseEffect,
    args: &Map<String, Value>,
) -> ToolResult {
    answer(&rest(mcp, call, spec, effect, args).await?)
}

/// [`call`], typed (the merged `e2b_list_sandboxes` reuses it).
pub(crate) async fn rest(
    mcp: &Components,
    call: &CallContext,
    spec: &ToolSpec,
    effect: LeaseEffect,
    args: &Map<String, Value>,
) -> Result<RestResult, ToolFailure> {
    let request = build_request(spec, args)?;
    let connected = require_connection(mcp, call)?;
    let response = connected
        .api
        .request(
            request.method,
            &request.path,
            &request.query,
            request.body.as_ref(),
        )
        .await?;
    if let Some(sandbox_id) = args.get("sandbox_id").and_then(Value::as_str) {
        let sessions = &mcp.sessions;
        let status = match effect {
            LeaseEffect::Renew => None,
            LeaseEffect::Delete => Some(SandboxStatus::Deleted),
            LeaseEffect::Pause => Some(SandboxStatus::Paused),
            LeaseEffect::Resume => Some(SandboxStatus::Running),
        };
        if let Some(status) = status {
            sessions.set_status(&call.identity, sandbox_id, status)?;
        }
        sessions.renew_lease(&call.identity, sandbox_id)?;
    }
    Ok(RestResult {
        status: response.status,
        result: response.body,
        next_token: response.next_token,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tools::table::connector_specs;

    fn spec(name: &str) -> ToolSpec {
        connector_specs()
            .into_iter()
            .find(|spec| spec.name == name)
            .unwrap()
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn path_query_and_defaults() {
        let request = build_request(
            &spec("e2b_get_sandbox_logs"),
            &args(json!({"sandbox_id": "iabc", "level": "warn"})),
        )
        .unwrap();
        assert_eq!(request.method, reqwest::Method::GET);
        assert_eq!(request.path, "/v2/sandboxes/iabc/logs");
        assert_eq!(
            request.query,
            vec![
                ("level".to_owned(), "warn".to_owned()),
                ("limit".to_owned(), "1000".to_owned())
            ]
        );
        assert_eq!(request.body, None);
    }

    #[test]
    fn body_wire_names_nest_and_rename() {
        let request = build_request(
            &spec("e2b_create_sandbox"),
            &args(json!({"template_id": "base", "auto_resume": true, "env_vars": {"A": "1"}})),
        )
        .unwrap();
        assert_eq!(request.path, "/sandboxes");
        assert_eq!(
            request.body.unwrap(),
            json!({"templateID": "base", "autoResume": {"enabled": true}, "envVars": {"A": "1"},
                   "autoPause": false, "timeout": 300})
        );
    }

    #[test]
    fn arrays_repeat_in_query_and_paths_are_escaped() {
        let request = build_request(
            &spec("e2b_list_sandbox_events"),
            &args(json!({"sandbox_id": "../x", "types": ["a", "b"]})),
        )
        .unwrap();
        assert_eq!(request.path, "/events/sandboxes/..%2Fx");
        assert!(request
            .query
            .contains(&("types".to_owned(), "a".to_owned())));
        assert!(request
            .query
            .contains(&("types".to_owned(), "b".to_owned())));
        assert!(request
            .query
            .contains(&("orderAsc".to_owned(), "false".to_owned())));
    }

    #[test]
    fn bad_arguments_are_refused() {
        let kill = spec("e2b_kill_sandbox");
        assert!(build_request(&kill, &args(json!({}))).is_err());
        assert!(build_request(&kill, &args(json!({"sandbox_id": 5}))).is_err());
        assert!(build_request(&kill, &args(json!({"sandbox_id": "i", "x": 1}))).is_err());
        let request = build_request(&kill, &args(json!({"sandbox_id": "i"}))).unwrap();
        assert_eq!(request.method, reqwest::Method::DELETE);
        let tags = build_request(
            &spec("e2b_delete_template_tags"),
            &args(json!({"name": "t", "tags": ["v1"]})),
        )
        .unwrap();
        assert_eq!(tags.body.unwrap(), json!({"name": "t", "tags": ["v1"]}));
    }
}
