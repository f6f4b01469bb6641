//! Webhook SSRF guard end to end: the real API and delivery task, loopback listeners that
//! must (or must not) receive anything, and a resolver the test controls (no real DNS).
//! Addresses outside loopback (198.18.0.0/15, the benchmarking range) only ever appear
//! in resolver answers for checks that do not connect.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{IpAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_runtime::HostRuntime;
use berth_server::{Resolution, Server, ServerConfig, WebhookConfig, WebhookResolver};
use berth_store::{EventRecord, Store};
use berth_template::TemplateStore;
use serde_json::{json, Value};

/// Answers every name with the next queued answer (the last one repeats), counting
/// lookups.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Vec<IpAddr>>>,
    lookups: AtomicUsize,
}

impl Scripted {
    fn then(&self, answer: &[&str]) {
        let answer = answer.iter().map(|a| a.parse().unwrap()).collect();
        self.answers.lock().unwrap().push_back(answer);
    }
}

impl WebhookResolver for Scripted {
    fn resolve<'a>(&'a self, _host: &'a str, _port: u16) -> Resolution<'a> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let mut answers = self.answers.lock().unwrap();
        let answer = if answers.len() > 1 {
            answers.pop_front()
        } else {
            answers.front().cloned()
        };
        Box::pin(async move { Ok(answer.unwrap_or_default()) })
    }
}

