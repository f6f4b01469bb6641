//! The JSON documents of an image: index (manifest list), manifest and config, in
//! their OCI and Docker v2 schema 2 spellings (same shapes, different media types).

use serde::{Deserialize, Serialize};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The Accept header for manifest requests: every kind berth can read.
pub(crate) const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// A content descriptor.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub urls: Vec<String>,
}

/// The platform an image is for, as in an index entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// linux/amd64: what berth's sandboxes run.
    pub fn linux_amd64() -> Platform {
        Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        }
    }

    fn matches(&self, wanted: &Platform) -> bool {
        self.os == wanted.os
            && self.architecture == wanted.architecture
            && (wanted.variant.is_none() || self.variant == wanted.variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

/// An image index / manifest list.
#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    pub manifests: Vec<Descriptor>,
}

impl Index {
    /// The entry for `wanted`, skipping attestation manifests (platform unknown/unknown).
    pub fn select(&self, wanted: &Platform) -> Option<&Descriptor> {
        self.manifests
            .iter()
            .find(|d| d.platform.as_ref().is_some_and(|p| p.matches(wanted)))
    }

    pub fn platforms(&self) -> String {
        let names: Vec<String> = self
            .manifests
            .iter()
            .filter_map(|d| d.platform.as_ref().map(ToString::to_string))
            .collect();
        if names.is_empty() {
            "no platforms".into()
        } else {
            names.join(", ")
        }
    }
}

/// An image manifest.
#[derive(Debug, Deserialize)]
pub(crate) struct Manifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The image config blob (only the parts berth uses).
#[derive(Debug, Deserialize)]
pub(crate) struct ConfigBlob {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<RunConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// The `config` object of an image config: how its containers start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RunConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The compression a layer media type names, or None if it is not a layer type berth
/// reads.
pub(crate) fn layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_selection_picks_linux_amd64_and_skips_attestations() {
        let index: Index = serde_json::from_str(
            r#"{"manifests":[
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:a","size":1,
               "platform":{"architecture":"arm64","os":"linux","variant":"v8"}},
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:u","size":1,
               "platform":{"architecture":"unknown","os":"unknown"}},
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:b","size":1,
               "platform":{"architecture":"amd64","os":"linux"}}]}"#,
        )
        .unwrap();
        assert_eq!(
            index.select(&Platform::linux_amd64()).unwrap().digest,
            "sha256:b"
        );
        assert!(index.platforms().contains("linux/arm64/v8"));
        let riscv = Platform {
            architecture: "riscv64".into(),
            os: "linux".into(),
            variant: None,
        };
        assert!(index.select(&riscv).is_none());
    }

    #[test]
    fn layer_media_types_name_their_compression() {
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(layer_compression("application/json"), None);
    }
}
