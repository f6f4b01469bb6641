//! berth-interpreter: the code-interpreter server of the `code-interpreter-v1` template.
//!
//! It listens on port 49999 inside a sandbox and speaks the HTTP API the official
//! code-interpreter SDKs (`e2b-code-interpreter`, `@e2b/code-interpreter`) call:
//! `POST /execute` streams newline-delimited JSON events (stdout, stderr, result,
//! error, number_of_executions, end_of_execution) as the kernel produces them;
//! `/contexts` creates, lists, restarts and removes contexts; `/health` says when the
//! warm-up kernels are running. It owns the Jupyter kernels it starts and nothing
//! else: it never touches envd, berth's server or the sandbox's configuration, and only
//! reads the sandbox's env vars from envd's `GET /envs`.
//!
//! Design. A *context* is one kernel process (found through its kernelspec, started
//! in its own process group, talked to over ZeroMQ with `jupyter-zmq-client` and the
//! message types of `jupyter-protocol`) plus an id, a language and a cwd. Each language
//! has a default context, made on first use or at start (`--warm`). An execution holds
//! its context's lock from start to end, so executions in one context are serialised
//! and different contexts run concurrently. The kernel's iopub and shell messages are
//! routed by parent `msg_id` to the waiting execution ([`kernel`]), translated into the
//! SDKs' events ([`output`]) and written to the response as they arrive. Env vars of a
//! request are set and then restored by silent executions (no execution count, no
//! history) around the user's code; the sandbox's own vars (from envd) are applied the
//! same way whenever they change. A client that disconnects gets its execution
//! interrupted (SIGINT to the kernel's group, or `interrupt_request` for kernels that
//! ask for it); a kernel that exits mid-execution ends the stream with an error event
//! and is restarted, as is one that ignores an interrupt.
//!
//! Charts and DataFrames come from berth's own IPython extension
//! (`python/berth_kernel.py`, loaded by the Python kernelspec): it adds the `e2b/chart`
//! and `e2b/data` MIME types this server maps to the SDKs' `chart` and `data` fields.

#![forbid(unsafe_code)]

pub mod context;
pub mod envd;
pub mod error;
pub mod kernel;
pub mod kernelspec;
pub mod language;
pub mod output;
pub mod server;

pub use context::{ContextInfo, Registry, Settings};
pub use error::{InterpreterError, KernelError, RequestError};
pub use kernelspec::KernelspecCatalog;
pub use language::Language;
pub use server::{router, AppState};
