//! The `/execute` stream's wire format — one JSON object per line, as both SDKs parse
//! them — and the translation of one execute_request's kernel messages into it.

use jupyter_protocol::{JupyterMessage, JupyterMessageContent, ReplyStatus, Stdio};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::kernel::{is_idle, KernelEvent};

/// See [`ExecutionTracker::reply_deadline`].
const REPLY_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// One line of the `/execute` response.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputEvent {
    Stdout {
        text: String,
        /// When the kernel produced it (RFC 3339), from the message header.
        timestamp: String,
    },
    Stderr {
        text: String,
        timestamp: String,
    },
    Result(Box<ResultBundle>),
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    NumberOfExecutions {
        execution_count: usize,
    },
    /// Always the last line of a stream.
    EndOfExecution,
    /// Written while the kernel is quiet, so a vanished client is noticed by a failed
    /// write; the SDKs skip types they do not know.
    Keepalive,
}

impl OutputEvent {
    /// The event as one NDJSON line (with its newline).
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|error| {
            // Serialising plain strings and JSON values cannot fail; say so if it does.
            format!(
                r#"{{"type":"error","name":"ServerError","value":{:?},"traceback":""}}"#,
                error.to_string()
            )
        });
        line.push('\n');
        line
    }

    pub fn error(name: &str, value: impl Into<String>) -> OutputEvent {
        OutputEvent::Error {
            name: name.to_string(),
            value: value.into(),
            traceback: String::new(),
        }
    }
}

/// A rich result: the MIME bundle of a display_data or execute_result message, split
/// into the fields the SDKs' `Result` has; MIME types without a field go to `extra`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ResultBundle {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// `e2b/data`: a DataFrame's columns, from berth's kernel startup module.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// `e2b/chart`: a matplotlib figure's structure, from berth's kernel startup module.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<Value>,
    pub is_main_result: bool,
    pub extra: Map<String, Value>,
}

impl ResultBundle {
    pub fn from_mime_bundle(mut bundle: Map<String, Value>, is_main_result: bool) -> ResultBundle {
        let mut take_text = |mime: &str| match bundle.remove(mime) {
            Some(Value::String(text)) => Some(text),
            // Notebook-style multi-line values arrive as arrays of lines.
            Some(Value::Array(lines)) => Some(
                lines
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .concat(),
            ),
            Some(other) => Some(other.to_string()),
            None => None,
        };
        let text = take_text("text/plain").map(strip_repr_quotes);
        let html = take_text("text/html");
        let markdown = take_text("text/markdown");
        let svg = take_text("image/svg+xml");
        let png = take_text("image/png");
        let jpeg = take_text("image/jpeg");
        let pdf = take_text("application/pdf");
        let latex = take_text("text/latex");
        let javascript = take_text("application/javascript");
        let non_empty = |value: Option<Value>| value.filter(|v| !v.is_null());
        let json = non_empty(bundle.remove("application/json"));
        let data = non_empty(bundle.remove("e2b/data"));
        // The startup module reports "no chart" as an empty object.
        let chart = non_empty(bundle.remove("e2b/chart"))
            .filter(|chart| chart.as_object().is_none_or(|o| !o.is_empty()));
        ResultBundle {
            text,
            html,
            markdown,
            svg,
            png,
            jpeg,
            pdf,
            latex,
            json,
            javascript,
            data,
            chart,
            is_main_result,
            extra: bundle,
        }
    }
}

/// A string's repr (`'abc'`, `"abc"`) is shown as its content, as E2B does.
fn strip_repr_quotes(text: String) -> String {
    let quoted = text.len() >= 2
        && ((text.starts_with('\'') && text.ends_with('\''))
            || (text.starts_with('"') && text.ends_with('"')));
    if quoted {
        text[1..text.len() - 1].to_string()
    } else {
        text
    }
}

/// Follows one execute_request: turns its messages into output events and knows when
/// it is over (the iopub `idle` status and the shell reply have both arrived, or the
/// kernel is gone).
#[derive(Debug, Default)]
pub struct ExecutionTracker {
    /// When the iopub `idle` status arrived.
    idle_at: Option<tokio::time::Instant>,
    replied: bool,
    errored: bool,
    exited: bool,
}

impl ExecutionTracker {
    pub fn finished(&self) -> bool {
        self.exited || (self.idle_at.is_some() && self.replied)
    }

    /// After `idle`, how long to still wait for the shell reply: kernels send it first,
    /// but on another socket, and a reply the protocol crate cannot parse never comes.
    pub fn reply_deadline(&self) -> Option<tokio::time::Instant> {
        self.idle_at
            .filter(|_| !self.replied)
            .map(|at| at + REPLY_GRACE)
    }

    /// Whether the execution ended with an error (of the code, or of the kernel).
    pub fn errored(&self) -> bool {
        self.errored
    }

    pub fn handle(&mut self, event: KernelEvent) -> Option<OutputEvent> {
        match event {
            KernelEvent::IoPub(message) => self.iopub(*message),
            KernelEvent::Reply(message) => self.reply(*message),
            KernelEvent::Exited(status) => {
                self.exited = true;
                self.errored = true;
                Some(OutputEvent::error(
                    "KernelDied",
                    format!(
                        "the kernel exited during the execution ({status}); it is restarted \
                         with a fresh state for the next execution"
                    ),
                ))
            }
        }
    }

