//! Sandboxes (running, paused, killed; their lifecycle), their metadata, idempotency
//! keys of creates, and the spans team metrics are computed from.
//!
//! `sandboxes.metadata` (JSON) is what records are read from; `sandbox_metadata` holds
//! the same pairs one per row so listings filter by them in SQL with a plain index. Both
//! are written in the one transaction of [`Store::insert_sandbox`]; metadata never
//! changes after that.

use time::OffsetDateTime;

use crate::columns::{now, string_map_json, to_ms, Columns};
use crate::cursor::{self, Listing, Position};
use crate::db::{params, Bindings, Row, Store, Value};
use crate::error::{Result, StoreError};

/// Whether a sandbox row describes a live sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStatus {
    Running,
    /// Stopped with its disk and, with `memory`, its processes' memory kept.
    Paused {
        memory: bool,
    },
    Killed,
}

impl SandboxStatus {
    const RUNNING: &str = "running";
    const PAUSED: &str = "paused";
    const KILLED: &str = "killed";

    fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Running => Self::RUNNING,
            SandboxStatus::Paused { .. } => Self::PAUSED,
            SandboxStatus::Killed => Self::KILLED,
        }
    }

    fn paused_memory(self) -> Option<bool> {
        match self {
            SandboxStatus::Paused { memory } => Some(memory),
            _ => None,
        }
    }
}

/// What happens at a sandbox's end time and on traffic while it is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// Pause instead of kill at the end time.
    pub auto_pause: bool,
    /// An automatic pause keeps memory (else only the disk).
    pub auto_pause_memory: bool,
    /// Traffic through the proxy resumes the sandbox when it is paused (with memory).
    pub auto_resume: bool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            auto_pause: false,
            auto_pause_memory: true,
            auto_resume: false,
        }
    }
}

/// A sandbox as the control plane records it.
#[derive(Debug, Clone)]
pub struct SandboxRecord {
    pub id: String,
    pub team_id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub build_id: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub metadata: berth_api::StringMap,
    pub envd_version: String,
    pub envd_access_token: Option<String>,
    pub allow_internet_access: Option<bool>,
    pub started_at: OffsetDateTime,
    pub end_at: OffsetDateTime,
    pub status: SandboxStatus,
    /// Env vars given at create (envd gets them again when it boots afresh).
    pub env_vars: berth_api::StringMap,
    /// Time to live given at create, in seconds (used again on automatic resume).
    pub timeout_secs: i64,
    pub lifecycle: Lifecycle,
    /// Network policy as the runtime's networking serialises it; `None` = E2B's default
    /// (internet access, public traffic allowed). Opaque to the store.
    pub network: Option<serde_json::Value>,
    /// Token user ports need (`e2b-traffic-access-token`) when public traffic is off.
    pub traffic_access_token: Option<String>,
    /// Volumes mounted, in mount order; fixed at create.
    pub volume_mounts: Vec<crate::VolumeMountRecord>,
    /// The current execution (E2B's `sandboxExecutionId`): new at create and at every
    /// resume; empty for rows written before execution ids existed.
    pub execution_id: String,
    /// The snapshot this sandbox was started from (None: a template or a fork); while
    /// the sandbox lives, retention keeps that snapshot.
    pub from_snapshot: Option<String>,
}

/// What a team's running sandboxes hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TeamUsage {
    pub sandboxes: u64,
    pub cpu_count: u64,
    pub memory_mb: u64,
}

/// A paused sandbox, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedSandbox {
    pub id: String,
    pub team_id: String,
    /// When it was paused (rows paused before this was kept: their last `paused`
    /// event, else their start).
    pub paused_at: OffsetDateTime,
}

/// Filters of a sandbox listing.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    /// Every pair must be present in the sandbox's metadata.
    pub metadata: Vec<(String, String)>,
    /// Template id or alias.
    pub template: Option<String>,
    pub started_after: Option<OffsetDateTime>,
    pub ascending: bool,
    pub states: StateFilter,
}

