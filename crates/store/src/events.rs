//! Lifecycle events, webhooks, and the deliveries queued for them (one per matching
//! webhook, in the transaction that records the event).

use time::OffsetDateTime;

use crate::columns::{now, string_list_json, to_ms, Columns};
use crate::db::{params, Bindings, Conn, Row, Store};
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

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    /// Not delivered yet; tried again at its next attempt time.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Given up after the last attempt failed.
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        }
    }
}

/// One delivery of an event to a webhook, as its history shows it.
#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    pub id: i64,
    pub webhook_id: String,
    pub event_id: String,
    /// The event's type (empty when the event row is gone).
    pub event_type: String,
    pub status: DeliveryStatus,
    pub attempts: u32,
    /// The receiver's answer to the last attempt, if it answered.
    pub response_code: Option<u16>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    pub created_at: OffsetDateTime,
    pub last_attempt_at: Option<OffsetDateTime>,
    /// When a pending delivery is tried next.
    pub next_attempt_at: Option<OffsetDateTime>,
}

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryAttempt {
    /// The receiver answered 2xx.
    pub delivered: bool,
    pub response_code: Option<u16>,
    pub error: Option<String>,
}

/// Finished deliveries kept per webhook (the newest); older ones are forgotten.
pub const DELIVERY_HISTORY: usize = 100;

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

