//! Connector tools: each one is a single REST call built from the tool table, and its
//! result is the API's JSON. Errors from the API come back unchanged.

use serde_json::{json, Map, Value};

use crate::server::{CallContext, Mcp, ToolFailure, ToolResult};
use crate::store::unix_now;
use crate::tools::{ParamLocation, ToolSpec};

/// A REST request derived from a tool call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BuiltRequest {
    pub(crate) method: reqwest::Method,
    pub(crate) path: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) body: Option<Value>,
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

/// Checks `args` against the tool's parameters: no unknown names, required ones present,
/// JSON types as declared.
pub(crate) fn check_args(spec: &ToolSpec, args: &Map<String, Value>) -> Result<(), ToolFailure> {
    for (name, value) in args {
        let Some(param) = spec.params.iter().find(|param| &param.name == name) else {
            return Err(ToolFailure::Message(format!("unknown parameter {name:?}")));
        };
        if !value.is_null() && !type_matches(&param.json_type, value) {
            return Err(ToolFailure::Message(format!(
                "parameter {name:?} must be of type {}",
                param.json_type
            )));
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
    check_args(spec, args)?;
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

impl Mcp {
    pub(crate) async fn call_connector(
        &self,
        context: &CallContext,
        spec: &ToolSpec,
        args: &Map<String, Value>,
    ) -> ToolResult {
        let request = build_request(spec, args)?;
        let connected = self.require_connection(&context.identity)?;
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
            self.after_connector_call(context, &spec.name, sandbox_id)?;
        }
        let mut result = json!({ "status": response.status, "result": response.body });
        if let Some(next_token) = response.next_token {
            result["next_token"] = json!(next_token);
        }
        Ok(result)
    }

    /// Keeps the lease table in step with lifecycle calls made through connector tools.
    fn after_connector_call(
        &self,
        context: &CallContext,
        tool: &str,
        sandbox_id: &str,
    ) -> Result<(), ToolFailure> {
        let store = &self.inner.store;
        match tool {
            "e2b_kill_sandbox" => {
                store.set_status(&context.identity, sandbox_id, "deleted", true)?
            }
            "e2b_pause_sandbox" => {
                store.set_status(&context.identity, sandbox_id, "paused", false)?
            }
            "e2b_connect_sandbox" => {
                store.set_status(&context.identity, sandbox_id, "running", false)?
            }
            _ => {}
        }
        let lease_until = unix_now() + self.inner.config.lease.ttl.as_secs() as i64;
        store.renew_lease(&context.identity, sandbox_id, lease_until)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::connector_specs;

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
