//! Lifecycle events and webhooks (E2B's events API, served on the API host).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use berth_api::{
    ApiError, DeliveriesQuery, EventsQuery, NewWebhook, SandboxEvent, Webhook, WebhookDelivery,
    WebhookUpdate, EVENT_TYPES,
};
use berth_store::{WebhookChanges, WebhookRecord};
use time::OffsetDateTime;

use crate::auth::Caller;
use crate::error::{HttpError, ServiceError};
use crate::extract::{ApiJson, ApiQuery};
use crate::SharedState;

struct Page {
    offset: u64,
    limit: u64,
    ascending: bool,
    types: Vec<String>,
}

fn page(query: &EventsQuery) -> Result<Page, HttpError> {
    let offset = query.offset.unwrap_or(0);
    if offset < 0 {
        return Err(ApiError::BadRequest("offset must not be negative".into()).into());
    }
    let limit = query.limit.unwrap_or(10);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::BadRequest(format!("limit must be between 1 and 100, got {limit}")).into(),
        );
    }
    let types = match &query.types {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| check_event_type(t).map(|()| t.to_string()))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    Ok(Page {
        offset: offset as u64,
        limit: limit as u64,
        ascending: query.order_asc.unwrap_or(false),
        types,
    })
}

fn check_event_type(event_type: &str) -> Result<(), HttpError> {
    if EVENT_TYPES.contains(&event_type) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "unknown event type \"{event_type}\" (one of {})",
            EVENT_TYPES.join(", ")
        ))
        .into())
    }
}

fn list(
    state: &SharedState,
    caller: &Caller,
    sandbox_id: Option<&str>,
    query: &EventsQuery,
) -> Result<Json<Vec<SandboxEvent>>, HttpError> {
    let page = page(query)?;
    let events = state.store.events(
        &caller.team.id,
        sandbox_id,
        &page.types,
        page.ascending,
        page.offset,
        page.limit,
    )?;
    Ok(Json(events.iter().map(crate::events::to_api).collect()))
}

