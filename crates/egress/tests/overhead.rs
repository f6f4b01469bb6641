//! Per-request overhead of the egress proxy against direct requests to the same test
//! host. A measurement, not a test of times: run it on purpose, in release mode:
//!
//! `cargo test --release -p berth-egress --test overhead -- --ignored --nocapture`
//!
//! "direct" is the host's own netns dialing the test host (one veth hop); "proxied" is
//! the sandbox netns going through the nft redirect and the proxy, which dials the same
//! test host from the host netns (one more veth hop plus userland).

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_egress::{Egress, EgressPolicy, HeaderRule, InterceptionConfig};
use common::*;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const NEW_CONNECTIONS: usize = 300;
const KEEP_ALIVE: usize = 1000;

fn report(label: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let (p50, p99) = (pick(0.50), pick(0.99));
    println!(
        "{label:<58} n={:<5} p50 {:>7.1} µs  p99 {:>7.1} µs",
        samples.len(),
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
    p50
}

/// Sends one keep-alive GET and reads its response (the test servers always send a
/// Content-Length).
async fn keep_alive_get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    buf: &mut Vec<u8>,
) {
    stream
        .write_all(format!("GET /k HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    buf.clear();
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed mid-response");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(response) = parse_response(buf) {
            let length: usize = response.header("content-length").unwrap().parse().unwrap();
            if response.body.len() >= length {
                assert_eq!(response.status, 200);
                return;
            }
        }
    }
}

