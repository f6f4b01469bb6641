//! Templates: a team's named templates (or berth's installed ones, with no team), their
//! builds and tags.
//!
//! A template is a row with an id, an optional owning team (none: installed on this host,
//! e.g. `base`, public to every team), an alias unique within its team (E2B's "name"),
//! and whether other teams may use it. Each build of it is a row naming the template
//! store manifest its result was written as; tags point at builds (`default` is the tag a
//! bare name means). A build's requested tags are assigned when it becomes ready, in the
//! same transaction, so a name never points at a build that is not ready. Whether a
//! caller may see a template is the server's decision; this module only stores.

use time::OffsetDateTime;

use crate::columns::{now, string_list_json, to_ms, Columns};
use crate::cursor::{self, Listing, Position};
use crate::db::{params, Bindings, Conn, Row, Store, Value};
use crate::error::{Result, StoreError};

/// The tag a name without `:tag` means (E2B's).
pub const DEFAULT_TAG: &str = "default";

/// A template row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub id: String,
    /// None: installed on this host (berth's own, public to every team).
    pub team_id: Option<String>,
    /// Unique within the team (or among installed templates).
    pub alias: String,
    pub public: bool,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub last_spawned_at: Option<OffsetDateTime>,
    pub spawn_count: u64,
    /// Builds of any status.
    pub build_count: u32,
}

/// Where a build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateBuildStatus {
    /// Requested (`POST /v3/templates`), not started.
    Waiting,
    Building,
    Ready,
    Error,
}

impl TemplateBuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateBuildStatus::Waiting => "waiting",
            TemplateBuildStatus::Building => "building",
            TemplateBuildStatus::Ready => "ready",
            TemplateBuildStatus::Error => "error",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "waiting" => TemplateBuildStatus::Waiting,
            "building" => TemplateBuildStatus::Building,
            "ready" => TemplateBuildStatus::Ready,
            "error" => TemplateBuildStatus::Error,
            _ => return None,
        })
    }

    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TemplateBuildStatus::Ready | TemplateBuildStatus::Error
        )
    }
}

/// Why a build failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BuildReason {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// A build row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateBuildRecord {
    pub id: String,
    pub template_id: String,
    pub status: TemplateBuildStatus,
    pub reason: Option<BuildReason>,
    /// Tags assigned to this build once it is ready.
    pub requested_tags: Vec<String>,
    /// The template store manifest the build's result is (or will be) written as.
    pub manifest_id: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub envd_version: String,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
}

/// A tag of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateTagRecord {
    pub tag: String,
    pub build_id: String,
    pub created_at: OffsetDateTime,
}

/// What `POST /v3/templates` records.
#[derive(Debug, Clone)]
pub struct NewTemplateBuild {
    pub team_id: String,
    pub alias: String,
    /// Used when the team has no template of that alias yet.
    pub new_template_id: String,
    pub build_id: String,
    pub manifest_id: String,
    pub tags: Vec<String>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub envd_version: String,
}

/// An installed template as the host's template store has it.
#[derive(Debug, Clone)]
pub struct InstalledTemplate {
    /// Its name (= id = alias = manifest id).
    pub name: String,
    /// Stable for the same layers: a rebuilt template gets a new build.
    pub build_id: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub envd_version: String,
    pub created_at: OffsetDateTime,
}

const TEMPLATE_COLUMNS: &str = "t.id, t.team_id, t.alias, t.public, t.created_at_ms, \
     t.updated_at_ms, t.last_spawned_at_ms, t.spawn_count, \
     (SELECT COUNT(*) FROM template_builds b WHERE b.template_id = t.id) AS build_count";

const BUILD_COLUMNS: &str = "id, template_id, status, reason, tags, manifest_id, cpu_count, \
     memory_mb, disk_size_mb, envd_version, created_at_ms, updated_at_ms, finished_at_ms";

