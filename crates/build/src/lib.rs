//! berth-build: the template build engine.
//!
//! Owns the execution of E2B template builds: a base (an OCI image pulled by
//! berth-oci, or an existing template), E2B's user phase (`user`, uid 1000 when free,
//! passwordless sudo), the request's steps as SDK 2.63 and the E2B CLI send them, and
//! with a start command a memory checkpoint of a sandbox where it is ready. It knows
//! nothing of HTTP or the database: the server calls [`BuildEngine`] and maps its
//! statuses and log entries to E2B's shapes; the result is a template in the
//! [`berth_template::TemplateStore`] the runtime makes sandboxes from.
//!
//! **Steps run isolated.** Every step that can change files (RUN, COPY/ADD, WORKDIR,
//! USER) runs in a fresh build sandbox made by [`berth_runtime::LinuxRuntime`] on the
//! current layers, with the template's cpu and memory limits, as the step's user, in
//! its workdir and environment (`berth-launch exec`: the sandbox's namespaces, cgroups,
//! seccomp and capabilities). Output lines become log entries with the step number.
//! Then `LinuxRuntime::commit_upper` kills the sandbox and copies its overlay upper dir
//! into a staged layer (owners shifted back to 0-based, whiteouts and opaque markers
//! kept), which the store commits under the hash of its content; a step that changed
//! nothing adds no layer. ENV/ARG only change the context. Build sandboxes have
//! loopback only unless a [`BuildNetwork`] is configured: that is where sandbox
//! networking plugs in.
//!
//! **Cache.** Each sandbox step's result (the layer stack and context after it) is
//! cached under sha256(layer ids before it, context before it, the step): an unchanged
//! rebuild runs nothing, a changed step reruns itself and — because their input layers
//! changed — the steps after it; `force` (per step, or the whole build) skips lookups.
//!
//! **COPY.** Uploads live in the [`FileStore`] by (scope, filesHash); the SDK's hash is
//! recomputed from the upload and the step's src/dest before it is used
//! ([`files::sdk_files_hash`]). The archive is unpacked inside the build sandbox on its
//! /tmp tmpfs and moved into place as E2B's copy script does, so paths resolve (and
//! symlinks are kept) inside the sandbox, never on the host.
//!
//! **Start and ready.** With `startCmd`, a sandbox of the final layers runs it detached
//! (re-parented to the sandbox's init, output to a file on its /tmp), the ready
//! command is retried until it succeeds, and `Runtime::checkpoint` saves the sandbox
//! with its memory as runtime checkpoint `tpl-<build>`; the manifest names it.
//!
//! **Crash safety.** Layers appear only by the store's atomic rename; the manifest is
//! written last; a build's `status.json` says `building` until then, so a restarted
//! engine marks such builds interrupted ([`BuildEngine::new`]) and kills leftover build
//! sandboxes (ids starting with [`SANDBOX_PREFIX`]).

mod dockerfile;
mod engine;
mod error;
mod executor;
pub mod files;
mod request;
mod scripts;

pub use dockerfile::{parse_dockerfile, DockerfileTemplate};
pub use engine::{
    BuildEngine, BuildFailure, BuildNetwork, BuildState, BuildStatus, EngineConfig, LogEntry,
    LogLevel, LogSink, SANDBOX_PREFIX,
};
pub use error::BuildError;
pub use executor::{BuildOutput, TEMPLATE_CHECKPOINT_PREFIX};
pub use files::FileStore;
pub use request::{BuildBase, BuildRequest, E2bBuildStart, E2bRegistry, Step};
