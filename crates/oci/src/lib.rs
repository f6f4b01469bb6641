//! berth-oci: base images from any OCI / Docker Registry v2 registry.
//!
//! Owns the registry protocol (manifests, blobs, Basic and Bearer-token auth, manifest
//! lists with platform selection, operator mirrors, plain http for loopback
//! registries) and the conversion of image layers into berth template layers. It
//! writes layers only through [`berth_template::TemplateStore::ensure_layer`], so it
//! knows nothing of sandboxes, namespaces or the E2B API; the build engine
//! (berth-build) turns a pulled image into a template. A crate of its own rather than
//! a module of berth-template because it is the only part of templates that speaks
//! HTTP (reqwest, TLS, decompressors), which the store and the runtime must not pull in.
//!
//! **Layers.** Each OCI layer becomes one berth layer whose id is derived from the
//! layer's uncompressed digest (`diff_id`, from the image config) and the converter
//! version, so two images sharing a base layer share it on disk, and a concurrent pull
//! of the same layer waits on the store's flock for one download. The blob streams
//! through two hashers (compressed digest and diff_id) and the decompressor (gzip, zstd
//! or none, sniffed from the bytes) straight into the tar unpacker ([`unpack`]); a
//! digest mismatch fails the build of that layer, so nothing unverified is published.
//! Manifests fetched by digest and config blobs are verified the same way.
//!
//! **Whiteouts** are converted to what the runtime's overlay (userxattr, inside a user
//! namespace) honours: a 0/0 char device per `.wh.<name>`, `user.overlay.opaque=y` per
//! `.wh..wh..opq` (see [`unpack`] for the measurements and the safety rules).
//!
//! **Image config.** Env, WorkingDir, User, Entrypoint and Cmd come back in
//! [`ImageConfig`] for the template.

mod error;
mod manifest;
mod reference;
mod registry;
pub mod unpack;

pub use error::OciError;
pub use manifest::Platform;
pub use reference::{ImageReference, DOCKER_HUB};
pub use registry::Credentials;

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth_template::{LayerId, TemplateError, TemplateStore};
use sha2::{Digest, Sha256};

use manifest::{
    layer_compression, Compression, ConfigBlob, Index, Manifest, DOCKER_LIST, DOCKER_MANIFEST,
    OCI_INDEX, OCI_MANIFEST,
};
use reference::validate_digest;
use registry::Repository;

/// Bump when the conversion of a layer tar into a layer directory changes, so layers
/// converted the old way are not reused.
const CONVERTER_VERSION: u32 = 1;

/// Registry credentials as a build request carries them (E2B's `fromImageRegistry`).
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    /// `{"type": "registry", "username", "password"}`.
    Basic(Credentials),
    /// `{"type": "aws", …}` or `{"type": "gcp", …}`: refused (they need cloud APIs).
    Cloud { kind: String },
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::Basic(c) => f.debug_tuple("Basic").field(c).finish(),
            RegistryAuth::Cloud { kind } => f.debug_struct("Cloud").field("kind", kind).finish(),
        }
    }
}

/// Operator settings for pulls.
#[derive(Debug, Clone, Default)]
pub struct PullerConfig {
    /// Registry (as references name it, e.g. `docker.io`) → base URL to pull from
    /// instead (e.g. `http://127.0.0.1:5000`). A mirrored registry is never contacted
    /// itself.
    pub mirrors: BTreeMap<String, String>,
    /// Registries (host[:port]) spoken to over plain http besides loopback ones.
    pub insecure_registries: Vec<String>,
}

/// How an image's containers start (from its config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `KEY=value` entries, in the image's order.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// A pulled image: its layers (lowest first, all in the store) and config.
#[derive(Debug, Clone)]
pub struct PulledImage {
    pub reference: ImageReference,
    /// Digest of the image manifest used (the platform's, below any index).
    pub manifest_digest: String,
    pub layers: Vec<LayerId>,
    pub config: ImageConfig,
}

