//! Phase 2 (issue 14): secrets injected as headers at egress, for plain HTTP and for
//! HTTPS terminated with the installation's CA; the real server is verified. Needs root.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use berth_egress::{Egress, EgressHandle, HeaderRule, InterceptionConfig, RefuseReason};
use common::*;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Setup {
    lab: Lab,
    policies: Arc<Policies>,
    secrets: Arc<Secrets>,
    egress: EgressHandle,
    berth_ca: CertificateDer<'static>,
    _ca_dir: TempDir,
}

fn fresh_secret() -> String {
    format!("sk-test-{:032x}", rand::random::<u128>())
}

async fn setup() -> Setup {
    let mut lab = Lab::new();
    lab.start_internet().await;
    let policies = Arc::new(Policies::default());
    let secrets = Arc::new(Secrets {
        sandbox: IpAddr::V4(lab.sandbox()),
        values: Mutex::new(HashMap::from([("TOKEN".to_string(), fresh_secret())])),
    });
    let ca_dir = TempDir(std::env::temp_dir().join(format!("berth-egress-test-ca-{}", lab.id)));
    let mut config = lab.config();
    config.interception = Some(InterceptionConfig {
        ca_dir: ca_dir.0.clone(),
        host_roots: false,
        extra_upstream_roots: vec![lab.test_ca.clone()],
        secrets: secrets.clone(),
    });
    let egress = Egress::start(config, policies.clone())
        .await
        .expect("egress starts");
    lab.redirect_to(&egress);
    let pem = egress
        .ca_cert_pem
        .clone()
        .expect("interception exports its CA");
    let berth_ca = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    Setup {
        lab,
        policies,
        secrets,
        egress,
        berth_ca,
        _ca_dir: ca_dir,
    }
}

impl Setup {
    fn secret(&self) -> String {
        self.secrets.values.lock().unwrap()["TOKEN"].clone()
    }
    fn allow_with_rule(&self, rule_domain: &str) {
        let rule = HeaderRule::new(
            rule_domain,
            [("Authorization", "Bearer ${e2b.secrets.TOKEN}")],
        )
        .unwrap();
        let policy = self.lab.policy_with(
            &[&format!("*.{DOMAIN}"), API],
            &["0.0.0.0/0"],
            vec![rule],
            self.lab.ceiling(),
        );
        self.policies.set(IpAddr::V4(self.lab.sandbox()), policy);
    }
    /// The authorization header each request to `path` arrived with upstream.
    fn upstream_auth(&self, path: &str) -> Vec<Option<String>> {
        self.lab
            .seen
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, p)| p == path)
            .map(|(_, h, _)| {
                h.iter()
                    .find(|(n, _)| n == "authorization")
                    .map(|(_, v)| v.clone())
            })
            .collect()
    }
}

/// Two pipelined requests on one keep-alive connection (a Content-Length body, then a
/// chunked one), and a last one that closes; returns every byte the sandbox received.
async fn pipelined<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
) -> String {
    let requests = format!(
        "POST /one HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer sandbox-guess\r\nContent-Length: 5\r\n\r\nhello\
         POST /two HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
         GET /three HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(requests.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut raw),
    )
    .await
    .expect("responses arrive")
    .unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test]