/// Which live states a listing includes (default: running only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateFilter {
    pub running: bool,
    pub paused: bool,
}

impl Default for StateFilter {
    fn default() -> Self {
        StateFilter {
            running: true,
            paused: false,
        }
    }
}

impl StateFilter {
    pub(crate) fn statuses(self) -> Vec<String> {
        let mut statuses = Vec::new();
        if self.running {
            statuses.push(SandboxStatus::RUNNING.to_string());
        }
        if self.paused {
            statuses.push(SandboxStatus::PAUSED.to_string());
        }
        statuses
    }
}

/// One page of a sandbox listing.
#[derive(Debug, Clone)]
pub struct SandboxPage {
    pub sandboxes: Vec<SandboxRecord>,
    /// Opaque cursor for the next page, when more rows match.
    pub next_token: Option<String>,
    /// Running sandboxes matching the filters, before paging.
    pub total: u64,
}

const SANDBOX_COLUMNS: &str = "id, team_id, template_id, alias, build_id, cpu_count, memory_mb, \
     disk_size_mb, metadata, envd_version, envd_access_token, allow_internet_access, \
     started_at_ms, end_at_ms, status, paused_memory, env_vars, timeout_secs, auto_pause, \
     auto_pause_memory, auto_resume, network, traffic_access_token, volume_mounts, execution_id, \
     from_snapshot";

/// Live rows: the states [`SandboxStatus::Running`] and [`SandboxStatus::Paused`].
const LIVE: &str = "status IN ('running', 'paused')";

fn sandbox_from_row(row: &Row<'_>) -> Result<SandboxRecord> {
    let c = Columns::new(row, "sandboxes", &["id"])?;
    let paused_memory: Option<bool> = c.get("paused_memory")?;
    let status = c.word("status", "running, paused or killed", |text| match text {
        SandboxStatus::RUNNING => Some(SandboxStatus::Running),
        // Rows paused before pauses without memory existed have no paused_memory.
        SandboxStatus::PAUSED => Some(SandboxStatus::Paused {
            memory: paused_memory.unwrap_or(true),
        }),
        SandboxStatus::KILLED => Some(SandboxStatus::Killed),
        _ => None,
    })?;
    Ok(SandboxRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        template_id: c.get("template_id")?,
        alias: c.get("alias")?,
        build_id: c.get("build_id")?,
        cpu_count: c.get("cpu_count")?,
        memory_mb: c.get("memory_mb")?,
        disk_size_mb: c.get("disk_size_mb")?,
        metadata: c.json("metadata")?,
        envd_version: c.get("envd_version")?,
        envd_access_token: c.get("envd_access_token")?,
        allow_internet_access: c.get("allow_internet_access")?,
        started_at: c.time("started_at_ms")?,
        end_at: c.time("end_at_ms")?,
        status,
        env_vars: c.json("env_vars")?,
        timeout_secs: c.get("timeout_secs")?,
        lifecycle: Lifecycle {
            auto_pause: c.get("auto_pause")?,
            auto_pause_memory: c.get("auto_pause_memory")?,
            auto_resume: c.get("auto_resume")?,
        },
        network: c.json_opt("network")?,
        traffic_access_token: c.get("traffic_access_token")?,
        volume_mounts: c.json("volume_mounts")?,
        execution_id: c.get("execution_id")?,
        from_snapshot: c.get("from_snapshot")?,
    })
}

