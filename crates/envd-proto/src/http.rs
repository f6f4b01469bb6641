//! JSON bodies of envd's plain HTTP routes (E2B's `envd.yaml`), and which of its routes
//! are internal.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};

/// envd routes only the orchestrator may call (`x-internal` in envd's OpenAPI document),
/// as first path segments. The public proxy refuses them; berth-envd serves `init`.
pub const INTERNAL_ROUTES: [&str; 6] = [
    "init", "freeze", "unfreeze", "collapse", "fsfreeze", "fsthaw",
];

/// Body of envd's internal `POST /init`: the sandbox-wide defaults the control plane
/// hands envd after start, resume and restore.
///
/// Empty fields (an empty map or string, `null`, or absent) leave envd's current value
/// alone, so a re-`/init` can change one thing. Fields of E2B's body that concern a VM
/// guest (`volumeMounts`, `caBundle`, `hyperloopIP`, `lifecycleID`) are not modelled;
/// envd ignores unknown fields. `Debug` hides the access token.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitRequest {
    /// Merged into the default environment of every process.
    #[serde(default, deserialize_with = "null_as_default")]
    pub env_vars: BTreeMap<String, String>,
    /// From now on every envd call (and `/init` itself) needs `X-Access-Token` equal to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// The OS user calls without `Authorization` run as.
    #[serde(default, deserialize_with = "null_as_default")]
    pub default_user: String,
    /// Where relative paths and new processes start.
    #[serde(default, deserialize_with = "null_as_default")]
    pub default_workdir: String,
    /// RFC 3339 host time, for a guest to sync its clock (a sandbox shares the host's).
    #[serde(default, deserialize_with = "null_as_default")]
    pub timestamp: String,
}

impl fmt::Debug for InitRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitRequest")
            .field("env_vars", &self.env_vars.keys().collect::<Vec<_>>())
            .field(
                "access_token",
                &self.access_token.as_ref().map(|_| "<redacted>"),
            )
            .field("default_user", &self.default_user)
            .field("default_workdir", &self.default_workdir)
            .field("timestamp", &self.timestamp)
            .finish()
    }
}

/// `null` reads as the type's default, as Go's JSON decoder (E2B's envd) treats it.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// One written file in the answer of `POST /files` (an array) and `POST /files/compose`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryInfo {
    /// Absolute path of the file.
    pub path: String,
    /// Its last path component.
    pub name: String,
    /// Always `"file"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The file's `user.e2b.*` metadata, when the upload set some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl EntryInfo {
    /// The entry of a written file at `path`.
    pub fn file(path: &Path, metadata: Option<BTreeMap<String, String>>) -> Self {
        Self {
            path: path.to_string_lossy().into_owned(),
            name: path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind: "file".to_owned(),
            metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn init_request_has_envds_field_names() {
        let request = InitRequest {
            env_vars: BTreeMap::from([("A".into(), "1".into())]),
            access_token: Some("tok".into()),
            default_user: "user".into(),
            default_workdir: "/home/user".into(),
            timestamp: "2026-01-01T00:00:00Z".into(),
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"envVars": {"A": "1"}, "accessToken": "tok", "defaultUser": "user",
                   "defaultWorkdir": "/home/user", "timestamp": "2026-01-01T00:00:00Z"})
        );
        let without_token = InitRequest {
            access_token: None,
            ..request.clone()
        };
        assert!(serde_json::to_value(&without_token)
            .unwrap()
            .get("accessToken")
            .is_none());
        assert!(!format!("{request:?}").contains("tok\""));
    }

    #[test]
    fn init_request_reads_partial_null_and_unknown_fields_as_unchanged() {
        let parsed: InitRequest = serde_json::from_value(json!({
            "envVars": null, "defaultUser": null, "volumeMounts": [], "caBundle": "x"
        }))
        .unwrap();
        assert_eq!(parsed, InitRequest::default());
        let parsed: InitRequest = serde_json::from_value(json!({"accessToken": "t"})).unwrap();
        assert_eq!(parsed.access_token.as_deref(), Some("t"));
        assert!(parsed.env_vars.is_empty() && parsed.default_workdir.is_empty());
        assert!(serde_json::from_value::<InitRequest>(json!({"envVars": [1]})).is_err());
    }

    #[test]
    fn entry_info_serializes_like_e2b() {
        let info = EntryInfo::file(Path::new("/home/user/hello.txt"), None);
        assert_eq!(
            serde_json::to_value(&info).unwrap(),
            json!({"path": "/home/user/hello.txt", "name": "hello.txt", "type": "file"})
        );
    }
}
