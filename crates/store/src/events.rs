//! Lifecycle events, webhooks, and the deliveries queued for them (one per matching
//! webhook, in the transaction that records the event).

use rusqlite::{params, Connection, Row};
use time::OffsetDateTime;

use crate::columns::{now, string_list_json, to_ms, Columns};
use crate::db::{execute, query_all, query_opt, Bindings, Store};
use crate::error::{Result, StoreError};

/// A lifecycle event row.
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub id: String,
    pub team_id: String,
    pub sandbox_id: String,
    pub template_id: String,
    pub build_id: String,
    pub event_type: String,
    pub data: Option<serde_json::Value>,
    pub timestamp: OffsetDateTime,
    /// The sandbox's execution the event happened in (empty for rows from before
    /// execution ids were kept).
    pub execution_id: String,
}

/// A webhook registration, secret included (for signing; never sent to clients).
#[derive(Debug, Clone)]
pub struct WebhookRecord {
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    pub events: Vec<String>,
    pub secret: String,
    pub created_at: OffsetDateTime,
}

/// Changes to a webhook; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct WebhookChanges {
    pub name: Option<String>,
    pub url: Option<String>,
    pub enabled: Option<bool>,
    pub events: Option<Vec<String>>,
    pub secret: Option<String>,
}

/// A delivery waiting to be (re)tried.
#[derive(Debug, Clone)]
pub struct PendingDelivery {
    pub id: i64,
    pub webhook_id: String,
    pub url: String,
    pub secret: String,
    pub body: String,
    pub attempts: u32,
}

const EVENT_COLUMNS: &str =
    "id, team_id, sandbox_id, template_id, build_id, event_type, data, timestamp_ms, execution_id";

const WEBHOOK_COLUMNS: &str = "id, team_id, name, url, enabled, events, secret, created_at_ms";

fn event_from_row(row: &Row<'_>) -> Result<EventRecord> {
    let c = Columns::new(row, "events", &["id"])?;
    Ok(EventRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        sandbox_id: c.get("sandbox_id")?,
        template_id: c.get("template_id")?,
        build_id: c.get("build_id")?,
        event_type: c.get("event_type")?,
        data: c.json_opt("data")?,
        timestamp: c.time("timestamp_ms")?,
        execution_id: c.get("execution_id")?,
    })
}

fn webhook_from_row(row: &Row<'_>) -> Result<WebhookRecord> {
    let c = Columns::new(row, "webhooks", &["id"])?;
    Ok(WebhookRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        name: c.get("name")?,
        url: c.get("url")?,
        enabled: c.get("enabled")?,
        events: c.json("events")?,
        secret: c.get("secret")?,
        created_at: c.time("created_at_ms")?,
    })
}

fn webhook(conn: &Connection, team_id: &str, id: &str) -> Result<Option<WebhookRecord>> {
    query_opt(
        conn,
        &format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 AND id = ?2"),
        params![team_id, id],
        webhook_from_row,
    )
}

fn webhook_not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        what: "webhook",
        id: id.to_string(),
    }
}

