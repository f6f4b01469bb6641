//! E2B REST models. Field names on the wire are exactly what the official SDKs send and
//! parse (checked against `e2b` 2.63.0); Rust names follow Rust conventions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

/// The legacy fixed client id E2B reports for every sandbox.
pub const CLIENT_ID: &str = "6532622b";

/// String-to-string map used for sandbox metadata and environment variables.
pub type StringMap = BTreeMap<String, String>;

/// Body of `POST /sandboxes` and `POST /v2/sandboxes`.
///
/// Fields for features berth does not have yet (MCP, IAM, volumes) are accepted so the official SDKs' requests parse, and rejected by the server
/// with a message naming the feature when they ask for something non-default.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct NewSandbox {
    /// Template id or alias to start the sandbox from.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Time to live in seconds (E2B's server default is 15; the SDKs send 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 2147483647)]
    pub timeout: Option<i64>,
    /// Secure all communication with envd by an access token (`POST /sandboxes` only;
    /// v2 sandboxes are always secured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<StringMap>,
    #[serde(default, rename = "envVars", skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<StringMap>,
    /// Pause instead of kill at the end time.
    #[serde(default, rename = "autoPause", skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// An automatic pause keeps memory (default true); false keeps only the files.
    #[serde(
        default,
        rename = "autoPauseMemory",
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_pause_memory: Option<bool>,
    /// `{"enabled": true}`: traffic through the proxy resumes the sandbox when paused.
    #[serde(
        default,
        rename = "autoResume",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Object>)]
    pub auto_resume: Option<serde_json::Value>,
    /// False: no egress (as `network.denyOut` 0.0.0.0/0). Snake case on the wire, as
    /// in E2B's API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// E2B's `SandboxNetworkConfig`: allowOut, denyOut, allowPublicTraffic,
    /// maskRequestHost, rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub network: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub mcp: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub iam: Option<serde_json::Value>,
    /// Volumes of the team mounted read-write at absolute paths.
    #[serde(
        default,
        rename = "volumeMounts",
        skip_serializing_if = "Option::is_none"
    )]
    pub volume_mounts: Option<Vec<SandboxVolumeMount>>,
}

/// A volume mounted into a sandbox: the volume's name and where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxVolumeMount {
    pub name: String,
    pub path: String,
}

/// A team's volume.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

/// A volume with the token of its content API (`Authorization: Bearer <token>`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    pub token: String,
    /// Only for teams on a custom cluster in E2B; berth never sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// Body of `POST /volumes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewVolume {
    /// `^[a-zA-Z0-9_-]+$`, unique per team.
    pub name: String,
}

/// A secret's metadata; never its value.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Secret {
    #[serde(rename = "secretID")]
    pub secret_id: String,
    /// Canonical (lower-case) name, unique per team.
    pub name: String,
    #[serde(rename = "currentVersion")]
    pub current_version: i64,
    pub metadata: StringMap,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "updatedAt", with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// Body of `POST /secrets`. `Debug` never shows the value.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct NewSecret {
    pub name: String,
    /// Write-only: stored sealed, resolved at egress, never returned or logged.
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<StringMap>,
}

impl std::fmt::Debug for NewSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewSecret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("metadata", &self.metadata)
            .finish()
    }
}

/// Body of `POST /secrets/{id}`: a new version. `Debug` never shows the value.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct SecretUpdate {
    pub value: String,
    /// Replaces the stored metadata when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<StringMap>,
}

impl std::fmt::Debug for SecretUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretUpdate")
            .field("value", &"<redacted>")
            .field("metadata", &self.metadata)
            .finish()
    }
}

/// A created or connected sandbox: what the SDK needs to reach it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// Token envd requires in `X-Access-Token` (secured sandboxes only).
    #[serde(
        default,
        rename = "envdAccessToken",
        skip_serializing_if = "Option::is_none"
    )]
    pub envd_access_token: Option<String>,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

