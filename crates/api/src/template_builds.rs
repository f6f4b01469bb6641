//! E2B's template build API models: requesting a build, COPY uploads, starting it,
//! status and logs, tags, and template updates. Wire names as SDK 2.63 and the E2B CLI
//! 2.19 send and parse them.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use crate::{LogLevel, TemplateBuildStatus};

/// Body of `POST /v3/templates`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildRequestV3 {
    /// `name` or `name:tag` (`namespace/name[:tag]` with the caller's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tags the build gets once it is ready (besides the one in `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Deprecated spelling of `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Deprecated; the API key's team is used.
    #[serde(default, rename = "teamID", skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    #[serde(default, rename = "cpuCount", skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Free disk space wanted after the build, MiB (the sandbox disk is sized to fit).
    #[serde(
        default,
        rename = "minFreeDiskMb",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_free_disk_mb: Option<u64>,
}

/// Answer of `POST /v3/templates`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateRequestResponseV3 {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// Answer of `GET /templates/{templateID}/files/{hash}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildFileUpload {
    /// The upload for this hash is already stored.
    pub present: bool,
    /// Where to `PUT` the tar(.gz) when it is not (served by berth itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// A build step: `{type, args, filesHash?, force?, forceUpload?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateStep {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default, rename = "filesHash", skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    #[serde(
        default,
        rename = "forceUpload",
        skip_serializing_if = "Option::is_none"
    )]
    pub force_upload: Option<bool>,
}

/// Credentials of `fromImage`'s registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FromImageRegistry {
    /// Any registry, Basic / token auth with these credentials.
    Registry { username: String, password: String },
    /// AWS ECR (not supported by berth: answered with a build error).
    Aws {
        #[serde(default, rename = "awsAccessKeyId")]
        aws_access_key_id: String,
        #[serde(default, rename = "awsSecretAccessKey")]
        aws_secret_access_key: String,
        #[serde(default, rename = "awsRegion")]
        aws_region: String,
    },
    /// Google Artifact Registry (not supported by berth: answered with a build error).
    Gcp {
        #[serde(default, rename = "serviceAccountJson")]
        service_account_json: String,
    },
}

/// Body of `POST /v2/templates/{templateID}/builds/{buildID}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildStartV2 {
    #[serde(default, rename = "fromImage", skip_serializing_if = "Option::is_none")]
    pub from_image: Option<String>,
    #[serde(
        default,
        rename = "fromTemplate",
        skip_serializing_if = "Option::is_none"
    )]
    pub from_template: Option<String>,
    #[serde(
        default,
        rename = "fromImageRegistry",
        skip_serializing_if = "Option::is_none"
    )]
    pub from_image_registry: Option<FromImageRegistry>,
    /// Rebuild every step, ignoring the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    #[serde(default)]
    pub steps: Vec<TemplateStep>,
    #[serde(default, rename = "startCmd", skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    #[serde(default, rename = "readyCmd", skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

/// One build log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BuildLogEntry {
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    pub message: String,
    pub level: LogLevel,
    /// "base", "1".. (the request's steps), "finalize".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// Why a build is in its status (for `error`: what failed).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BuildStatusReason {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The failing step's warnings and errors.
    #[serde(default, rename = "logEntries")]
    pub log_entries: Vec<BuildLogEntry>,
}

/// Answer of `GET /templates/{templateID}/builds/{buildID}/status`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildInfo {
    /// Legacy plain log lines; always empty (use `logEntries`).
    pub logs: Vec<String>,
    #[serde(rename = "logEntries")]
    pub log_entries: Vec<BuildLogEntry>,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: TemplateBuildStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildStatusReason>,
}

/// Answer of `GET /templates/{templateID}/builds/{buildID}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildLogsResponse {
    pub logs: Vec<BuildLogEntry>,
}

/// Where `GET …/logs` reads from; berth keeps one log per build, so both are it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogsSource {
    Temporary,
    Persistent,
}

/// Body of `POST /templates/tags`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AssignTemplateTagsRequest {
    /// The build to tag, as `name:tag` (`name` alone: its `default` tag).
    pub target: String,
    pub tags: Vec<String>,
}

/// Answer of `POST /templates/tags`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AssignedTemplateTags {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// Body of `DELETE /templates/tags`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeleteTemplateTagsRequest {
    /// Template name, without a tag.
    pub name: String,
    pub tags: Vec<String>,
}

/// One tag of a template.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateTag {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Body of `PATCH /templates/{templateID}` and `PATCH /v2/templates/{templateID}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TemplateUpdateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
}

/// Answer of `PATCH /v2/templates/{templateID}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateUpdateResponse {
    pub names: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_bodies_parse_and_unknown_fields_are_ignored() {
        let request: TemplateBuildRequestV3 = serde_json::from_str(
            r#"{"name":"app:v1","tags":["x"],"cpuCount":2,"memoryMB":1024,"minFreeDiskMb":10,"future":1}"#,
        )
        .unwrap();
        assert_eq!(request.name.as_deref(), Some("app:v1"));
        assert_eq!(request.min_free_disk_mb, Some(10));
        let start: TemplateBuildStartV2 = serde_json::from_str(
            r#"{"steps":[{"type":"COPY","args":["a","/a","",""],"filesHash":"ab","force":false,"forceUpload":null}],
                "force":false,"fromImage":"x:1","fromImageRegistry":{"type":"registry","username":"u","password":"p"}}"#,
        )
        .unwrap();
        assert_eq!(start.steps[0].files_hash.as_deref(), Some("ab"));
        assert!(matches!(
            start.from_image_registry,
            Some(FromImageRegistry::Registry { .. })
        ));
        let aws: FromImageRegistry = serde_json::from_str(
            r#"{"type":"aws","awsAccessKeyId":"a","awsSecretAccessKey":"b","awsRegion":"c"}"#,
        )
        .unwrap();
        assert!(matches!(aws, FromImageRegistry::Aws { .. }));
    }

    #[test]
    fn status_answers_have_the_sdk_shape() {
        let info = TemplateBuildInfo {
            logs: vec![],
            log_entries: vec![BuildLogEntry {
                timestamp: OffsetDateTime::UNIX_EPOCH,
                message: "m".into(),
                level: LogLevel::Info,
                step: Some("1".into()),
            }],
            template_id: "t".into(),
            build_id: "b".into(),
            status: TemplateBuildStatus::Error,
            reason: Some(BuildStatusReason {
                message: "boom".into(),
                step: Some("1".into()),
                log_entries: vec![],
            }),
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["logEntries"][0]["step"], "1");
        assert_eq!(json["logEntries"][0]["timestamp"], "1970-01-01T00:00:00Z");
        assert_eq!(json["reason"]["step"], "1");
        assert_eq!(json["status"], "error");
    }
}
