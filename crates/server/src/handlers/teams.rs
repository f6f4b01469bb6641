//! Team routes: the caller's team and its sandbox-count metrics.

use axum::extract::{Path, State};
use axum::Json;
use berth_api::{ApiError, MaxTeamMetric, Team, TeamMetric};
use serde::Deserialize;
use time::OffsetDateTime;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::ApiQuery;
use crate::SharedState;

/// Most points a team metric series has; the step grows with the interval.
const MAX_POINTS: i64 = 300;
/// Default interval when `start` is absent: the last hour.
const DEFAULT_WINDOW_SECS: i64 = 3600;

/// Teams the caller belongs to (exactly the key's team).
#[utoipa::path(get, path = "/teams", tag = "teams",
    responses(
        (status = 200, body = Vec<Team>, description = "The caller's team"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_teams(caller: Caller) -> Json<Vec<Team>> {
    Json(vec![Team {
        team_id: caller.team.id.clone(),
        name: caller.team.name.clone(),
        api_key: caller.key.mask.display(),
        is_default: caller.team.is_default,
    }])
}

/// Query of the team metric routes.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TeamMetricsQuery {
    /// Start of the interval, unix seconds (default: one hour before `end`).
    #[param(minimum = 0)]
    start: Option<i64>,
    /// End of the interval, unix seconds (default: now).
    #[param(minimum = 0)]
    end: Option<i64>,
}

/// Query of `GET /teams/{teamID}/metrics/max`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TeamMetricsMaxQuery {
    /// Start of the interval, unix seconds (default: one hour before `end`).
    #[param(minimum = 0)]
    start: Option<i64>,
    /// End of the interval, unix seconds (default: now).
    #[param(minimum = 0)]
    end: Option<i64>,
    /// `concurrent_sandboxes` or `sandbox_start_rate`.
    #[param(inline)]
    metric: berth_api::TeamMetricName,
}

fn own_team(caller: &Caller, team_id: &str) -> Result<(), HttpError> {
    if caller.team.id != team_id {
        return Err(ApiError::Forbidden(format!(
            "team \"{team_id}\" is not the team of this API key"
        )).into());
    }
    Ok(())
}

/// The series: at each step end, how many sandboxes ran and how many started per second
/// during the step.
fn series(
    state: &SharedState,
    team_id: &str,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<Vec<TeamMetric>, HttpError> {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let end = end.unwrap_or(now).min(now);
    let start = start.unwrap_or(end - DEFAULT_WINDOW_SECS);
    if start < 0 || end < 0 {
        return Err(ApiError::BadRequest(
            "start and end must not be negative".into(),
        ).into());
    }
    if start > end {
        return Ok(Vec::new());
    }
    let from = OffsetDateTime::from_unix_timestamp(start)
        .map_err(|_| ApiError::BadRequest(format!("start {start} is out of range")))?;
    let to = OffsetDateTime::from_unix_timestamp(end)
        .map_err(|_| ApiError::BadRequest(format!("end {end} is out of range")))?;
    let spans = state
        .store
        .team_sandbox_spans(team_id, from, to)?;
    let step = ((end - start) / MAX_POINTS).max(5);
    let mut points = Vec::new();
    let mut t = start + step;
    loop {
        let at = t.min(end);
        let concurrent = spans
            .iter()
            .filter(|(started, ended)| {
                started.unix_timestamp() <= at && ended.is_none_or(|e| e.unix_timestamp() > at)
            })
            .count() as u32;
        let started = spans
            .iter()
            .filter(|(started, _)| {
                let s = started.unix_timestamp();
                s > at - step && s <= at
            })
            .count();
        points.push(TeamMetric {
            timestamp: OffsetDateTime::from_unix_timestamp(at)
                .unwrap_or(OffsetDateTime::UNIX_EPOCH),
            timestamp_unix: at,
            concurrent_sandboxes: concurrent,
            sandbox_start_rate: started as f64 / step as f64,
        });
        if at >= end {
            break;
        }
        t += step;
    }
    Ok(points)
}

/// Team sandbox counts over time.
#[utoipa::path(get, path = "/teams/{teamID}/metrics", tag = "teams",
    params(("teamID" = String, Path, description = "Team id"), TeamMetricsQuery),
    responses(
        (status = 200, body = Vec<TeamMetric>, description = "The series"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Not the caller's team"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn team_metrics(
    State(state): State<SharedState>,
    caller: Caller,
    Path(team_id): Path<String>,
    ApiQuery(query): ApiQuery<TeamMetricsQuery>,
) -> Result<Json<Vec<TeamMetric>>, HttpError> {
    own_team(&caller, &team_id)?;
    Ok(Json(series(&state, &team_id, query.start, query.end)?))
}

/// Maximum of one team metric over an interval.
#[utoipa::path(get, path = "/teams/{teamID}/metrics/max", tag = "teams",
    params(("teamID" = String, Path, description = "Team id"), TeamMetricsMaxQuery),
    responses(
        (status = 200, body = MaxTeamMetric, description = "The maximum"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Not the caller's team"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn team_metrics_max(
    State(state): State<SharedState>,
    caller: Caller,
    Path(team_id): Path<String>,
    ApiQuery(query): ApiQuery<TeamMetricsMaxQuery>,
) -> Result<Json<MaxTeamMetric>, HttpError> {
    own_team(&caller, &team_id)?;
    let points = series(&state, &team_id, query.start, query.end)?;
    let value_of = |p: &TeamMetric| match query.metric {
        berth_api::TeamMetricName::ConcurrentSandboxes => f64::from(p.concurrent_sandboxes),
        berth_api::TeamMetricName::SandboxStartRate => p.sandbox_start_rate,
    };
    let best = points
        .iter()
        .max_by(|a, b| value_of(a).total_cmp(&value_of(b)));
    let now = OffsetDateTime::now_utc();
    Ok(Json(match best {
        Some(point) => MaxTeamMetric {
            timestamp: point.timestamp,
            timestamp_unix: point.timestamp_unix,
            value: value_of(point),
        },
        None => MaxTeamMetric {
            timestamp: now,
            timestamp_unix: now.unix_timestamp(),
            value: 0.0,
        },
    }))
}