/// State of a sandbox as E2B reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

/// One entry of a sandbox listing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "startedAt", with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(rename = "endAt", with = "time::serde::rfc3339")]
    pub end_at: OffsetDateTime,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// Optional in E2B's schema: a listing without it reads as no metadata.
    #[serde(default)]
    pub metadata: StringMap,
    pub state: SandboxState,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "volumeMounts", default)]
    pub volume_mounts: Vec<SandboxVolumeMount>,
}

/// Everything known about one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "startedAt", with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(rename = "endAt", with = "time::serde::rfc3339")]
    pub end_at: OffsetDateTime,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(
        default,
        rename = "envdAccessToken",
        skip_serializing_if = "Option::is_none"
    )]
    pub envd_access_token: Option<String>,
    #[serde(rename = "allowInternetAccess")]
    pub allow_internet_access: Option<bool>,
    pub domain: Option<String>,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub metadata: StringMap,
    pub state: SandboxState,
    /// E2B's `SandboxNetworkConfig` of the sandbox's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub network: Option<serde_json::Value>,
    #[serde(rename = "volumeMounts", default)]
    pub volume_mounts: Vec<SandboxVolumeMount>,
}

/// Body of `POST /sandboxes/{id}/connect`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConnectSandbox {
    /// Seconds from now after which the sandbox expires; connect only extends.
    #[schema(minimum = 0, maximum = 2147483647)]
    pub timeout: i64,
}

/// Body of `POST /v2/sandboxes/{id}/connect` (what SDK 2.63 sends).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ConnectSandboxV2 {
    /// Seconds from now after which the sandbox expires (default 300); only extends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 2147483647)]
    pub timeout: Option<i64>,
    /// Resume with memory (only meaningful for paused sandboxes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// Body of `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxTimeoutRequest {
    /// Seconds from now after which the sandbox expires (overwrites the end time).
    #[schema(minimum = 0, maximum = 2147483647)]
    pub timeout: i64,
}

/// Body of `POST /sandboxes/{id}/refreshes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SandboxRefreshRequest {
    /// Seconds to keep the sandbox alive from now (0..=3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 3600)]
    pub duration: Option<i64>,
}

/// Body of `POST /sandboxes/{id}/pause` (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SandboxPauseRequest {
    /// Keep every process's memory (default); false keeps only the filesystem and the
    /// sandbox boots afresh on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// Accepted for compatibility; berth checkpoints the processes as they are.
    #[serde(
        default,
        rename = "requireHealthyGuest",
        skip_serializing_if = "Option::is_none"
    )]
    pub require_healthy_guest: Option<bool>,
}

/// Body of `POST /sandboxes/{id}/resume`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ResumedSandbox {
    /// Seconds from now after which the resumed sandbox expires (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 2147483647)]
    pub timeout: Option<i64>,
    /// Deprecated: pause instead of kill at the new end time.
    #[serde(default, rename = "autoPause", skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
}

/// Body of `POST /sandboxes/{id}/fork` (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SandboxForkRequest {
    /// Seconds the forks live (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 2147483647)]
    pub timeout: Option<i64>,
    /// Number of forks, 1..=100 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub count: Option<i64>,
}

/// One fork's outcome: exactly one of `sandbox` and `error`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxForkResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::Error>,
}

/// Body of `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SandboxSnapshotRequest {
    /// Name of the snapshot (usable as `templateID`); a snapshot of that name is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Keep memory (default): sandboxes from it continue its processes; false keeps only
    /// the files and sandboxes from it boot afresh on them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// A snapshot as E2B reports it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotInfo {
    /// The name (or id) to pass as `templateID`.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// Full names of the snapshot.
    pub names: Vec<String>,
}

