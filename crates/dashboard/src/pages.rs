//! The HTML pages: sign-in and sign-out, and the shells `assets/app.js` fills.

use std::fmt::Write as _;

use axum::extract::{Form, Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::DashboardError;
use crate::session::{self, Session, CSRF_FIELD, LOGIN_COOKIE, SESSION_COOKIE};
use crate::Shared;

/// Scripts only from the dashboard itself; xterm.js and uPlot set element styles, so
/// inline styles are allowed, inline scripts are not.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
    frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn see_other(to: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    response.headers_mut().insert(
        LOCATION,
        HeaderValue::from_str(to).expect("static locations"),
    );
    response
}

/// Navigation entries: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/dashboard/", "Sandboxes"),
    ("/dashboard/templates", "Templates"),
    ("/dashboard/snapshots", "Snapshots"),
    ("/dashboard/volumes", "Volumes"),
    ("/dashboard/secrets", "Secrets"),
    ("/dashboard/keys", "API keys"),
    ("/dashboard/webhooks", "Webhooks"),
    ("/dashboard/usage", "Usage"),
];

/// What one page of the signed-in dashboard is.
struct Shell<'a> {
    title: &'a str,
    /// `data-page`, which tells app.js what to render.
    page: &'a str,
    /// The nav entry marked current.
    nav: &'a str,
    body: &'a str,
    sandbox_id: Option<&'a str>,
    /// The webhook a deliveries page shows (`data-webhook-id`).
    webhook_id: Option<&'a str>,
    /// Loads xterm.js and uPlot.
    heavy: bool,
}