/// What a pull is doing, for build logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    Resolved {
        manifest_digest: String,
        layers: usize,
    },
    /// The layer is already in the store (from this or another image).
    LayerCached {
        digest: String,
        layer: LayerId,
    },
    /// Another pull is fetching the same layer; waiting for it.
    LayerWaiting {
        digest: String,
    },
    LayerDownloading {
        digest: String,
        size: u64,
    },
    LayerReady {
        digest: String,
        layer: LayerId,
        bytes: u64,
        elapsed: Duration,
    },
}

/// Pulls images into a template store.
pub struct ImagePuller {
    http: reqwest::blocking::Client,
    config: PullerConfig,
}

impl ImagePuller {
    pub fn new(config: PullerConfig) -> Result<ImagePuller, OciError> {
        let http = reqwest::blocking::Client::builder()
            .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .timeout(None)
            .build()
            .map_err(|source| OciError::Connect {
                registry: "(client setup)".into(),
                source,
            })?;
        Ok(ImagePuller { http, config })
    }

    /// Pulls `reference` for `platform` into `store`, reusing every layer the store
    /// already has. `cancelled` is polled while bytes stream.
    pub fn pull(
        &self,
        store: &TemplateStore,
        reference: &str,
        auth: Option<&RegistryAuth>,
        platform: &Platform,
        cancelled: &AtomicBool,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<PulledImage, OciError> {
        let reference = ImageReference::parse(reference)?;
        let credentials = match auth {
            None => None,
            Some(RegistryAuth::Basic(c)) => Some(c.clone()),
            Some(RegistryAuth::Cloud { kind }) => {
                return Err(OciError::UnsupportedCredentials { kind: kind.clone() })
            }
        };
        let (base_url, registry_name) = self.endpoint(&reference);
        let mut repo = Repository::new(
            self.http.clone(),
            base_url,
            registry_name,
            reference.repository.clone(),
            credentials,
        );
        let (manifest_digest, manifest) = self.resolve_manifest(&mut repo, &reference, platform)?;
        let config_bytes = repo.small_blob(&manifest.config.digest)?;
        verify("config", &manifest.config.digest, &config_bytes)?;
        let config: ConfigBlob =
            serde_json::from_slice(&config_bytes).map_err(|e| OciError::Malformed {
                registry: repo.registry().to_string(),
                what: "image config",
                detail: e.to_string(),
            })?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(OciError::LayerCountMismatch {
                layers: manifest.layers.len(),
                diff_ids: config.rootfs.diff_ids.len(),
            });
        }
        if !config.os.is_empty()
            && (config.os != platform.os || config.architecture != platform.architecture)
        {
            return Err(OciError::NoMatchingPlatform {
                reference: reference.to_string(),
                platform: platform.to_string(),
                available: format!("{}/{}", config.os, config.architecture),
            });
        }
        progress(PullProgress::Resolved {
            manifest_digest: manifest_digest.clone(),
            layers: manifest.layers.len(),
        });
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (descriptor, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
            if cancelled.load(Ordering::Relaxed) {
                return Err(OciError::Cancelled);
            }
            layers
                .push(self.pull_layer(store, &mut repo, descriptor, diff_id, cancelled, progress)?);
        }
        let run = config.config.unwrap_or_default();
        Ok(PulledImage {
            reference,
            manifest_digest,
            layers,
            config: ImageConfig {
                env: run.env.unwrap_or_default(),
                working_dir: run.working_dir.filter(|w| !w.is_empty()),
                user: run.user.filter(|u| !u.is_empty()),
                entrypoint: run.entrypoint.unwrap_or_default(),
                cmd: run.cmd.unwrap_or_default(),
            },
        })
    }