/// A loopback listener that records whole requests it receives and answers each with
/// `answer` (a full HTTP response).
struct Listener {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Listener {
    fn start(ip: &str, port: u16, answer: &'static str) -> Listener {
        let listener = TcpListener::bind((ip, port)).expect("bind a loopback listener");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                stream
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&buf[..n]);
                    if request.windows(4).any(|w| w == b"\r\n\r\n")
                        && String::from_utf8_lossy(&request).contains("\"berth-probe\"")
                    {
                        break;
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&request).into_owned());
                let _ = std::io::Write::write_all(&mut stream, answer.as_bytes());
            }
        });
        Listener { url, requests }
    }

    fn received(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

struct Api {
    url: String,
    key: String,
    team: String,
    store: Arc<Store>,
    http: reqwest::Client,
    _server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start(webhooks: WebhookConfig) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let team = store.create_team("hooks").unwrap();
    let (_, key) = store.create_api_key(&team.id, "hooks").unwrap();
    let templates = TemplateStore::open(dir.path()).unwrap();
    // No sandbox is ever created: any executable stands in for envd.
    let runtime = HostRuntime::new(dir.path().join("runtime"), "/bin/true").unwrap();
    let config = ServerConfig {
        webhooks,
        ..Default::default()
    };
    let server = Server::start(store.clone(), Arc::new(runtime), templates, config)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = tokio::spawn(async move {
        server
            .serve(listener, axum::Router::new(), std::future::pending())
            .await
            .unwrap();
    });
    Api {
        url,
        key,
        team: team.id,
        store,
        http: reqwest::Client::new(),
        _server: handle,
        _dir: dir,
    }
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("X-API-Key", &self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn create_hook(&self, url: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::POST,
            "/events/webhooks",
            json!({
                "name": "probe",
                "url": url,
                "enabled": true,
                "events": ["sandbox.lifecycle.created"],
                "signatureSecret": "probe-secret",
            }),
        )
        .await
    }

    /// Records a `created` event for the team, which queues a delivery to its webhooks.
    fn fire_event(&self) {
        let event = EventRecord {
            id: uuid_like(),
            team_id: self.team.clone(),
            sandbox_id: "iprobe".into(),
            template_id: "base".into(),
            build_id: "b".into(),
            event_type: "sandbox.lifecycle.created".into(),
            execution_id: "probe-execution".into(),
            data: None,
            timestamp: time::OffsetDateTime::now_utc(),
        };
        self.store
            .record_event(&event, |_| r#"{"sandboxId":"berth-probe"}"#.to_string())
            .unwrap();
    }
}

fn uuid_like() -> String {
    format!(
        "{:032x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Waits until `done` holds (the delivery loop runs at least every 5 s).
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn internal_urls_are_refused_at_create_and_update() {
    let resolver = Arc::new(Scripted::default());
    resolver.then(&["198.18.0.9"]);
    let api = start(WebhookConfig {
        allow: Vec::new(),
        resolver: resolver.clone(),
    })
    .await;
    let listener = Listener::start("127.0.0.1", 0, OK);
    let port = listener.url.rsplit(':').next().unwrap().to_string();
    for url in [
        listener.url.clone(),
        format!("http://localhost:{port}/hook"),
        format!("http://[::1]:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/".to_string(),
        "http://[fe80::1]/".to_string(),
    ] {
        let (status, body) = api.create_hook(&url).await;
        assert_eq!(status, 400, "{url}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("berth does not deliver there"),
            "{url}: {body}"
        );
    }
    let (status, created) = api.create_hook("http://hooks.example.test/in").await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let (status, body) = api
        .send(
            reqwest::Method::PATCH,
            &format!("/events/webhooks/{id}"),
            json!({ "url": listener.url }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (_, kept) = api
        .send(
            reqwest::Method::GET,
            &format!("/events/webhooks/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(kept["url"], "http://hooks.example.test/in");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listener.received(), 0, "a refused URL received a request");
}

#[tokio::test]
async fn a_name_that_turns_internal_after_create_receives_nothing() {
    let listener = Listener::start("127.0.0.1", 0, OK);
    let port: u16 = listener.url.rsplit(':').next().unwrap().parse().unwrap();
    let resolver = Arc::new(Scripted::default());
    resolver.then(&["198.18.0.9"]);
    let api = start(WebhookConfig {
        allow: Vec::new(),
        resolver: resolver.clone(),
    })
    .await;
    let (status, body) = api
        .create_hook(&format!("http://rebind.example.test:{port}/hook"))
        .await;
    assert_eq!(status, 201, "{body}");
    // The name now answers with the loopback listener's address.
    resolver.answers.lock().unwrap().clear();
    resolver.then(&["127.0.0.1"]);
    let before = resolver.lookups.load(Ordering::SeqCst);
    api.fire_event();
    eventually("the delivery to look the name up again", || {
        resolver.lookups.load(Ordering::SeqCst) > before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(listener.received(), 0, "a delivery reached loopback");
}

#[tokio::test]
async fn deliveries_connect_to_the_checked_address_and_follow_no_redirect() {
    // Both listeners on one port: A on 127.0.0.2 (allowed), B on 127.0.0.1 (denied).
    let b = Listener::start("127.0.0.1", 0, OK);
    let port: u16 = b.url.rsplit(':').next().unwrap().parse().unwrap();
    let a = Listener::start("127.0.0.2", port, OK);
    let resolver = Arc::new(Scripted::default());
    // Create's check, the delivery's check, then a rebinding answer for anyone asking
    // again.
    resolver.then(&["127.0.0.2"]);
    resolver.then(&["127.0.0.2"]);
    resolver.then(&["127.0.0.1"]);
    let api = start(WebhookConfig {
        allow: vec!["127.0.0.2/32".parse().unwrap()],
        resolver: resolver.clone(),
    })
    .await;
    let (status, body) = api
        .create_hook(&format!("http://pinned.example.test:{port}/hook"))
        .await;
    assert_eq!(status, 201, "{body}");
    api.fire_event();
    eventually("a delivery to the checked address", || a.received() == 1).await;
    let request = a.requests.lock().unwrap()[0].clone();
    assert!(request.starts_with("POST /hook HTTP/1.1"), "{request}");
    assert!(
        request
            .to_ascii_lowercase()
            .contains(&format!("host: pinned.example.test:{port}")),
        "{request}"
    );
    assert!(request.contains("e2b-signature"), "{request}");
    assert_eq!(b.received(), 0, "the delivery resolved the name again");
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 2);

    // A receiver that redirects to the denied listener: the redirect is not followed.
    let redirector = Listener::start(
        "127.0.0.2",
        0,
        Box::leak(
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{port}/hook\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n"
            )
            .into_boxed_str(),
        ),
    );
    let redirect_port = redirector.url.rsplit(':').next().unwrap().to_string();
    resolver.answers.lock().unwrap().clear();
    resolver.then(&["127.0.0.2"]);
    let (status, body) = api
        .create_hook(&format!("http://redirect.example.test:{redirect_port}/r"))
        .await;
    assert_eq!(status, 201, "{body}");
    api.fire_event();
    eventually("a delivery to the redirector", || {
        redirector.received() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.received(), 0, "a redirect was followed");
}