fn template_from_row(row: &Row<'_>) -> Result<TemplateRecord> {
    let c = Columns::new(row, "templates", &["id"])?;
    Ok(TemplateRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        alias: c.get("alias")?,
        public: c.get("public")?,
        created_at: c.time("created_at_ms")?,
        updated_at: c.time("updated_at_ms")?,
        last_spawned_at: c.time_opt("last_spawned_at_ms")?,
        spawn_count: c.get::<i64>("spawn_count")?.max(0) as u64,
        build_count: c.get("build_count")?,
    })
}

fn build_from_row(row: &Row<'_>) -> Result<TemplateBuildRecord> {
    let c = Columns::new(row, "template_builds", &["id"])?;
    Ok(TemplateBuildRecord {
        id: c.get("id")?,
        template_id: c.get("template_id")?,
        status: c.word(
            "status",
            "waiting, building, ready, error",
            TemplateBuildStatus::parse,
        )?,
        reason: c.json_opt("reason")?,
        requested_tags: c.json("tags")?,
        manifest_id: c.get("manifest_id")?,
        cpu_count: c.get("cpu_count")?,
        memory_mb: c.get("memory_mb")?,
        disk_size_mb: c.get("disk_size_mb")?,
        envd_version: c.get("envd_version")?,
        created_at: c.time("created_at_ms")?,
        updated_at: c.time("updated_at_ms")?,
        finished_at: c.time_opt("finished_at_ms")?,
    })
}

fn tag_from_row(row: &Row<'_>) -> Result<TemplateTagRecord> {
    let c = Columns::new(row, "template_tags", &["template_id", "tag"])?;
    Ok(TemplateTagRecord {
        tag: c.get("tag")?,
        build_id: c.get("build_id")?,
        created_at: c.time("created_at_ms")?,
    })
}

fn template_where(
    conn: &mut Conn<'_>,
    condition: &str,
    params: &[Value],
) -> Result<Option<TemplateRecord>> {
    conn.query_opt(
        &format!("SELECT {TEMPLATE_COLUMNS} FROM templates t WHERE {condition}"),
        params,
        template_from_row,
    )
}

fn build_where(
    conn: &mut Conn<'_>,
    condition: &str,
    params: &[Value],
) -> Result<Option<TemplateBuildRecord>> {
    conn.query_opt(
        &format!("SELECT {BUILD_COLUMNS} FROM template_builds WHERE {condition}"),
        params,
        build_from_row,
    )
}

/// Points `tags` of `template_id` at `build_id` (replacing what they pointed at).
fn assign_tags(
    tx: &mut Conn<'_>,
    template_id: &str,
    build_id: &str,
    tags: &[String],
    at_ms: i64,
) -> Result<()> {
    for tag in tags {
        tx.execute(
            "INSERT INTO template_tags (template_id, tag, build_id, created_at_ms) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (template_id, tag) \
             DO UPDATE SET build_id = excluded.build_id, created_at_ms = excluded.created_at_ms",
            params![template_id, tag, build_id, at_ms],
        )?;
    }
    Ok(())
}

fn not_found(what: &'static str, id: &str) -> StoreError {
    StoreError::NotFound {
        what,
        id: id.to_string(),
    }
}

