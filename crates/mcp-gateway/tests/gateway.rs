//! The real `mcp-gateway` binary end to end, unprivileged: repositories cloned from a
//! `file://` base, a stdio MCP server in plain Python (tests/data/echo_server.py), the
//! command returning once the detached gateway serves, and MCP over HTTP with and
//! without the token. Every detached gateway a test starts is stopped by its pid.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

const TOKEN: &str = "0b7e8f3c-test-token";
const ECHO_SERVER: &str = include_str!("data/echo_server.py");

struct Fixture {
    dir: tempfile::TempDir,
    port: u16,
    /// Pids of detached gateways to stop at the end.
    started: Vec<u32>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for pid in &self.started {
            if let Some(pid) = rustix::process::Pid::from_raw(*pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
    }
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

impl Fixture {
    fn new() -> Fixture {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            port,
            started: Vec::new(),
        }
    }

    /// A repository `<owner>/<repo>` under the git base holding the echo server.
    fn repository(&self, owner: &str, repo: &str) {
        let path = self.dir.path().join("git").join(owner).join(repo);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("server.py"), ECHO_SERVER).unwrap();
        git(&path, &["init", "--quiet", "--initial-branch=main"]);
        git(&path, &["add", "server.py"]);
        git(&path, &["commit", "--quiet", "-m", "echo server"]);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Runs `mcp-gateway --config <config>` as the SDKs do; remembers the pid it reports.
    fn run(&mut self, config: &Value, token: &str) -> Output {
        let output = Command::new(env!("CARGO_BIN_EXE_mcp-gateway"))
            .arg("--config")
            .arg(config.to_string())
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--token-file")
            .arg(self.path("etc/mcp-gateway/.token"))
            .arg("--servers-dir")
            .arg(self.path("servers"))
            .arg("--log-file")
            .arg(self.path("log/gateway.log"))
            .arg("--git-url")
            .arg(format!("file://{}", self.path("git").display()))
            .args(["--init-timeout-secs", "20"])
            .env("GATEWAY_ACCESS_TOKEN", token)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if let Some(pid) = stdout
            .split("(pid ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
        {
            self.started.push(pid.parse().unwrap());
        }
        output
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A streamable-HTTP MCP session over plain HTTP.
struct Session {
    http: reqwest::Client,
    url: String,
    token: String,
    id: Option<String>,
    next: u64,
}

impl Session {
    fn new(url: String, token: &str) -> Session {
        Session {
            http: reqwest::Client::new(),
            url,
            token: token.to_string(),
            id: None,
            next: 1,
        }
    }

    async fn post(&self, body: &Value) -> reqwest::Response {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {}", self.token))
            .body(body.to_string());
        if let Some(id) = &self.id {
            request = request
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-06-18");
        }
        request.send().await.unwrap()
    }

    /// Sends request `method` and returns its JSON-RPC answer.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let response = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert_eq!(response.status(), 200, "{method}");
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.id = Some(session.to_str().unwrap().to_string());
        }
        let text = response.text().await.unwrap();
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {method} in {text:?}"))
    }

    async fn open(url: String, token: &str) -> Session {
        let mut session = Session::new(url, token);
        let answer = session
            .call(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}),
            )
            .await;
        assert!(
            answer["result"]["capabilities"]["tools"].is_object(),
            "{answer}"
        );
        let initialized = session
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(initialized.status(), 202);
        session
    }

    async fn tool(&mut self, name: &str, arguments: Value) -> String {
        let answer = self
            .call("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"))
            .to_string()
    }
}

