//! State shared by every route and service of envd.

use std::collections::HashMap;
use std::sync::RwLock;

/// What `/init` sets: the sandbox-wide defaults every call falls back to.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    /// Default OS user for calls without `Authorization: Basic`.
    pub user: Option<String>,
    /// Default working directory for processes and relative paths.
    pub workdir: Option<String>,
    /// Environment variables added to every process.
    pub env_vars: HashMap<String, String>,
    /// When set, every call must carry `X-Access-Token` equal to it.
    pub access_token: Option<String>,
}

/// Shared envd state; wrap in `Arc`.
#[derive(Debug, Default)]
pub struct EnvdState {
    pub defaults: RwLock<Defaults>,
    /// Users and groups of the sandbox (`/etc/passwd`, `/etc/group`).
    pub users: crate::users::UserDb,
    /// Previous CPU sample, for `/metrics`' CPU percentage.
    pub cpu_sampler: crate::files::metrics::CpuSampler,
}