/// Lifecycle events of the caller's team.
#[utoipa::path(get, path = "/events/sandboxes", tag = "events", params(EventsQuery),
    responses(
        (status = 200, body = Vec<SandboxEvent>, description = "Events, newest first unless orderAsc"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn team_events(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<Vec<SandboxEvent>>, HttpError> {
    list(&state, &caller, None, &query)
}

/// Lifecycle events of one sandbox of the caller's team.
#[utoipa::path(get, path = "/events/sandboxes/{sandboxID}", tag = "events",
    params(("sandboxID" = String, Path, description = "Sandbox id"), EventsQuery),
    responses(
        (status = 200, body = Vec<SandboxEvent>, description = "Events, newest first unless orderAsc"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn sandbox_events(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<Vec<SandboxEvent>>, HttpError> {
    if state.store.sandbox(&caller.team.id, &id)?.is_none() {
        return Err(ApiError::sandbox_not_found(&id).into());
    }
    list(&state, &caller, Some(&id), &query)
}

fn to_api(hook: &WebhookRecord) -> Webhook {
    Webhook {
        id: hook.id.clone(),
        team_id: hook.team_id.clone(),
        name: hook.name.clone(),
        url: hook.url.clone(),
        enabled: hook.enabled,
        events: hook.events.clone(),
        created_at: hook.created_at,
    }
}

fn check_events(events: &[String]) -> Result<(), HttpError> {
    events.iter().try_for_each(|e| check_event_type(e))
}

fn check_text(field: &str, value: &str) -> Result<(), HttpError> {
    if value.trim().is_empty() || value.len() > 1024 {
        return Err(ApiError::BadRequest(format!(
            "{field} must be 1 to 1024 characters and not blank"
        ))
        .into());
    }
    Ok(())
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("webhook \"{id}\" not found"))
}

/// Register a webhook for the caller's team.
#[utoipa::path(post, path = "/events/webhooks", tag = "events", request_body = NewWebhook,
    responses(
        (status = 201, body = Webhook, description = "The webhook"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_webhook(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<NewWebhook>,
) -> Result<(StatusCode, Json<Webhook>), HttpError> {
    check_text("name", &body.name)?;
    check_text("signatureSecret", &body.signature_secret)?;
    check_events(&body.events)?;
    state
        .webhook_guard
        .check(&body.url)
        .await
        .map_err(ServiceError::from)?;
    let hook = WebhookRecord {
        id: uuid::Uuid::new_v4().to_string(),
        team_id: caller.team.id.clone(),
        name: body.name,
        url: body.url,
        enabled: body.enabled,
        events: body.events,
        secret: body.signature_secret,
        created_at: OffsetDateTime::now_utc(),
    };
    state.store.create_webhook(&hook)?;
    Ok((StatusCode::CREATED, Json(to_api(&hook))))
}

/// Webhooks of the caller's team.
#[utoipa::path(get, path = "/events/webhooks", tag = "events",
    responses(
        (status = 200, body = Vec<Webhook>, description = "The webhooks"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_webhooks(
    State(state): State<SharedState>,
    caller: Caller,
) -> Result<Json<Vec<Webhook>>, HttpError> {
    let hooks = state.store.webhooks(&caller.team.id)?;
    Ok(Json(hooks.iter().map(to_api).collect()))
}

/// One webhook of the caller's team.
#[utoipa::path(get, path = "/events/webhooks/{webhookID}", tag = "events",
    params(("webhookID" = String, Path, description = "Webhook id")),
    responses(
        (status = 200, body = Webhook, description = "The webhook"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such webhook"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_webhook(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Webhook>, HttpError> {
    let hook = state
        .store
        .webhook(&caller.team.id, &id)?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(to_api(&hook)))
}

/// Change a webhook; absent fields stay as they are.
#[utoipa::path(patch, path = "/events/webhooks/{webhookID}", tag = "events",
    params(("webhookID" = String, Path, description = "Webhook id")),
    request_body = WebhookUpdate,
    responses(
        (status = 200, body = Webhook, description = "The updated webhook"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such webhook"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn update_webhook(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WebhookUpdate>,
) -> Result<Json<Webhook>, HttpError> {
    if let Some(name) = &body.name {
        check_text("name", name)?;
    }
    if let Some(secret) = &body.signature_secret {
        check_text("signatureSecret", secret)?;
    }
    if let Some(url) = &body.url {
        state
            .webhook_guard
            .check(url)
            .await
            .map_err(ServiceError::from)?;
    }
    if let Some(events) = &body.events {
        check_events(events)?;
    }
    let changes = WebhookChanges {
        name: body.name,
        url: body.url,
        enabled: body.enabled,
        events: body.events,
        secret: body.signature_secret,
    };
    let hook = state
        .store
        .update_webhook(&caller.team.id, &id, &changes)
        .map_err(|err| match err {
            berth_store::StoreError::NotFound { .. } => not_found(&id).into(),
            other => HttpError::from(other),
        })?;
    Ok(Json(to_api(&hook)))
}

/// Remove a webhook (and its pending deliveries).
#[utoipa::path(delete, path = "/events/webhooks/{webhookID}", tag = "events",
    params(("webhookID" = String, Path, description = "Webhook id")),
    responses(
        (status = 204, description = "The webhook was removed"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such webhook"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn delete_webhook(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    state
        .store
        .delete_webhook(&caller.team.id, &id)
        .map_err(|err| match err {
            berth_store::StoreError::NotFound { .. } => not_found(&id).into(),
            other => HttpError::from(other),
        })?;
    Ok(StatusCode::NO_CONTENT)
}

/// The newest deliveries of one webhook of the caller's team (berth's own route: E2B
/// has none), with their status, attempts and the receiver's last answer.
#[utoipa::path(get, path = "/events/webhooks/{webhookID}/deliveries", tag = "events",
    params(("webhookID" = String, Path, description = "Webhook id"), DeliveriesQuery),
    responses(
        (status = 200, body = Vec<WebhookDelivery>, description = "Deliveries, newest first"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such webhook"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn webhook_deliveries(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeliveriesQuery>,
) -> Result<Json<Vec<WebhookDelivery>>, HttpError> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::BadRequest(format!("limit must be between 1 and 100, got {limit}")).into(),
        );
    }
    let deliveries = state
        .store
        .webhook_deliveries(&caller.team.id, &id, limit as usize)
        .map_err(|err| match err {
            berth_store::StoreError::NotFound { .. } => not_found(&id).into(),
            other => HttpError::from(other),
        })?;
    Ok(Json(
        deliveries
            .into_iter()
            .map(|delivery| WebhookDelivery {
                id: delivery.id,
                event_id: delivery.event_id,
                event_type: delivery.event_type,
                status: delivery.status.as_str().to_string(),
                attempts: delivery.attempts,
                response_code: delivery.response_code,
                error: delivery.last_error,
                created_at: delivery.created_at,
                last_attempt_at: delivery.last_attempt_at,
                next_attempt_at: delivery.next_attempt_at,
            })
            .collect(),
    ))
}
