//! Template manifests: the JSON file naming a template's layers and config.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, TemplateError};
use crate::layer::LayerId;

/// What a sandbox made from a template starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateConfig {
    /// User that commands run as unless the caller names one.
    pub default_user: String,
    /// Working directory of commands unless the caller names one.
    pub default_workdir: String,
    /// Environment added to every process (under the caller's own variables).
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Command started in the background in every sandbox of the template (E2B's
    /// `startCmd`); with [`TemplateConfig::checkpoint`] it is already running there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    /// Command that succeeds once the start command is ready (E2B's `readyCmd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
    /// The runtime's id of a memory checkpoint taken once the start command was ready;
    /// sandboxes of the template start from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// On-disk form of a template: `manifests/<id>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateManifest {
    pub id: String,
    /// Layer ids, lowest first.
    pub layers: Vec<LayerId>,
    #[serde(flatten)]
    pub config: TemplateConfig,
    /// Seconds since the Unix epoch when the manifest was written.
    pub created_at: u64,
}

impl TemplateManifest {
    pub(crate) fn read(path: &Path) -> Result<TemplateManifest, TemplateError> {
        let bytes = fs::read(path).ctx("read manifest", path)?;
        serde_json::from_slice(&bytes).map_err(|source| TemplateError::BadManifest {
            path: path.to_path_buf(),
            source,
        })
    }

    pub(crate) fn write(&self, path: &Path) -> Result<(), TemplateError> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("manifest serializes");
        bytes.push(b'\n');
        write_atomically(path, &bytes)
    }
}

/// Replace `path` with `bytes` so that readers see the old or the new file, never a
/// partial one, even across a crash: write a sibling, fsync it, rename, fsync the dir.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TemplateError> {
    let dir = path.parent().expect("manifest path has a parent");
    let file_name = path.file_name().expect("manifest path has a file name");
    let temp = dir.join(format!(
        ".{}.tmp-{}-{:?}",
        file_name.to_string_lossy(),
        std::process::id(),
        std::thread::current().id()
    ));
    let result = (|| {
        let mut file = File::create(&temp).ctx("create", &temp)?;
        file.write_all(bytes).ctx("write", &temp)?;
        file.sync_all().ctx("fsync", &temp)?;
        fs::rename(&temp, path).ctx("rename into place", path)?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .ctx("fsync dir", dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TemplateManifest {
        TemplateManifest {
            id: "base".into(),
            layers: vec![LayerId::of_bytes(b"a"), LayerId::of_bytes(b"b")],
            config: TemplateConfig {
                default_user: "user".into(),
                default_workdir: "/home/user".into(),
                envs: BTreeMap::from([("LANG".into(), "C.UTF-8".into())]),
                ..TemplateConfig::default()
            },
            created_at: 1,
        }
    }

    #[test]
    fn manifest_round_trips_and_replaces_atomically() {
        let dir = std::env::temp_dir().join(format!("berth-manifest-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.json");
        let mut manifest = sample();
        manifest.write(&path).unwrap();
        assert_eq!(TemplateManifest::read(&path).unwrap(), manifest);

        manifest.layers.pop();
        manifest.write(&path).unwrap();
        assert_eq!(TemplateManifest::read(&path).unwrap(), manifest);
        // Only the manifest remains: no temp siblings left behind.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("base.json")]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn manifest_json_is_flat_and_readable() {
        let json: serde_json::Value = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["default_user"], "user");
        assert_eq!(json["default_workdir"], "/home/user");
        assert_eq!(json["layers"].as_array().unwrap().len(), 2);
        // Unset start/ready/checkpoint fields are not written: older berths read it.
        assert!(json.get("start_cmd").is_none() && json.get("checkpoint").is_none());
    }

    #[test]
    fn manifests_without_start_fields_still_read() {
        let old =
            r#"{"id":"t","layers":[],"default_user":"user","default_workdir":"/","created_at":1}"#;
        let manifest: TemplateManifest = serde_json::from_str(old).unwrap();
        assert_eq!(manifest.config.start_cmd, None);
        let mut started = sample();
        started.config.start_cmd = Some("python -m http.server".into());
        started.config.checkpoint = Some("tpl-x".into());
        let json = serde_json::to_string(&started).unwrap();
        assert_eq!(
            serde_json::from_str::<TemplateManifest>(&json).unwrap(),
            started
        );
    }

    #[test]
    fn truncated_manifest_is_a_typed_error() {
        let dir = std::env::temp_dir().join(format!("berth-badmanifest-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.json");
        fs::write(&path, b"{\"id\": \"x\", \"lay").unwrap();
        assert!(matches!(
            TemplateManifest::read(&path),
            Err(TemplateError::BadManifest { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
