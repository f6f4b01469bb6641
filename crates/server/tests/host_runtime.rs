//! The control plane end to end without root: the real API router and proxy on a
//! loopback listener, the real store and template store in a temp dir, and sandboxes
//! from `berth_runtime::HostRuntime` — the real `berth-envd` as a host process. Covers
//! create → command → files → kill, pause/resume and their errors, team isolation, the
//! proxy's 502 for a sandbox that is gone, and the capacity error.
//!
//! The fixture is `berth_server::testing::HostApi` (feature `test-support`).

use berth_envd_proto::connect::{encode_envelope, EnvelopeDecoder};
use berth_server::testing::HostApi;
use berth_server::ServerConfig;
use serde_json::{json, Value};

/// The control plane and a client for it.
struct Api {
    _host: HostApi,
    url: String,
    key_a: String,
    key_b: String,
    http: reqwest::Client,
}

async fn start(max_sandboxes: Option<usize>) -> Api {
    start_configured(ServerConfig::default(), max_sandboxes).await
}

async fn start_configured(config: ServerConfig, max_sandboxes: Option<usize>) -> Api {
    let host = HostApi::start_configured(config, max_sandboxes, |_, _| axum::Router::new()).await;
    Api {
        url: host.url.clone(),
        key_a: host.key_a.clone(),
        key_b: host.key_b.clone(),
        _host: host,
        http: reqwest::Client::new(),
    }
}

