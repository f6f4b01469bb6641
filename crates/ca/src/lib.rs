//! berth-ca: a per-installation certificate authority, created once in a directory of
//! the state dir (`ca.key` 0600, written first; `ca.crt`, whose presence marks the CA
//! complete), loaded on every start, and issuing short-lived leaf certificates for one
//! host name each (exactly that name as subject alternative name: OpenSSL's host checks
//! refuse wildcards under a public suffix such as `*.localhost`), cached per name.
//!
//! berth keeps two: the egress proxy's interception CA (`<state>/egress-ca`, trusted by
//! sandboxes) and the serving CA of `berth up`'s TLS listener (`<state>/serving-ca`,
//! trusted by clients). It owns those files and nothing else; which names get a leaf is
//! the caller's decision.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

/// The CA could not be created or loaded, or a leaf not issued.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(
        "CA file {path}: {source}; check the directory exists and is writable by the daemon only"
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("CA file {path} is not a usable PEM certificate or key ({source}); remove both ca.crt and ca.key to generate a new CA (whoever trusted the old one must then trust the new one)")]
    Parse { path: PathBuf, source: rcgen::Error },
    #[error("generating a CA or a leaf certificate failed: {0}")]
    Generate(#[source] rcgen::Error),
}

const KEY_FILE: &str = "ca.key";
/// Written after the key: its presence marks the CA complete.
const CERT_FILE: &str = "ca.crt";
/// Leaves are valid this long and reissued after half of it.
const LEAF_LIFETIME: Duration = Duration::from_secs(14 * 24 * 3600);
const MAX_CACHED_LEAVES: usize = 4096;

/// A CA and the leaves it issued.
pub struct CertificateAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    /// One key for every leaf, kept in memory only: signing stays cheap, and the
    /// leaves are only ever presented by this process.
    leaf_key: Arc<dyn rustls::sign::SigningKey>,
    leaf_public: KeyPair,
    leaves: Mutex<HashMap<String, (Instant, Arc<CertifiedKey>)>>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write, fsync, rename; `mode` applies to the new file.
fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let tmp: PathBuf = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    file.write_all(contents).map_err(io_err(&tmp))?;
    file.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

impl CertificateAuthority {
    /// Loads the CA from `dir`, or creates it there (named `common_name`) when `dir`
    /// holds none.
    pub fn load_or_create(dir: &Path, common_name: &str) -> Result<Self, CaError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let (key_path, cert_path) = (dir.join(KEY_FILE), dir.join(CERT_FILE));
        let (key, cert_pem) = if cert_path.exists() {
            let key_pem = std::fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
            let cert_pem = std::fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
            let key = KeyPair::from_pem(&key_pem).map_err(|source| CaError::Parse {
                path: key_path.clone(),
                source,
            })?;
            (key, cert_pem)
        } else {
            let key = KeyPair::generate().map_err(CaError::Generate)?;
            let cert = ca_params(common_name)
                .self_signed(&key)
                .map_err(CaError::Generate)?;
            write_atomically(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
            write_atomically(&cert_path, cert.pem().as_bytes(), 0o644)?;
            (key, cert.pem())
        };
        let cert_der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|_| CaError::Parse {
                path: cert_path.clone(),
                source: rcgen::Error::CouldNotParseCertificate,
            })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|source| CaError::Parse {
            path: cert_path.clone(),
            source,
        })?;
        let leaf_public = KeyPair::generate().map_err(CaError::Generate)?;
        let leaf_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_public.serialize_der()));
        let leaf_key = rustls::crypto::ring::sign::any_supported_type(&leaf_der)
            .map_err(|_| CaError::Generate(rcgen::Error::KeyGenerationUnavailable))?;
        Ok(CertificateAuthority {
            cert_pem,
            cert_der,
            issuer,
            leaf_key,
            leaf_public,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate (PEM), what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for `name` (already normalized by the caller: lower case, no
    /// trailing dot; an IP address gets an IP address SAN), issued now or taken from the
    /// cache.
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((issued, leaf)) = leaves.get(name) {
            if issued.elapsed() < LEAF_LIFETIME / 2 {
                return Ok(leaf.clone());
            }
        }
        let mut params =
            CertificateParams::new(vec![name.to_string()]).map_err(CaError::Generate)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + LEAF_LIFETIME;
        let cert = params
            .signed_by(&self.leaf_public, &self.issuer)
            .map_err(CaError::Generate)?;
        let leaf = Arc::new(CertifiedKey::new(
            vec![cert.der().clone(), self.cert_der.clone()],
            self.leaf_key.clone(),
        ));
        if leaves.len() >= MAX_CACHED_LEAVES {
            leaves.clear();
        }
        leaves.insert(name.to_string(), (Instant::now(), leaf.clone()));
        Ok(leaf)
    }
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "berth");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(3650);
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_once_then_loaded_with_a_private_key_file() {
        let dir = std::env::temp_dir().join(format!("berth-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = CertificateAuthority::load_or_create(&dir, "test CA").unwrap();
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        let second = CertificateAuthority::load_or_create(&dir, "test CA").unwrap();
        let leaf = second.leaf("api.test").unwrap();
        let cached = second.leaf("api.test").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            first.cert_pem(),
            second.cert_pem(),
            "the CA survives restarts"
        );
        assert!(Arc::ptr_eq(&leaf, &cached), "leaves are cached");
        assert_eq!(leaf.cert.len(), 2, "leaf and CA");
    }
}
