//! Drives the real `berth` binary: `berth up` on a fresh state directory (without the
//! base template, so no sandbox is started), `berth keys` against the same state while it
//! runs, auth, tenancy of keys and webhooks, error bodies, restart and shutdown.
//!
//! Needs root (the runtime sets up cgroups) and the `berth-envd` and `berth-launch`
//! binaries next to `berth` (`cargo test --workspace` builds them; alone:
//! `cargo build -p berth-envd -p berth-runtime --bins` first).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

fn sibling(name: &str) -> PathBuf {
    let path = Path::new(BERTH).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p berth-envd -p berth-runtime --bins`",
        path.display()
    );
    path
}

/// A running `berth up`; killed (by pid) and its state removed on drop.
struct Up {
    child: Option<Child>,
    state: PathBuf,
    url: String,
    /// What is printed about the key: on a pipe, always a comment saying where to get one.
    key_line: String,
}

/// A /20 pool derived from the state dir's path, so two instances of this suite (and a
/// restart of one instance, which must find its pool again) agree.
fn sandbox_cidr(state: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    state.hash(&mut hasher);
    let h = hasher.finish();
    format!("10.{}.{}.0/20", 128 + (h % 120), 16 * ((h >> 8) % 16))
}

impl Up {
    fn start(state: &Path) -> Up {
        let mut child = Command::new(BERTH)
            .args([
                "up",
                "--skip-base",
                "--listen",
                "127.0.0.1:0",
                // The tenancy probe's webhook points at loopback, refused by default.
                "--webhook-allow",
                "127.0.0.1/32",
                "--state-dir",
            ])
            .arg(state)
            .env("BERTH_ENVD_BIN", sibling("berth-envd"))
            // Its own sandbox pool (daemons on one host need distinct pools) and a
            // ceiling admitting only the range tests keep their fake internet in.
            .env("BERTH_SANDBOX_CIDR", sandbox_cidr(state))
            .env("BERTH_EGRESS_ALLOW", "198.18.0.0/15")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn berth up");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut printed = Vec::new();
        while printed.len() < 4 {
            match lines.next() {
                Some(Ok(line)) => printed.push(line),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("berth up stopped early; printed {printed:?}");
                }
            }
        }
        let url = printed[0]
            .strip_prefix("E2B_API_URL=")
            .expect("first line is E2B_API_URL")
            .to_string();
        assert_eq!(printed[1], format!("E2B_SANDBOX_URL={url}"));
        let port = url.rsplit(':').next().unwrap();
        assert_eq!(printed[3], format!("E2B_DOMAIN=localhost:{port}"));
        Up {
            child: Some(child),
            state: state.to_path_buf(),
            url,
            key_line: printed[2].clone(),
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, String) {
        let address = self.url.strip_prefix("http://").unwrap();
        let mut stream = TcpStream::connect(address).expect("connect to berth");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut head =
            format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
        if let Some(key) = key {
            head.push_str(&format!("X-API-Key: {key}\r\n"));
        }
        let body = body.unwrap_or("");
        if !body.is_empty() || method == "POST" || method == "PATCH" {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        // A refused oversized body may close the connection before it is all sent.
        let _ = stream.write_all(body.as_bytes());
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    fn keys(&self, args: &[&str]) -> String {
        let output = Command::new(BERTH)
            .arg("keys")
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .output()
            .expect("run berth keys");
        assert!(
            output.status.success(),
            "berth keys {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// SIGTERM, then wait (bounded) for a clean exit; returns whether it exited 0.
    fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet, so
        // the pid cannot have been reused.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|err| panic!("not JSON ({err}): {body:?}"))
}

fn last_line(output: &str) -> String {
    output.lines().last().unwrap_or_default().trim().to_string()
}

#[test]
fn up_keys_auth_and_tenancy() {
    let state = tempfile::tempdir().unwrap();
    let mut up = Up::start(state.path());
    // stdout is a pipe: the first run prints where to get a key, never a key.
    assert!(
        up.key_line.starts_with("# no E2B_API_KEY printed")
            && up.key_line.contains("berth keys create"),
        "{}",
        up.key_line
    );
    let key = last_line(&up.keys(&["create", "--team", "default"]));
    assert!(key.starts_with("e2b_") && key[4..].chars().all(|c| c.is_ascii_hexdigit()));

    // Health and the OpenAPI document need no key; everything else does.
    assert_eq!(up.request("GET", "/health", None, None).0, 204);
    let (status, doc) = up.request("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert!(json(&doc)["paths"].get("/v2/sandboxes").is_some());
    let (status, body) = up.request("GET", "/v2/sandboxes", None, None);
    assert_eq!(status, 401);
    assert_eq!(json(&body)["code"], 401);
    assert_eq!(
        up.request("GET", "/v2/sandboxes", Some("e2b_00"), None).0,
        401
    );
    let (status, body) = up.request("GET", "/v2/sandboxes", Some(&key), None);
    assert_eq!((status, body.as_str()), (200, "[]"));

    // A key made by the CLI while `berth up` runs works at once, for its own team.
    let other = last_line(&up.keys(&["create", "--team", "other"]));
    let (status, teams) = up.request("GET", "/teams", Some(&other), None);
    assert_eq!(status, 200);
    assert_eq!(json(&teams)[0]["name"], "other");
    let (_, other_keys) = up.request("GET", "/api-keys", Some(&other), None);
    let other_key_id = json(&other_keys)[0]["id"].as_str().unwrap().to_string();
    let (_, own_keys) = up.request("GET", "/api-keys", Some(&key), None);
    assert!(!own_keys.contains(&other_key_id));
    assert_eq!(
        up.request(
            "DELETE",
            &format!("/api-keys/{other_key_id}"),
            Some(&key),
            None
        )
        .0,
        404
    );
    assert!(up.keys(&["list"]).contains(&other_key_id));

    // Webhooks never reach internal addresses the operator did not allow.
    let metadata = r#"{"name":"m","url":"http://169.254.169.254/latest","events":["sandbox.lifecycle.killed"],"signatureSecret":"s"}"#;
    let (status, refused) = up.request("POST", "/events/webhooks", Some(&key), Some(metadata));
    assert_eq!(status, 400, "{refused}");
    assert!(refused.contains("--webhook-allow"), "{refused}");

    // Webhooks are per team.
    let hook = r#"{"name":"h","url":"http://127.0.0.1:9/hook","events":["sandbox.lifecycle.killed"],"signatureSecret":"s"}"#;
    let (status, created) = up.request("POST", "/events/webhooks", Some(&key), Some(hook));
    assert_eq!(status, 201, "{created}");
    let created = json(&created);
    assert!(
        created.get("signatureSecret").is_none(),
        "secrets are never returned"
    );
    let hook_path = format!("/events/webhooks/{}", created["id"].as_str().unwrap());
    assert_eq!(up.request("GET", &hook_path, Some(&other), None).0, 404);
    assert_eq!(up.request("DELETE", &hook_path, Some(&other), None).0, 404);
    assert_eq!(up.request("GET", &hook_path, Some(&key), None).0, 200);

    // Bad input: unknown template named, oversized body refused, later features 501.
    let (status, body) = up.request(
        "POST",
        "/v2/sandboxes",
        Some(&key),
        Some(r#"{"templateID":"no-such-template"}"#),
    );
    assert_eq!(status, 404);
    assert!(json(&body)["message"]
        .as_str()
        .unwrap()
        .contains("no-such-template"));
    let huge = format!(r#"{{"templateID":"{}"}}"#, "x".repeat(2 * 1024 * 1024));
    assert_eq!(
        up.request("POST", "/v2/sandboxes", Some(&key), Some(&huge))
            .0,
        413
    );
    let (status, body) = up.request("POST", "/sandboxes/iabc/pause", Some(&key), Some("{}"));
    assert_eq!(status, 404);
    assert!(json(&body)["message"].as_str().unwrap().contains("iabc"));
    let (status, body) = up.request("POST", "/v3/templates", Some(&key), Some("{}"));
    assert_eq!(status, 400, "a build request without a name: {body}");
    assert!(
        json(&body)["message"].as_str().unwrap().contains("name"),
        "the message names the field: {body}"
    );
    let (status, body) = up.request("POST", "/v2/templates", Some(&key), Some("{}"));
    assert_eq!(status, 501, "what berth lacks is named, never faked");
    assert!(json(&body)["message"]
        .as_str()
        .unwrap()
        .contains("legacy template build API"));

    // Revoking by the CLI takes effect on the running server.
    up.keys(&["revoke", &other_key_id]);
    assert_eq!(up.request("GET", "/teams", Some(&other), None).0, 401);

    assert!(up.stop(), "berth up exits 0 on SIGTERM");

    // A restart keeps keys (stored hashed, so the key is not printed again).
    let mut again = Up::start(state.path());
    assert!(again.key_line.starts_with('#'), "{}", again.key_line);
    assert_eq!(
        again.request("GET", "/v2/sandboxes", Some(&key), None).0,
        200
    );
    assert!(again.stop());
}
