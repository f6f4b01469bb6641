//! The tool tables. `data/connector_tools.json` and `data/session_tools.json` were written
//! from the seed documents (names, titles, descriptions, parameters, defaults, enums,
//! labels) plus, for connector tools, the REST route each one calls and where each
//! parameter goes on the wire. This module turns them into MCP tool definitions.
//!
//! In `all`, `e2b_create_sandbox` and `e2b_list_sandboxes` exist in both documents. Each
//! gets one superset schema: the union of both parameter lists, nothing required (the
//! connector's required `template_id` has the session tool's `template`/default `base` as
//! an alternative), the connector document's title, description and label, followed by a
//! note describing the merged behaviour. `e2b_list_sandboxes` adds `scope`
//! (`session`: this session's sandboxes; `project`: the API's list with filters); without
//! `scope` it lists the session's sandboxes unless a connector filter is given.

use rmcp::model::Tool;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::config::Toolset;

const CONNECTOR_TABLE: &str = include_str!("../../data/connector_tools.json");
const SESSION_TABLE: &str = include_str!("../../data/session_tools.json");

/// The names both documents define.
pub const SHARED_NAMES: [&str; 2] = ["e2b_create_sandbox", "e2b_list_sandboxes"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Label {
    ReadOnly,
    Write,
    Destructive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamLocation {
    Path,
    Query,
    Body,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ParamSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub json_type: String,
    pub required: bool,
    pub description: String,
    #[serde(default)]
    pub r#enum: Option<Vec<String>>,
    #[serde(default)]
    pub default: Option<Value>,
    #[serde(default)]
    pub items: Option<Value>,
    /// Connector tools only: where the value goes, and its wire name (dots nest objects).
    #[serde(default, rename = "in")]
    pub location: Option<ParamLocation>,
    #[serde(default)]
    pub wire: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub title: Option<String>,
    pub description: String,
    pub label: Label,
    #[serde(default)]
    pub idempotent: bool,
    /// Connector tools only: the REST method and path template (`{param}` placeholders).
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    pub params: Vec<ParamSpec>,
}

#[derive(Deserialize)]
struct Table {
    tools: Vec<ToolSpec>,
}

fn parse_table(text: &str) -> Vec<ToolSpec> {
    serde_json::from_str::<Table>(text)
        .expect("the committed tool tables are valid JSON (checked by unit tests)")
        .tools
}

pub fn connector_specs() -> Vec<ToolSpec> {
    parse_table(CONNECTOR_TABLE)
}

pub fn session_specs() -> Vec<ToolSpec> {
    parse_table(SESSION_TABLE)
}

/// The extra `scope` parameter of the merged `e2b_list_sandboxes`.
fn scope_param() -> ParamSpec {
    ParamSpec {
        name: "scope".into(),
        json_type: "string".into(),
        required: false,
        description: "session: only sandboxes created in this session (the default when no \
                      filter is given); project: every sandbox the API key can see, with the \
                      filters above."
            .into(),
        r#enum: Some(vec!["session".into(), "project".into()]),
        default: None,
        items: None,
        location: None,
        wire: None,
    }
}

const CREATE_NOTE: &str = " In this server the tool accepts both the session parameters \
(title, template, timeout_seconds, env_vars, upload_files) and the API parameters: \
template_id wins over template (default base), timeout over timeout_seconds (default 3600). \
The sandbox is tracked in this session; the result holds the session fields and the API's \
response under `sandbox`, without access tokens (e2b_connect_sandbox returns them).";

const LIST_NOTE: &str = " In this server, scope=session (the default without filters) lists \
only this session's sandboxes; scope=project, or any filter, lists the API's sandboxes.";

/// The specs a toolset serves, in a stable order (session tools first, then connector).
pub fn specs_for(toolset: Toolset) -> Vec<ToolSpec> {
    match toolset {
        Toolset::Session => session_specs(),
        Toolset::Connector => connector_specs(),
        Toolset::All => {
            let connector = connector_specs();
            let mut all: Vec<ToolSpec> = session_specs()
                .into_iter()
                .map(
                    |spec| match connector.iter().find(|c| c.name == spec.name) {
                        Some(shared) => merge(spec, shared.clone()),
                        None => spec,
                    },
                )
                .collect();
            all.extend(
                connector
                    .into_iter()
                    .filter(|spec| !SHARED_NAMES.contains(&spec.name.as_str())),
            );
            all
        }
    }
}

/// Superset of a session spec and a connector spec with the same name.
fn merge(session: ToolSpec, connector: ToolSpec) -> ToolSpec {
    let mut params: Vec<ParamSpec> = session.params;
    for param in connector.params {
        if params.iter().all(|existing| existing.name != param.name) {
            params.push(param);
        }
    }
    for param in &mut params {
        param.required = false;
    }
    let note = if connector.name == "e2b_list_sandboxes" {
        params.push(scope_param());
        LIST_NOTE
    } else {
        CREATE_NOTE
    };
    ToolSpec {
        description: format!("{}{note}", connector.description),
        params,
        ..connector
    }
}

pub fn input_schema(spec: &ToolSpec) -> Map<String, Value> {
    let mut properties = Map::new();
    for param in &spec.params {
        let mut schema = Map::new();
        schema.insert("type".into(), json!(param.json_type));
        schema.insert("description".into(), json!(param.description));
        if let Some(values) = &param.r#enum {
            schema.insert("enum".into(), json!(values));
        }
        if let Some(default) = &param.default {
            schema.insert("default".into(), default.clone());
        }
        if let Some(items) = &param.items {
            schema.insert("items".into(), items.clone());
        }
        if param.json_type == "object" && param.name.ends_with("env_vars") {
            schema.insert("additionalProperties".into(), json!({"type": "string"}));
        }
        properties.insert(param.name.clone(), Value::Object(schema));
    }
    let required: Vec<&str> = spec
        .params
        .iter()
        .filter(|param| param.required)
        .map(|param| param.name.as_str())
        .collect();
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), Value::Object(properties));
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema
}

