//! The real berth-interpreter binary over raw HTTP on loopback. Tests marked
//! `#[ignore]` need the kernel environment (`bash scripts/interpreter-env.sh`) and run
//! with `cargo test -p berth-interpreter -- --include-ignored` (tests/interpreter/run.sh
//! does that).

mod common;

use std::time::Duration;

use common::{main_text, of_type, stdout, Server};
use serde_json::{json, Value};

/// Kernels on TCP (Deno, JJava) get ports peeked by their server; servers of tests
/// running at once could hand the same free port to two kernels (one server serialises
/// its own launches, but not another process's). Tests starting TCP kernels take turns.
static TCP_KERNELS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tcp_kernels_turn() -> std::sync::MutexGuard<'static, ()> {
    TCP_KERNELS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn no_kernels() -> Server {
    Server::start(None, "", &[])
}

fn with_kernels(warm: &str) -> Server {
    Server::start(Some(common::require_kernels()), warm, &[])
}

#[test]
fn malformed_requests_get_4xx_with_a_message() {
    let server = no_kernels();
    let cases: &[(&str, &str, Option<&str>, u16, &str)] = &[
        ("POST", "/execute", Some("{not json"), 400, "invalid JSON"),
        ("POST", "/execute", Some("{}"), 400, "missing field `code`"),
        (
            "POST",
            "/execute",
            Some(r#"{"code": 5}"#),
            400,
            "invalid JSON",
        ),
        ("POST", "/execute", Some(""), 400, "missing field `code`"),
        (
            "POST",
            "/execute",
            Some(r#"{"code":"1","language":"cobol"}"#),
            400,
            "unknown language \"cobol\"",
        ),
        (
            "POST",
            "/execute",
            Some(r#"{"code":"1","language":"python","context_id":"x"}"#),
            400,
            "either context_id or language",
        ),
        (
            "POST",
            "/execute",
            Some(r#"{"code":"1","context_id":"nope"}"#),
            404,
            "context nope not found",
        ),
        (
            "POST",
            "/execute",
            Some(r#"{"code":"1","env_vars":{"BAD-NAME":"x"}}"#),
            400,
            "invalid environment variable name \"BAD-NAME\"",
        ),
        (
            "POST",
            "/execute",
            Some(r#"{"code":"1","env_vars":{"A":1}}"#),
            400,
            "invalid JSON",
        ),
        (
            "POST",
            "/contexts",
            Some(r#"{"language":"klingon"}"#),
            400,
            "klingon",
        ),
        ("POST", "/contexts", Some("[1,2"), 400, "invalid JSON"),
        (
            "POST",
            "/contexts",
            Some(r#"{"cwd":"/definitely/not/here"}"#),
            400,
            "/definitely/not/here",
        ),
        (
            "DELETE",
            "/contexts/nope",
            None,
            404,
            "context nope not found",
        ),
        (
            "POST",
            "/contexts/nope/restart",
            None,
            404,
            "context nope not found",
        ),
        ("GET", "/nowhere", None, 404, "no such route"),
        // No kernelspec installed for the language: a 4xx naming it.
        (
            "POST",
            "/execute",
            Some(r#"{"code":"1","language":"java"}"#),
            400,
            "language java is not installed",
        ),
        (
            "POST",
            "/contexts",
            Some(r#"{"language":"r"}"#),
            400,
            "language r is not installed",
        ),
    ];
    for (method, path, body, status, message) in cases {
        let response = server.request(method, path, *body);
        assert_eq!(
            response.status, *status,
            "{method} {path} {body:?}: {}",
            response.body
        );
        assert!(
            response.body.contains(message),
            "{method} {path} {body:?}: {:?} lacks {message:?}",
            response.body
        );
    }
    // Still serving after all of that.
    assert_eq!(server.request("GET", "/health", None).status, 200);
    assert_eq!(server.request("GET", "/contexts", None).body, "[]");
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn python_results_state_errors_and_counts() {
    let server = with_kernels("python");
    let events = server.execute(&json!({"code": "x = 41\nprint('out')\nx + 1"}));
    assert_eq!(stdout(&events), "out\n");
    assert_eq!(main_text(&events).as_deref(), Some("42"));
    assert_eq!(events.last().unwrap()["type"], "end_of_execution");
    let first_count = of_type(&events, "number_of_executions")[0]["execution_count"]
        .as_u64()
        .unwrap();

    let events = server.execute(&json!({"code": "x", "language": "python"}));
    assert_eq!(main_text(&events).as_deref(), Some("41"));
    assert_eq!(
        of_type(&events, "number_of_executions")[0]["execution_count"],
        first_count + 1
    );

    let events = server.execute(&json!({"code": "def f():\n    raise ValueError('boom')\nf()"}));
    let errors = of_type(&events, "error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["name"], "ValueError");
    assert_eq!(errors[0]["value"], "boom");
    let traceback = errors[0]["traceback"].as_str().unwrap();
    assert!(
        traceback.contains("raise ValueError('boom')"),
        "{traceback}"
    );
    assert!(!traceback.contains('\u{1b}'), "colours in {traceback:?}");
    assert_eq!(events.last().unwrap()["type"], "end_of_execution");
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn output_is_streamed_as_it_happens() {
    let server = with_kernels("python");
    let events = server.execute_timed(&json!({
        "code": "import time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b', flush=True)"
    }));
    let a = events.iter().find(|(_, e)| e["text"] == "a\n").unwrap().0;
    let b = events.iter().find(|(_, e)| e["text"] == "b\n").unwrap().0;
    assert!(
        b.duration_since(a) >= Duration::from_secs(1),
        "a and b arrived together"
    );
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn rich_results_and_display_calls() {
    let server = with_kernels("python");
    let events = server.execute(&json!({"code": "\
from IPython.display import display, HTML, Markdown, Latex, JSON, SVG, Javascript
display(HTML('<b>h</b>'))
display(Markdown('**m**'))
display(Latex(r'$x$'))
display(JSON({'k': 1}))
display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>'))
display(Javascript('1'))
display({'application/x-custom': 'c', 'text/plain': 'custom'}, raw=True)
'main'"}));
    let results = of_type(&events, "result");
    assert_eq!(results.len(), 8, "{events:?}");
    assert_eq!(results[0]["html"], "<b>h</b>");
    assert_eq!(results[1]["markdown"], "**m**");
    assert_eq!(results[2]["latex"], "$x$");
    assert_eq!(results[3]["json"], json!({"k": 1}));
    assert!(results[4]["svg"].as_str().unwrap().contains("<svg"));
    assert_eq!(results[5]["javascript"], "1");
    assert_eq!(results[6]["extra"], json!({"application/x-custom": "c"}));
    assert!(results[..7].iter().all(|r| r["is_main_result"] == false));
    assert_eq!(results[7]["is_main_result"], true);
    assert_eq!(results[7]["text"], "main");
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn matplotlib_png_and_chart_and_dataframes() {
    let server = with_kernels("python");
    let events = server.execute(&json!({"code": "\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9], label='sq')
plt.xlabel('x (s)')
plt.title('t')
plt.show()"}));
    let result = of_type(&events, "result")[0];
    assert!(result["png"].as_str().unwrap().starts_with("iVBOR"));
    let chart = &result["chart"];
    assert_eq!(chart["type"], "line");
    assert_eq!(chart["title"], "t");
    assert_eq!(chart["x_unit"], "s");
    assert_eq!(chart["elements"][0]["label"], "sq");
    assert_eq!(
        chart["elements"][0]["points"],
        json!([[1.0, 1.0], [2.0, 4.0], [3.0, 9.0]])
    );
    assert_eq!(result["extra"], json!({}));

    let events = server.execute(&json!({"code": "\
import pandas as pd
pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', None]})"}));
    let result = of_type(&events, "result")[0];
    assert!(result["html"].as_str().unwrap().contains("<table"));
    assert_eq!(
        result["data"],
        json!({"a": [1, 2, 3], "b": ["x", "y", null]})
    );
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn env_vars_apply_per_execution_and_do_not_leak() {
    let server = Server::start(
        Some(common::require_kernels()),
        "python",
        &[("BERTH_TEST_SANDBOX_VAR", "from-server")],
    );
    let events = server.execute(&json!({
        "code": "import os, subprocess\nprint(os.environ['FOO'])\nprint(subprocess.run(['sh','-c','echo $FOO'],capture_output=True,text=True).stdout, end='')",
        "env_vars": {"FOO": "it's \"quoted\"", "BERTH_TEST_SANDBOX_VAR": "overridden"}
    }));
    assert_eq!(stdout(&events), "it's \"quoted\"\nit's \"quoted\"\n");
    let events = server.execute(&json!({
        "code": "import os\nos.getenv('FOO', 'unset'), os.getenv('BERTH_TEST_SANDBOX_VAR')"
    }));
    assert_eq!(
        main_text(&events).as_deref(),
        Some("('unset', 'from-server')")
    );
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn disconnect_interrupts_and_the_context_stays_usable() {
    let server = with_kernels("python");
    let stream = server
        .send(
            "POST",
            "/execute",
            Some(r#"{"code":"x = 5\nwhile True: pass"}"#),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    drop(stream);
    let events = server.execute(&json!({"code": "x * 2"}));
    assert_eq!(main_text(&events).as_deref(), Some("10"), "{events:?}");
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn a_dying_kernel_ends_the_stream_with_an_error_and_is_restarted() {
    let server = with_kernels("python");
    let events =
        server.execute(&json!({"code": "import os\nprint('bye', flush=True)\nos._exit(3)"}));
    let errors = of_type(&events, "error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["name"], "KernelDied");
    assert!(errors[0]["value"].as_str().unwrap().contains("exit code 3"));
    assert_eq!(events.last().unwrap()["type"], "end_of_execution");
    let events = server.execute(&json!({"code": "1 + 1"}));
    assert_eq!(main_text(&events).as_deref(), Some("2"));
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn contexts_are_separate_serialised_and_concurrent() {
    let server = with_kernels("python");
    let a = server.create_context(&json!({}));
    let b = server.create_context(&json!({"language": "python", "cwd": "/tmp"}));
    assert_eq!(a["language"], "python");
    assert_eq!(b["cwd"], "/tmp");
    let list: Value = serde_json::from_str(&server.request("GET", "/contexts", None).body).unwrap();
    let ids: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    assert!(ids.contains(&a["id"]) && ids.contains(&b["id"]), "{list}");

    server.execute(&json!({"code": "v = 'a'", "context_id": a["id"]}));
    let events = server
        .execute(&json!({"code": "import os\nos.getcwd(), 'v' in dir()", "context_id": b["id"]}));
    assert_eq!(main_text(&events).as_deref(), Some("('/tmp', False)"));

    // Two executions in one context run one after the other; another context is not
    // held up by them.
    let started = std::time::Instant::now();
    let slow = |server: &Server, id: &Value| {
        server
            .execute(&json!({"code": "import time; time.sleep(1); time.time()", "context_id": id}))
    };
    std::thread::scope(|scope| {
        let first = scope.spawn(|| slow(&server, &a["id"]));
        let second = scope.spawn(|| slow(&server, &a["id"]));
        let other = scope.spawn(|| slow(&server, &b["id"]));
        let ends: Vec<f64> = [first, second]
            .into_iter()
            .map(|h| main_text(&h.join().unwrap()).unwrap().parse().unwrap())
            .collect();
        assert!(
            (ends[0] - ends[1]).abs() >= 0.9,
            "same context overlapped: {ends:?}"
        );
        other.join().unwrap();
    });
    assert!(started.elapsed() < Duration::from_secs(10));

    assert_eq!(
        server
            .request(
                "POST",
                &format!("/contexts/{}/restart", a["id"].as_str().unwrap()),
                None
            )
            .status,
        200
    );
    let events = server.execute(&json!({"code": "v", "context_id": a["id"]}));
    assert_eq!(of_type(&events, "error")[0]["name"], "NameError");

    let path = format!("/contexts/{}", b["id"].as_str().unwrap());
    assert_eq!(server.request("DELETE", &path, None).status, 200);
    assert_eq!(server.request("DELETE", &path, None).status, 404);
    let events = server.request(
        "POST",
        "/execute",
        Some(&json!({"code": "1", "context_id": b["id"]}).to_string()),
    );
    assert_eq!(events.status, 404);
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn other_languages_keep_state_and_cwd() {
    let _turn = tcp_kernels_turn();
    let server = with_kernels("");
    let cwd = server.cwd.path().to_str().unwrap().to_string();
    let cases = [
        (
            "js",
            "var n = 40; console.log('hi')",
            "n + 2",
            "42",
            "process.cwd()",
        ),
        ("ts", "let t: number = 1", "t + 1", "2", "Deno.cwd()"),
        ("r", "n <- 41", "n + 1", "[1] 42", "getwd()"),
        ("bash", "N=41", "echo $((N+1))", "42\n", "pwd"),
    ];
    for (language, setup, read, expected, cwd_code) in cases {
        server.execute(&json!({"code": setup, "language": language}));
        let events = server.execute(&json!({"code": read, "language": language}));
        let got = if language == "bash" {
            stdout(&events)
        } else {
            of_type(&events, "result")
                .first()
                .and_then(|r| r["text"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(got, expected, "{language}: {events:?}");
        let events = server.execute(&json!({"code": cwd_code, "language": language}));
        let text = format!(
            "{}{}",
            stdout(&events),
            serde_json::to_string(&of_type(&events, "result")).unwrap()
        );
        assert!(text.contains(&cwd), "{language} cwd: {events:?}");
    }
    let events = server
        .execute(&json!({"code": "echo $FOO", "language": "bash", "env_vars": {"FOO": "b a'r"}}));
    assert_eq!(stdout(&events), "b a'r\n");
    let events = server.execute(&json!({"code": "echo ${FOO:-unset}", "language": "bash"}));
    assert_eq!(stdout(&events), "unset\n");
    let events = server.execute(&json!({"code": "Deno.env.get('FOO') ?? 'unset'", "language": "js", "env_vars": {"FOO": "j"}}));
    assert_eq!(main_text(&events).as_deref(), Some("j"));
    let events = server.execute(&json!({"code": "process.env.FOO ?? 'unset'", "language": "js"}));
    assert_eq!(main_text(&events).as_deref(), Some("unset"));
    let events = server.execute(&json!({"code": "Sys.getenv('FOO', unset = 'unset')", "language": "r", "env_vars": {"FOO": "r"}}));
    assert_eq!(of_type(&events, "result")[0]["text"], "[1] \"r\"");
    let events =
        server.execute(&json!({"code": "Sys.getenv('FOO', unset = 'unset')", "language": "r"}));
    assert_eq!(of_type(&events, "result")[0]["text"], "[1] \"unset\"");
}

#[test]
#[ignore = "needs the kernel environment (with a JDK for JJava): bash scripts/interpreter-env.sh"]
fn java_runs_when_installed() {
    let _turn = tcp_kernels_turn();
    let server = with_kernels("");
    let events = server
        .execute(&json!({"code": "System.out.println(\"Hello\"); 40 + 2", "language": "java"}));
    assert_eq!(stdout(&events), "Hello\n");
    assert_eq!(main_text(&events).as_deref(), Some("42"));
}

#[test]
#[ignore = "needs the kernel environment: bash scripts/interpreter-env.sh"]
fn other_languages_survive_an_abandoned_busy_loop() {
    let _turn = tcp_kernels_turn();
    let server = with_kernels("");
    // (language, set state, busy loop, read state, expected)
    let cases = [
        ("r", "keep <- 5", "while (TRUE) {}", "keep + 1", "[1] 6"),
        (
            "bash",
            "KEEP=5",
            "while true; do :; done",
            "echo $((KEEP+1))",
            "6\n",
        ),
        // Deno exits on SIGINT; the server restarts it, so only usability is kept.
        (
            "js",
            "var keep = 5",
            "while (true) {}",
            "typeof keep",
            "undefined",
        ),
    ];
    for (language, set, busy, read, expected) in cases {
        server.execute(&json!({"code": set, "language": language}));
        let stream = server
            .send(
                "POST",
                "/execute",
                Some(&json!({"code": busy, "language": language}).to_string()),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        drop(stream);
        let events = server.execute(&json!({"code": read, "language": language}));
        let got = if language == "bash" {
            stdout(&events)
        } else {
            of_type(&events, "result")
                .first()
                .and_then(|r| r["text"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(got, expected, "{language}: {events:?}");
    }
}