fn shell(session: &Session, page: Shell<'_>) -> Response {
    let mut nav = String::new();
    for (path, label) in NAV {
        let current = if *path == page.nav {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(nav, r#"<li><a href="{path}"{current}>{label}</a></li>"#);
    }
    let (vendor_css, vendor_js) = if page.heavy {
        (
            r#"<link rel="stylesheet" href="/dashboard/assets/xterm.css"><link rel="stylesheet" href="/dashboard/assets/uplot.css">"#,
            r#"<script src="/dashboard/assets/xterm.js"></script><script src="/dashboard/assets/addon-fit.js"></script><script src="/dashboard/assets/uplot.js"></script>"#,
        )
    } else {
        ("", "")
    };
    let mut sandbox = page
        .sandbox_id
        .map(|id| format!(r#" data-sandbox-id="{}""#, escape(id)))
        .unwrap_or_default();
    if let Some(id) = page.webhook_id {
        let _ = write!(sandbox, r#" data-webhook-id="{}""#, escape(id));
    }
    let body = format!(
        r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{csrf}">
<meta name="team-id" content="{team}">
<title>{title} · berth</title>
<link rel="stylesheet" href="/dashboard/assets/app.css">{vendor_css}
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header>
<span class="brand">berth</span>
<nav aria-label="Main"><ul>{nav}</ul></nav>
<form method="post" action="/dashboard/logout" class="logout">
<input type="hidden" name="{CSRF_FIELD}" value="{csrf}">
<button type="submit">Sign out</button>
</form>
</header>
<main id="main" tabindex="-1" data-page="{page}"{sandbox}>
<h1>{title}</h1>
<p id="status" role="status" aria-live="polite"></p>
{content}
</main>
{vendor_js}<script src="/dashboard/assets/app.js"></script>
</body>
</html>
"##,
        csrf = escape(&session.csrf),
        team = escape(&session.team_id),
        title = escape(page.title),
        page = page.page,
        content = page.body,
    );
    html(StatusCode::OK, body)
}

fn login_page(status: StatusCode, token: &str, error: Option<&str>, secure: bool) -> Response {
    let error = error
        .map(|text| {
            format!(
                r#"<p class="error" role="alert" id="login-error">{}</p>"#,
                escape(text)
            )
        })
        .unwrap_or_default();
    let body = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · berth</title>
<link rel="stylesheet" href="/dashboard/assets/app.css">
</head>
<body class="login">
<main id="main">
<h1>Sign in to berth</h1>
{error}
<form method="post" action="/dashboard/login">
<input type="hidden" name="{CSRF_FIELD}" value="{token}">
<label for="api-key">API key</label>
<input id="api-key" name="api_key" type="password" autocomplete="off" required autofocus aria-describedby="api-key-help">
<p id="api-key-help" class="help">An API key of this berth (<code>berth keys create</code>). It stays on the server; the browser keeps only a session cookie.</p>
<button type="submit">Sign in</button>
</form>
</main>
</body>
</html>
"#
    );
    let mut response = html(status, body);
    session::set_cookie(response.headers_mut(), LOGIN_COOKIE, Some(token), secure);
    response
}

pub async fn login_form(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if state.sessions.find(&headers).is_some() {
        return see_other("/dashboard/");
    }
    login_page(
        StatusCode::OK,
        &session::random_token(),
        None,
        session::over_tls(&headers),
    )
}

#[derive(Deserialize)]
pub struct LoginForm {
    api_key: String,
    csrf: String,
}

#[derive(Deserialize)]
struct ApiTeam {
    #[serde(rename = "teamID")]
    team_id: String,
    #[serde(rename = "isDefault", default)]
    is_default: bool,
}

pub async fn login(
    State(state): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let secure = session::over_tls(&headers);
    let expected = session::cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !session::constant_time_eq(expected.as_bytes(), form.csrf.as_bytes())
    {
        return login_page(
            StatusCode::FORBIDDEN,
            &session::random_token(),
            Some("The sign-in form expired. Try again."),
            secure,
        );
    }
    let key = form.api_key.trim();
    let refused = || {
        login_page(
            StatusCode::UNAUTHORIZED,
            &session::random_token(),
            Some("That API key was refused."),
            secure,
        )
    };
    if key.is_empty() {
        return refused();
    }
    let teams = match state.upstream.api(key, Method::GET, "/teams", None).await {
        Ok((StatusCode::OK, body)) => body,
        Ok((StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, _)) => return refused(),
        Ok((status, body)) => {
            return DashboardError::Api {
                status,
                message: crate::upstream::api_message(&body),
            }
            .into_response()
        }
        Err(error) => return error.into_response(),
    };
    let teams: Vec<ApiTeam> = serde_json::from_slice(&teams).unwrap_or_default();
    let team_id = teams
        .iter()
        .find(|team| team.is_default)
        .or(teams.first())
        .map(|team| team.team_id.clone())
        .unwrap_or_default();
    let id = state.sessions.create(key.to_owned(), team_id);
    let mut response = see_other("/dashboard/");
    session::set_cookie(response.headers_mut(), SESSION_COOKIE, Some(&id), secure);
    session::set_cookie(response.headers_mut(), LOGIN_COOKIE, None, secure);
    response
}

#[derive(Deserialize)]
pub struct LogoutForm {
    csrf: String,
}

pub async fn logout(
    State(state): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    if let Some(session) = state.sessions.find(&headers) {
        if !session.csrf_matches(&form.csrf) {
            return DashboardError::Csrf.into_response();
        }
        state.sessions.remove(&headers);
    }
    let mut response = see_other("/dashboard/login");
    session::set_cookie(
        response.headers_mut(),
        SESSION_COOKIE,
        None,
        session::over_tls(&headers),
    );
    response
}

/// Renders a simple page, or sends the browser to sign in.
async fn simple(
    state: &Shared,
    headers: &HeaderMap,
    title: &str,
    page: &str,
    nav: &str,
    body: &str,
) -> Response {
    let Some(session) = state.sessions.find(headers) else {
        return see_other("/dashboard/login");
    };
    shell(
        &session,
        Shell {
            title,
            page,
            nav,
            body,
            sandbox_id: None,
            webhook_id: None,
            heavy: page == "usage",
        },
    )
}

const SANDBOXES_BODY: &str = r#"<form id="filters" class="filters" role="search" aria-label="Filter sandboxes">
<label for="filter-metadata">Metadata (key=value, comma-separated)</label>
<input id="filter-metadata" name="metadata" placeholder="owner=alice,env=dev">
<label for="filter-template">Template</label>
<input id="filter-template" name="template" placeholder="base">
<label for="filter-state">State</label>
<select id="filter-state" name="state"><option value="running,paused">running and paused</option><option value="running">running</option><option value="paused">paused</option></select>
<button type="submit">Filter</button>
</form>
<table id="sandboxes" aria-describedby="sandboxes-caption">
<caption id="sandboxes-caption">Sandboxes of your team, refreshed every few seconds</caption>
<thead><tr><th scope="col">Sandbox</th><th scope="col">Template</th><th scope="col">State</th><th scope="col">Started</th><th scope="col">Ends</th><th scope="col">CPU / memory</th><th scope="col">Metadata</th></tr></thead>
<tbody></tbody>
</table>"#;

pub async fn sandboxes(State(state): State<Shared>, headers: HeaderMap) -> Response {
    simple(
        &state,
        &headers,
        "Sandboxes",
        "sandboxes",
        "/dashboard/",
        SANDBOXES_BODY,
    )
    .await
}

const SANDBOX_BODY: &str = r#"<section aria-labelledby="info-heading">
<h2 id="info-heading">Info</h2>
<dl id="info" class="info"></dl>
<div class="actions" role="group" aria-label="Sandbox actions">
<button type="button" data-action="pause">Pause</button>
<button type="button" data-action="resume">Resume</button>
<button type="button" data-action="snapshot">Snapshot</button>
<button type="button" data-action="fork">Fork</button>
<button type="button" data-action="kill" class="danger">Kill</button>
</div>
</section>
<section aria-labelledby="metrics-heading">
<h2 id="metrics-heading">Metrics</h2>
<div class="charts">
<figure><figcaption id="cpu-caption">CPU used (%)</figcaption><div id="chart-cpu" class="chart" role="img" aria-labelledby="cpu-caption" data-samples="0"></div></figure>
<figure><figcaption id="mem-caption">Memory used (MiB)</figcaption><div id="chart-mem" class="chart" role="img" aria-labelledby="mem-caption" data-samples="0"></div></figure>
<figure><figcaption id="disk-caption">Disk used (MiB)</figcaption><div id="chart-disk" class="chart" role="img" aria-labelledby="disk-caption" data-samples="0"></div></figure>
</div>
</section>
<section aria-labelledby="terminal-heading">
<h2 id="terminal-heading">Terminal</h2>
<p id="terminal-status" role="status" aria-live="polite">Not connected.</p>
<button type="button" id="terminal-connect">Connect terminal</button>
<div id="terminal" class="terminal" aria-label="Terminal"></div>
</section>
<section aria-labelledby="files-heading">
<h2 id="files-heading">Files</h2>
<form id="files-nav" class="inline">
<label for="files-path">Directory</label>
<input id="files-path" name="path" value="/home/user">
<button type="submit">Open</button>
</form>
<table id="files"><caption>Entries of the directory</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Type</th><th scope="col">Size</th><th scope="col">Download</th></tr></thead>
<tbody></tbody></table>
<form id="upload-form" class="inline">
<label for="upload-file">Upload into this directory</label>
<input type="file" id="upload-file" name="file" required>
<button type="submit">Upload</button>
</form>
</section>
<section aria-labelledby="logs-heading">
<h2 id="logs-heading">Logs</h2>
<div class="inline">
<label for="log-level">Minimum level</label>
<select id="log-level"><option value="">all</option><option value="debug">debug</option><option value="info">info</option><option value="warn">warn</option><option value="error">error</option></select>
<input type="checkbox" id="log-tail" checked><label for="log-tail">Live tail</label>
</div>
<ol id="logs" class="logs"></ol>
</section>
<section aria-labelledby="events-heading">
<h2 id="events-heading">Lifecycle events</h2>
<table id="events"><caption>Most recent first</caption>
<thead><tr><th scope="col">Time</th><th scope="col">Event</th><th scope="col">Details</th></tr></thead>
<tbody></tbody></table>
</section>"#;

pub async fn sandbox(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = state.sessions.find(&headers) else {
        return see_other("/dashboard/login");
    };
    match state.upstream.sandbox(&session.api_key, &id).await {
        Ok(_) => shell(
            &session,
            Shell {
                title: &format!("Sandbox {id}"),
                page: "sandbox",
                nav: "/dashboard/",
                body: SANDBOX_BODY,
                sandbox_id: Some(&id),
                webhook_id: None,
                heavy: true,
            },
        ),
        Err(DashboardError::NotFound) => not_found_page(Some(&session)),
        Err(error) => error.into_response(),
    }
}

fn not_found_page(session: Option<&Session>) -> Response {
    let body = r#"<p>There is no such page, or what it names belongs to another team.</p><p><a href="/dashboard/">Back to sandboxes</a></p>"#;
    let mut response = match session {
        Some(session) => shell(
            session,
            Shell {
                title: "Not found",
                page: "not-found",
                nav: "",
                body,
                sandbox_id: None,
                webhook_id: None,
                heavy: false,
            },
        ),
        None => html(StatusCode::NOT_FOUND, format!("<!doctype html><html lang=\"en\"><title>Not found · berth</title><main><h1>Not found</h1>{body}</main></html>")),
    };
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

pub async fn not_found(State(state): State<Shared>, headers: HeaderMap) -> Response {
    not_found_page(state.sessions.find(&headers).as_deref())
}

const TEMPLATES_BODY: &str = r#"<table id="templates"><caption>Templates of your team and public ones</caption>
<thead><tr><th scope="col">Template</th><th scope="col">Names</th><th scope="col">Visibility</th><th scope="col">Builds (select for logs)</th><th scope="col">CPU / memory</th><th scope="col">Updated</th></tr></thead><tbody></tbody></table>
<section aria-labelledby="build-heading" hidden id="build-section">
<h2 id="build-heading">Build logs</h2>
<pre id="build-logs" class="logs" tabindex="0"></pre>
</section>"#;

pub async fn templates(State(state): State<Shared>, headers: HeaderMap) -> Response {
    simple(
        &state,
        &headers,
        "Templates",
        "templates",
        "/dashboard/templates",
        TEMPLATES_BODY,
    )
    .await
}

fn table_body(id: &str, caption: &str, columns: &[&str]) -> String {
    let mut head = String::new();
    for column in columns {
        let _ = write!(head, r#"<th scope="col">{column}</th>"#);
    }
    format!(
        r#"<table id="{id}"><caption>{caption}</caption><thead><tr>{head}</tr></thead><tbody></tbody></table>"#
    )
}

pub async fn snapshots(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let body = table_body(
        "snapshots",
        "Snapshots of your team's sandboxes",
        &["Snapshot (use as templateID)", "Names"],
    );
    simple(
        &state,
        &headers,
        "Snapshots",
        "snapshots",
        "/dashboard/snapshots",
        &body,
    )
    .await
}

pub async fn volumes(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let body = table_body("volumes", "Volumes of your team", &["Volume", "Name"]);
    simple(
        &state,
        &headers,
        "Volumes",
        "volumes",
        "/dashboard/volumes",
        &body,
    )
    .await
}

pub async fn secrets(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let body = table_body(
        "secrets",
        "Secrets of your team (names only: values never leave the server)",
        &["Name", "Description", "Allowed hosts", "Created"],
    );
    simple(
        &state,
        &headers,
        "Secrets",
        "secrets",
        "/dashboard/secrets",
        &body,
    )
    .await
}

pub async fn keys(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let body = table_body(
        "keys",
        "API keys of your team (masked)",
        &["Name", "Key", "Created", "Last used"],
    );
    simple(
        &state,
        &headers,
        "API keys",
        "keys",
        "/dashboard/keys",
        &body,
    )
    .await
}

pub async fn webhooks(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let body = table_body(
        "webhooks",
        "Webhooks of your team",
        &[
            "Webhook (select for deliveries)",
            "URL",
            "Events",
            "Enabled",
        ],
    );
    simple(
        &state,
        &headers,
        "Webhooks",
        "webhooks",
        "/dashboard/webhooks",
        &body,
    )
    .await
}

const WEBHOOK_BODY: &str = r#"<p id="webhook-target"></p>
<table id="deliveries"><caption>Recent deliveries, newest first (the last 100 finished ones are kept)</caption>
<thead><tr><th scope="col">Event</th><th scope="col">Status</th><th scope="col">Attempts</th><th scope="col">Response</th><th scope="col">Error</th><th scope="col">Queued</th><th scope="col">Last attempt</th><th scope="col">Next attempt</th></tr></thead><tbody></tbody></table>
<p><a href="/dashboard/webhooks">Back to webhooks</a></p>"#;

/// One webhook and its recent deliveries.
pub async fn webhook(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = state.sessions.find(&headers) else {
        return see_other("/dashboard/login");
    };
    match state.upstream.webhook(&session.api_key, &id).await {
        Ok(hook) => {
            let name = hook["name"]
                .as_str()
                .filter(|name| !name.is_empty())
                .unwrap_or(&id);
            shell(
                &session,
                Shell {
                    title: &format!("Webhook {name}"),
                    page: "webhook",
                    nav: "/dashboard/webhooks",
                    body: WEBHOOK_BODY,
                    sandbox_id: None,
                    webhook_id: Some(&id),
                    heavy: false,
                },
            )
        }
        Err(DashboardError::NotFound) => not_found_page(Some(&session)),
        Err(error) => error.into_response(),
    }
}

const USAGE_BODY: &str = r#"<div class="inline">
<label for="usage-window">Window</label>
<select id="usage-window"><option value="3600">last hour</option><option value="21600">last 6 hours</option><option value="86400">last 24 hours</option></select>
</div>
<div class="charts">
<figure><figcaption id="concurrency-caption">Concurrent sandboxes</figcaption><div id="chart-concurrency" class="chart" role="img" aria-labelledby="concurrency-caption" data-samples="0"></div></figure>
<figure><figcaption id="rate-caption">Sandbox starts per second</figcaption><div id="chart-rate" class="chart" role="img" aria-labelledby="rate-caption" data-samples="0"></div></figure>
</div>"#;

pub async fn usage(State(state): State<Shared>, headers: HeaderMap) -> Response {
    simple(
        &state,
        &headers,
        "Usage",
        "usage",
        "/dashboard/usage",
        USAGE_BODY,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