/// One resource-usage sample of a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxMetric {
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    #[serde(rename = "timestampUnix")]
    pub timestamp_unix: i64,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "cpuUsedPct")]
    pub cpu_used_pct: f64,
    #[serde(rename = "memUsed")]
    pub mem_used: u64,
    #[serde(rename = "memTotal")]
    pub mem_total: u64,
    #[serde(rename = "memCache")]
    pub mem_cache: u64,
    #[serde(rename = "diskUsed")]
    pub disk_used: u64,
    #[serde(rename = "diskTotal")]
    pub disk_total: u64,
}

/// Latest metric per sandbox id.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxesWithMetrics {
    pub sandboxes: BTreeMap<String, SandboxMetric>,
}

/// Log severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "debug" => Some(LogLevel::Debug),
            "info" => Some(LogLevel::Info),
            "warn" => Some(LogLevel::Warn),
            "error" => Some(LogLevel::Error),
            _ => None,
        }
    }
}

/// Order of log pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogsDirection {
    Forward,
    Backward,
}

/// Sort order of sandbox listings by start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrderDirection {
    Asc,
    Desc,
}

/// Legacy log line.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxLog {
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    pub line: String,
}

/// Structured log entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxLogEntry {
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    pub message: String,
    pub level: LogLevel,
    pub fields: StringMap,
}

/// Response of `GET /sandboxes/{id}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxLogs {
    pub logs: Vec<SandboxLog>,
    #[serde(rename = "logEntries")]
    pub log_entries: Vec<SandboxLogEntry>,
}

/// Response of `GET /v2/sandboxes/{id}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxLogsV2Response {
    pub logs: Vec<SandboxLogEntry>,
}

/// A team the caller belongs to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Team {
    #[serde(rename = "teamID")]
    pub team_id: String,
    pub name: String,
    /// Masked form of the key used for the request; raw keys are never stored.
    #[serde(rename = "apiKey")]
    pub api_key: String,
    #[serde(rename = "isDefault")]
    pub is_default: bool,
}

/// Team-wide sandbox counts at one point in time.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamMetric {
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    #[serde(rename = "timestampUnix")]
    pub timestamp_unix: i64,
    #[serde(rename = "concurrentSandboxes")]
    pub concurrent_sandboxes: u32,
    /// Sandboxes started per second.
    #[serde(rename = "sandboxStartRate")]
    pub sandbox_start_rate: f64,
}

/// Maximum of one team metric over an interval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MaxTeamMetric {
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    #[serde(rename = "timestampUnix")]
    pub timestamp_unix: i64,
    pub value: f64,
}

/// Which team metric `GET /teams/{teamID}/metrics/max` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TeamMetricName {
    ConcurrentSandboxes,
    SandboxStartRate,
}

/// How a key is shown without revealing it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IdentifierMaskingDetails {
    pub prefix: String,
    #[serde(rename = "valueLength")]
    pub value_length: u32,
    #[serde(rename = "maskedValuePrefix")]
    pub masked_value_prefix: String,
    #[serde(rename = "maskedValueSuffix")]
    pub masked_value_suffix: String,
}

/// An API key of the team, masked.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamApiKey {
    pub id: String,
    pub name: String,
    pub mask: IdentifierMaskingDetails,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "createdBy")]
    #[schema(value_type = Option<Object>)]
    pub created_by: Option<serde_json::Value>,
    #[serde(rename = "lastUsed", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_used: Option<OffsetDateTime>,
}

/// A newly created key: the only time the raw value is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedTeamApiKey {
    pub id: String,
    pub key: String,
    pub mask: IdentifierMaskingDetails,
    pub name: String,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "createdBy")]
    #[schema(value_type = Option<Object>)]
    pub created_by: Option<serde_json::Value>,
    #[serde(rename = "lastUsed", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_used: Option<OffsetDateTime>,
}

/// Body of `POST /api-keys`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewTeamApiKey {
    pub name: String,
}

/// Body of `PATCH /api-keys/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UpdateTeamApiKey {
    pub name: String,
}