    fn iopub(&mut self, message: JupyterMessage) -> Option<OutputEvent> {
        if is_idle(&message) {
            self.idle_at = Some(tokio::time::Instant::now());
            return None;
        }
        // Some kernels (JJava) leave the date out, which the crate reads as the epoch.
        let date = message.header.date;
        let date = if date.timestamp() == 0 {
            chrono::Utc::now()
        } else {
            date
        };
        let timestamp = date.to_rfc3339();
        match message.content {
            JupyterMessageContent::StreamContent(stream) => Some(match stream.name {
                Stdio::Stdout => OutputEvent::Stdout {
                    text: stream.text,
                    timestamp,
                },
                Stdio::Stderr => OutputEvent::Stderr {
                    text: stream.text,
                    timestamp,
                },
            }),
            JupyterMessageContent::DisplayData(display) => Some(OutputEvent::Result(Box::new(
                ResultBundle::from_mime_bundle(media_map(&display.data), false),
            ))),
            JupyterMessageContent::ExecuteResult(result) => Some(OutputEvent::Result(Box::new(
                ResultBundle::from_mime_bundle(media_map(&result.data), true),
            ))),
            JupyterMessageContent::ErrorOutput(error) => {
                self.error(error.ename, error.evalue, &error.traceback)
            }
            JupyterMessageContent::ExecuteInput(input) => Some(OutputEvent::NumberOfExecutions {
                execution_count: input.execution_count.value(),
            }),
            _ => None,
        }
    }

    fn reply(&mut self, message: JupyterMessage) -> Option<OutputEvent> {
        let JupyterMessageContent::ExecuteReply(reply) = message.content else {
            return None;
        };
        self.replied = true;
        match reply.status {
            ReplyStatus::Ok => None,
            ReplyStatus::Error => {
                let error = reply.error.unwrap_or_default();
                self.error(error.ename, error.evalue, &error.traceback)
            }
            ReplyStatus::Aborted => {
                self.errored = true;
                Some(OutputEvent::error(
                    "ExecutionAborted",
                    "the kernel aborted the execution",
                ))
            }
        }
    }

    /// Kernels report an error twice (iopub `error` and the reply); send it once.
    fn error(&mut self, name: String, value: String, traceback: &[String]) -> Option<OutputEvent> {
        if self.errored {
            return None;
        }
        self.errored = true;
        Some(OutputEvent::Error {
            name,
            value,
            traceback: traceback.join("\n"),
        })
    }
}

fn media_map(media: &jupyter_protocol::Media) -> Map<String, Value> {
    match serde_json::to_value(media) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bundle_splits_known_mime_types_and_keeps_the_rest() {
        let bundle = json!({
            "text/plain": "'hello'",
            "text/html": "<b>hi</b>",
            "image/png": "iVBOR",
            "application/json": {"a": 1},
            "e2b/chart": {},
            "e2b/data": {"a": [1, 2]},
            "application/vnd.custom": "x",
        });
        let Value::Object(bundle) = bundle else {
            unreachable!()
        };
        let result = ResultBundle::from_mime_bundle(bundle, true);
        assert_eq!(result.text.as_deref(), Some("hello"));
        assert_eq!(result.html.as_deref(), Some("<b>hi</b>"));
        assert_eq!(result.png.as_deref(), Some("iVBOR"));
        assert_eq!(result.json, Some(json!({"a": 1})));
        assert_eq!(result.chart, None);
        assert_eq!(result.data, Some(json!({"a": [1, 2]})));
        assert_eq!(
            result.extra.get("application/vnd.custom"),
            Some(&json!("x"))
        );
        let line: Value =
            serde_json::from_str(&OutputEvent::Result(Box::new(result)).to_line()).unwrap();
        assert_eq!(line["type"], "result");
        assert_eq!(line["is_main_result"], true);
        assert!(line.get("svg").is_none());
    }

    #[test]
    fn repr_quotes_are_stripped_once() {
        assert_eq!(strip_repr_quotes("'a'".into()), "a");
        assert_eq!(strip_repr_quotes("\"a\"".into()), "a");
        assert_eq!(strip_repr_quotes("'".into()), "'");
        assert_eq!(strip_repr_quotes("'a\"".into()), "'a\"");
        assert_eq!(strip_repr_quotes("2".into()), "2");
    }

    #[test]
    fn events_serialise_as_the_sdks_expect() {
        assert_eq!(
            OutputEvent::NumberOfExecutions { execution_count: 3 }.to_line(),
            "{\"type\":\"number_of_executions\",\"execution_count\":3}\n"
        );
        assert_eq!(
            OutputEvent::EndOfExecution.to_line(),
            "{\"type\":\"end_of_execution\"}\n"
        );
        let error: Value =
            serde_json::from_str(&OutputEvent::error("NameError", "x").to_line()).unwrap();
        assert_eq!(
            error,
            json!({"type": "error", "name": "NameError", "value": "x", "traceback": ""})
        );
    }

    #[test]
    fn a_dead_kernel_finishes_the_execution_with_an_error() {
        let mut tracker = ExecutionTracker::default();
        assert!(!tracker.finished());
        let event = tracker.handle(KernelEvent::Exited("killed by signal 9".into()));
        assert!(matches!(event, Some(OutputEvent::Error { ref name, .. }) if name == "KernelDied"));
        assert!(tracker.finished());
    }
}