#[tokio::test]
async fn two_servers_behind_one_token_checked_endpoint() {
    let mut fixture = Fixture::new();
    fixture.repository("acme", "echo");
    fixture.repository("acme", "other");
    let config = json!({
        "github/acme/echo": {
            "install_cmd": "echo from-install > installed.txt",
            "run_cmd": "exec python3 server.py",
            "envs": {"GREETING": "hello"},
        },
        "github/acme/other": {"runCmd": "python3 server.py other_"},
    });
    let output = fixture.run(&config, TOKEN);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(fixture.started.len(), 1, "the summary names the pid");
    let token_file = fixture.path("etc/mcp-gateway/.token");
    assert_eq!(std::fs::read_to_string(token_file).unwrap(), TOKEN);

    let mut session = Session::open(fixture.url(), TOKEN).await;
    let tools = session.call("tools/list", json!({})).await;
    let mut names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["echo", "info", "other_echo", "other_info"]);
    assert_eq!(session.tool("echo", json!({"text": "hi"})).await, "hi");
    assert_eq!(
        session.tool("other_echo", json!({"text": "yo"})).await,
        "yo"
    );
    let info: Value = serde_json::from_str(&session.tool("info", json!({})).await).unwrap();
    assert_eq!(info["greeting"], "hello");
    assert_eq!(info["installed"], "from-install");
    assert_eq!(info["token_visible"], false, "servers never see the token");
    assert!(info["cwd"].as_str().unwrap().ends_with("servers/acme/echo"));
    let unknown = session
        .call("tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert!(unknown["error"]["message"]
        .as_str()
        .unwrap()
        .contains("nope"));

    let resources = session.call("resources/list", json!({})).await;
    let mut uris: Vec<&str> = resources["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    uris.sort();
    assert_eq!(uris, ["echo://other_readme", "echo://readme"]);
    let read = session
        .call("resources/read", json!({"uri": "echo://other_readme"}))
        .await;
    assert_eq!(
        read["result"]["contents"][0]["text"], "readme of other_",
        "{read}"
    );
    let prompts = session.call("prompts/list", json!({})).await;
    assert_eq!(prompts["result"]["prompts"].as_array().unwrap().len(), 2);
    let prompt = session
        .call(
            "prompts/get",
            json!({"name": "other_greet", "arguments": {"name": "ada"}}),
        )
        .await;
    assert_eq!(
        prompt["result"]["messages"][0]["content"]["text"], "greet ada",
        "{prompt}"
    );

    for token in [None, Some("wrong"), Some("")] {
        let mut request = reqwest::Client::new()
            .post(fixture.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string());
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "token {token:?}");
        assert!(response.headers().contains_key("www-authenticate"));
    }
    let health = reqwest::get(format!("http://127.0.0.1:{}/health", fixture.port))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let again = fixture.run(&config, TOKEN);
    assert!(
        !again.status.success(),
        "a second gateway cannot take the port"
    );
    assert!(
        stderr(&again).contains("another MCP gateway"),
        "{}",
        stderr(&again)
    );
}

#[tokio::test]
async fn a_server_that_does_not_start_fails_the_command_with_its_stderr() {
    let mut fixture = Fixture::new();
    fixture.repository("acme", "echo");
    fixture.repository("acme", "broken");
    let config = json!({
        "github/acme/broken": {"run_cmd": "echo 'cannot find module foo' >&2; exit 3"},
        "github/acme/echo": {"run_cmd": "python3 server.py"},
    });
    let output = fixture.run(&config, TOKEN);
    assert!(!output.status.success());
    let text = stderr(&output);
    assert!(text.contains("\"github/acme/broken\""), "{text}");
    assert!(text.contains("exit status 3"), "{text}");
    assert!(text.contains("cannot find module foo"), "{text}");
    assert!(fixture.started.is_empty());
    // Nothing keeps serving: the port is free again.
    std::net::TcpListener::bind(("127.0.0.1", fixture.port)).expect("the gateway exited");
    let log = std::fs::read_to_string(fixture.path("log/gateway.log")).unwrap();
    assert!(log.contains("cannot find module foo"), "{log}");

    let install = json!({"github/acme/echo": {"run_cmd": "python3 server.py",
                                              "install_cmd": "echo no network >&2; false"}});
    let text = stderr(&fixture.run(&install, TOKEN));
    assert!(
        text.contains("install_cmd failed (exit status 1)") && text.contains("no network"),
        "{text}"
    );
    let missing = json!({"github/acme/missing": {"run_cmd": "python3 server.py"}});
    let text = stderr(&fixture.run(&missing, TOKEN));
    assert!(text.contains("cloning file://"), "{text}");
    let silent = json!({"github/acme/echo": {"run_cmd": "python3 server.py", "envs": {"X": "1"}},
                        "github/acme/broken": {"run_cmd": "python3 server.py"}});
    let text = stderr(&fixture.run(&silent, TOKEN));
    assert!(
        text.contains("both offer the tool \"echo\""),
        "same tool names collide: {text}"
    );
}

#[test]
fn catalog_servers_pull_and_a_missing_token_are_refused_at_once() {
    let mut fixture = Fixture::new();
    let text = stderr(&fixture.run(&json!({"airtable": {"airtableApiKey": "k"}}), TOKEN));
    assert!(
        text.contains("\"airtable\"") && text.contains("Docker"),
        "{text}"
    );
    let text = stderr(&fixture.run(&json!({}), ""));
    assert!(text.contains("GATEWAY_ACCESS_TOKEN"), "{text}");
    let pull = Command::new(env!("CARGO_BIN_EXE_mcp-gateway"))
        .args(["pull", "brave"])
        .output()
        .unwrap();
    assert!(!pull.status.success());
    assert!(
        stderr(&pull).contains("cannot pull brave"),
        "{}",
        stderr(&pull)
    );
    assert!(fixture.started.is_empty());
    assert!(!fixture.path("log").exists(), "nothing was started");
}