fn connector(roots: &[CertificateDer<'static>]) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run with --release --ignored --nocapture"]
async fn measure_proxy_overhead() {
    let mut lab = Lab::new();
    lab.start_internet().await;
    let policies = Arc::new(Policies::default());
    let sandbox = IpAddr::V4(lab.sandbox());
    let secrets = Arc::new(Secrets {
        sandbox,
        values: Mutex::new(HashMap::from([(
            "TOKEN".to_string(),
            "sk-measure".to_string(),
        )])),
    });
    let ca_dir = TempDir(std::env::temp_dir().join(format!("berth-egress-measure-ca-{}", lab.id)));
    let mut config = lab.config();
    config.interception = Some(InterceptionConfig {
        ca_dir: ca_dir.0.clone(),
        host_roots: false,
        extra_upstream_roots: vec![lab.test_ca.clone()],
        secrets,
    });
    let egress = Egress::start(config, policies.clone()).await.unwrap();
    lab.redirect_to(&egress);
    let berth_ca: CertificateDer<'static> = rustls::pki_types::pem::PemObject::from_pem_slice(
        egress.ca_cert_pem.as_ref().unwrap().as_bytes(),
    )
    .unwrap();
    let rule = HeaderRule::new(API, [("Authorization", "Bearer ${e2b.secrets.TOKEN}")]).unwrap();
    let domains = lab.policy_with(
        &[&format!("*.{DOMAIN}"), API],
        &["0.0.0.0/0"],
        vec![rule],
        lab.ceiling(),
    );
    let open = EgressPolicy::open(Arc::new(lab.ceiling()));
    let api = lab.api_ip();
    let www = "www.test-internet.example";
    let test_ca = lab.test_ca.clone();
    let lab_ref = &lab;

    println!("\n-- new connection per request (connect + request + response + close) --");
    let http_new = move |direct: bool, host: &'static str| async move {
        let mut samples = Vec::new();
        for _ in 0..NEW_CONNECTIONS {
            let start = Instant::now();
            let mut stream = if direct {
                TcpStream::connect((api, 80)).await.unwrap()
            } else {
                lab_ref.sandbox_connect(api, 80).await.unwrap()
            };
            let response = http_get(&mut stream, host, "/").await.unwrap();
            assert_eq!(response.status, 200);
            samples.push(start.elapsed());
        }
        samples
    };
    let direct_http = report(
        "HTTP direct (host netns -> test host)",
        http_new(true, www).await,
    );
    policies.set(sandbox, open.clone());
    let cidr = report(
        "HTTP proxied, address allowed (no sniff)",
        http_new(false, www).await,
    );
    policies.set(sandbox, domains.clone());
    let by_name = report(
        "HTTP proxied, domain rule (sniff + DNS + dial name)",
        http_new(false, www).await,
    );
    let injected = report(
        "HTTP proxied, header rule (sniff + DNS + inject)",
        http_new(false, API).await,
    );

    let tls_new = move |direct: bool, name: &'static str, roots: Vec<CertificateDer<'static>>| {
        let connector = connector(&roots);
        async move {
            let mut samples = Vec::new();
            let mut sockets = lab_ref.sandbox_sockets(NEW_CONNECTIONS);
            for _ in 0..NEW_CONNECTIONS {
                let socket = sockets.pop().unwrap();
                let start = Instant::now();
                let tcp = if direct {
                    TcpStream::connect((api, 443)).await.unwrap()
                } else {
                    socket.connect((api, 443).into()).await.unwrap()
                };
                let mut tls = connector
                    .connect(ServerName::try_from(name).unwrap(), tcp)
                    .await
                    .unwrap();
                let response = http_get(&mut tls, name, "/").await.unwrap();
                assert_eq!(response.status, 200);
                samples.push(start.elapsed());
            }
            samples
        }
    };
    let direct_tls = report(
        "HTTPS direct (host netns -> test host)",
        tls_new(true, www, vec![test_ca.clone()]).await,
    );
    let tls_splice = report(
        "HTTPS proxied, domain rule (SNI sniff + DNS + splice)",
        tls_new(false, www, vec![test_ca.clone()]).await,
    );
    let tls_inject = report(
        "HTTPS proxied, header rule (terminate + inject + re-encrypt)",
        tls_new(false, API, vec![berth_ca.clone()]).await,
    );

    println!("\n-- requests on one kept-alive connection --");
    let mut buf = Vec::new();
    let keep = |label: &'static str| (label, Vec::with_capacity(KEEP_ALIVE));
    let (l, mut s) = keep("HTTP direct");
    let mut stream = TcpStream::connect((api, 80)).await.unwrap();
    stream.set_nodelay(true).unwrap();
    for _ in 0..KEEP_ALIVE {
        let t = Instant::now();
        keep_alive_get(&mut stream, www, &mut buf).await;
        s.push(t.elapsed());
    }
    let ka_direct = report(l, s);
    let (l, mut s) = keep("HTTP proxied splice");
    let mut stream = lab_ref.sandbox_connect(api, 80).await.unwrap();
    stream.set_nodelay(true).unwrap();
    for _ in 0..KEEP_ALIVE {
        let t = Instant::now();
        keep_alive_get(&mut stream, www, &mut buf).await;
        s.push(t.elapsed());
    }
    let ka_splice = report(l, s);
    let (l, mut s) = keep("HTTP proxied injection");
    let mut stream = lab_ref.sandbox_connect(api, 80).await.unwrap();
    stream.set_nodelay(true).unwrap();
    for _ in 0..KEEP_ALIVE {
        let t = Instant::now();
        keep_alive_get(&mut stream, API, &mut buf).await;
        s.push(t.elapsed());
    }
    let ka_inject = report(l, s);
    let tls_keep = move |direct: bool, name: &'static str, roots: Vec<CertificateDer<'static>>| {
        let connector = connector(&roots);
        async move {
            let tcp = if direct {
                TcpStream::connect((api, 443)).await.unwrap()
            } else {
                lab_ref.sandbox_connect(api, 443).await.unwrap()
            };
            tcp.set_nodelay(true).unwrap();
            let mut tls = connector
                .connect(ServerName::try_from(name).unwrap(), tcp)
                .await
                .unwrap();
            let mut buf = Vec::new();
            let mut samples = Vec::new();
            for _ in 0..KEEP_ALIVE {
                let t = Instant::now();
                keep_alive_get(&mut tls, name, &mut buf).await;
                samples.push(t.elapsed());
            }
            samples
        }
    };
    let ka_tls_direct = report(
        "HTTPS direct",
        tls_keep(true, www, vec![test_ca.clone()]).await,
    );
    let ka_tls_splice = report(
        "HTTPS proxied splice",
        tls_keep(false, www, vec![test_ca.clone()]).await,
    );
    let ka_tls_inject = report(
        "HTTPS proxied terminate + inject",
        tls_keep(false, API, vec![berth_ca]).await,
    );

    let over = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e6;
    println!("\n-- p50 overhead vs direct --");
    println!("new connection: HTTP address-allowed +{:.0} µs, HTTP by name +{:.0} µs, HTTP inject +{:.0} µs", over(cidr, direct_http), over(by_name, direct_http), over(injected, direct_http));
    println!(
        "new connection: HTTPS splice +{:.0} µs, HTTPS terminate+inject +{:.0} µs",
        over(tls_splice, direct_tls),
        over(tls_inject, direct_tls)
    );
    println!("kept-alive:     HTTP splice +{:.0} µs, HTTP inject +{:.0} µs, HTTPS splice +{:.0} µs, HTTPS inject +{:.0} µs",
        over(ka_splice, ka_direct), over(ka_inject, ka_direct), over(ka_tls_splice, ka_tls_direct), over(ka_tls_inject, ka_tls_direct));
    let counters = egress.counters();
    println!("counters: {counters:?}");
    assert_eq!(
        lab.seen.connections_to(Ipv4Addr::new(198, 18, lab.x, 20)),
        0
    );
    drop(ca_dir);
}