impl Store {
    /// Records a requested build of the team's template `alias` (created when the
    /// team has none of that alias), waiting to be started. Earlier builds of that
    /// template still waiting are marked failed (superseded), as E2B does. Returns the
    /// template and the build.
    pub fn request_template_build(
        &self,
        request: &NewTemplateBuild,
    ) -> Result<(TemplateRecord, TemplateBuildRecord)> {
        self.write(|tx| {
            let at = to_ms(now());
            let template_id = match template_where(
                tx,
                "t.team_id = ?1 AND t.alias = ?2",
                params![request.team_id, request.alias],
            )? {
                Some(existing) => {
                    tx.execute(
                        "UPDATE templates SET updated_at_ms = ?2 WHERE id = ?1",
                        params![existing.id, at],
                    )?;
                    tx.execute(
                        "UPDATE template_builds SET status = 'error', reason = ?2, \
                     updated_at_ms = ?3, finished_at_ms = ?3 \
                     WHERE template_id = ?1 AND status = 'waiting'",
                        params![
                        existing.id,
                        serde_json::to_string(&BuildReason {
                            message:
                                "The build was canceled because it was superseded by a newer one."
                                    .into(),
                            step: None,
                        })
                        .expect("reasons serialize"),
                        at
                    ],
                    )?;
                    existing.id
                }
                None => {
                    tx.execute(
                        "INSERT INTO templates (id, team_id, alias, public, created_at_ms, \
                     updated_at_ms, last_spawned_at_ms, spawn_count) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?5, NULL, 0)",
                        params![
                            request.new_template_id,
                            request.team_id,
                            request.alias,
                            false,
                            at
                        ],
                    )?;
                    request.new_template_id.clone()
                }
            };
            tx.execute(
                &format!(
                    "INSERT INTO template_builds ({BUILD_COLUMNS}) VALUES \
                 (?1, ?2, 'waiting', NULL, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, NULL)"
                ),
                params![
                    request.build_id,
                    template_id,
                    string_list_json(&request.tags),
                    request.manifest_id,
                    request.cpu_count,
                    request.memory_mb as i64,
                    request.disk_size_mb as i64,
                    request.envd_version,
                    at
                ],
            )?;
            let template = template_where(tx, "t.id = ?1", params![&template_id])?
                .ok_or_else(|| not_found("template", &template_id))?;
            let build = build_where(tx, "id = ?1", params![&request.build_id])?
                .ok_or_else(|| not_found("template build", &request.build_id))?;
            Ok((template, build))
        })
    }

    /// Makes the store's rows of installed templates match `installed` (the host's
    /// template store): missing ones are added, a changed one gets a new ready build
    /// tagged `default`, and (`remove_missing`: this host is the only one) ones no longer
    /// installed are removed. Returns the names removed.
    pub fn sync_installed_templates(
        &self,
        installed: &[InstalledTemplate],
        remove_missing: bool,
    ) -> Result<Vec<String>> {
        self.write(|tx| {
            let at = to_ms(now());
            for template in installed {
                let created = to_ms(template.created_at);
                tx.execute(
                    "INSERT INTO templates (id, team_id, alias, public, created_at_ms, \
                 updated_at_ms, last_spawned_at_ms, spawn_count) \
                 VALUES (?1, NULL, ?1, ?2, ?3, ?3, NULL, 0) ON CONFLICT (id) DO NOTHING",
                    params![template.name, true, created],
                )?;
                let known = build_where(tx, "id = ?1", params![&template.build_id])?;
                if known.is_none() {
                    tx.execute(
                        &format!(
                            "INSERT INTO template_builds ({BUILD_COLUMNS}) VALUES \
                         (?1, ?2, 'ready', NULL, ?3, ?2, ?4, ?5, ?6, ?7, ?8, ?8, ?8)"
                        ),
                        params![
                            template.build_id,
                            template.name,
                            string_list_json(&[DEFAULT_TAG.to_string()]),
                            template.cpu_count,
                            template.memory_mb as i64,
                            template.disk_size_mb as i64,
                            template.envd_version,
                            created
                        ],
                    )?;
                    tx.execute(
                        "UPDATE templates SET updated_at_ms = ?2 WHERE id = ?1",
                        params![template.name, created],
                    )?;
                }
                assign_tags(
                    tx,
                    &template.name,
                    &template.build_id,
                    &[DEFAULT_TAG.to_string()],
                    at,
                )?;
            }
            let names: Vec<String> = installed.iter().map(|t| t.name.clone()).collect();
            let stale: Vec<String> = tx
                .query_all(
                    "SELECT id FROM templates WHERE team_id IS NULL",
                    params![],
                    |row| Columns::new(row, "templates", &["id"])?.get("id"),
                )?
                .into_iter()
                .filter(|id| remove_missing && !names.contains(id))
                .collect();
            for id in &stale {
                delete_template_rows(tx, id)?;
            }
            Ok(stale)
        })
    }

