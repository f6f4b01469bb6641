//! API key shape, generation, hashing and masking.

use sha2::{Digest, Sha256};

/// Every key starts with this, as the official SDKs check (`^e2b_[0-9a-f]+$`).
pub const API_KEY_PREFIX: &str = "e2b_";

/// A fresh random key: `e2b_` + 40 lowercase hex digits (160 bits).
pub fn generate_api_key() -> String {
    let bytes: [u8; 20] = rand::random();
    let mut key = String::from(API_KEY_PREFIX);
    for byte in bytes {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// The stored form of a key: lowercase hex sha256 of the raw key.
pub fn hash_api_key(raw: &str) -> String {
    let digest = Sha256::digest(raw.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// What can be shown of a key without revealing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMask {
    /// Length of the hex part (after the prefix).
    pub value_length: u32,
    /// First characters of the hex part.
    pub masked_prefix: String,
    /// Last characters of the hex part.
    pub masked_suffix: String,
}

impl KeyMask {
    /// Mask of a raw key: its first two and last four hex digits.
    pub fn of(raw: &str) -> Self {
        let hex = raw.strip_prefix(API_KEY_PREFIX).unwrap_or(raw);
        let chars: Vec<char> = hex.chars().collect();
        let prefix: String = chars.iter().take(2).collect();
        let suffix: String = chars[chars.len().saturating_sub(4)..].iter().collect();
        KeyMask {
            value_length: chars.len() as u32,
            masked_prefix: prefix,
            masked_suffix: suffix,
        }
    }

    /// Human form, e.g. `e2b_ab…1234`.
    pub fn display(&self) -> String {
        format!(
            "{API_KEY_PREFIX}{}…{}",
            self.masked_prefix, self.masked_suffix
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_sdk_shape_and_differ() {
        let a = generate_api_key();
        let b = generate_api_key();
        assert_ne!(a, b);
        let hex = a.strip_prefix("e2b_").unwrap();
        assert_eq!(hex.len(), 40);
        assert!(hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    }

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(
            hash_api_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn mask_keeps_only_the_ends() {
        let mask = KeyMask::of("e2b_0123456789abcdef");
        assert_eq!(mask.value_length, 16);
        assert_eq!(mask.masked_prefix, "01");
        assert_eq!(mask.masked_suffix, "cdef");
        assert_eq!(mask.display(), "e2b_01…cdef");
    }
}
