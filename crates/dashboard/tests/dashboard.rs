//! The dashboard over a real control plane (berth-server on the host runtime: the real
//! envd as a host process), driven over HTTP and WebSocket like a browser: sign-in and
//! its refusals, CSRF, team isolation, files through envd, and the terminal.

use std::collections::HashMap;
use std::time::Duration;

use berth_server::testing::HostApi;
use berth_server::ServerConfig;
use futures::{SinkExt, StreamExt};
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use reqwest::StatusCode;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

async fn start() -> HostApi {
    HostApi::start_with_server(ServerConfig::default(), None, |server, _, _| {
        berth_dashboard::router(server.router())
    })
    .await
}

/// A cookie-keeping client that does not follow redirects.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookies: HashMap<String, String>,
    set_cookie_lines: Vec<String>,
}

impl Browser {
    fn new(base: &str) -> Self {
        Browser {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: base.to_owned(),
            cookies: HashMap::new(),
            set_cookie_lines: Vec::new(),
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn absorb(&mut self, response: &reqwest::Response) {
        for line in response.headers().get_all(SET_COOKIE) {
            let line = line.to_str().unwrap().to_owned();
            let (pair, _) = line.split_once(';').unwrap_or((&line, ""));
            let (name, value) = pair.split_once('=').unwrap();
            if line.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
            self.set_cookie_lines.push(line);
        }
    }

    async fn get(&mut self, path: &str) -> reqwest::Response {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header(COOKIE, self.cookie_header())
            .send()
            .await
            .unwrap();
        self.absorb(&response);
        response
    }

    async fn post(
        &mut self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        csrf: Option<&str>,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header(COOKIE, self.cookie_header())
            .header(CONTENT_TYPE, content_type)
            .body(body);
        if let Some(csrf) = csrf {
            request = request.header("x-csrf-token", csrf);
        }
        let response = request.send().await.unwrap();
        self.absorb(&response);
        response
    }

    /// Signs in with `key`; returns the login answer's status.
    async fn sign_in(&mut self, key: &str) -> StatusCode {
        let form = self.get("/dashboard/login").await.text().await.unwrap();
        let token = attribute_after(&form, r#"name="csrf" value=""#);
        let body = format!("api_key={key}&csrf={token}");
        self.post(
            "/dashboard/login",
            "application/x-www-form-urlencoded",
            body.into_bytes(),
            None,
        )
        .await
        .status()
    }

    /// The CSRF token the signed-in pages carry.
    async fn csrf(&mut self) -> String {
        let page = self.get("/dashboard/").await.text().await.unwrap();
        attribute_after(&page, r#"<meta name="csrf-token" content=""#)
    }
}

fn attribute_after(html: &str, prefix: &str) -> String {
    let start = html.find(prefix).expect("attribute in page") + prefix.len();
    html[start..].split('"').next().unwrap().to_owned()
}

async fn create_sandbox(api: &HostApi, key: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{}/sandboxes", api.url))
        .header("x-api-key", key)
        .header(CONTENT_TYPE, "application/json")
        .body(r#"{"templateID":"base","timeout":300}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = response.text().await.unwrap();
    attribute_after(&body, r#""sandboxID":""#)
}

#[tokio::test]
async fn sign_in_keeps_the_key_on_the_server_and_refuses_what_it_must() {
    let api = start().await;
    let mut browser = Browser::new(&api.url);

    // Signed out: pages send the browser to sign in, the relay answers 401.
    let response = browser.get("/dashboard/").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[LOCATION], "/dashboard/login");
    assert_eq!(
        browser.get("/dashboard/api/v2/sandboxes").await.status(),
        StatusCode::UNAUTHORIZED
    );

    // A wrong key is refused and starts no session.
    assert_eq!(
        browser
            .sign_in("e2b_0000000000000000000000000000000000000000")
            .await,
        StatusCode::UNAUTHORIZED
    );
    assert!(!browser.cookies.contains_key("berth_session"));

    // A login form posted without its double-submit cookie is refused.
    let mut foreign = Browser::new(&api.url);
    let body = format!("api_key={}&csrf=abc", api.key_a);
    let refused = foreign
        .post(
            "/dashboard/login",
            "application/x-www-form-urlencoded",
            body.into_bytes(),
            None,
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(!foreign.cookies.contains_key("berth_session"));

    // The right key: a session cookie that script cannot read and other sites never send.
    assert_eq!(browser.sign_in(&api.key_a).await, StatusCode::SEE_OTHER);
    let session = browser
        .set_cookie_lines
        .iter()
        .find(|line| line.starts_with("berth_session=") && !line.contains("Max-Age=0"))
        .expect("session cookie");
    assert!(session.contains("HttpOnly") && session.contains("SameSite=Strict"));
    assert!(!session.contains(&api.key_a));
    let page = browser.get("/dashboard/").await.text().await.unwrap();
    assert!(
        !page.contains(&api.key_a),
        "the key must not reach the page"
    );
    assert_eq!(
        browser.get("/dashboard/api/v2/sandboxes").await.status(),
        StatusCode::OK
    );

    // State changes need the session's CSRF token.
    let csrf = browser.csrf().await;
    let create = br#"{"templateID":"base"}"#.to_vec();
    let without = browser
        .post(
            "/dashboard/api/sandboxes",
            "application/json",
            create.clone(),
            None,
        )
        .await;
    assert_eq!(without.status(), StatusCode::FORBIDDEN);
    let wrong = browser
        .post(
            "/dashboard/api/sandboxes",
            "application/json",
            create,
            Some(&"0".repeat(64)),
        )
        .await;
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);

    // The relay never reaches the proxy.
    assert_eq!(
        browser
            .get("/dashboard/api/proxy/x/49983/health")
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );

    // Signing out ends the session on the server.
    let out = browser
        .post(
            "/dashboard/logout",
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}").into_bytes(),
            None,
        )
        .await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        browser.get("/dashboard/api/v2/sandboxes").await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn sandbox_pages_files_and_terminal_are_the_teams_own() {
    let api = start().await;
    let id = create_sandbox(&api, &api.key_a).await;
    let mut owner = Browser::new(&api.url);
    assert_eq!(owner.sign_in(&api.key_a).await, StatusCode::SEE_OTHER);
    let mut other = Browser::new(&api.url);
    assert_eq!(other.sign_in(&api.key_b).await, StatusCode::SEE_OTHER);
    let csrf = owner.csrf().await;

    assert_eq!(
        owner
            .get(&format!("/dashboard/sandboxes/{id}"))
            .await
            .status(),
        StatusCode::OK
    );
    for path in [
        format!("/dashboard/sandboxes/{id}"),
        format!("/dashboard/sandboxes/{id}/files?path=/etc/hostname"),
        format!("/dashboard/sandboxes/{id}/files/list?path=/tmp"),
        format!("/dashboard/api/sandboxes/{id}"),
    ] {
        assert_eq!(
            other.get(&path).await.status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }

    // Upload, list, download through envd.
    // The host runtime's sandboxes share the host's files: a directory removed on drop.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_str().unwrap().to_owned();
    let target = format!("{dir}/uploaded.txt");
    let boundary = "dashboardtestboundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"uploaded.txt\"\r\n\r\nhello from the dashboard\r\n--{boundary}--\r\n"
    );
    let upload_path = format!("/dashboard/sandboxes/{id}/files?path={target}");
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let refused = owner
        .post(&upload_path, &content_type, body.clone().into_bytes(), None)
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let uploaded = owner
        .post(&upload_path, &content_type, body.into_bytes(), Some(&csrf))
        .await;
    assert_eq!(uploaded.status(), StatusCode::OK);
    let listed = owner
        .get(&format!("/dashboard/sandboxes/{id}/files/list?path={dir}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(listed.contains("uploaded.txt"), "{listed}");
    let downloaded = owner.get(&upload_path).await;
    assert_eq!(downloaded.status(), StatusCode::OK);
    assert!(downloaded.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));
    assert_eq!(downloaded.text().await.unwrap(), "hello from the dashboard");

    // A form without a `file` part writes nothing; a file larger than axum's default
    // body limit streams through whole.
    let empty = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--{boundary}--\r\n");
    let no_file = owner
        .post(&upload_path, &content_type, empty.into_bytes(), Some(&csrf))
        .await;
    assert_eq!(no_file.status(), StatusCode::BAD_REQUEST);
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&big);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let big_path = format!("/dashboard/sandboxes/{id}/files?path={dir}/big.bin");
    let uploaded = owner
        .post(&big_path, &content_type, body, Some(&csrf))
        .await;
    assert_eq!(uploaded.status(), StatusCode::OK);
    let downloaded = owner.get(&big_path).await.bytes().await.unwrap();
    assert!(
        downloaded.as_ref() == big.as_slice(),
        "the big file came back changed"
    );

    // The terminal: refused without the CSRF token or from another origin, then a shell.
    let ws_base = api.url.replacen("http://", "ws://", 1);
    let terminal = |csrf: &str, origin: &str| {
        let mut request = format!("{ws_base}/dashboard/sandboxes/{id}/terminal?csrf={csrf}")
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert(COOKIE, owner.cookie_header().parse().unwrap());
        request
            .headers_mut()
            .insert("origin", origin.parse().unwrap());
        request
    };
    let own_origin = api.url.clone();
    assert!(
        tokio_tungstenite::connect_async(terminal("nope", &own_origin))
            .await
            .is_err()
    );
    assert!(
        tokio_tungstenite::connect_async(terminal(&csrf, "http://evil.example"))
            .await
            .is_err()
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(terminal(&csrf, &own_origin))
        .await
        .expect("terminal");
    socket
        .send(Message::Binary(b"echo hi-$((40+2))\n".to_vec().into()))
        .await
        .unwrap();
    let mut seen = String::new();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(message)) = socket.next().await {
            if let Message::Binary(bytes) = message {
                seen.push_str(&String::from_utf8_lossy(&bytes));
                // The command's output, not its echo: the shell expanded it.
                if seen.contains("hi-42") {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "terminal output so far: {seen:?}");
    socket.send(Message::Close(None)).await.unwrap();
}