/// Status of a template build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TemplateBuildStatus {
    Building,
    Waiting,
    Ready,
    Error,
}

/// An installed template.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "updatedAt", with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(rename = "createdBy")]
    #[schema(value_type = Option<Object>)]
    pub created_by: Option<serde_json::Value>,
    #[serde(rename = "lastSpawnedAt", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_spawned_at: Option<OffsetDateTime>,
    #[serde(rename = "spawnCount")]
    pub spawn_count: u64,
    #[serde(rename = "buildCount")]
    pub build_count: u32,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "buildStatus")]
    pub build_status: TemplateBuildStatus,
}

/// One build of a template.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuild {
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: TemplateBuildStatus,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "updatedAt", with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(
        rename = "finishedAt",
        with = "time::serde::rfc3339::option",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
}

/// A template with its builds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateWithBuilds {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "updatedAt", with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(rename = "lastSpawnedAt", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_spawned_at: Option<OffsetDateTime>,
    #[serde(rename = "spawnCount")]
    pub spawn_count: u64,
    pub builds: Vec<TemplateBuild>,
}

/// Response of `GET /templates/aliases/{alias}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateAliasResponse {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}

/// Event types: E2B's lifecycle events, and berth's `sandbox.snapshot.deleted` (a
/// snapshot deleted by request or by the operator's retention).
pub const EVENT_TYPES: [&str; 7] = [
    "sandbox.lifecycle.created",
    "sandbox.lifecycle.killed",
    "sandbox.lifecycle.paused",
    "sandbox.lifecycle.resumed",
    "sandbox.lifecycle.updated",
    "sandbox.lifecycle.checkpointed",
    "sandbox.snapshot.deleted",
];

/// A sandbox lifecycle event (also the body of a webhook delivery).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxEvent {
    /// Always `v1`.
    pub version: String,
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(rename = "eventData")]
    #[schema(value_type = Option<Object>)]
    pub event_data: Option<serde_json::Value>,
    #[serde(rename = "sandboxBuildId")]
    pub sandbox_build_id: String,
    #[serde(rename = "sandboxExecutionId")]
    pub sandbox_execution_id: String,
    #[serde(rename = "sandboxId")]
    pub sandbox_id: String,
    #[serde(rename = "sandboxTeamId")]
    pub sandbox_team_id: String,
    #[serde(rename = "sandboxTemplateId")]
    pub sandbox_template_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
}

/// Body of `POST /events/webhooks`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewWebhook {
    pub name: String,
    /// Where deliveries are POSTed (http or https).
    pub url: String,
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Event types to deliver; empty means all.
    #[serde(default)]
    pub events: Vec<String>,
    /// Secret for the `e2b-signature` header; never returned.
    #[serde(rename = "signatureSecret")]
    pub signature_secret: String,
}

fn default_true() -> bool {
    true
}

/// Body of `PATCH /events/webhooks/{id}`; absent fields are left unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct WebhookUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    #[serde(
        default,
        rename = "signatureSecret",
        skip_serializing_if = "Option::is_none"
    )]
    pub signature_secret: Option<String>,
}

/// A registered webhook (its secret is never shown).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    pub id: String,
    #[serde(rename = "teamID")]
    pub team_id: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    pub events: Vec<String>,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// One delivery of an event to a webhook (berth's `GET
/// /events/webhooks/{webhookID}/deliveries`; E2B's API has no delivery listing).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookDelivery {
    pub id: i64,
    #[serde(rename = "eventID")]
    pub event_id: String,
    #[serde(rename = "eventType")]
    pub event_type: String,
    /// `pending` (tried again at `nextAttemptAt`), `delivered` or `failed` (given up).
    pub status: String,
    pub attempts: u32,
    /// The receiver's HTTP status to the last attempt, when it answered.
    #[serde(rename = "responseCode")]
    pub response_code: Option<u16>,
    /// Why the last attempt failed, when it did.
    pub error: Option<String>,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(rename = "lastAttemptAt", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_attempt_at: Option<OffsetDateTime>,
    #[serde(rename = "nextAttemptAt", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_attempt_at: Option<OffsetDateTime>,
}