    /// The layer id an OCI layer with uncompressed digest `diff_id` is stored under.
    pub fn layer_id(diff_id: &str) -> LayerId {
        LayerId::of_bytes(format!("berth-oci-layer v{CONVERTER_VERSION} {diff_id}").as_bytes())
    }

    /// Base URL and display name of the registry serving `reference`.
    fn endpoint(&self, reference: &ImageReference) -> (String, String) {
        if let Some(mirror) = self.config.mirrors.get(&reference.registry) {
            return (mirror.trim_end_matches('/').to_string(), mirror.clone());
        }
        let host = reference.api_host();
        let scheme = if is_loopback(host)
            || self
                .config
                .insecure_registries
                .iter()
                .any(|r| r == host || r == &reference.registry)
        {
            "http"
        } else {
            "https"
        };
        (format!("{scheme}://{host}"), reference.registry.clone())
    }

    /// The image manifest for `platform`, following an index if the reference names one.
    fn resolve_manifest(
        &self,
        repo: &mut Repository,
        reference: &ImageReference,
        platform: &Platform,
    ) -> Result<(String, Manifest), OciError> {
        let (bytes, media_type) = repo.manifest(reference.manifest_reference())?;
        if let Some(digest) = &reference.digest {
            verify("manifest", digest, &bytes)?;
        }
        let registry = repo.registry().to_string();
        let malformed = |detail: String| OciError::Malformed {
            registry: registry.clone(),
            what: "manifest",
            detail,
        };
        let kind = effective_media_type(&media_type, &bytes);
        let (digest, bytes, kind) = match kind.as_str() {
            OCI_INDEX | DOCKER_LIST => {
                let index: Index =
                    serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
                let entry = index
                    .select(platform)
                    .ok_or_else(|| OciError::NoMatchingPlatform {
                        reference: reference.to_string(),
                        platform: platform.to_string(),
                        available: index.platforms(),
                    })?;
                validate_digest(&entry.digest)
                    .map_err(|_| malformed(format!("bad digest {:?}", entry.digest)))?;
                let digest = entry.digest.clone();
                let (bytes, media_type) = repo.manifest(&digest)?;
                verify("manifest", &digest, &bytes)?;
                let kind = effective_media_type(&media_type, &bytes);
                (digest, bytes, kind)
            }
            _ => (sha256_digest(&bytes), bytes, kind),
        };
        match kind.as_str() {
            OCI_MANIFEST | DOCKER_MANIFEST => {}
            other => {
                return Err(OciError::UnsupportedMediaType {
                    what: "manifest",
                    media_type: other.to_string(),
                })
            }
        }
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
        Ok((digest, manifest))
    }

