//! The node token: the cluster's shared secret. API instances send it on every request
//! to a node (`x-berth-node-token`); a node answers nothing but `/health` without it.
//! Compared in constant time; never logged (its `Debug` is redacted).
//!
//! The token file holds one token per line: the first is the one sent, every one is
//! admitted. Rotation without downtime: add the new token as a second line on every
//! node, then make it the first line on every API instance, then remove the old one.

use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

/// Header carrying the token on API → node requests.
pub const NODE_TOKEN_HEADER: &str = "x-berth-node-token";

/// Fewer bytes than this cannot be a secret worth the name.
const MIN_TOKEN_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("reading the node token {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no node token (one per line; make one with `openssl rand -hex 32`)")]
    Empty { path: PathBuf },
    #[error("line {line} of {path} has {found} bytes; a node token needs at least {MIN_TOKEN_BYTES} (e.g. `openssl rand -hex 32`)")]
    TooShort {
        path: PathBuf,
        line: usize,
        found: usize,
    },
    #[error("line {line} of {path} is not one printable ASCII word (a node token travels in an HTTP header)")]
    NotPrintable { path: PathBuf, line: usize },
}

/// The cluster's shared secret: the token sent, and every token admitted.
#[derive(Clone)]
pub struct NodeToken {
    sent: String,
    admitted: Vec<String>,
}

impl std::fmt::Debug for NodeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeToken(<redacted>)")
    }
}

impl NodeToken {
    /// The tokens in `path`, one per line (blank lines and surrounding whitespace
    /// ignored, so `echo` and editors are fine).
    pub fn read(path: &Path) -> Result<NodeToken, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut admitted = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() {
                continue;
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TokenError::NotPrintable {
                    path: path.to_path_buf(),
                    line: index + 1,
                });
            }
            if token.len() < MIN_TOKEN_BYTES {
                return Err(TokenError::TooShort {
                    path: path.to_path_buf(),
                    line: index + 1,
                    found: token.len(),
                });
            }
            admitted.push(token.to_owned());
        }
        let sent = admitted.first().cloned().ok_or_else(|| TokenError::Empty {
            path: path.to_path_buf(),
        })?;
        Ok(NodeToken { sent, admitted })
    }

    /// The value to send in [`NODE_TOKEN_HEADER`].
    pub fn header_value(&self) -> http::HeaderValue {
        let mut value =
            http::HeaderValue::from_str(&self.sent).expect("checked printable ASCII when read");
        value.set_sensitive(true);
        value
    }

    /// A token of 40 copies of `fill` (tests of this crate: no file to race on).
    #[cfg(test)]
    pub(crate) fn repeated(fill: char) -> NodeToken {
        let token = fill.to_string().repeat(40);
        NodeToken {
            sent: token.clone(),
            admitted: vec![token],
        }
    }

    /// Whether `headers` carry one of the admitted tokens. Every candidate is compared,
    /// each in constant time, so timing does not tell which one (if any) matched.
    pub fn admits(&self, headers: &http::HeaderMap) -> bool {
        let Some(presented) = headers.get(NODE_TOKEN_HEADER) else {
            return false;
        };
        self.admitted
            .iter()
            .fold(subtle::Choice::from(0), |matched, token| {
                matched | presented.as_bytes().ct_eq(token.as_bytes())
            })
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_trimmed_and_checked() {
        let dir = std::env::temp_dir().join(format!("berth-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, format!("{}\n", "a".repeat(64))).unwrap();
        let token = NodeToken::read(&good).unwrap();
        assert_eq!(format!("{token:?}"), "NodeToken(<redacted>)");
        let mut headers = http::HeaderMap::new();
        assert!(!token.admits(&headers));
        headers.insert(NODE_TOKEN_HEADER, token.header_value());
        assert!(token.admits(&headers));
        headers.insert(NODE_TOKEN_HEADER, "a".repeat(63).parse().unwrap());
        assert!(!token.admits(&headers));

        let short = dir.join("short");
        std::fs::write(&short, "abc").unwrap();
        assert!(matches!(
            NodeToken::read(&short),
            Err(TokenError::TooShort { found: 3, .. })
        ));
        let spaced = dir.join("spaced");
        std::fs::write(&spaced, format!("{} {}", "a".repeat(20), "b".repeat(20))).unwrap();
        assert!(matches!(
            NodeToken::read(&spaced),
            Err(TokenError::NotPrintable { line: 1, .. })
        ));
        let blank = dir.join("blank");
        std::fs::write(&blank, "\n  \n").unwrap();
        assert!(matches!(
            NodeToken::read(&blank),
            Err(TokenError::Empty { .. })
        ));

        // Rotation: the first line is sent, every line is admitted.
        let rotating = dir.join("rotating");
        std::fs::write(
            &rotating,
            format!("{}\n\n{}\n", "n".repeat(40), "o".repeat(40)),
        )
        .unwrap();
        let token = NodeToken::read(&rotating).unwrap();
        assert_eq!(token.header_value(), "n".repeat(40).as_str());
        for admitted in ["n".repeat(40), "o".repeat(40)] {
            headers.insert(NODE_TOKEN_HEADER, admitted.parse().unwrap());
            assert!(token.admits(&headers));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
