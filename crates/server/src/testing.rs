//! A real control plane for tests that need no root (feature `test-support`): the API
//! router and proxy on a loopback listener, the store and template store in a temp dir,
//! and sandboxes from [`berth_runtime::HostRuntime`] — the real `berth-envd` as a host
//! process. Two teams with a key each. Used by this crate's tests and by `berth-mcp`'s
//! to cover API → pipeline → envd, the proxy and `/mcp` with a plain `cargo test`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use berth_runtime::HostRuntime;
use berth_store::Store;
use berth_template::{TemplateConfig, TemplateStore};

use crate::{Server, ServerConfig};

/// The `berth-envd` binary: `BERTH_ENVD_BIN`, else `<target>/debug/berth-envd` next to
/// the running test's `deps/` directory, built with cargo on first need.
pub fn envd_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("BERTH_ENVD_BIN") {
                return PathBuf::from(path);
            }
            let exe = std::env::current_exe().expect("test executable path");
            let debug = exe
                .parent()
                .and_then(|deps| deps.parent())
                .expect("target dir");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "-q", "-p", "berth-envd", "--bin", "berth-envd"])
                .status()
                .expect("run cargo build");
            assert!(status.success(), "building berth-envd failed");
            debug.join("berth-envd")
        })
        .clone()
}

/// The user commands run as: whoever runs the tests (envd switches users only as root).
pub fn current_user() -> String {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .expect("stat /proc/self")
        .uid();
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.get(2) == Some(&uid.to_string().as_str())).then(|| fields[0].to_string())
        })
        .expect("the current uid has a passwd entry")
}

/// A running control plane; everything goes when it drops.
pub struct HostApi {
    /// `http://127.0.0.1:<port>`: the API and the proxy.
    pub url: String,
    pub store: Arc<Store>,
    /// Keys of teams `a` and `b`.
    pub key_a: String,
    pub key_b: String,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl HostApi {
    /// Start it, with `extra` routes (e.g. `/mcp`) built from the store and the URL;
    /// `max_sandboxes` caps the runtime like a host out of slots.
    pub async fn start(
        max_sandboxes: Option<usize>,
        extra: impl FnOnce(Arc<Store>, &str) -> axum::Router,
    ) -> HostApi {
        Self::start_configured(ServerConfig::default(), max_sandboxes, extra).await
    }

    /// Like [`HostApi::start`], with `config` (e.g. warm pools).
    pub async fn start_configured(
        config: ServerConfig,
        max_sandboxes: Option<usize>,
        extra: impl FnOnce(Arc<Store>, &str) -> axum::Router,
    ) -> HostApi {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(Store::open(dir.path()).expect("open store"));
        let team_a = store.create_team("a").expect("team a");
        let team_b = store.create_team("b").expect("team b");
        let (_, key_a) = store.create_api_key(&team_a.id, "a").expect("key a");
        let (_, key_b) = store.create_api_key(&team_b.id, "b").expect("key b");
        let templates = TemplateStore::open(dir.path()).expect("template store");
        let layer = templates
            .commit_layer(templates.stage_layer().expect("stage layer"))
            .expect("commit layer");
        templates
            .put(
                "base",
                vec![layer],
                TemplateConfig {
                    default_user: current_user(),
                    default_workdir: "/tmp".into(),
                    envs: [("FROM_TEMPLATE".to_string(), "yes".to_string())].into(),
                    start_cmd: None,
                    ready_cmd: None,
                    checkpoint: None,
                },
            )
            .expect("base template");
        let mut runtime =
            HostRuntime::new(dir.path().join("runtime"), envd_binary()).expect("host runtime");
        if let Some(max) = max_sandboxes {
            runtime = runtime.with_max_sandboxes(max);
        }
        let server = Server::start(store.clone(), Arc::new(runtime), templates, config)
            .await
            .expect("start the control plane");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let routes = extra(store.clone(), &url);
        let server = tokio::spawn(async move {
            server
                .serve(listener, routes, std::future::pending())
                .await
                .expect("serve");
        });
        HostApi {
            url,
            store,
            key_a,
            key_b,
            server,
            _dir: dir,
        }
    }
}

impl Drop for HostApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}