impl Store {
    /// Record an event and queue a delivery for every enabled webhook of its team that
    /// wants it. `body` renders the event as the JSON delivered to webhooks.
    pub fn record_event(
        &self,
        event: &EventRecord,
        body: impl Fn(&EventRecord) -> String,
    ) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        execute(
            &tx,
            &format!(
                "INSERT INTO events ({EVENT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            params![
                event.id,
                event.team_id,
                event.sandbox_id,
                event.template_id,
                event.build_id,
                event.event_type,
                event.data.as_ref().map(|d| d.to_string()),
                to_ms(event.timestamp),
                event.execution_id
            ],
        )?;
        let hooks = query_all(
            &tx,
            &format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 AND enabled = ?2"),
            params![event.team_id, true],
            webhook_from_row,
        )?;
        let rendered = body(event);
        for hook in hooks {
            // An empty list subscribes to every type.
            if !hook.events.is_empty() && !hook.events.contains(&event.event_type) {
                continue;
            }
            execute(
                &tx,
                "INSERT INTO webhook_deliveries (webhook_id, event_id, body, attempts, next_attempt_ms) \
                 VALUES (?1, ?2, ?3, 0, ?4)",
                params![hook.id, event.id, rendered, to_ms(now())],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Events of a team (optionally of one sandbox), of the given types (all when
    /// empty), in recording order, paged by offset (E2B's events API pages that way).
    pub fn events(
        &self,
        team_id: &str,
        sandbox_id: Option<&str>,
        types: &[String],
        ascending: bool,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<EventRecord>> {
        let mut bindings = Bindings::default();
        let mut conditions = vec![format!("team_id = {}", bindings.bind(team_id.to_string()))];
        if let Some(sandbox_id) = sandbox_id {
            conditions.push(format!(
                "sandbox_id = {}",
                bindings.bind(sandbox_id.to_string())
            ));
        }
        if !types.is_empty() {
            conditions.push(format!(
                "event_type IN ({})",
                bindings.bind_list(types.iter().cloned())
            ));
        }
        let order = if ascending { "ASC" } else { "DESC" };
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE {} ORDER BY seq {order} LIMIT {} OFFSET {}",
            conditions.join(" AND "),
            bindings.bind(i64::try_from(limit).unwrap_or(i64::MAX)),
            bindings.bind(i64::try_from(offset).unwrap_or(i64::MAX)),
        );
        query_all(&self.conn(), &sql, bindings.params(), event_from_row)
    }

    pub fn create_webhook(&self, hook: &WebhookRecord) -> Result<()> {
        execute(
            &self.conn(),
            &format!(
                "INSERT INTO webhooks ({WEBHOOK_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ),
            params![
                hook.id,
                hook.team_id,
                hook.name,
                hook.url,
                hook.enabled,
                string_list_json(&hook.events),
                hook.secret,
                to_ms(hook.created_at)
            ],
        )?;
        Ok(())
    }

    /// Every webhook of a team, oldest first (a team has a handful; not paged).
    pub fn webhooks(&self, team_id: &str) -> Result<Vec<WebhookRecord>> {
        query_all(
            &self.conn(),
            &format!(
                "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 ORDER BY created_at_ms, id"
            ),
            [team_id],
            webhook_from_row,
        )
    }

    pub fn webhook(&self, team_id: &str, id: &str) -> Result<Option<WebhookRecord>> {
        webhook(&self.conn(), team_id, id)
    }

    pub fn update_webhook(
        &self,
        team_id: &str,
        id: &str,
        changes: &WebhookChanges,
    ) -> Result<WebhookRecord> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut hook = webhook(&tx, team_id, id)?.ok_or_else(|| webhook_not_found(id))?;
        if let Some(name) = &changes.name {
            hook.name = name.clone();
        }
        if let Some(url) = &changes.url {
            hook.url = url.clone();
        }
        if let Some(enabled) = changes.enabled {
            hook.enabled = enabled;
        }
        if let Some(events) = &changes.events {
            hook.events = events.clone();
        }
        if let Some(secret) = &changes.secret {
            hook.secret = secret.clone();
        }
        execute(
            &tx,
            "UPDATE webhooks SET name = ?1, url = ?2, enabled = ?3, events = ?4, secret = ?5 \
             WHERE id = ?6 AND team_id = ?7",
            params![
                hook.name,
                hook.url,
                hook.enabled,
                string_list_json(&hook.events),
                hook.secret,
                id,
                team_id
            ],
        )?;
        tx.commit()?;
        Ok(hook)
    }

    /// Remove a webhook and its pending deliveries.
    pub fn delete_webhook(&self, team_id: &str, id: &str) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let changed = execute(
            &tx,
            "DELETE FROM webhooks WHERE id = ?1 AND team_id = ?2",
            params![id, team_id],
        )?;
        if changed == 0 {
            return Err(webhook_not_found(id));
        }
        execute(
            &tx,
            "DELETE FROM webhook_deliveries WHERE webhook_id = ?1",
            [id],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Deliveries due at `at`, oldest first.
    pub fn due_deliveries(&self, at: OffsetDateTime, limit: usize) -> Result<Vec<PendingDelivery>> {
        query_all(
            &self.conn(),
            "SELECT d.id, d.webhook_id, w.url, w.secret, d.body, d.attempts \
             FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id \
             WHERE d.next_attempt_ms <= ?1 ORDER BY d.next_attempt_ms, d.id LIMIT ?2",
            params![to_ms(at), i64::try_from(limit).unwrap_or(i64::MAX)],
            |row| {
                let c = Columns::new(row, "webhook_deliveries", &["id"])?;
                Ok(PendingDelivery {
                    id: c.get("id")?,
                    webhook_id: c.get("webhook_id")?,
                    url: c.get("url")?,
                    secret: c.get("secret")?,
                    body: c.get("body")?,
                    attempts: c.get("attempts")?,
                })
            },
        )
    }

    /// Earliest time any delivery is due.
    pub fn next_delivery_at(&self) -> Result<Option<OffsetDateTime>> {
        query_opt(
            &self.conn(),
            "SELECT id, next_attempt_ms FROM webhook_deliveries ORDER BY next_attempt_ms LIMIT 1",
            [],
            |row| Columns::new(row, "webhook_deliveries", &["id"])?.time("next_attempt_ms"),
        )
    }

    /// A delivery succeeded (or is abandoned): forget it.
    pub fn finish_delivery(&self, id: i64) -> Result<()> {
        execute(
            &self.conn(),
            "DELETE FROM webhook_deliveries WHERE id = ?1",
            [id],
        )?;
        Ok(())
    }

    /// A delivery failed: try again at `next`.
    pub fn retry_delivery(&self, id: i64, next: OffsetDateTime) -> Result<()> {
        execute(
            &self.conn(),
            "UPDATE webhook_deliveries SET attempts = attempts + 1, next_attempt_ms = ?1 WHERE id = ?2",
            params![to_ms(next), id],
        )?;
        Ok(())
    }
}
