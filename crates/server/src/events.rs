//! Recording lifecycle events: stored per team, and queued for the team's webhooks in the
//! same transaction.

use berth_api::SandboxEvent;
use berth_store::{EventRecord, SandboxRecord, SnapshotRecord};
use time::OffsetDateTime;

use crate::AppState;

pub const CREATED: &str = "sandbox.lifecycle.created";
pub const KILLED: &str = "sandbox.lifecycle.killed";
pub const UPDATED: &str = "sandbox.lifecycle.updated";
pub const PAUSED: &str = "sandbox.lifecycle.paused";
pub const RESUMED: &str = "sandbox.lifecycle.resumed";
pub const CHECKPOINTED: &str = "sandbox.lifecycle.checkpointed";
/// berth's own: a snapshot was deleted (by request or by retention); the event names
/// the sandbox the snapshot was taken from.
pub const SNAPSHOT_DELETED: &str = "sandbox.snapshot.deleted";

/// The wire form of a stored event (also the webhook delivery body).
pub fn to_api(event: &EventRecord) -> SandboxEvent {
    SandboxEvent {
        version: "v1".into(),
        id: event.id.clone(),
        event_type: event.event_type.clone(),
        event_data: event.data.clone(),
        sandbox_build_id: event.build_id.clone(),
        // Events stored before execution ids were kept name the sandbox instead.
        sandbox_execution_id: if event.execution_id.is_empty() {
            event.sandbox_id.clone()
        } else {
            event.execution_id.clone()
        },
        sandbox_id: event.sandbox_id.clone(),
        sandbox_team_id: event.team_id.clone(),
        sandbox_template_id: event.template_id.clone(),
        timestamp: event.timestamp,
    }
}

/// Record `event_type` for `sandbox`. Failures are logged, never fail the API call: the
/// sandbox operation itself already happened.
pub fn record(
    state: &AppState,
    sandbox: &SandboxRecord,
    event_type: &str,
    data: Option<serde_json::Value>,
) {
    store(
        state,
        EventRecord {
            id: uuid::Uuid::new_v4().to_string(),
            team_id: sandbox.team_id.clone(),
            sandbox_id: sandbox.id.clone(),
            template_id: sandbox.template_id.clone(),
            build_id: sandbox.build_id.clone(),
            event_type: event_type.to_string(),
            data,
            timestamp: OffsetDateTime::now_utc(),
            execution_id: sandbox.execution_id.clone(),
        },
    );
}

/// Record [`SNAPSHOT_DELETED`] for `snapshot`, on the sandbox it was taken from; `data`
/// gets the snapshot's id, name and size added.
pub fn record_snapshot_deleted(
    state: &AppState,
    snapshot: &SnapshotRecord,
    mut data: serde_json::Value,
) {
    if let Some(fields) = data.as_object_mut() {
        fields.insert("snapshotID".into(), snapshot.id.clone().into());
        fields.insert("name".into(), snapshot.name.clone().into());
        fields.insert("sizeBytes".into(), snapshot.size_bytes.into());
    }
    store(
        state,
        EventRecord {
            id: uuid::Uuid::new_v4().to_string(),
            team_id: snapshot.team_id.clone(),
            sandbox_id: snapshot.source_sandbox_id.clone(),
            template_id: snapshot.template_id.clone(),
            build_id: snapshot.build_id.clone(),
            event_type: SNAPSHOT_DELETED.to_string(),
            data: Some(data),
            timestamp: OffsetDateTime::now_utc(),
            // Not one of the source's executions: reported as the sandbox id.
            execution_id: String::new(),
        },
    );
}

fn store(state: &AppState, event: EventRecord) {
    let render = |event: &EventRecord| {
        serde_json::to_string(&to_api(event)).unwrap_or_else(|_| String::from("{}"))
    };
    match state.store.record_event(&event, render) {
        Ok(()) => state.delivery_wakeup.notify_one(),
        Err(err) => tracing::error!(
            sandbox = %event.sandbox_id,
            %err,
            "recording {} event",
            event.event_type
        ),
    }
}