/// The conditions of `filter` for `team_id`, without the cursor.
fn filter_conditions(
    bindings: &mut Bindings,
    team_id: &str,
    filter: &SandboxFilter,
    statuses: Vec<String>,
) -> Vec<String> {
    let mut conditions = vec![
        format!("team_id = {}", bindings.bind(team_id.to_string())),
        format!("status IN ({})", bindings.bind_list(statuses)),
    ];
    if let Some(template) = &filter.template {
        let param = bindings.bind(template.clone());
        conditions.push(format!("(template_id = {param} OR alias = {param})"));
    }
    if let Some(after) = filter.started_after {
        conditions.push(format!("started_at_ms >= {}", bindings.bind(to_ms(after))));
    }
    for (key, value) in &filter.metadata {
        let key = bindings.bind(key.clone());
        let value = bindings.bind(value.clone());
        conditions.push(format!(
            "EXISTS (SELECT 1 FROM sandbox_metadata m WHERE m.sandbox_id = sandboxes.id \
             AND m.key = {key} AND m.value = {value})"
        ));
    }
    conditions
}

/// The SQL of one page of a listing: rows matching `filter` strictly after `after`, in
/// the listing's order, one more than `limit` (to tell whether another page follows).
pub(crate) fn page_query(
    team_id: &str,
    filter: &SandboxFilter,
    statuses: Vec<String>,
    after: Option<Position>,
    limit: usize,
) -> (String, Bindings) {
    let listing = Listing::Sandboxes {
        ascending: filter.ascending,
    };
    let mut bindings = Bindings::default();
    let mut conditions = filter_conditions(&mut bindings, team_id, filter, statuses);
    if let Some(after) = after {
        let ms = bindings.bind(after.ms);
        let id = bindings.bind(after.id);
        conditions.push(cursor::after(listing, "started_at_ms", "id", &ms, &id));
    }
    let sql = format!(
        "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE {} {} LIMIT {}",
        conditions.join(" AND "),
        cursor::order_by(listing, "started_at_ms", "id"),
        bindings.bind(cursor::fetch_limit(limit)),
    );
    (sql, bindings)
}

