//! Upload failures answer with their own status through the sandbox proxy: a disk that
//! fills up is a 507, a read-only path a 403, never the proxy's 502 or a 500. The real
//! API, proxy and `berth-envd` (a host process, `berth_runtime::HostRuntime`) against
//! small filesystems this test mounts (root: it mounts tmpfs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use berth_runtime::HostRuntime;
use berth_server::{Server, ServerConfig};
use berth_store::Store;
use berth_template::{TemplateConfig, TemplateStore};
use serde_json::{json, Value};

fn envd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_ENVD_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "berth-envd", "--bin", "berth-envd"])
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building berth-envd failed");
    debug.join("berth-envd")
}

/// A tmpfs mounted at a fresh directory, unmounted and removed on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                options,
                "berth-test",
                dir.to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs at {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test]
async fn full_disks_and_read_only_paths_keep_their_status_through_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let full = Tmpfs::mount(&dir.path().join("full"), "size=1m");
    let read_only = Tmpfs::mount(&dir.path().join("ro"), "size=1m,ro");

    let store = Arc::new(Store::open(dir.path()).unwrap());
    let team = store.create_team("t").unwrap();
    let (_, key) = store.create_api_key(&team.id, "k").unwrap();
    let templates = TemplateStore::open(dir.path()).unwrap();
    let layer = templates
        .commit_layer(templates.stage_layer().unwrap())
        .unwrap();
    templates
        .put(
            "base",
            vec![layer],
            TemplateConfig {
                default_user: "root".into(),
                default_workdir: "/tmp".into(),
                envs: Default::default(),
                start_cmd: None,
                ready_cmd: None,
                checkpoint: None,
            },
        )
        .unwrap();
    let runtime = HostRuntime::new(dir.path().join("runtime"), envd_binary()).unwrap();
    let server = Server::start(store, Arc::new(runtime), templates, ServerConfig::default())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let _serving = tokio::spawn(async move {
        server
            .serve(listener, axum::Router::new(), std::future::pending())
            .await
            .unwrap();
    });
    let http = reqwest::Client::new();
    let sandbox: Value = http
        .post(format!("{url}/v2/sandboxes"))
        .header("x-api-key", &key)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sandbox_id = sandbox["sandboxID"]
        .as_str()
        .expect("a sandbox")
        .to_string();
    let upload = |path: PathBuf, body: Vec<u8>| {
        http.post(format!("{url}/files?path={}", path.display()))
            .header("e2b-sandbox-id", &sandbox_id)
            .header("e2b-sandbox-port", "49983")
            .header(
                "x-access-token",
                sandbox["envdAccessToken"].as_str().unwrap_or(""),
            )
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
    };

    // 64 MiB into 1 MiB: envd stops writing after the first megabyte.
    let answer = upload(full.0.join("big"), vec![0x5a; 64 << 20])
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["code"], 507, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("disk space"),
        "{body}"
    );

    let answer = upload(read_only.0.join("file"), b"hello".to_vec())
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("Read-only"),
        "{body}"
    );

    // The sandbox still answers afterwards, on the same proxy.
    let answer = upload(dir.path().join("ok"), b"fine".to_vec())
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    http.delete(format!("{url}/sandboxes/{sandbox_id}"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
}
