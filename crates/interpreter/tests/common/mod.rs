//! Test fixture: the real `berth-interpreter` binary on a loopback port, and a tiny
//! HTTP/1.1 client over a raw TcpStream (so malformed requests are sent as written).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Where scripts/interpreter-env.sh installs the kernels (override with
/// BERTH_INTERPRETER_PREFIX).
pub fn kernel_prefix() -> PathBuf {
    match std::env::var_os("BERTH_INTERPRETER_PREFIX") {
        Some(prefix) => PathBuf::from(prefix),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.interpreter-env"),
    }
}

/// Panics with the command to run when the kernel environment is missing (the tests
/// that need it are `#[ignore]`d, so this only fires when asked to run them).
pub fn require_kernels() -> PathBuf {
    let prefix = kernel_prefix();
    let jupyter = prefix.join("share/jupyter");
    assert!(
        jupyter.join("kernels/python3/kernel.json").exists(),
        "no kernel environment at {}: run `bash scripts/interpreter-env.sh` first",
        prefix.display()
    );
    jupyter
}

pub struct Server {
    child: Child,
    pub port: u16,
    pub cwd: tempfile::TempDir,
    _runtime: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM lets the server shut its kernels down; then make sure it is gone.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Starts the server; `jupyter_path` None means no kernels at all. `warm` is the
    /// `--warm` list. Waits for /health (200).
    pub fn start(jupyter_path: Option<PathBuf>, warm: &str, extra_env: &[(&str, &str)]) -> Server {
        let cwd = tempfile::tempdir().unwrap();
        let runtime = tempfile::tempdir().unwrap();
        let port = free_port();
        let empty = tempfile::tempdir().unwrap();
        let isolated = jupyter_path.is_none();
        let jupyter = jupyter_path.unwrap_or_else(|| empty.path().to_owned());
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth-interpreter"));
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--jupyter-path")
            .arg(&jupyter)
            .arg("--runtime-dir")
            .arg(runtime.path())
            .arg("--default-cwd")
            .arg(cwd.path())
            .arg("--warm")
            .arg(warm)
            .arg("--envd-url")
            .arg("")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Kernels must not find the host's own kernelspecs in Jupyter's default
            // dirs when a test wants none.
            .env("JUPYTER_PATH", &jupyter)
            .env_remove("BERTH_LOG");
        if isolated {
            command.arg("--only-jupyter-path");
        }
        for (key, value) in extra_env {
            command.env(key, value);
        }
        let child = command.spawn().expect("spawn berth-interpreter");
        let server = Server {
            child,
            port,
            cwd,
            _runtime: runtime,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(response) = server.try_request("GET", "/health", None) {
                if response.status == 200 {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "server never became healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(empty);
        server
    }

    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        self.try_request(method, path, body)
            .unwrap_or_else(|error| panic!("{method} {path}: {error}"))
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> std::io::Result<Response> {
        let mut stream = self.send(method, path, body)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        Ok(Response::parse(&raw))
    }

    /// Sends a request and returns the stream positioned at the response.
    pub fn send(&self, method: &str, path: &str, body: Option<&str>) -> std::io::Result<TcpStream> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(180)))?;
        let body = body.unwrap_or("");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        Ok(stream)
    }

    /// POST /execute and the parsed NDJSON events.
    pub fn execute(&self, body: &Value) -> Vec<Value> {
        let response = self.request("POST", "/execute", Some(&body.to_string()));
        assert_eq!(response.status, 200, "{}", response.body);
        response.events()
    }

    /// POST /execute, reading events as they arrive: each with the time it was read.
    pub fn execute_timed(&self, body: &Value) -> Vec<(Instant, Value)> {
        let stream = self
            .send("POST", "/execute", Some(&body.to_string()))
            .unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        // Status line and headers.
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut events = Vec::new();
        loop {
            // Chunked body: size line, data, CRLF.
            line.clear();
            if reader.read_line(&mut line).unwrap() == 0 {
                break;
            }
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            let at = Instant::now();
            for text in String::from_utf8_lossy(&chunk[..size]).lines() {
                if !text.is_empty() {
                    events.push((at, serde_json::from_str(text).unwrap()));
                }
            }
        }
        events
    }

    pub fn create_context(&self, body: &Value) -> Value {
        let response = self.request("POST", "/contexts", Some(&body.to_string()));
        assert_eq!(response.status, 200, "{}", response.body);
        serde_json::from_str(&response.body).unwrap()
    }
}

pub struct Response {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Response {
    fn parse(raw: &[u8]) -> Response {
        let text = String::from_utf8_lossy(raw).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_string()
        };
        Response {
            status,
            headers: head.to_string(),
            body,
        }
    }

    pub fn events(&self) -> Vec<Value> {
        self.body
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
            .collect()
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size..];
        body = body.strip_prefix("\r\n").unwrap_or(body);
    }
    out
}

/// The events of one type.
pub fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// stdout text joined.
pub fn stdout(events: &[Value]) -> String {
    of_type(events, "stdout")
        .iter()
        .map(|e| e["text"].as_str().unwrap_or_default())
        .collect()
}

/// The text of the main result.
pub fn main_text(events: &[Value]) -> Option<String> {
    of_type(events, "result")
        .iter()
        .find(|e| e["is_main_result"] == true)
        .and_then(|e| e["text"].as_str().map(str::to_string))
}
