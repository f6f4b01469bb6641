//! Reading the name a client asks for from its first bytes, without consuming them:
//! the HTTP Host of a request head, or the SNI of a TLS ClientHello. The caller keeps
//! the bytes and replays them upstream (or into its TLS acceptor).

use crate::policy::normalize_hostname;

/// What a prefix of a client's first bytes says.
#[derive(Debug, PartialEq, Eq)]
pub enum Sniff {
    /// More bytes are needed.
    Incomplete,
    /// Complete; the normalized host name it names, if any.
    Host(Option<String>),
    /// These bytes are not the protocol expected.
    Malformed,
}

/// Host of an HTTP/1.x request head: the authority of an absolute-form target (which
/// RFC 9112 says wins over the header), else the `Host` header; port dropped.
pub fn http_host(buf: &[u8]) -> Sniff {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buf) {
        Ok(httparse::Status::Partial) => Sniff::Incomplete,
        Err(_) => Sniff::Malformed,
        Ok(httparse::Status::Complete(_)) => {
            let from_target = request.path.and_then(absolute_form_authority);
            let from_header = || {
                request
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("host"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
            };
            let authority = from_target.or_else(from_header);
            Sniff::Host(authority.and_then(|a| normalize_hostname(strip_port(a.trim()))))
        }
    }
}

fn absolute_form_authority(target: &str) -> Option<&str> {
    let (scheme, rest) = target.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}

fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority;
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;
/// RFC 8446 §5.1: a plaintext record carries at most 2^14 bytes.
const MAX_RECORD: usize = 1 << 14;

/// SNI of a TLS ClientHello, reassembled across handshake records.
pub fn tls_sni(buf: &[u8]) -> Sniff {
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            return Sniff::Incomplete;
        }
        let length = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if rest[0] != RECORD_HANDSHAKE || rest[1] != 3 || length == 0 || length > MAX_RECORD {
            return Sniff::Malformed;
        }
        let Some(fragment) = rest.get(5..5 + length) else {
            return Sniff::Incomplete;
        };
        handshake.extend_from_slice(fragment);
        rest = &rest[5 + length..];
        if handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Sniff::Malformed;
            }
            let body_len =
                u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize;
            if handshake.len() >= 4 + body_len {
                return match client_hello_sni(&handshake[4..4 + body_len]) {
                    Some(sni) => Sniff::Host(sni),
                    None => Sniff::Malformed,
                };
            }
        }
    }
}

/// A cursor over big-endian TLS structures; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// `None`: malformed. `Some(None)`: well-formed, no (usable) host name.
fn client_hello_sni(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        return Some(None); // no extensions at all (TLS 1.2 allows it)
    }
    let mut extensions = Reader(r.vec16()?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        let mut list = Reader(Reader(data).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == NAME_TYPE_HOST {
                return Some(std::str::from_utf8(name).ok().and_then(normalize_hostname));
            }
        }
        return Some(None);
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_host_from_header_and_absolute_target() {
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: API.Test:8080\r\n\r\n"),
            Sniff::Host(Some("api.test".into()))
        );
        assert_eq!(
            http_host(b"GET http://abs.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n"),
            Sniff::Host(Some("abs.test".into()))
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: 198.18.0.1\r\n\r\n"),
            Sniff::Host(None)
        );
        assert_eq!(http_host(b"GET / HTTP/1.1\r\n\r\n"), Sniff::Host(None));
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.test\r\n"),
            Sniff::Incomplete
        );
        assert_eq!(http_host(b"\x16\x03\x01\x00\x05hello"), Sniff::Malformed);
    }

    /// A ClientHello produced by rustls itself, so the parser meets real bytes.
    fn real_client_hello(name: &str) -> Vec<u8> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn =
            rustls::ClientConnection::new(std::sync::Arc::new(config), server_name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn sni_from_a_real_client_hello_and_every_prefix_is_incomplete() {
        let hello = real_client_hello("Api.Test-Internet.Example");
        assert_eq!(
            tls_sni(&hello),
            Sniff::Host(Some("api.test-internet.example".into()))
        );
        for cut in 0..hello.len() {
            assert_eq!(
                tls_sni(&hello[..cut]),
                Sniff::Incomplete,
                "prefix of {cut} bytes"
            );
        }
    }

    #[test]
    fn sni_reassembled_across_records() {
        let hello = real_client_hello("split.test");
        let body = &hello[5..];
        let (a, b) = body.split_at(body.len() / 2);
        let mut split = Vec::new();
        for part in [a, b] {
            split.extend_from_slice(&[22, 3, 1]);
            split.extend_from_slice(&(part.len() as u16).to_be_bytes());
            split.extend_from_slice(part);
        }
        assert_eq!(tls_sni(&split), Sniff::Host(Some("split.test".into())));
    }

    #[test]
    fn sni_rejects_garbage_without_panicking() {
        assert_eq!(tls_sni(b"GET / HTTP/1.1\r\n"), Sniff::Malformed);
        let mut hello = real_client_hello("x.test");
        // Claim a longer extensions block than there is: malformed, not a panic.
        let len = hello.len();
        hello[len - 3] = 0xff;
        let _ = tls_sni(&hello);
        for byte in 0..=255u8 {
            let mut h = real_client_hello("y.test");
            h[60] = byte;
            let _ = tls_sni(&h);
        }
    }
}