impl Api {
    async fn call(
        &self,
        key: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("x-api-key", key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create(&self, key: &str) -> Value {
        let (status, body) = self
            .call(
                key,
                reqwest::Method::POST,
                "/v2/sandboxes",
                Some(json!({"templateID": "base", "envVars": {"FROM_CALLER": "1"}})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body
    }

    /// A request to envd of `sandbox` through the proxy, as the SDKs send it with
    /// `E2B_SANDBOX_URL`.
    fn envd(
        &self,
        sandbox: &Value,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .header("e2b-sandbox-id", sandbox["sandboxID"].as_str().unwrap())
            .header("e2b-sandbox-port", "49983")
            .header(
                "x-access-token",
                sandbox["envdAccessToken"].as_str().unwrap_or(""),
            )
    }

    /// Runs `command` with `bash -c` in `sandbox`: (exit code, stdout).
    async fn run(&self, sandbox: &Value, command: &str) -> (i64, String) {
        let request = json!({"process": {"cmd": "/bin/bash", "args": ["-c", command]}});
        let body = encode_envelope(0, &serde_json::to_vec(&request).unwrap());
        let response = self
            .envd(sandbox, reqwest::Method::POST, "/process.Process/Start")
            .header("content-type", "application/connect+json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
        let bytes = response.bytes().await.unwrap();
        let mut decoder = EnvelopeDecoder::new(1 << 20);
        decoder.push(&bytes);
        let (mut stdout, mut exit) = (String::new(), None);
        while let Some(envelope) = decoder.next_envelope().unwrap() {
            if envelope.is_end_stream() {
                break;
            }
            let message: Value = serde_json::from_slice(&envelope.payload).unwrap();
            let event = &message["event"];
            if let Some(data) = event["data"]["stdout"].as_str() {
                use base64::Engine;
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap();
                stdout.push_str(&String::from_utf8_lossy(&raw));
            }
            if event.get("end").is_some() {
                exit = Some(event["end"]["exitCode"].as_i64().unwrap_or(0));
            }
        }
        (exit.expect("the stream had an end event"), stdout)
    }
}

fn id(sandbox: &Value) -> &str {
    sandbox["sandboxID"].as_str().unwrap()
}

#[tokio::test]
async fn create_run_files_and_kill() {
    let api = start(None).await;
    let sandbox = api.create(&api.key_a).await;
    assert!(sandbox["envdAccessToken"].is_string());

    let (exit, stdout) = api
        .run(
            &sandbox,
            "echo \"$FROM_TEMPLATE $FROM_CALLER $E2B_SANDBOX_ID\"; exit 3",
        )
        .await;
    assert_eq!(exit, 3);
    assert_eq!(stdout.trim(), format!("yes 1 {}", id(&sandbox)));

    let path = "/tmp/berth-host-runtime-test-file";
    let upload = api
        .envd(
            &sandbox,
            reqwest::Method::POST,
            &format!("/files?path={path}-{}", id(&sandbox)),
        )
        .header("content-type", "application/octet-stream")
        .body("hello from the test")
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 200, "{:?}", upload.text().await);
    let download = api
        .envd(
            &sandbox,
            reqwest::Method::GET,
            &format!("/files?path={path}-{}", id(&sandbox)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    assert_eq!(download.text().await.unwrap(), "hello from the test");
    let (_, stdout) = api
        .run(
            &sandbox,
            &format!("cat {path}-{0}; rm {path}-{0}", id(&sandbox)),
        )
        .await;
    assert_eq!(stdout, "hello from the test");

    let (status, _) = api
        .call(
            &api.key_a,
            reqwest::Method::DELETE,
            &format!("/sandboxes/{}", id(&sandbox)),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (status, _) = api
        .call(
            &api.key_a,
            reqwest::Method::GET,
            &format!("/sandboxes/{}", id(&sandbox)),
            None,
        )
        .await;
    assert_eq!(status, 404);

    // The proxy's answer for a sandbox that is gone: E2B's 502 shape.
    let gone = api
        .envd(&sandbox, reqwest::Method::GET, "/health")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 502);
    let body: Value = gone.json().await.unwrap();
    assert_eq!(body["code"], 502);
    assert_eq!(body["sandboxId"], id(&sandbox));
    assert_eq!(body["message"], "The sandbox was not found");
}

/// From the moment a kill begins the proxy answers for the sandbox as before or with
/// "not found", never with a failed connection into the dying sandbox: after a kill
/// cuts its stream, the SDKs' health probe tells "killed" from "unreachable, state
/// unknown" by that answer. Probes run back to back through the whole kill.
#[tokio::test]
async fn a_sandbox_being_killed_is_not_found_never_unreachable() {
    let api = std::sync::Arc::new(start(None).await);
    for _ in 0..5 {
        let sandbox = api.create(&api.key_a).await;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let prober = {
            let (api, sandbox, done) = (api.clone(), sandbox.clone(), done.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                // One more probe after the kill returned, so the last answer is the
                // settled one.
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let response = api
                        .envd(&sandbox, reqwest::Method::GET, "/health")
                        .send()
                        .await
                        .unwrap();
                    let status = response.status().as_u16();
                    answers.push((status, response.text().await.unwrap()));
                    if finished {
                        return answers;
                    }
                }
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let (status, _) = api
            .call(
                &api.key_a,
                reqwest::Method::DELETE,
                &format!("/sandboxes/{}", id(&sandbox)),
                None,
            )
            .await;
        assert_eq!(status, 204);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let answers = prober.await.unwrap();
        let first_gone = answers
            .iter()
            .position(|(status, _)| *status == 502)
            .expect("a probe after the kill");
        for (status, body) in &answers[..first_gone] {
            assert_eq!(*status, 204, "{body}");
        }
        for (status, body) in &answers[first_gone..] {
            let body: Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                (*status, body["message"].as_str().unwrap()),
                (502, "The sandbox was not found"),
                "after {first_gone} answers from the running sandbox"
            );
        }
    }
}

#[tokio::test]
async fn pause_resume_and_their_errors() {
    let api = start(None).await;
    let sandbox = api.create(&api.key_a).await;
    let sid = id(&sandbox).to_string();
    // A background process whose memory must survive a pause with memory.
    api.run(
        &sandbox,
        "nohup sleep 600 >/dev/null 2>&1 & echo $! > /proc/$PPID/cwd/sleeper",
    )
    .await;
    let post = |path: String, body: Option<Value>| {
        let api = &api;
        async move {
            api.call(&api.key_a, reqwest::Method::POST, &path, body)
                .await
        }
    };
    let (status, body) = post(format!("/sandboxes/{sid}/pause"), None).await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = post(format!("/sandboxes/{sid}/pause"), None).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("already paused"),
        "{body}"
    );
    let (status, body) = post(
        format!("/sandboxes/{sid}/timeout"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let paused = api
        .envd(&sandbox, reqwest::Method::GET, "/health")
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), 502, "a paused sandbox is not reachable");

    let (status, body) = post(
        format!("/v2/sandboxes/{sid}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (exit, _) = api
        .run(&sandbox, "kill -0 $(cat /proc/$PPID/cwd/sleeper)")
        .await;
    assert_eq!(exit, 0, "the background process continued");
    let (status, body) = post(format!("/sandboxes/{sid}/resume"), Some(json!({}))).await;
    assert_eq!(status, 409, "{body}");
    let (status, _) = post(
        format!("/v2/sandboxes/{sid}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(status, 200, "connect to a running sandbox");

    // Without memory: files stay, processes do not; envd is initialised again.
    let (status, _) = post(
        format!("/sandboxes/{sid}/pause"),
        Some(json!({"memory": false})),
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = post(format!("/sandboxes/{sid}/resume"), Some(json!({}))).await;
    assert_eq!(status, 201, "{body}");
    // Gone, or a zombie not yet reaped by the host's init.
    let alive = "s=$(cut -d' ' -f3 /proc/$(cat /proc/$PPID/cwd/sleeper)/stat 2>/dev/null); \
                 [ -n \"$s\" ] && [ \"$s\" != Z ] && echo alive || echo gone";
    let (_, stdout) = api
        .run(&sandbox, &format!("{alive}; echo $FROM_CALLER"))
        .await;
    assert_eq!(stdout, "gone\n1\n", "process gone, file and env kept");

    let (status, _) = post("/sandboxes/inotasandbox00000000000/pause".into(), None).await;
    assert_eq!(status, 404);
    // This runtime offers no checkpoints: a named 501, not a 500.
    let (status, body) = post(format!("/sandboxes/{sid}/snapshots"), Some(json!({}))).await;
    assert_eq!(status, 501, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("checkpoints"),
        "{body}"
    );
}

#[tokio::test]
async fn teams_see_only_their_own_sandboxes() {
    let api = start(None).await;
    let mine = api.create(&api.key_a).await;
    let theirs = api.create(&api.key_b).await;
    let (status, listed) = api
        .call(&api.key_a, reqwest::Method::GET, "/v2/sandboxes", None)
        .await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(id).collect();
    assert_eq!(ids, [id(&mine)]);
    for (method, path) in [
        (reqwest::Method::GET, format!("/sandboxes/{}", id(&theirs))),
        (
            reqwest::Method::DELETE,
            format!("/sandboxes/{}", id(&theirs)),
        ),
        (
            reqwest::Method::POST,
            format!("/sandboxes/{}/pause", id(&theirs)),
        ),
    ] {
        let (status, body) = api.call(&api.key_a, method, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    // Another team's envd is not reachable with one's own sandbox's token either.
    let mut forged = theirs.clone();
    forged["envdAccessToken"] = mine["envdAccessToken"].clone();
    let denied = api
        .envd(&forged, reqwest::Method::GET, "/envs")
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 401);
}

#[tokio::test]
async fn a_full_host_is_a_clear_503() {
    let api = start(Some(1)).await;
    api.create(&api.key_a).await;
    let (status, body) = api
        .call(
            &api.key_a,
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("slots are in use"),
        "{body}"
    );
}

/// Seconds since sandbox `sandbox`'s envd (the parent of its commands) started.
async fn envd_age(api: &Api, sandbox: &Value) -> f64 {
    let (_, out) = api
        .run(
            sandbox,
            "ticks=$(cut -d' ' -f22 /proc/$PPID/stat); hz=$(getconf CLK_TCK); \
             up=$(cut -d' ' -f1 /proc/uptime); echo \"$up $ticks $hz\"",
        )
        .await;
    let fields: Vec<f64> = out.split_whitespace().map(|v| v.parse().unwrap()).collect();
    fields[0] - fields[1] / fields[2]
}

#[tokio::test]
async fn a_create_claims_a_warm_sandbox_that_carries_nothing_of_another() {
    let config = ServerConfig {
        pool_size: 2,
        ..ServerConfig::default()
    };
    let api = start_configured(config, None).await;
    // The first create of a template starts its pool.
    let (status, first) = api
        .call(
            &api.key_a,
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "envVars": {"ONLY_A": "a-secret"}})),
        )
        .await;
    assert_eq!(status, 201, "{first}");
    // The host runtime gives each sandbox a directory: its envd's working dir.
    api.run(&first, "echo from-a > /proc/$PPID/cwd/mark").await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let claimed = api.create(&api.key_b).await;
    assert!(
        envd_age(&api, &claimed).await >= 2.0,
        "the sandbox was started before its create: a pool claim"
    );
    let (_, out) = api
        .run(
            &claimed,
            "echo \"[$FROM_CALLER] [$ONLY_A] $E2B_SANDBOX_ID\"; cat /proc/$PPID/cwd/mark 2>&1 || true",
        )
        .await;
    assert!(
        out.starts_with(&format!("[1] [] {}", id(&claimed))),
        "{out}"
    );
    assert!(!out.contains("from-a"), "another sandbox's files: {out}");
    assert_ne!(first["sandboxID"], claimed["sandboxID"]);
    assert_ne!(first["envdAccessToken"], claimed["envdAccessToken"]);
    // The pooled envd took the claimant's token: the old one, or none, is refused.
    let mut without = claimed.clone();
    without["envdAccessToken"] = Value::String(String::new());
    let denied = api
        .envd(&without, reqwest::Method::GET, "/envs")
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 401);
    // Pooled sandboxes are nobody's: listings show only what was created.
    let (_, listed) = api
        .call(&api.key_b, reqwest::Method::GET, "/v2/sandboxes", None)
        .await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
}

#[tokio::test]
async fn installed_templates_are_listed_resolved_and_read_only() {
    use reqwest::Method;
    let api = start(None).await;
    for path in ["/templates", "/v2/templates"] {
        let (status, listed) = api.call(&api.key_a, Method::GET, path, None).await;
        assert_eq!(status, 200, "{listed}");
        let base = &listed.as_array().unwrap()[0];
        assert_eq!(base["templateID"], "base");
        assert_eq!(base["names"], json!(["base"]));
        assert_eq!(base["public"], true);
        assert_eq!(base["buildStatus"], "ready");
    }
    let (status, one) = api
        .call(&api.key_b, Method::GET, "/templates/base", None)
        .await;
    assert_eq!(status, 200, "{one}");
    let builds = one["builds"].as_array().unwrap();
    assert_eq!(builds.len(), 1);
    assert_eq!(builds[0]["status"], "ready");
    let (status, tags) = api
        .call(&api.key_a, Method::GET, "/templates/base/tags", None)
        .await;
    assert_eq!(status, 200, "{tags}");
    assert_eq!(tags[0]["tag"], "default");
    assert_eq!(tags[0]["buildID"], builds[0]["buildID"]);
    let (status, alias) = api
        .call(&api.key_a, Method::GET, "/templates/aliases/base", None)
        .await;
    assert_eq!((status, &alias["templateID"]), (200, &json!("base")));
    let (status, _) = api
        .call(&api.key_a, Method::GET, "/templates/aliases/base:v9", None)
        .await;
    assert_eq!(status, 404, "a missing tag");
    let (status, _) = api
        .call(&api.key_a, Method::GET, "/templates/aliases/Bad Name", None)
        .await;
    assert_eq!(status, 400);

    // Read-only: installed templates are nobody's to change.
    let (status, body) = api
        .call(
            &api.key_a,
            Method::PATCH,
            "/templates/base",
            Some(json!({"public": false})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = api
        .call(&api.key_a, Method::DELETE, "/templates/base", None)
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = api
        .call(
            &api.key_a,
            Method::POST,
            "/templates/tags",
            Some(json!({"target": "base", "tags": ["mine"]})),
        )
        .await;
    assert_eq!(status, 403, "{body}");

    // This runtime builds nothing: a clear 501, not a fake build.
    let (status, body) = api
        .call(
            &api.key_a,
            Method::POST,
            "/v3/templates",
            Some(json!({"name": "app"})),
        )
        .await;
    assert_eq!(status, 501, "{body}");
    let (status, _) = api
        .call(&api.key_a, Method::GET, "/templates/nope/files/00", None)
        .await;
    assert_eq!(status, 400, "a malformed hash");

    // `base:default` is `base`; the sandbox reports the name and build it came from.
    let (status, sandbox) = api
        .call(
            &api.key_a,
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base:default"})),
        )
        .await;
    assert_eq!(status, 201, "{sandbox}");
    let (_, info) = api
        .call(
            &api.key_a,
            Method::GET,
            &format!("/sandboxes/{}", id(&sandbox)),
            None,
        )
        .await;
    assert_eq!(info["templateID"], "base");
    assert_eq!(info["cpuCount"], 2);
    let (status, one) = api
        .call(&api.key_a, Method::GET, "/templates/base", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(one["spawnCount"], 1);
    let (status, body) = api
        .call(&api.key_a, Method::DELETE, "/templates/base", None)
        .await;
    assert_eq!(status, 403, "{body}");
    api.call(
        &api.key_a,
        Method::DELETE,
        &format!("/sandboxes/{}", id(&sandbox)),
        None,
    )
    .await;
}

#[tokio::test]
async fn a_sandbox_whose_envd_exits_is_reported_killed_and_freed() {
    let api = start(None).await;
    let sandbox = api.create(&api.key_a).await;
    // The host runtime's envd is a host process; the command's parent is it.
    let (_, envd_pid) = api.run(&sandbox, "echo $PPID").await;
    let envd_pid: i32 = envd_pid.trim().parse().unwrap();
    // SAFETY: kill(2) of the envd this test's runtime started.
    assert_eq!(unsafe { libc::kill(envd_pid, libc::SIGKILL) }, 0);
    let path = format!("/sandboxes/{}", id(&sandbox));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, _) = api
            .call(&api.key_a, reqwest::Method::GET, &path, None)
            .await;
        if status == 404 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a sandbox whose envd exited is still listed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, events) = api
        .call(
            &api.key_a,
            reqwest::Method::GET,
            &format!("/events/sandboxes/{}?orderAsc=true", id(&sandbox)),
            None,
        )
        .await;
    assert_eq!(status, 200, "{events}");
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(
        kinds.last().copied(),
        Some("sandbox.lifecycle.killed"),
        "{kinds:?}"
    );
    let (status, logs) = api
        .call(
            &api.key_a,
            reqwest::Method::GET,
            &format!("/v2/sandboxes/{}/logs", id(&sandbox)),
            None,
        )
        .await;
    assert_eq!(status, 200, "{logs}");
    assert!(
        logs.to_string().contains("its envd (PID 1) exited"),
        "{logs}"
    );
}

/// Sends one request whose body follows its headers late, then `GET /health` on the
/// same connection; returns both status lines (`None` for the second if the connection
/// was closed under it).
async fn refused_then_health(url: &str, head: &str, body: &[u8]) -> (String, Option<String>) {
    let address = url.trim_start_matches("http://");
    let health = format!("GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n");
    let (refused, next) =
        berth_leftover_body::testing::late_body_then(address, head, body, &health).await;
    (refused, next.map(|(status, _)| status))
}

#[tokio::test]
async fn a_refused_request_leaves_its_connection_usable() {
    let api = start(None).await;
    // No API key: the API's 401.
    let (refused, next) = refused_then_health(
        &api.url,
        "POST /sandboxes HTTP/1.1\r\nContent-Type: application/json\r\n",
        br#"{"templateID":"base"}"#,
    )
    .await;
    assert!(refused.contains(" 401 "), "{refused}");
    assert_eq!(next.as_deref(), Some("HTTP/1.1 204 No Content"));
    // A sandbox that does not exist, through the proxy.
    let (refused, next) = refused_then_health(
        &api.url,
        "POST /process.Process/List HTTP/1.1\r\nE2b-Sandbox-Id: inowhere\r\nE2b-Sandbox-Port: 49983\r\nContent-Type: application/json\r\n",
        b"{}",
    )
    .await;
    assert!(
        refused.contains(" 404 ") || refused.contains(" 502 "),
        "{refused}"
    );
    assert_eq!(next.as_deref(), Some("HTTP/1.1 204 No Content"));
}