async fn secrets_are_injected_into_plain_http_and_never_reach_the_sandbox() {
    let s = setup().await;
    s.allow_with_rule(API);
    let secret = s.secret();
    let mut stream = s.lab.sandbox_connect(s.lab.denied_ip(), 80).await.unwrap();
    let seen_by_sandbox = pipelined(&mut stream, API).await;
    assert_eq!(
        seen_by_sandbox.matches("HTTP/1.1 200").count(),
        3,
        "{seen_by_sandbox}"
    );
    assert!(
        seen_by_sandbox.contains("path /one body 5")
            && seen_by_sandbox.contains("path /two body 3")
    );
    assert!(
        !seen_by_sandbox.contains(&secret),
        "the secret never reaches the sandbox"
    );
    let expected = Some(format!("Bearer {secret}"));
    for path in ["/one", "/two", "/three"] {
        assert_eq!(
            s.upstream_auth(path),
            std::slice::from_ref(&expected),
            "{path}"
        );
    }

    // A rotated secret applies to the next request.
    let rotated = fresh_secret();
    s.secrets
        .values
        .lock()
        .unwrap()
        .insert("TOKEN".into(), rotated.clone());
    let mut stream = s.lab.sandbox_connect(s.lab.api_ip(), 80).await.unwrap();
    assert_eq!(
        http_get(&mut stream, API, "/after-rotation")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        s.upstream_auth("/after-rotation"),
        [Some(format!("Bearer {rotated}"))]
    );

    // Another domain, even one under the same wildcard allow rule, gets no header.
    let mut stream = s.lab.sandbox_connect(s.lab.api_ip(), 80).await.unwrap();
    assert_eq!(
        http_get(&mut stream, "www.test-internet.example", "/other-domain")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(s.upstream_auth("/other-domain"), [None]);
    assert_eq!(s.egress.counters().requests_injected, 4);
}

#[tokio::test]
async fn secrets_are_injected_into_https_terminated_with_the_berth_ca() {
    let s = setup().await;
    s.allow_with_rule(API);
    let secret = s.secret();

    // The sandbox trusts only berth's CA: the proxy's leaf for the rule domain passes.
    let tcp = s.lab.sandbox_connect(s.lab.denied_ip(), 443).await.unwrap();
    let connector = berth_only_connector(&s.berth_ca);
    let mut tls = connector
        .connect(ServerName::try_from(API).unwrap(), tcp)
        .await
        .expect("berth CA leaf");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let seen_by_sandbox = pipelined(&mut tls, API).await;
    assert_eq!(
        seen_by_sandbox.matches("HTTP/1.1 200").count(),
        3,
        "{seen_by_sandbox}"
    );
    assert!(!seen_by_sandbox.contains(&secret));
    let expected = Some(format!("Bearer {secret}"));
    for path in ["/one", "/two", "/three"] {
        assert_eq!(
            s.upstream_auth(path),
            std::slice::from_ref(&expected),
            "{path}"
        );
    }
    for (local, _, _) in s.lab.seen.requests.lock().unwrap().iter() {
        assert_eq!(
            local.ip(),
            IpAddr::V4(s.lab.api_ip()),
            "dialed by name, never the original address"
        );
    }

    // Without a rule, TLS stays a blind splice: the real server's certificate arrives.
    let blind = s
        .lab
        .sandbox_https_get(s.lab.api_ip(), "www.test-internet.example", &[])
        .await
        .unwrap();
    assert_eq!(blind.status, 200);
    let tcp = s.lab.sandbox_connect(s.lab.api_ip(), 443).await.unwrap();
    let not_terminated = berth_only_connector(&s.berth_ca)
        .connect(
            ServerName::try_from("www.test-internet.example").unwrap(),
            tcp,
        )
        .await;
    assert!(
        not_terminated.is_err(),
        "a non-rule domain is never terminated"
    );
    assert_eq!(s.egress.counters().tls_terminated, 1);
}

#[tokio::test]
async fn an_untrusted_upstream_certificate_is_an_error_not_a_downgrade() {
    let s = setup().await;
    s.allow_with_rule("untrusted.test-internet.example");
    let tcp = s.lab.sandbox_connect(s.lab.api_ip(), 443).await.unwrap();
    let mut tls = berth_only_connector(&s.berth_ca)
        .connect(
            ServerName::try_from("untrusted.test-internet.example").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let response = http_get(&mut tls, "untrusted.test-internet.example", "/")
        .await
        .unwrap();
    assert_eq!(response.status, 502);
    assert_eq!(
        response.header("x-berth-egress-refused"),
        Some("upstream_tls_failed")
    );
    assert_eq!(
        s.lab.seen.connections_to(s.lab.untrusted_ip()),
        1,
        "the handshake was tried"
    );
    assert!(
        s.lab.seen.requests.lock().unwrap().is_empty(),
        "no request (and no secret) was sent to it"
    );
    assert_eq!(
        s.egress.counters().refused(RefuseReason::UpstreamTlsFailed),
        1
    );
}

#[tokio::test]
async fn a_missing_secret_refuses_the_request() {
    let s = setup().await;
    s.secrets.values.lock().unwrap().clear();
    s.allow_with_rule(API);
    let mut stream = s.lab.sandbox_connect(s.lab.api_ip(), 80).await.unwrap();
    let response = http_get(&mut stream, API, "/").await.unwrap();
    assert_eq!(response.status, 502);
    assert_eq!(
        response.header("x-berth-egress-refused"),
        Some("secret_unavailable")
    );
    assert!(s.lab.seen.requests.lock().unwrap().is_empty());
}

fn berth_only_connector(berth_ca: &CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(berth_ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}