    fn pull_layer(
        &self,
        store: &TemplateStore,
        repo: &mut Repository,
        descriptor: &manifest::Descriptor,
        diff_id: &str,
        cancelled: &AtomicBool,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<LayerId, OciError> {
        let digest = descriptor.digest.clone();
        validate_digest(&digest).map_err(|_| OciError::Malformed {
            registry: repo.registry().to_string(),
            what: "manifest",
            detail: format!("bad layer digest {digest:?}"),
        })?;
        validate_digest(diff_id).map_err(|_| OciError::Malformed {
            registry: repo.registry().to_string(),
            what: "image config",
            detail: format!("bad diff id {diff_id:?}"),
        })?;
        if !descriptor.urls.is_empty() && descriptor.media_type.contains("foreign") {
            return Err(OciError::ForeignLayer {
                digest,
                urls: descriptor.urls.clone(),
            });
        }
        if layer_compression(&descriptor.media_type).is_none() {
            return Err(OciError::UnsupportedMediaType {
                what: "layer",
                media_type: descriptor.media_type.clone(),
            });
        }
        let id = Self::layer_id(diff_id);
        if store.has_layer(&id) {
            progress(PullProgress::LayerCached {
                digest,
                layer: id.clone(),
            });
            return Ok(id);
        }
        let started = Instant::now();
        // ensure_layer's builder can only return a TemplateError; the real cause is
        // kept here and returned instead.
        let mut failure: Option<OciError> = None;
        let mut bytes = 0u64;
        let shared_progress = std::cell::RefCell::new(&mut *progress);
        let source = format!("oci layer {digest} (diff {diff_id})");
        let result = store.ensure_layer(
            &id,
            &source,
            &mut |event| {
                if let berth_template::BuildProgress::WaitingForBuilder { .. } = event {
                    (shared_progress.borrow_mut())(PullProgress::LayerWaiting {
                        digest: digest.clone(),
                    });
                }
            },
            |rootfs, _| {
                (shared_progress.borrow_mut())(PullProgress::LayerDownloading {
                    digest: digest.clone(),
                    size: descriptor.size,
                });
                let fetched = repo
                    .blob(&digest)
                    .and_then(|blob| fetch_into(blob, rootfs, &digest, diff_id, cancelled));
                match fetched {
                    Ok(n) => {
                        bytes = n;
                        Ok(())
                    }
                    Err(e) => {
                        failure = Some(e);
                        Err(TemplateError::BuildFailed {
                            stage: format!("pull layer {digest}"),
                            status: "failed".into(),
                            output_tail: String::new(),
                        })
                    }
                }
            },
        );
        match (result, failure) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(e.into()),
            (Ok(_), None) => {
                progress(PullProgress::LayerReady {
                    digest,
                    layer: id.clone(),
                    bytes,
                    elapsed: started.elapsed(),
                });
                Ok(id)
            }
        }
    }
}

/// Streams a layer blob through both digests and the decompressor into `rootfs`;
/// returns the compressed bytes read.
fn fetch_into(
    blob: impl Read,
    rootfs: &std::path::Path,
    digest: &str,
    diff_id: &str,
    cancelled: &AtomicBool,
) -> Result<u64, OciError> {
    let mut compressed = HashingReader::new(CancellableReader {
        inner: blob,
        cancelled,
    });
    let mut buffered = BufReader::with_capacity(256 * 1024, &mut compressed);
    let compression = sniff(&mut buffered).map_err(|e| archive_error(digest, e, cancelled))?;
    let decompressed: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(buffered)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(buffered)
                .map_err(|e| archive_error(digest, e, cancelled))?,
        ),
    };
    let mut uncompressed = HashingReader::new(decompressed);
    let unpacked = unpack::unpack_layer(&mut uncompressed, rootfs, digest);
    if cancelled.load(Ordering::Relaxed) {
        return Err(OciError::Cancelled);
    }
    unpacked?;
    // The tar may end before the stream does (padding after the end-of-archive
    // blocks); both digests cover every byte.
    io::copy(&mut uncompressed, &mut io::sink())
        .map_err(|e| archive_error(digest, e, cancelled))?;
    let diff = uncompressed.finish();
    io::copy(&mut compressed, &mut io::sink()).map_err(|e| archive_error(digest, e, cancelled))?;
    let total = compressed.count;
    let blob_digest = compressed.finish();
    if blob_digest != digest {
        return Err(OciError::DigestMismatch {
            what: "layer blob",
            expected: digest.to_string(),
            actual: blob_digest,
        });
    }
    if diff != diff_id {
        return Err(OciError::DigestMismatch {
            what: "uncompressed layer (diff id)",
            expected: diff_id.to_string(),
            actual: diff,
        });
    }
    Ok(total)
}

fn archive_error(digest: &str, e: io::Error, cancelled: &AtomicBool) -> OciError {
    if cancelled.load(Ordering::Relaxed) {
        return OciError::Cancelled;
    }
    OciError::BadArchive {
        digest: digest.to_string(),
        detail: e.to_string(),
    }
}

/// Gzip and zstd announce themselves by magic bytes; anything else is a plain tar.
fn sniff(reader: &mut impl BufRead) -> io::Result<Compression> {
    let head = reader.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    })
}

