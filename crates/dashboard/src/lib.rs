//! berth-dashboard: the web dashboard `berth up` serves under `/dashboard`.
//!
//! Owns: sign-in with an API key and the server-side sessions that hold it, CSRF
//! protection, the HTML pages and the script that renders them, the embedded browser
//! libraries (xterm.js, uPlot; vendored from npm by `vendor-assets.sh`, never fetched
//! at run time), the browser terminal's WebSocket bridge to envd's PTY, and file
//! download/upload through envd. Must not touch: the store, the runtime, or any rule
//! of the API (team scoping, validation, errors): those stay the server's.
//!
//! Design. The dashboard is one more client of the control plane, called in-process:
//! [`router`] takes the server's own router (API plus sandbox proxy) as a tower service
//! and sends it requests with the session's API key, exactly as an SDK would but
//! without a socket. So every page sees what the key's team may see and nothing else
//! (another team's sandbox is the API's 404), and the dashboard can never drift from
//! the API's semantics. envd is reached the same way, through the proxy with the
//! sandbox's `E2b-Sandbox-Id` header and envd access token, which the dashboard reads
//! from the API and never hands to the browser.
//!
//! Sessions. `POST /dashboard/login` checks the key against the API (`GET /teams`),
//! then keeps it in memory on the server under a random session id; the browser holds
//! only that id, in an `HttpOnly; SameSite=Strict; Path=/dashboard` cookie (also
//! `Secure` when a TLS-terminating proxy says `X-Forwarded-Proto: https`). Each session
//! has a CSRF token rendered into its pages; every state-changing request (form POSTs,
//! the JSON relay's non-GET calls, the terminal's WebSocket) must carry it, compared in
//! constant time. The login form has its own double-submit token (cookie + field) so a
//! foreign page cannot sign a browser into an attacker's team. Sessions end on logout,
//! after [`SESSION_IDLE`] without use, or when `berth up` restarts.
//!
//! Pages are server-rendered shells (navigation, labels, the CSRF token) filled by
//! `assets/app.js` from `/dashboard/api/…`, a relay to the REST API (GET freely,
//! anything else with the CSRF header; the proxy's `/proxy/…` paths are refused). The
//! sandbox page is checked server-side first, so a foreign sandbox id is a 404 page.

#![forbid(unsafe_code)]

mod assets;
mod envd;
mod error;
mod pages;
mod session;
mod terminal;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::response::Redirect;
use axum::routing::{any, get, post};
use axum::Router;

pub use error::DashboardError;

/// A session unused this long is signed out.
pub const SESSION_IDLE: Duration = Duration::from_secs(12 * 60 * 60);

/// Largest file the browser may upload into a sandbox (streamed through, never held).
pub const MAX_UPLOAD_BYTES: usize = 2 * 1024 * 1024 * 1024;

/// Where the dashboard is mounted.
pub const MOUNT: &str = "/dashboard";

pub(crate) struct Dashboard {
    pub upstream: upstream::Upstream,
    pub sessions: session::Sessions,
}

pub(crate) type Shared = Arc<Dashboard>;

/// The dashboard's routes under [`MOUNT`], calling `api` (the server's router: API and
/// sandbox proxy) in-process for everything it shows or does.
pub fn router(api: Router) -> Router {
    let state = Arc::new(Dashboard {
        upstream: upstream::Upstream::new(api),
        sessions: session::Sessions::default(),
    });
    Router::new()
        // The API has no root page: a browser pointed at berth lands on the dashboard.
        .route("/", get(|| async { Redirect::to("/dashboard/") }))
        .route("/dashboard", get(pages::sandboxes))
        .route("/dashboard/", get(pages::sandboxes))
        .route(
            "/dashboard/login",
            get(pages::login_form).post(pages::login),
        )
        .route("/dashboard/logout", post(pages::logout))
        .route("/dashboard/sandboxes/{id}", get(pages::sandbox))
        .route("/dashboard/sandboxes/{id}/terminal", get(terminal::upgrade))
        .route(
            "/dashboard/sandboxes/{id}/files",
            get(envd::download)
                .post(envd::upload)
                .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES)),
        )
        .route("/dashboard/sandboxes/{id}/files/list", get(envd::list_dir))
        .route("/dashboard/templates", get(pages::templates))
        .route("/dashboard/snapshots", get(pages::snapshots))
        .route("/dashboard/volumes", get(pages::volumes))
        .route("/dashboard/secrets", get(pages::secrets))
        .route("/dashboard/keys", get(pages::keys))
        .route("/dashboard/webhooks", get(pages::webhooks))
        .route("/dashboard/webhooks/{id}", get(pages::webhook))
        .route("/dashboard/usage", get(pages::usage))
        .route("/dashboard/api/{*path}", any(upstream::relay))
        .route("/dashboard/assets/{name}", get(assets::serve))
        // A route, not a fallback: the server's router, which this is merged into,
        // has its own fallback.
        .route("/dashboard/{*rest}", any(pages::not_found))
        .with_state(state)
}