impl Store {
    /// Record live sandbox `id`'s new network policy.
    pub fn set_network(&self, id: &str, network: &serde_json::Value) -> Result<()> {
        let changed = self.conn()?.execute(
            &format!("UPDATE sandboxes SET network = ?2 WHERE id = ?1 AND {LIVE}"),
            params![id, network.to_string()],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                what: "sandbox",
                id: id.to_string(),
            });
        }
        Ok(())
    }

    /// Records a new sandbox with its metadata and volume rows, in one write
    /// transaction.
    pub fn insert_sandbox(&self, sandbox: &SandboxRecord) -> Result<()> {
        let volume_mounts =
            serde_json::to_string(&sandbox.volume_mounts).map_err(|err| StoreError::Encode {
                what: "volume mounts",
                source: err,
            })?;
        self.write(|tx| {
            tx.execute(
                &format!(
                    "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
                 ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26)"
                ),
                params![
                    sandbox.id,
                    sandbox.team_id,
                    sandbox.template_id,
                    sandbox.alias,
                    sandbox.build_id,
                    sandbox.cpu_count,
                    sandbox.memory_mb,
                    sandbox.disk_size_mb,
                    string_map_json(&sandbox.metadata),
                    sandbox.envd_version,
                    sandbox.envd_access_token,
                    sandbox.allow_internet_access,
                    to_ms(sandbox.started_at),
                    to_ms(sandbox.end_at),
                    sandbox.status.as_str(),
                    sandbox.status.paused_memory(),
                    string_map_json(&sandbox.env_vars),
                    sandbox.timeout_secs,
                    sandbox.lifecycle.auto_pause,
                    sandbox.lifecycle.auto_pause_memory,
                    sandbox.lifecycle.auto_resume,
                    sandbox.network.as_ref().map(|v| v.to_string()),
                    sandbox.traffic_access_token,
                    volume_mounts,
                    sandbox.execution_id,
                    sandbox.from_snapshot,
                ],
            )?;
            for (position, mount) in sandbox.volume_mounts.iter().enumerate() {
                tx.execute(
                "INSERT INTO sandbox_volumes (sandbox_id, position, volume_id) VALUES (?1, ?2, ?3)",
                params![sandbox.id, position as i64, mount.volume_id],
            )?;
            }
            for (key, value) in &sandbox.metadata {
                tx.execute(
                    "INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?1, ?2, ?3)",
                    params![sandbox.id, key, value],
                )?;
            }
            Ok(())
        })
    }

    fn sandbox_where(&self, condition: &str, params: &[Value]) -> Result<Option<SandboxRecord>> {
        self.conn()?.query_opt(
            &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE {condition}"),
            params,
            sandbox_from_row,
        )
    }

    fn sandboxes_where(&self, condition: &str, params: &[Value]) -> Result<Vec<SandboxRecord>> {
        self.conn()?.query_all(
            &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE {condition}"),
            params,
            sandbox_from_row,
        )
    }

    /// A sandbox of `team_id` in any state (killed ones keep their logs and metrics).
    pub fn sandbox(&self, team_id: &str, id: &str) -> Result<Option<SandboxRecord>> {
        self.sandbox_where("id = ?1 AND team_id = ?2", params![id, team_id])
    }

    /// A running sandbox of `team_id`.
    pub fn running_sandbox(&self, team_id: &str, id: &str) -> Result<Option<SandboxRecord>> {
        self.sandbox_where(
            "id = ?1 AND team_id = ?2 AND status = 'running'",
            params![id, team_id],
        )
    }

    /// A running or paused sandbox of `team_id`.
    pub fn live_sandbox(&self, team_id: &str, id: &str) -> Result<Option<SandboxRecord>> {
        self.sandbox_where(
            &format!("id = ?1 AND team_id = ?2 AND {LIVE}"),
            params![id, team_id],
        )
    }

    /// A running or paused sandbox by id, whatever its team (for the proxy).
    pub fn live_sandbox_any_team(&self, id: &str) -> Result<Option<SandboxRecord>> {
        self.sandbox_where(&format!("id = ?1 AND {LIVE}"), params![id])
    }

    /// How many sandboxes of `team_id` are running now, and the CPUs and memory they
    /// were given.
    pub fn team_usage(&self, team_id: &str) -> Result<TeamUsage> {
        // SUM of BIGINT is NUMERIC on Postgres: cast back to the one integer type.
        let usage = self.conn()?.query_opt(
            "SELECT COUNT(*) AS sandboxes, CAST(coalesce(SUM(cpu_count), 0) AS BIGINT) AS cpus, \
             CAST(coalesce(SUM(memory_mb), 0) AS BIGINT) AS memory \
             FROM sandboxes WHERE team_id = ?1 AND status = 'running'",
            params![team_id],
            |row| {
                let c = Columns::new(row, "sandboxes", &[])?;
                Ok((
                    c.get::<i64>("sandboxes")?,
                    c.get::<i64>("cpus")?,
                    c.get::<i64>("memory")?,
                ))
            },
        )?;
        let (sandboxes, cpu_count, memory_mb) = usage.unwrap_or_default();
        Ok(TeamUsage {
            sandboxes: u64::try_from(sandboxes).unwrap_or(0),
            cpu_count: u64::try_from(cpu_count).unwrap_or(0),
            memory_mb: u64::try_from(memory_mb).unwrap_or(0),
        })
    }

    /// Every paused sandbox of every team with the time it was paused, oldest pause
    /// first (for retention).
    pub fn paused_sandboxes_by_age(&self) -> Result<Vec<PausedSandbox>> {
        self.conn()?.query_all(
            "SELECT id, team_id, coalesce(paused_at_ms, started_at_ms) AS paused_ms \
             FROM sandboxes WHERE status = 'paused' ORDER BY paused_ms, id",
            params![],
            |row| {
                let c = Columns::new(row, "sandboxes", &["id"])?;
                Ok(PausedSandbox {
                    id: c.get("id")?,
                    team_id: c.get("team_id")?,
                    paused_at: c.time("paused_ms")?,
                })
            },
        )
    }

    /// Ids of the snapshots live (running or paused) sandboxes were started from.
    pub fn snapshots_in_use(&self) -> Result<std::collections::HashSet<String>> {
        let ids = self.conn()?.query_all(
            &format!(
                "SELECT DISTINCT from_snapshot FROM sandboxes \
                 WHERE from_snapshot IS NOT NULL AND {LIVE}"
            ),
            params![],
            |row| Columns::new(row, "sandboxes", &[])?.get("from_snapshot"),
        )?;
        Ok(ids.into_iter().collect())
    }

    /// Every running sandbox of every team.
    pub fn all_running_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        self.sandboxes_where("status = 'running' ORDER BY started_at_ms, id", params![])
    }

    /// Every paused sandbox of every team.
    pub fn all_paused_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        self.sandboxes_where("status = 'paused' ORDER BY started_at_ms, id", params![])
    }

    /// Running sandboxes whose end time has passed.
    pub fn expired_sandboxes(&self, at: OffsetDateTime) -> Result<Vec<SandboxRecord>> {
        self.sandboxes_where("status = 'running' AND end_at_ms <= ?1", params![to_ms(at)])
    }

    /// Earliest end time among running sandboxes (the reaper sleeps until then).
    pub fn next_end_at(&self) -> Result<Option<OffsetDateTime>> {
        self.conn()?.query_opt(
            "SELECT id, end_at_ms FROM sandboxes WHERE status = 'running' \
             ORDER BY end_at_ms LIMIT 1",
            params![],
            |row| Columns::new(row, "sandboxes", &["id"])?.time("end_at_ms"),
        )
    }

    /// Live sandboxes of a team matching `filter`, in start order (then id), at most
    /// `limit` after the cursor `next_token` of a previous page.
    pub fn list_sandboxes(
        &self,
        team_id: &str,
        filter: &SandboxFilter,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<SandboxPage> {
        let listing = Listing::Sandboxes {
            ascending: filter.ascending,
        };
        let after = next_token
            .map(|token| cursor::decode(listing, token))
            .transpose()?;
        let statuses = filter.states.statuses();
        if statuses.is_empty() {
            return Ok(SandboxPage {
                sandboxes: Vec::new(),
                next_token: None,
                total: 0,
            });
        }

        let (page_sql, page) = page_query(team_id, filter, statuses, after, limit);
        // One read transaction: the page and the total see the same rows.
        let (rows, total) = self.read(|tx| {
            let rows = tx.query_all(&page_sql, page.params(), sandbox_from_row)?;
            let total = if filter.states.running {
                let mut count = Bindings::default();
                let conditions = filter_conditions(
                    &mut count,
                    team_id,
                    filter,
                    StateFilter::default().statuses(),
                );
                let count_sql = format!(
                    "SELECT COUNT(*) AS n FROM sandboxes WHERE {}",
                    conditions.join(" AND ")
                );
                tx.query_count(&count_sql, count.params())?.max(0) as u64
            } else {
                0
            };
            Ok((rows, total))
        })?;

        let (sandboxes, next_token) = cursor::paginate(listing, rows, limit, |s| Position {
            ms: to_ms(s.started_at),
            id: s.id.clone(),
        });
        Ok(SandboxPage {
            sandboxes,
            next_token,
            total,
        })
    }

    /// Turn pausing at the end time on or off for a live sandbox.
    pub fn set_auto_pause(&self, id: &str, auto_pause: bool) -> Result<()> {
        self.conn()?.execute(
            &format!("UPDATE sandboxes SET auto_pause = ?1 WHERE id = ?2 AND {LIVE}"),
            params![auto_pause, id],
        )?;
        Ok(())
    }

    /// Set the end time of a running sandbox.
    pub fn set_end_at(&self, team_id: &str, id: &str, end_at: OffsetDateTime) -> Result<()> {
        let changed = self.conn()?.execute(
            "UPDATE sandboxes SET end_at_ms = ?1 WHERE id = ?2 AND team_id = ?3 AND status = 'running'",
            params![to_ms(end_at), id, team_id],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                what: "sandbox",
                id: id.to_string(),
            });
        }
        Ok(())
    }

    /// Mark a running sandbox paused. False when it was not running.
    pub fn mark_paused(&self, id: &str, memory: bool) -> Result<bool> {
        let changed = self.conn()?.execute(
            "UPDATE sandboxes SET status = 'paused', paused_memory = ?1, paused_at_ms = ?3 \
             WHERE id = ?2 AND status = 'running'",
            params![memory, id, to_ms(now())],
        )?;
        Ok(changed == 1)
    }

    /// Mark a paused sandbox running again until `end_at`, in its new execution
    /// `execution_id`. False when it was not paused.
    pub fn mark_resumed(
        &self,
        id: &str,
        end_at: OffsetDateTime,
        execution_id: &str,
    ) -> Result<bool> {
        let changed = self.conn()?.execute(
            "UPDATE sandboxes SET status = 'running', paused_memory = NULL, paused_at_ms = NULL, \
             end_at_ms = ?1, execution_id = ?3 WHERE id = ?2 AND status = 'paused'",
            params![to_ms(end_at), id, execution_id],
        )?;
        Ok(changed == 1)
    }

    /// Mark a running or paused sandbox killed. Returns false when it was neither
    /// (someone else killed it first), so exactly one caller records the `killed` event.
    pub fn mark_killed(&self, id: &str) -> Result<bool> {
        let changed = self.conn()?.execute(
            &format!(
                "UPDATE sandboxes SET status = 'killed', paused_memory = NULL, \
                 end_at_ms = CASE WHEN end_at_ms < ?1 THEN end_at_ms ELSE ?1 END \
                 WHERE id = ?2 AND {LIVE}"
            ),
            params![to_ms(now()), id],
        )?;
        Ok(changed == 1)
    }

    /// Remember which sandbox an idempotency key created.
    pub fn remember_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        sandbox_id: &str,
    ) -> Result<()> {
        self.conn()?.execute(
            "INSERT INTO idempotency_keys (team_id, key, sandbox_id, created_at_ms) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (team_id, key) DO UPDATE SET \
             sandbox_id = excluded.sandbox_id, created_at_ms = excluded.created_at_ms",
            params![team_id, key, sandbox_id, to_ms(now())],
        )?;
        Ok(())
    }

    /// Forget idempotency keys recorded before `before`; returns how many.
    pub fn forget_idempotency_keys(&self, before: OffsetDateTime) -> Result<usize> {
        self.conn()?.execute(
            "DELETE FROM idempotency_keys WHERE created_at_ms < ?1",
            params![to_ms(before)],
        )
    }

    /// Sandbox an idempotency key created, if any.
    pub fn idempotent_sandbox(&self, team_id: &str, key: &str) -> Result<Option<String>> {
        self.conn()?.query_opt(
            "SELECT team_id, key, sandbox_id FROM idempotency_keys WHERE team_id = ?1 AND key = ?2",
            params![team_id, key],
            |row| Columns::new(row, "idempotency_keys", &["team_id", "key"])?.get("sandbox_id"),
        )
    }

    /// Sandboxes of a team started in `[from, to]` (ms), with their start and kill times,
    /// for team metrics.
    pub fn team_sandbox_spans(
        &self,
        team_id: &str,
        from: OffsetDateTime,
        to: OffsetDateTime,
    ) -> Result<Vec<(OffsetDateTime, Option<OffsetDateTime>)>> {
        self.conn()?.query_all(
            "SELECT id, started_at_ms, \
             CASE WHEN status = 'running' THEN NULL ELSE end_at_ms END AS killed_at_ms \
             FROM sandboxes WHERE team_id = ?1 AND started_at_ms <= ?3 \
             AND (status = 'running' OR end_at_ms >= ?2)",
            params![team_id, to_ms(from), to_ms(to)],
            |row| {
                let c = Columns::new(row, "sandboxes", &["id"])?;
                Ok((c.time("started_at_ms")?, c.time_opt("killed_at_ms")?))
            },
        )
    }
}