    /// Template `id`, whatever its team.
    pub fn template(&self, id: &str) -> Result<Option<TemplateRecord>> {
        template_where(&mut self.conn()?, "t.id = ?1", params![id])
    }

    /// The template of alias `alias` in team `team_id` (None: among installed ones).
    pub fn template_by_alias(
        &self,
        team_id: Option<&str>,
        alias: &str,
    ) -> Result<Option<TemplateRecord>> {
        let mut conn = self.conn()?;
        match team_id {
            Some(team) => template_where(
                &mut conn,
                "t.team_id = ?1 AND t.alias = ?2",
                params![team, alias],
            ),
            None => template_where(
                &mut conn,
                "t.team_id IS NULL AND t.alias = ?1",
                params![alias],
            ),
        }
    }

    /// Templates installed on the host and those of `team_id`: installed first, then
    /// the team's newest first; at most `limit` after the cursor of a previous page.
    pub fn list_templates(
        &self,
        team_id: &str,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<(Vec<TemplateRecord>, Option<String>)> {
        let listing = Listing::Templates;
        let mut bindings = Bindings::default();
        let team = bindings.bind(team_id.to_string());
        // Installed templates sort as if made at the end of time: before any team's.
        let order_ms = format!(
            "CASE WHEN t.team_id IS NULL THEN {} ELSE t.created_at_ms END",
            i64::MAX
        );
        let mut conditions = vec![format!("(t.team_id IS NULL OR t.team_id = {team})")];
        if let Some(token) = next_token {
            let after = cursor::decode(listing, token)?;
            let ms = bindings.bind(after.ms);
            let id = bindings.bind(after.id);
            conditions.push(cursor::after(listing, &order_ms, "t.id", &ms, &id));
        }
        let sql = format!(
            "SELECT {TEMPLATE_COLUMNS}, {order_ms} AS order_ms FROM templates t WHERE {} {} LIMIT {}",
            conditions.join(" AND "),
            cursor::order_by(listing, "order_ms", "t.id"),
            bindings.bind(cursor::fetch_limit(limit)),
        );
        let rows = self.conn()?.query_all(&sql, bindings.params(), |row| {
            let order: i64 = Columns::new(row, "templates", &["id"])?.get("order_ms")?;
            Ok((template_from_row(row)?, order))
        })?;
        let (page, next) = cursor::paginate(listing, rows, limit, |(t, order)| Position {
            ms: *order,
            id: t.id.clone(),
        });
        Ok((page.into_iter().map(|(t, _)| t).collect(), next))
    }

    /// Sets whether other teams may use template `id`.
    pub fn set_template_public(&self, id: &str, public: bool) -> Result<()> {
        let changed = self.conn()?.execute(
            "UPDATE templates SET public = ?2, updated_at_ms = ?3 WHERE id = ?1",
            params![id, public, to_ms(now())],
        )?;
        if changed == 0 {
            return Err(not_found("template", id));
        }
        Ok(())
    }

    /// Counts a sandbox started from template `id`.
    pub fn record_template_spawn(&self, id: &str) -> Result<()> {
        self.conn()?.execute(
            "UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at_ms = ?2 \
             WHERE id = ?1",
            params![id, to_ms(now())],
        )?;
        Ok(())
    }

    /// Deletes template `id` with its builds and tags; returns its builds (their
    /// manifests are the caller's to remove).
    pub fn delete_template(&self, id: &str) -> Result<Vec<TemplateBuildRecord>> {
        self.write(|tx| {
            if template_where(tx, "t.id = ?1", params![id])?.is_none() {
                return Err(not_found("template", id));
            }
            let builds = tx.query_all(
                &format!("SELECT {BUILD_COLUMNS} FROM template_builds WHERE template_id = ?1"),
                params![id],
                build_from_row,
            )?;
            delete_template_rows(tx, id)?;
            Ok(builds)
        })
    }

    /// Live sandboxes and snapshots made from template `id` (a template in use is not
    /// deleted): (running or paused sandboxes, snapshots).
    pub fn template_users(&self, id: &str) -> Result<(u64, u64)> {
        let mut conn = self.conn()?;
        let mut count =
            |sql: &str| -> Result<u64> { Ok(conn.query_count(sql, params![id])?.max(0) as u64) };
        Ok((
            count(
                "SELECT COUNT(*) AS n FROM sandboxes WHERE template_id = ?1 \
                 AND status IN ('running', 'paused')",
            )?,
            count("SELECT COUNT(*) AS n FROM snapshots WHERE template_id = ?1")?,
        ))
    }

    /// Running or paused sandboxes, and snapshots, made from build `build_id` of
    /// template `template_id`.
    pub fn template_build_users(&self, template_id: &str, build_id: &str) -> Result<(u64, u64)> {
        let mut conn = self.conn()?;
        let mut count = |sql: &str| -> Result<u64> {
            Ok(conn
                .query_count(sql, params![template_id, build_id])?
                .max(0) as u64)
        };
        Ok((
            count(
                "SELECT COUNT(*) AS n FROM sandboxes WHERE template_id = ?1 AND build_id = ?2 \
                 AND status IN ('running', 'paused')",
            )?,
            count("SELECT COUNT(*) AS n FROM snapshots WHERE template_id = ?1 AND build_id = ?2")?,
        ))
    }

    /// Build `build_id` of template `template_id`.
    pub fn template_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<Option<TemplateBuildRecord>> {
        build_where(
            &mut self.conn()?,
            "id = ?1 AND template_id = ?2",
            params![build_id, template_id],
        )
    }

    /// Build `build_id`, whatever its template.
    pub fn template_build_by_id(&self, build_id: &str) -> Result<Option<TemplateBuildRecord>> {
        build_where(&mut self.conn()?, "id = ?1", params![build_id])
    }

    /// Builds of template `template_id`, newest first, paged.
    pub fn list_template_builds(
        &self,
        template_id: &str,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<(Vec<TemplateBuildRecord>, Option<String>)> {
        let listing = Listing::TemplateBuilds;
        let mut bindings = Bindings::default();
        let mut conditions = vec![format!(
            "template_id = {}",
            bindings.bind(template_id.to_string())
        )];
        if let Some(token) = next_token {
            let after = cursor::decode(listing, token)?;
            let ms = bindings.bind(after.ms);
            let id = bindings.bind(after.id);
            conditions.push(cursor::after(listing, "created_at_ms", "id", &ms, &id));
        }
        let sql = format!(
            "SELECT {BUILD_COLUMNS} FROM template_builds WHERE {} {} LIMIT {}",
            conditions.join(" AND "),
            cursor::order_by(listing, "created_at_ms", "id"),
            bindings.bind(cursor::fetch_limit(limit)),
        );
        let rows = self
            .conn()?
            .query_all(&sql, bindings.params(), build_from_row)?;
        Ok(cursor::paginate(listing, rows, limit, |b| Position {
            ms: to_ms(b.created_at),
            id: b.id.clone(),
        }))
    }

    /// Builds not finished (waiting or building), of every template.
    pub fn unfinished_template_builds(&self) -> Result<Vec<TemplateBuildRecord>> {
        self.conn()?.query_all(
            &format!(
                "SELECT {BUILD_COLUMNS} FROM template_builds \
                 WHERE status IN ('waiting', 'building') ORDER BY created_at_ms, id"
            ),
            params![],
            build_from_row,
        )
    }

    /// Moves waiting build `build_id` to building. False when it was not waiting.
    pub fn start_template_build(&self, build_id: &str) -> Result<bool> {
        let changed = self.conn()?.execute(
            "UPDATE template_builds SET status = 'building', updated_at_ms = ?2 \
             WHERE id = ?1 AND status = 'waiting'",
            params![build_id, to_ms(now())],
        )?;
        Ok(changed == 1)
    }

    /// Marks unfinished build `build_id` failed for `reason`. False when it had already
    /// finished.
    pub fn fail_template_build(&self, build_id: &str, reason: &BuildReason) -> Result<bool> {
        let at = to_ms(now());
        let changed = self.conn()?.execute(
            "UPDATE template_builds SET status = 'error', reason = ?2, updated_at_ms = ?3, \
             finished_at_ms = ?3 WHERE id = ?1 AND status IN ('waiting', 'building')",
            params![
                build_id,
                serde_json::to_string(reason).expect("reasons serialize"),
                at
            ],
        )?;
        Ok(changed == 1)
    }

    /// Marks build `build_id` ready and points its requested tags at it, in one
    /// transaction. False when it had already finished.
    pub fn finish_template_build(&self, build_id: &str) -> Result<bool> {
        self.write(|tx| {
            let Some(build) = build_where(tx, "id = ?1", params![build_id])? else {
                return Err(not_found("template build", build_id));
            };
            if build.status.is_finished() {
                return Ok(false);
            }
            let at = to_ms(now());
            tx.execute(
                "UPDATE template_builds SET status = 'ready', updated_at_ms = ?2, \
             finished_at_ms = ?2 WHERE id = ?1",
                params![build_id, at],
            )?;
            tx.execute(
                "UPDATE templates SET updated_at_ms = ?2 WHERE id = ?1",
                params![build.template_id, at],
            )?;
            assign_tags(tx, &build.template_id, build_id, &build.requested_tags, at)?;
            Ok(true)
        })
    }

    /// The build tag `tag` of template `template_id` points at.
    pub fn template_build_by_tag(
        &self,
        template_id: &str,
        tag: &str,
    ) -> Result<Option<TemplateBuildRecord>> {
        let mut conn = self.conn()?;
        let build_id: Option<String> = conn.query_opt(
            "SELECT template_id, tag, build_id FROM template_tags \
             WHERE template_id = ?1 AND tag = ?2",
            params![template_id, tag],
            |row| Columns::new(row, "template_tags", &["template_id", "tag"])?.get("build_id"),
        )?;
        match build_id {
            Some(id) => build_where(&mut conn, "id = ?1", params![id]),
            None => Ok(None),
        }
    }

    /// Points `tags` of template `template_id` at its ready build `build_id`.
    pub fn assign_template_tags(
        &self,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<()> {
        self.write(|tx| {
            assign_tags(tx, template_id, build_id, tags, to_ms(now()))?;
            Ok(())
        })
    }

    /// Removes `tags` from template `template_id` (absent ones are ignored).
    pub fn delete_template_tags(&self, template_id: &str, tags: &[String]) -> Result<()> {
        self.write(|tx| {
            for tag in tags {
                tx.execute(
                    "DELETE FROM template_tags WHERE template_id = ?1 AND tag = ?2",
                    params![template_id, tag],
                )?;
            }
            Ok(())
        })
    }

    /// Tags of template `template_id`, by name.
    pub fn template_tags(&self, template_id: &str) -> Result<Vec<TemplateTagRecord>> {
        self.conn()?.query_all(
            "SELECT template_id, tag, build_id, created_at_ms FROM template_tags \
             WHERE template_id = ?1 ORDER BY tag",
            params![template_id],
            tag_from_row,
        )
    }

    /// Every manifest id some build row names (kept by template store cleanups).
    pub fn template_manifests(&self) -> Result<Vec<String>> {
        self.conn()?.query_all(
            "SELECT id, manifest_id FROM template_builds",
            params![],
            |row| Columns::new(row, "template_builds", &["id"])?.get("manifest_id"),
        )
    }
}

fn delete_template_rows(tx: &mut Conn<'_>, id: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM template_tags WHERE template_id = ?1",
        params![id],
    )?;
    tx.execute(
        "DELETE FROM template_builds WHERE template_id = ?1",
        params![id],
    )?;
    tx.execute("DELETE FROM templates WHERE id = ?1", params![id])?;
    Ok(())
}
