//! berth-envd: the daemon inside every sandbox, wire-compatible with E2B's envd 0.6.x.
//!
//! Serves the Process and Filesystem RPC services over the Connect protocol and the
//! HTTP routes (`/health`, `/metrics`, `/envs`, `/files`, `/init`) on one port
//! (49983), as HTTP/1.1 and h2c. It depends on nothing of the server: it is a small
//! static binary (`build-static.sh`) that runs as the sandbox's init, or on a plain
//! host for tests (`berth-envd --listen 127.0.0.1:49983`).
//!
//! Map: [`connect`] is the reusable Connect server layer every RPC route is built
//! with; [`process`] the Process service; [`reaper`] the only place children are
//! waited for (and orphans reaped when envd is PID 1), from one spawner thread whose
//! short scheduler slice ([`sched`]) lets it answer before its child's first CPU burst
//! ends; [`server`] the router and the listener; [`files`], [`filesystem`], [`users`], [`auth`] the file routes, the
//! Filesystem service, OS users and access control.
//!
//! Process lifetime, in short (details in [`process`]): a process runs until it exits
//! or is signalled. A client disconnecting never kills it — unlike E2B's envd, so
//! background commands outlive the script that started them. `Connect-Timeout-Ms` on
//! `Start` is the command's time limit while its `Start` stream is attached (the SDKs'
//! `commands.run(timeout=N)`): when it passes, the process group is SIGKILLed and the
//! stream ends with `deadline_exceeded`; a stream that detaches earlier drops the
//! limit. Timeouts of `Connect` streams and unary calls end only those calls. A
//! finished process stays reachable by `Connect` for 30 s. On SIGTERM/SIGINT envd
//! SIGTERMs its running processes, SIGKILLs them after 2 s, and exits.

pub mod auth;
pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod reaper;
pub mod sched;
pub mod server;
pub mod state;
pub mod users;

pub use berth_envd_proto::ENVD_VERSION;