/// A registry sometimes labels manifests `application/json` or not at all; the
/// document's own `mediaType` then says what it is.
fn effective_media_type(header: &str, bytes: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    if [OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST].contains(&header) {
        return header.to_string();
    }
    match serde_json::from_slice::<Probe>(bytes) {
        Ok(Probe {
            media_type: Some(t),
            ..
        }) => t,
        Ok(Probe {
            manifests: Some(_), ..
        }) => OCI_INDEX.to_string(),
        _ => OCI_MANIFEST.to_string(),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.split_once(']').map(|(ip, _)| ip))
        .unwrap_or_else(|| host.rsplit_once(':').map_or(host, |(h, _)| h));
    bare == "localhost" || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn verify(what: &'static str, expected: &str, bytes: &[u8]) -> Result<(), OciError> {
    let actual = sha256_digest(bytes);
    if actual == expected {
        Ok(())
    } else {
        Err(OciError::DigestMismatch {
            what,
            expected: expected.to_string(),
            actual,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    fn finish(self) -> String {
        format!("sha256:{}", hex(&self.hasher.finalize()))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

struct CancellableReader<'a, R> {
    inner: R,
    cancelled: &'a AtomicBool,
}

impl<R: Read> Read for CancellableReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "pull cancelled"));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised_with_ports() {
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("127.8.9.1"));
        assert!(is_loopback("localhost:5000"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("registry.example:5000"));
        assert!(!is_loopback("10.0.0.1:5000"));
    }

    #[test]
    fn endpoints_follow_mirrors_and_insecure_settings() {
        let puller = ImagePuller::new(PullerConfig {
            mirrors: BTreeMap::from([("docker.io".into(), "http://127.0.0.1:5000/".into())]),
            insecure_registries: vec!["reg.internal:5000".into()],
        })
        .unwrap();
        let endpoint = |r: &str| puller.endpoint(&ImageReference::parse(r).unwrap()).0;
        assert_eq!(endpoint("ubuntu"), "http://127.0.0.1:5000");
        assert_eq!(endpoint("reg.internal:5000/a"), "http://reg.internal:5000");
        assert_eq!(endpoint("127.0.0.1:5001/a"), "http://127.0.0.1:5001");
        assert_eq!(endpoint("quay.io/a/b"), "https://quay.io");
    }

    #[test]
    fn layer_ids_follow_the_diff_id_and_converter() {
        let a = ImagePuller::layer_id(&format!("sha256:{}", "a".repeat(64)));
        assert_eq!(
            a,
            ImagePuller::layer_id(&format!("sha256:{}", "a".repeat(64)))
        );
        assert_ne!(
            a,
            ImagePuller::layer_id(&format!("sha256:{}", "b".repeat(64)))
        );
    }

    #[test]
    fn cloud_credentials_are_refused_before_any_request() {
        let puller = ImagePuller::new(PullerConfig::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::open(dir.path()).unwrap();
        let err = puller
            .pull(
                &store,
                "127.0.0.1:1/x",
                Some(&RegistryAuth::Cloud { kind: "aws".into() }),
                &Platform::linux_amd64(),
                &AtomicBool::new(false),
                &mut |_| {},
            )
            .unwrap_err();
        assert!(matches!(err, OciError::UnsupportedCredentials { .. }));
    }

    #[test]
    fn media_types_are_inferred_from_documents() {
        assert_eq!(
            effective_media_type("application/json", br#"{"manifests":[]}"#),
            OCI_INDEX
        );
        assert_eq!(
            effective_media_type(
                "",
                format!(r#"{{"mediaType":"{DOCKER_MANIFEST}"}}"#).as_bytes()
            ),
            DOCKER_MANIFEST
        );
        assert_eq!(effective_media_type(OCI_MANIFEST, b"{}"), OCI_MANIFEST);
    }
}
