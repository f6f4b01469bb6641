//! The OpenAPI document of what berth implements, generated from the handlers' and
//! models' annotations so it cannot drift from the code. Routes that answer 501 are
//! deliberately absent.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::handlers;

struct ApiKeyScheme;

impl Modify for ApiKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "ApiKeyAuth",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "berth", description = "E2B-compatible control plane served by berth."),
    modifiers(&ApiKeyScheme),
    paths(
        handlers::health,
        handlers::create_sandbox_v1,
        handlers::create_sandbox_v2,
        handlers::list_sandboxes_v1,
        handlers::list_sandboxes_v2,
        handlers::get_sandbox,
        handlers::kill_sandbox,
        handlers::set_timeout,
        handlers::update_network,
        handlers::refresh,
        handlers::connect_v1,
        handlers::connect_v2,
        handlers::pause_sandbox,
        handlers::resume_sandbox,
        handlers::fork_sandbox,
        handlers::create_snapshot,
        handlers::list_snapshots,
        handlers::delete_template,
        handlers::create_volume,
        handlers::list_volumes,
        handlers::get_volume,
        handlers::delete_volume,
        handlers::create_secret,
        handlers::list_secrets,
        handlers::get_secret,
        handlers::update_secret,
        handlers::delete_secret,
        handlers::logs_v1,
        handlers::logs_v2,
        handlers::sandbox_metrics,
        handlers::sandboxes_metrics,
        handlers::list_teams,
        handlers::team_metrics,
        handlers::team_metrics_max,
        handlers::list_keys,
        handlers::create_key,
        handlers::update_key,
        handlers::delete_key,
        handlers::list_templates_v2,
        handlers::list_templates_v1,
        handlers::get_template,
        handlers::get_template_alias,
        handlers::update_template_v1,
        handlers::update_template_v2,
        handlers::request_build_v3,
        handlers::file_upload_link,
        handlers::start_build_v2,
        handlers::cancel_build,
        handlers::build_status_route,
        handlers::build_logs_route,
        handlers::assign_tags,
        handlers::delete_tags,
        handlers::list_tags,
        handlers::team_events,
        handlers::sandbox_events,
        handlers::create_webhook,
        handlers::list_webhooks,
        handlers::get_webhook,
        handlers::update_webhook,
        handlers::delete_webhook,
        handlers::webhook_deliveries,
    )
)]
struct BerthApi;

/// The document served at `GET /openapi.json`.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    BerthApi::openapi()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lists_implemented_routes_only() {
        let doc = serde_json::to_value(openapi_document()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.contains_key("/v2/sandboxes"));
        assert!(paths.contains_key("/events/webhooks/{webhookID}"));
        assert!(paths.contains_key("/events/webhooks/{webhookID}/deliveries"));
        assert!(paths.contains_key("/sandboxes/{sandboxID}/pause"));
        for route in [
            "/v3/templates",
            "/templates/{templateID}/files/{hash}",
            "/v2/templates/{templateID}/builds/{buildID}",
            "/templates/{templateID}/builds/{buildID}/status",
            "/templates/{templateID}/builds/{buildID}/logs",
            "/templates/tags",
            "/templates/{templateID}/tags",
            "/v2/templates/{templateID}",
        ] {
            assert!(paths.contains_key(route), "{route} missing");
        }
        let step = &doc["components"]["schemas"]["TemplateStep"]["properties"];
        assert!(step.get("filesHash").is_some());
        assert!(paths.contains_key("/sandboxes/{sandboxID}/network"));
        assert!(paths.contains_key("/volumes/{volumeID}"));
        assert!(paths.contains_key("/secrets/{secretID}"));
        let sandbox = &doc["components"]["schemas"]["Sandbox"]["properties"];
        assert!(sandbox.get("sandboxID").is_some());
        assert!(sandbox.get("envdAccessToken").is_some());
        // Fields berth refuses are not advertised.
        let new_sandbox = &doc["components"]["schemas"]["NewSandbox"]["properties"];
        assert!(new_sandbox.get("network").is_some());
        assert!(new_sandbox.get("mcp").is_none());
        assert!(new_sandbox.get("autoPause").is_some());
    }
}
