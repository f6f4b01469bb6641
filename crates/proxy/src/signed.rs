//! Signed file URLs that name no sandbox.
//!
//! With `E2B_SANDBOX_URL` set, the SDKs build a secure sandbox's `download_url` /
//! `upload_url` as `<E2B_SANDBOX_URL>/files?path=…&signature=…[&username=…][&signature_expiration=…]`:
//! no sandbox id in the host, the path or a header (a browser or `curl` fetching the link
//! sends none). The signature is keyed by the sandbox's envd access token, so it names
//! exactly one sandbox: the proxy recomputes it under every signing sandbox's token and
//! forwards to the one that matches (envd then verifies it again).
//!
//! Every candidate is checked with a constant-time compare and without stopping at the
//! first match, and a signature no sandbox signed gets the same answer whether or not
//! any sandbox exists, so a forged link learns nothing about which sandboxes there are.

use berth_envd_proto::signature::{constant_time_eq, file_signature, FileOperation};
use http::{Method, Request};

use crate::target::SandboxId;

/// Path of envd's file route.
const FILES_PATH: &str = "/files";

/// A `/files` request authorised by its signature alone, as parsed from its query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedFileUrl {
    pub operation: FileOperation,
    /// Decoded `path` query value (empty when absent).
    pub path: String,
    /// Decoded `username` query value (empty when absent: the default user).
    pub username: String,
    pub signature: String,
    /// `signature_expiration` (unix seconds), when the URL has one.
    pub expiration: Option<i64>,
    /// Path and query to forward, exactly as received.
    pub path_and_query: String,
}

/// Why a signed file URL is refused before it reaches a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No signing sandbox's token produces this signature (or the expiration is not a
    /// number): forged, for another path or user, or its sandbox is gone.
    #[error("invalid signature")]
    Invalid,
    #[error("signature is already expired")]
    Expired,
}

impl SignedFileUrl {
    /// `Some` when `req` is `GET` or `POST` `/files` with a `signature` query parameter;
    /// requests that address a sandbox otherwise are classified before this.
    pub fn from_request<B>(req: &Request<B>) -> Option<Result<Self, SignatureError>> {
        let operation = match *req.method() {
            Method::GET => FileOperation::Read,
            Method::POST => FileOperation::Write,
            _ => return None,
        };
        if req.uri().path() != FILES_PATH {
            return None;
        }
        let query = req.uri().query()?;
        let mut path = String::new();
        let mut username = String::new();
        let mut signature = None;
        let mut expiration = None;
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match name.as_ref() {
                "path" => path = value.into_owned(),
                "username" => username = value.into_owned(),
                "signature" => signature = Some(value.into_owned()),
                "signature_expiration" => expiration = Some(value.into_owned()),
                _ => {}
            }
        }
        let signature = signature?;
        let expiration = match expiration.map(|raw| raw.parse::<i64>()) {
            None => None,
            Some(Ok(at)) => Some(at),
            Some(Err(_)) => return Some(Err(SignatureError::Invalid)),
        };
        Some(Ok(SignedFileUrl {
            operation,
            path,
            username,
            signature,
            expiration,
            path_and_query: req
                .uri()
                .path_and_query()
                .map_or(FILES_PATH, |pq| pq.as_str())
                .to_owned(),
        }))
    }

    /// The one sandbox among `signers` (id, envd access token) whose token signed this
    /// URL. Every candidate is compared, in constant time, whatever matched before.
    pub fn signer(&self, signers: &[(SandboxId, String)]) -> Option<SandboxId> {
        let mut found = None;
        for (id, token) in signers {
            let expected = file_signature(
                &self.path,
                self.operation,
                &self.username,
                token,
                self.expiration,
            );
            if constant_time_eq(expected.as_bytes(), self.signature.as_bytes()) && found.is_none() {
                found = Some(id.clone());
            }
        }
        found
    }

    /// Refuses a URL whose expiration is before `now` (unix seconds).
    pub fn check_expiration(&self, now: i64) -> Result<(), SignatureError> {
        match self.expiration {
            Some(at) if at < now => Err(SignatureError::Expired),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
    }

    fn id(raw: &str) -> SandboxId {
        SandboxId::parse(raw).unwrap()
    }

    #[test]
    fn only_signed_get_and_post_of_files_are_recognised() {
        assert!(SignedFileUrl::from_request(&request(Method::GET, "/files?path=a")).is_none());
        assert!(
            SignedFileUrl::from_request(&request(Method::GET, "/sandboxes?signature=x")).is_none()
        );
        assert!(
            SignedFileUrl::from_request(&request(Method::DELETE, "/files?signature=x")).is_none()
        );
        let signed = SignedFileUrl::from_request(&request(
            Method::POST,
            "/files?path=%2Fhome%2Fuser%2Fa%20b.txt&username=user&signature=v1_x&signature_expiration=17",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(signed.operation, FileOperation::Write);
        assert_eq!(signed.path, "/home/user/a b.txt");
        assert_eq!(signed.username, "user");
        assert_eq!(signed.expiration, Some(17));
        assert_eq!(
            SignedFileUrl::from_request(&request(
                Method::GET,
                "/files?signature=v1_x&signature_expiration=soon"
            )),
            Some(Err(SignatureError::Invalid))
        );
    }

    #[test]
    fn the_signer_is_the_sandbox_whose_token_signed() {
        let signature = file_signature("/a", FileOperation::Read, "", "token-b", Some(100));
        let uri = format!("/files?path=/a&signature={}&signature_expiration=100", {
            signature.replace('+', "%2B").replace('/', "%2F")
        });
        let signed = SignedFileUrl::from_request(&request(Method::GET, &uri))
            .unwrap()
            .unwrap();
        let signers = vec![
            (id("a"), "token-a".to_owned()),
            (id("b"), "token-b".to_owned()),
        ];
        assert_eq!(signed.signer(&signers), Some(id("b")));
        assert_eq!(signed.signer(&signers[..1]), None);
        assert_eq!(signed.check_expiration(100), Ok(()));
        assert_eq!(signed.check_expiration(101), Err(SignatureError::Expired));
        // The same signature does not grant a write, another path or another user.
        for uri in [
            uri.replace("/files?path=/a", "/files?path=/b"),
            format!("{uri}&username=root"),
        ] {
            let other = SignedFileUrl::from_request(&request(Method::GET, &uri))
                .unwrap()
                .unwrap();
            assert_eq!(other.signer(&signers), None, "{uri}");
        }
        let write = SignedFileUrl::from_request(&request(Method::POST, &uri))
            .unwrap()
            .unwrap();
        assert_eq!(write.signer(&signers), None);
    }
}
