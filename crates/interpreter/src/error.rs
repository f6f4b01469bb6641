//! Typed errors: what a request got wrong ([`RequestError`]) and what went wrong with a
//! kernel ([`KernelError`]). `server::ApiError` is the one place they become HTTP.

use std::path::PathBuf;

/// The request cannot be served as sent (4xx).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("invalid JSON body: {detail}")]
    InvalidJson { detail: String },
    #[error("unknown language {language:?}: use one of python, javascript (js), typescript (ts), r, bash, java")]
    UnknownLanguage { language: String },
    #[error("give either context_id or language, not both")]
    ContextAndLanguage,
    #[error("context {id} not found: list the contexts with GET /contexts or create one with POST /contexts")]
    UnknownContext { id: String },
    #[error("invalid environment variable name {name:?}: names must match [A-Za-z_][A-Za-z0-9_]*")]
    InvalidEnvName { name: String },
    #[error("environment variable {name} contains a NUL byte, which no environment can hold")]
    InvalidEnvValue { name: String },
    #[error("working directory {cwd:?} does not exist or is not a directory")]
    CwdNotFound { cwd: String },
}

/// A kernel could not be started, talked to or kept alive.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("language {language} is not installed in this sandbox: no kernelspec {kernelspec:?} under {searched:?}")]
    NotInstalled {
        language: &'static str,
        kernelspec: &'static str,
        searched: Vec<PathBuf>,
    },
    #[error("kernelspec {path}: {detail}")]
    BadKernelspec { path: PathBuf, detail: String },
    #[error("cannot write the kernel connection file {path}: {source}")]
    ConnectionFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start kernel {command:?}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reserve local ports for the kernel: {0}")]
    Ports(#[source] jupyter_zmq_client::RuntimeError),
    #[error("ZeroMQ connection to the kernel failed: {0}")]
    Connect(#[source] jupyter_zmq_client::RuntimeError),
    #[error("sending to the kernel failed: {0}")]
    Send(#[source] jupyter_zmq_client::RuntimeError),
    #[error("the {kernelspec} kernel exited while starting ({status}); its last output: {output}")]
    ExitedDuringStart {
        kernelspec: String,
        status: String,
        output: String,
    },
    #[error("the {kernelspec} kernel did not answer kernel_info within {seconds} s; its last output: {output}")]
    StartTimeout {
        kernelspec: String,
        seconds: u64,
        output: String,
    },
    #[error("the kernel has exited ({status})")]
    Dead { status: String },
    #[error("cannot interrupt the kernel: {0}")]
    Interrupt(#[source] std::io::Error),
}

/// Anything an operation of the interpreter can fail with.
#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}
