//! Signed file URLs: the v1 signature the SDKs put on `/files` download and upload URLs
//! of a sandbox created with `secure`, so a link works without `X-Access-Token`.
//!
//! `signature = "v1_" + base64_std_no_pad(sha256("<path>:<read|write>:<username>:<token>[:<expiration>]"))`
//!
//! `path` and `username` are the decoded query values (`username` empty when absent),
//! `token` the sandbox's envd access token, `expiration` the optional
//! `signature_expiration` query value (unix seconds). envd verifies it; the proxy uses
//! it to find the sandbox a signed URL without a sandbox id is meant for.

use base64::Engine;
use sha2::{Digest, Sha256};

/// What a signed URL grants: `GET /files` reads, `POST /files` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOperation {
    Read,
    Write,
}

impl FileOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            FileOperation::Read => "read",
            FileOperation::Write => "write",
        }
    }
}

/// The v1 signature of a file URL.
pub fn file_signature(
    path: &str,
    operation: FileOperation,
    username: &str,
    access_token: &str,
    expiration: Option<i64>,
) -> String {
    let mut message = format!("{path}:{}:{username}:{access_token}", operation.as_str());
    if let Some(expiration) = expiration {
        message.push(':');
        message.push_str(&expiration.to_string());
    }
    let digest = Sha256::digest(message.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Compares without an early exit, so timing does not reveal a matching prefix (only
/// the length, which the signature format makes public anyway).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimizer from turning the fold into an early-exit compare.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_known_vector() {
        // Computed independently: `printf %s '<message>' | sha256sum | xxd -r -p | base64`,
        // padding dropped.
        let sig = file_signature("/home/user/a.txt", FileOperation::Read, "user", "tok", None);
        assert_eq!(sig, "v1_p0WqJQYCLtO6YX+e4h7VbpybRsdJbMbIw7clYpulIJk");
        let with_exp = file_signature(
            "/home/user/a.txt",
            FileOperation::Write,
            "",
            "tok",
            Some(1_700_000_000),
        );
        assert_eq!(with_exp, "v1_QdtRqpz7xKNXzcs4IguYpySRPZbSGp8b64s9hqOl+wo");
        assert!(!sig.ends_with('='));
    }

    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret1"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
