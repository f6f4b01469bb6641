//! One MCP server made of several: the tools, resources and prompts every upstream
//! listed at start, under their own names, each call routed to the server that listed
//! it. Two servers offering the same tool name, prompt name or resource URI are refused
//! at start (as Docker's gateway does without prefixes): a client could not say which one
//! it means.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, GetPromptRequestParams, GetPromptResponse,
    Implementation, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, Prompt, PromptsCapability, ReadResourceRequestParams,
    ReadResourceResponse, Resource, ResourceTemplate, ResourcesCapability, ResultType,
    ServerCapabilities, ServerConfig, Tool, ToolsCapability,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use crate::backend::{Listing, Upstream};
use crate::error::GatewayError;

/// What the gateway offers and who answers each name: a pure function of the listings.
#[derive(Debug, Default)]
pub struct Catalog {
    pub tools: Vec<Tool>,
    pub resources: Vec<Resource>,
    pub resource_templates: Vec<ResourceTemplate>,
    pub prompts: Vec<Prompt>,
    /// Tool name → index of its server.
    tool_owner: HashMap<String, usize>,
    /// Resource URI → index of its server.
    resource_owner: HashMap<String, usize>,
    /// Prompt name → index of its server.
    prompt_owner: HashMap<String, usize>,
    /// Servers with the resources capability, in config order (where a URI no listing
    /// named, e.g. one of a template, is tried).
    resource_servers: Vec<usize>,
    has_prompts: bool,
}

impl Catalog {
    /// The catalog of `listings` (one per server, named), or the first name two
    /// servers share.
    pub fn build(listings: &[(String, Listing)]) -> Result<Catalog, GatewayError> {
        let mut catalog = Catalog::default();
        let names: Vec<&str> = listings.iter().map(|(name, _)| name.as_str()).collect();
        for (index, (_, listing)) in listings.iter().enumerate() {
            for tool in &listing.tools {
                claim(&mut catalog.tool_owner, "tool", &tool.name, index, &names)?;
                catalog.tools.push(tool.clone());
            }
            if let Some((resources, templates)) = &listing.resources {
                catalog.resource_servers.push(index);
                for resource in resources {
                    claim(
                        &mut catalog.resource_owner,
                        "resource",
                        &resource.uri,
                        index,
                        &names,
                    )?;
                    catalog.resources.push(resource.clone());
                }
                catalog.resource_templates.extend(templates.iter().cloned());
            }
            if let Some(prompts) = &listing.prompts {
                catalog.has_prompts = true;
                for prompt in prompts {
                    claim(
                        &mut catalog.prompt_owner,
                        "prompt",
                        &prompt.name,
                        index,
                        &names,
                    )?;
                    catalog.prompts.push(prompt.clone());
                }
            }
        }
        Ok(catalog)
    }

    /// The capabilities of the whole: tools always, resources and prompts when a server
    /// has them.
    pub fn capabilities(&self) -> ServerCapabilities {
        let mut capabilities = ServerCapabilities::default();
        capabilities.tools = Some(ToolsCapability::default());
        if !self.resource_servers.is_empty() {
            capabilities.resources = Some(ResourcesCapability::default());
        }
        if self.has_prompts {
            capabilities.prompts = Some(PromptsCapability::default());
        }
        capabilities
    }

    /// The server answering tool `name`.
    pub fn tool_server(&self, name: &str) -> Option<usize> {
        self.tool_owner.get(name).copied()
    }

    /// The server answering prompt `name`.
    pub fn prompt_server(&self, name: &str) -> Option<usize> {
        self.prompt_owner.get(name).copied()
    }

    /// The servers to ask for resource `uri`: its lister, else every server with
    /// resources (a URI of a template is not listed).
    pub fn resource_servers(&self, uri: &str) -> Vec<usize> {
        match self.resource_owner.get(uri) {
            Some(index) => vec![*index],
            None => self.resource_servers.clone(),
        }
    }
}

fn claim(
    owners: &mut HashMap<String, usize>,
    kind: &'static str,
    name: &str,
    index: usize,
    names: &[&str],
) -> Result<(), GatewayError> {
    match owners.insert(name.to_string(), index) {
        Some(first) => Err(GatewayError::Collision {
            kind,
            name: name.to_string(),
            first: names[first].to_string(),
            second: names[index].to_string(),
        }),
        None => Ok(()),
    }
}

/// The running servers and their catalog.
pub struct Gateway {
    upstreams: Vec<Upstream>,
    catalog: Catalog,
}

impl Gateway {
    /// Lists what each upstream offers and builds the catalog.
    pub async fn new(upstreams: Vec<Upstream>) -> Result<Gateway, GatewayError> {
        let mut listings = Vec::with_capacity(upstreams.len());
        for upstream in &upstreams {
            listings.push((upstream.name.clone(), upstream.list().await?));
        }
        let catalog = Catalog::build(&listings)?;
        Ok(Gateway { upstreams, catalog })
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }
}

/// The MCP handler of one client session; every session shares the gateway.
#[derive(Clone)]
pub struct Handler(pub Arc<Gateway>);