fn webhook(conn: &mut Conn<'_>, team_id: &str, id: &str) -> Result<Option<WebhookRecord>> {
    conn.query_opt(
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
        self.write(|tx| {
            tx.execute(
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
            let hooks = tx.query_all(
                &format!(
                    "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 AND enabled = ?2"
                ),
                params![event.team_id, true],
                webhook_from_row,
            )?;
            let rendered = body(event);
            for hook in hooks {
                // An empty list subscribes to every type.
                if !hook.events.is_empty() && !hook.events.contains(&event.event_type) {
                    continue;
                }
                tx.execute(
                    "INSERT INTO webhook_deliveries (webhook_id, event_id, body, attempts, \
                 next_attempt_ms, status, created_at_ms) VALUES (?1, ?2, ?3, 0, ?4, 'pending', ?4)",
                    params![hook.id, event.id, rendered, to_ms(now())],
                )?;
            }
            Ok(())
        })
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
        self.conn()?
            .query_all(&sql, bindings.params(), event_from_row)
    }

    pub fn create_webhook(&self, hook: &WebhookRecord) -> Result<()> {
        self.conn()?.execute(
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
        self.conn()?.query_all(
            &format!(
                "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 ORDER BY created_at_ms, id"
            ),
            params![team_id],
            webhook_from_row,
        )
    }

    pub fn webhook(&self, team_id: &str, id: &str) -> Result<Option<WebhookRecord>> {
        webhook(&mut self.conn()?, team_id, id)
    }

    pub fn update_webhook(
        &self,
        team_id: &str,
        id: &str,
        changes: &WebhookChanges,
    ) -> Result<WebhookRecord> {
        self.write(|tx| {
            let mut hook = webhook(tx, team_id, id)?.ok_or_else(|| webhook_not_found(id))?;
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
            tx.execute(
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
            Ok(hook)
        })
    }

    /// Remove a webhook and its pending deliveries.
    pub fn delete_webhook(&self, team_id: &str, id: &str) -> Result<()> {
        self.write(|tx| {
            let changed = tx.execute(
                "DELETE FROM webhooks WHERE id = ?1 AND team_id = ?2",
                params![id, team_id],
            )?;
            if changed == 0 {
                return Err(webhook_not_found(id));
            }
            tx.execute(
                "DELETE FROM webhook_deliveries WHERE webhook_id = ?1",
                params![id],
            )?;
            Ok(())
        })
    }

    /// Claims up to `limit` deliveries due at `at` for `claim_for`: they are returned
    /// to this caller and to no other until then (several `berth api` instances deliver
    /// from one database; a claim whose holder died lapses and the delivery is due
    /// again). The claimer records the outcome with [`Store::record_delivery_attempt`].
    pub fn claim_due_deliveries(
        &self,
        at: OffsetDateTime,
        limit: usize,
        claim_for: std::time::Duration,
    ) -> Result<Vec<PendingDelivery>> {
        let until = to_ms(at) + i64::try_from(claim_for.as_millis()).unwrap_or(i64::MAX / 2);
        let mut conn = self.conn()?;
        // The outer conditions are checked again on each row as it is updated (SQLite
        // has one writer; Postgres re-reads a row another transaction just updated), so
        // of two claimers racing for a delivery only the first takes it.
        let claimed: Vec<(i64, String, String, u32)> = conn.query_all(
            "UPDATE webhook_deliveries SET next_attempt_ms = ?3 \
             WHERE status = 'pending' AND next_attempt_ms <= ?1 AND id IN ( \
                 SELECT id FROM webhook_deliveries WHERE status = 'pending' \
                 AND next_attempt_ms <= ?1 ORDER BY next_attempt_ms, id LIMIT ?2) \
             RETURNING id, webhook_id, body, attempts",
            params![to_ms(at), i64::try_from(limit).unwrap_or(i64::MAX), until],
            |row| {
                let c = Columns::new(row, "webhook_deliveries", &["id"])?;
                Ok((
                    c.get("id")?,
                    c.get("webhook_id")?,
                    c.get("body")?,
                    c.get("attempts")?,
                ))
            },
        )?;
        let mut due = Vec::with_capacity(claimed.len());
        for (id, webhook_id, body, attempts) in claimed {
            let target = conn.query_opt(
                "SELECT id, url, secret FROM webhooks WHERE id = ?1",
                params![webhook_id],
                |row| {
                    let c = Columns::new(row, "webhooks", &["id"])?;
                    Ok((c.get::<String>("url")?, c.get::<String>("secret")?))
                },
            )?;
            // A webhook deleted meanwhile took its deliveries with it.
            if let Some((url, secret)) = target {
                due.push(PendingDelivery {
                    id,
                    webhook_id,
                    url,
                    secret,
                    body,
                    attempts,
                });
            }
        }
        due.sort_by_key(|delivery| delivery.id);
        Ok(due)
    }

    /// Earliest time any delivery is due.
    pub fn next_delivery_at(&self) -> Result<Option<OffsetDateTime>> {
        self.conn()?.query_opt(
            "SELECT id, next_attempt_ms FROM webhook_deliveries WHERE status = 'pending' \
             ORDER BY next_attempt_ms LIMIT 1",
            params![],
            |row| Columns::new(row, "webhook_deliveries", &["id"])?.time("next_attempt_ms"),
        )
    }

    /// Records attempt `attempt` of delivery `id`: with `retry_at`, it stays pending
    /// until then; without, it is finished (delivered or failed) and kept in its
    /// webhook's history, of which the newest [`DELIVERY_HISTORY`] stay.
    pub fn record_delivery_attempt(
        &self,
        id: i64,
        attempt: &DeliveryAttempt,
        retry_at: Option<OffsetDateTime>,
    ) -> Result<()> {
        let status = match (attempt.delivered, retry_at) {
            (true, _) => DeliveryStatus::Delivered,
            (false, Some(_)) => DeliveryStatus::Pending,
            (false, None) => DeliveryStatus::Failed,
        };
        self.write(|tx| {
        tx.execute(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, status = ?2, \
             response_code = ?3, last_error = ?4, last_attempt_ms = ?5, \
             next_attempt_ms = coalesce(?6, next_attempt_ms) WHERE id = ?1",
            params![
                id,
                status.as_str(),
                attempt.response_code,
                attempt.error,
                to_ms(now()),
                retry_at.map(to_ms),
            ],
        )?;
        if status != DeliveryStatus::Pending {
            tx.execute(
            "DELETE FROM webhook_deliveries WHERE status <> 'pending' \
                 AND webhook_id = (SELECT webhook_id FROM webhook_deliveries WHERE id = ?1) \
                 AND id NOT IN (SELECT d.id FROM webhook_deliveries d \
                     WHERE d.webhook_id = (SELECT webhook_id FROM webhook_deliveries WHERE id = ?1) \
                     AND d.status <> 'pending' ORDER BY d.id DESC LIMIT ?2)",
                params![id, DELIVERY_HISTORY as i64],
            )?;
        }
        Ok(())
        })
    }

    /// The newest `limit` deliveries of webhook `webhook_id` of `team_id`, newest first;
    /// [`StoreError::NotFound`] when the team has no such webhook.
    pub fn webhook_deliveries(
        &self,
        team_id: &str,
        webhook_id: &str,
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>> {
        let mut conn = self.conn()?;
        if webhook(&mut conn, team_id, webhook_id)?.is_none() {
            return Err(webhook_not_found(webhook_id));
        }
        conn.query_all(
            "SELECT d.id, d.webhook_id, d.event_id, coalesce(e.event_type, '') AS event_type, \
             d.status, d.attempts, d.response_code, d.last_error, d.created_at_ms, \
             d.last_attempt_ms, d.next_attempt_ms \
             FROM webhook_deliveries d LEFT JOIN events e ON e.id = d.event_id \
             WHERE d.webhook_id = ?1 ORDER BY d.id DESC LIMIT ?2",
            params![webhook_id, i64::try_from(limit).unwrap_or(i64::MAX)],
            |row| {
                let c = Columns::new(row, "webhook_deliveries", &["id"])?;
                let status = c.word("status", "pending, delivered or failed", |text| {
                    [
                        DeliveryStatus::Pending,
                        DeliveryStatus::Delivered,
                        DeliveryStatus::Failed,
                    ]
                    .into_iter()
                    .find(|status| status.as_str() == text)
                })?;
                Ok(DeliveryRecord {
                    id: c.get("id")?,
                    webhook_id: c.get("webhook_id")?,
                    event_id: c.get("event_id")?,
                    event_type: c.get("event_type")?,
                    status,
                    attempts: c.get("attempts")?,
                    response_code: c.get("response_code")?,
                    last_error: c.get("last_error")?,
                    created_at: c.time("created_at_ms")?,
                    last_attempt_at: c.time_opt("last_attempt_ms")?,
                    next_attempt_at: match status {
                        DeliveryStatus::Pending => Some(c.time("next_attempt_ms")?),
                        _ => None,
                    },
                })
            },
        )
    }
}