/// MCP annotations from a label: Write sets readOnlyHint and destructiveHint to false
/// explicitly because MCP's default for destructiveHint is true.
pub fn annotations(spec: &ToolSpec) -> Value {
    let mut annotations = Map::new();
    if let Some(title) = &spec.title {
        annotations.insert("title".into(), json!(title));
    }
    match spec.label {
        Label::ReadOnly => {
            annotations.insert("readOnlyHint".into(), json!(true));
        }
        Label::Write => {
            annotations.insert("readOnlyHint".into(), json!(false));
            annotations.insert("destructiveHint".into(), json!(false));
        }
        Label::Destructive => {
            annotations.insert("readOnlyHint".into(), json!(false));
            annotations.insert("destructiveHint".into(), json!(true));
        }
    }
    if spec.idempotent {
        annotations.insert("idempotentHint".into(), json!(true));
    }
    Value::Object(annotations)
}

pub fn mcp_tool(spec: &ToolSpec) -> Tool {
    let mut tool = json!({
        "name": spec.name,
        "description": spec.description,
        "inputSchema": input_schema(spec),
        "annotations": annotations(spec),
    });
    if let Some(title) = &spec.title {
        tool["title"] = json!(title);
    }
    serde_json::from_value(tool).expect("a tool built from the table is a valid MCP tool")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_the_seed_counts_and_labels() {
        let connector = connector_specs();
        assert_eq!(connector.len(), 38);
        let count = |label| connector.iter().filter(|t| t.label == label).count();
        assert_eq!(count(Label::ReadOnly), 20);
        assert_eq!(count(Label::Write), 13);
        assert_eq!(count(Label::Destructive), 5);
        assert_eq!(session_specs().len(), 6);
        for spec in &connector {
            let path = spec.path.as_deref().unwrap();
            for param in &spec.params {
                let location = param.location.unwrap();
                assert_eq!(
                    location == ParamLocation::Path,
                    path.contains(&format!("{{{}}}", param.name)),
                    "{}.{}",
                    spec.name,
                    param.name
                );
            }
        }
    }

    #[test]
    fn toolset_sizes_and_unique_names() {
        assert_eq!(specs_for(Toolset::Session).len(), 6);
        assert_eq!(specs_for(Toolset::Connector).len(), 38);
        let all = specs_for(Toolset::All);
        assert_eq!(all.len(), 42);
        let mut names: Vec<_> = all.iter().map(|s| s.name.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 42);
    }

    #[test]
    fn superset_create_accepts_both_documents_and_requires_nothing() {
        let all = specs_for(Toolset::All);
        let create = all.iter().find(|s| s.name == "e2b_create_sandbox").unwrap();
        let schema = input_schema(create);
        let properties = schema["properties"].as_object().unwrap();
        for name in [
            "title",
            "template",
            "timeout_seconds",
            "env_vars",
            "upload_files",
            "template_id",
            "timeout",
            "metadata",
            "network",
            "volume_mounts",
        ] {
            assert!(properties.contains_key(name), "{name}");
        }
        assert!(!schema.contains_key("required"));
        let list = all.iter().find(|s| s.name == "e2b_list_sandboxes").unwrap();
        assert!(input_schema(list)["properties"]["scope"].is_object());
    }

    #[test]
    fn annotations_follow_labels() {
        let connector = connector_specs();
        let find = |name: &str| connector.iter().find(|s| s.name == name).unwrap();
        let write = annotations(find("e2b_create_volume"));
        assert_eq!(write["readOnlyHint"], json!(false));
        assert_eq!(write["destructiveHint"], json!(false));
        assert!(write.get("idempotentHint").is_none());
        let destructive = annotations(find("e2b_kill_sandbox"));
        assert_eq!(destructive["destructiveHint"], json!(true));
        assert_eq!(destructive["idempotentHint"], json!(true));
        assert_eq!(
            annotations(find("e2b_get_sandbox"))["readOnlyHint"],
            json!(true)
        );
        let tool = mcp_tool(find("e2b_set_sandbox_timeout"));
        assert_eq!(tool.title.as_deref(), Some("Set Sandbox Timeout"));
    }
}