/// An upstream's failure as the client sees it: its own MCP error as is, anything else
/// (it exited, the pipe broke) as an internal error naming the server.
fn upstream_error(server: &str, error: rmcp::ServiceError) -> ErrorData {
    match error {
        rmcp::ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(format!("MCP server {server:?}: {other}"), None),
    }
}

impl Handler {
    fn upstream(&self, index: usize) -> &Upstream {
        &self.0.upstreams[index]
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(self.0.catalog.capabilities()).with_server_info(Implementation::new(
            "berth-mcp-gateway",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.0.catalog.tools.clone(),
        ))
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(index) = self.0.catalog.tool_server(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            ));
        };
        // The client's per-request protocol metadata is for this gateway, not upstream.
        request.meta = None;
        let upstream = self.upstream(index);
        let mut response = upstream
            .peer
            .call_tool_once(request)
            .await
            .map_err(|e| upstream_error(&upstream.name, e))?;
        // An upstream on an older revision sends no `resultType`, which 2026-07-28
        // clients require (rmcp strips it again for older clients).
        if let CallToolResponse::Complete(result) = &mut response {
            result.result_type = Some(ResultType::COMPLETE);
        }
        Ok(response)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(
            self.0.catalog.resources.clone(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            self.0.catalog.resource_templates.clone(),
        ))
    }

    async fn read_resource(
        &self,
        mut request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        request.meta = None;
        let mut last = None;
        for index in self.0.catalog.resource_servers(&request.uri) {
            let upstream = self.upstream(index);
            match upstream.peer.read_resource_once(request.clone()).await {
                Ok(mut response) => {
                    if let ReadResourceResponse::Complete(result) = &mut response {
                        result.result_type = Some(ResultType::COMPLETE);
                    }
                    return Ok(response);
                }
                Err(error) => last = Some(upstream_error(&upstream.name, error)),
            }
        }
        Err(last.unwrap_or_else(|| {
            ErrorData::resource_not_found(format!("unknown resource {:?}", request.uri), None)
        }))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(
            self.0.catalog.prompts.clone(),
        ))
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let Some(index) = self.0.catalog.prompt_server(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown prompt {:?}", request.name),
                None,
            ));
        };
        request.meta = None;
        let upstream = self.upstream(index);
        let mut response = upstream
            .peer
            .get_prompt_once(request)
            .await
            .map_err(|e| upstream_error(&upstream.name, e))?;
        if let GetPromptResponse::Complete(result) = &mut response {
            result.result_type = Some(ResultType::COMPLETE);
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool::new(name.to_string(), "a tool", Arc::new(serde_json::Map::new()))
    }

    fn listing(tools: &[&str]) -> Listing {
        Listing {
            tools: tools.iter().map(|t| tool(t)).collect(),
            ..Listing::default()
        }
    }

    #[test]
    fn tools_keep_their_names_and_route_to_their_server() {
        let catalog = Catalog::build(&[
            ("github/a/one".into(), listing(&["echo", "add"])),
            ("github/a/two".into(), listing(&["shout"])),
        ])
        .unwrap();
        let names: Vec<&str> = catalog.tools.iter().map(|t| &*t.name).collect();
        assert_eq!(names, ["echo", "add", "shout"]);
        assert_eq!(catalog.tool_server("add"), Some(0));
        assert_eq!(catalog.tool_server("shout"), Some(1));
        assert_eq!(catalog.tool_server("nope"), None);
        let capabilities = catalog.capabilities();
        assert!(capabilities.tools.is_some());
        assert!(capabilities.resources.is_none() && capabilities.prompts.is_none());
    }

    #[test]
    fn a_name_two_servers_offer_is_refused_naming_both() {
        let err = Catalog::build(&[
            ("github/a/one".into(), listing(&["echo"])),
            ("github/a/two".into(), listing(&["echo"])),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("\"github/a/one\" and \"github/a/two\""),
            "{err}"
        );
        assert!(err.contains("tool \"echo\""), "{err}");
    }

    #[test]
    fn unlisted_resource_uris_go_to_every_server_with_resources() {
        let resource = Resource::new("mem://a", "a");
        let with_resources = Listing {
            resources: Some((vec![resource], Vec::new())),
            ..Listing::default()
        };
        let catalog = Catalog::build(&[
            ("github/a/one".into(), listing(&["echo"])),
            ("github/a/two".into(), with_resources.clone()),
            ("github/a/three".into(), with_resources.clone()),
        ]);
        assert!(catalog.is_err(), "mem://a is listed twice");
        let catalog = Catalog::build(&[
            ("github/a/one".into(), listing(&["echo"])),
            ("github/a/two".into(), with_resources),
            (
                "github/a/three".into(),
                Listing {
                    resources: Some((Vec::new(), Vec::new())),
                    ..Listing::default()
                },
            ),
        ])
        .unwrap();
        assert_eq!(catalog.resource_servers("mem://a"), [1]);
        assert_eq!(catalog.resource_servers("mem://other"), [1, 2]);
        assert!(catalog.capabilities().resources.is_some());
    }
}