/// Query of `GET /events/webhooks/{webhookID}/deliveries`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// Newest deliveries to return, 1..=100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
}

/// Query of `GET /events/sandboxes` and `GET /events/sandboxes/{id}`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events to skip.
    #[param(minimum = 0, maximum = 2147483647)]
    pub offset: Option<i64>,
    /// Page size, 1..=100 (default 10).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// Oldest first when true (default newest first).
    #[serde(rename = "orderAsc")]
    pub order_asc: Option<bool>,
    /// Comma-separated event types to keep.
    pub types: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sandbox_parses_what_sdk_2_63_sends() {
        let body = r#"{"templateID":"base","timeout":300,"autoPause":false,
            "autoPauseMemory":true,"metadata":{"a":"b"},"envVars":{"X":"1"},
            "allow_internet_access":true}"#;
        let parsed: NewSandbox = serde_json::from_str(body).unwrap();
        assert_eq!(parsed.template_id, "base");
        assert_eq!(parsed.timeout, Some(300));
        assert_eq!(parsed.allow_internet_access, Some(true));
        assert_eq!(parsed.env_vars.unwrap()["X"], "1");
    }

    #[test]
    fn sandbox_serializes_with_e2b_names() {
        let sandbox = Sandbox {
            template_id: "base".into(),
            sandbox_id: "iabc".into(),
            alias: None,
            client_id: CLIENT_ID.into(),
            envd_version: "0.6.4".into(),
            envd_access_token: Some("tok".into()),
            traffic_access_token: None,
            domain: None,
        };
        let value = serde_json::to_value(&sandbox).unwrap();
        for key in [
            "templateID",
            "sandboxID",
            "clientID",
            "envdVersion",
            "envdAccessToken",
            "trafficAccessToken",
            "domain",
        ] {
            assert!(value.get(key).is_some(), "missing {key}: {value}");
        }
        assert!(value.get("alias").is_none());
    }

    #[test]
    fn answers_of_e2b_cloud_parse_with_fields_berth_does_not_model() {
        let created: Sandbox = serde_json::from_str(
            r#"{"templateID":"rki5dems9wqfm4r03t7g","sandboxID":"iabc","alias":"base",
                "clientID":"6532622b","envdVersion":"0.2.0","envdAccessToken":"tok",
                "trafficAccessToken":null,"domain":"e2b.app","someNewField":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(created.sandbox_id, "iabc");
        assert_eq!(created.domain.as_deref(), Some("e2b.app"));
        let listed: Vec<ListedSandbox> = serde_json::from_str(
            r#"[{"templateID":"t","sandboxID":"iabc","clientID":"6532622b",
                 "startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z",
                 "cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"state":"running",
                 "envdVersion":"0.2.0","volumeMounts":[]}]"#,
        )
        .unwrap();
        assert!(listed[0].metadata.is_empty());
    }

    #[test]
    fn listed_sandbox_times_are_rfc3339() {
        let listed = ListedSandbox {
            template_id: "base".into(),
            alias: None,
            sandbox_id: "iabc".into(),
            client_id: CLIENT_ID.into(),
            started_at: OffsetDateTime::UNIX_EPOCH,
            end_at: OffsetDateTime::UNIX_EPOCH,
            cpu_count: 1,
            memory_mb: 512,
            disk_size_mb: 1024,
            metadata: StringMap::new(),
            state: SandboxState::Running,
            envd_version: "0.6.4".into(),
            volume_mounts: Vec::new(),
        };
        let value = serde_json::to_value(&listed).unwrap();
        assert_eq!(value["startedAt"], "1970-01-01T00:00:00Z");
        assert_eq!(value["state"], "running");
        assert_eq!(value["memoryMB"], 512);
    }
}
