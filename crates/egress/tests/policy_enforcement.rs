//! Phase 1 (issue 11): domain policy enforced by the egress proxy and DNS server, driven
//! from a sandbox netns through real nft redirects (so SO_ORIGINAL_DST is real) against
//! a test internet in its own netns. Needs root.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use berth_egress::{Egress, EgressConfig, EgressHandle, EgressPolicy, RefuseReason};
use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn setup_with(adjust: impl FnOnce(&mut EgressConfig)) -> (Lab, Arc<Policies>, EgressHandle) {
    let mut lab = Lab::new();
    lab.start_internet().await;
    let policies = Arc::new(Policies::default());
    let mut config = lab.config();
    adjust(&mut config);
    let egress = Egress::start(config, policies.clone())
        .await
        .expect("egress starts");
    lab.redirect_to(&egress);
    (lab, policies, egress)
}

async fn setup() -> (Lab, Arc<Policies>, EgressHandle) {
    setup_with(|_| {}).await
}

fn sandbox(lab: &Lab) -> IpAddr {
    IpAddr::V4(lab.sandbox())
}

async fn get(lab: &Lab, ip: std::net::Ipv4Addr, host: &str) -> Response {
    let mut stream = lab
        .sandbox_connect(ip, 80)
        .await
        .expect("connect from sandbox");
    http_get(&mut stream, host, "/")
        .await
        .expect("an HTTP response")
}

#[tokio::test]
async fn allowed_domain_by_host_and_forged_host_dials_the_name() {
    let (lab, policies, egress) = setup().await;
    policies.set(sandbox(&lab), lab.policy(&[API], &["0.0.0.0/0"]));

    // The sandbox aims at the denied host but names the allowed domain: the proxy
    // dials the name, so the request lands on the domain's real address.
    let forged = get(&lab, lab.denied_ip(), API).await;
    assert_eq!(forged.status, 200, "{}", forged.body);
    assert_eq!(served_by(&forged), Some(IpAddr::V4(lab.api_ip())));
    assert_eq!(
        lab.seen.connections_to(lab.denied_ip()),
        0,
        "the denied address is never dialed"
    );

    let other = get(&lab, lab.api_ip(), "other.example").await;
    assert_eq!(other.status, 403);
    assert_eq!(
        other.header("x-berth-egress-refused"),
        Some("domain_not_allowed")
    );
    assert!(other.body.starts_with("berth egress: "), "{}", other.body);

    // An IP literal in Host is no name: the address itself decides, and it is denied.
    let literal = get(&lab, lab.api_ip(), &lab.api_ip().to_string()).await;
    assert_eq!(literal.status, 403);
    assert_eq!(
        literal.header("x-berth-egress-refused"),
        Some("no_hostname")
    );

    let counters = egress.counters();
    assert_eq!(counters.http_allowed, 1);
    assert_eq!(counters.refused(RefuseReason::DomainNotAllowed), 1);
    assert_eq!(counters.refused(RefuseReason::NoHostname), 1);
    assert!(counters.bytes_to_sandbox > 0 && counters.bytes_to_upstream > 0);
}

#[tokio::test]
async fn allowed_domain_by_sni_with_wildcards() {
    let (lab, policies, egress) = setup().await;
    policies.set(
        sandbox(&lab),
        lab.policy(&[&format!("*.{DOMAIN}")], &["0.0.0.0/0"]),
    );

    for name in ["www.test-internet.example", "Www2.Test-Internet.Example"] {
        let response = lab
            .sandbox_https_get(lab.denied_ip(), name, &[])
            .await
            .expect("TLS through the proxy");
        assert_eq!(response.status, 200);
        assert_eq!(
            served_by(&response),
            Some(IpAddr::V4(lab.api_ip())),
            "{name} dialed by name"
        );
    }
    // The wildcard does not cover the apex (as in E2B), nor another domain.
    for name in [DOMAIN, "other.example"] {
        let refused = lab.sandbox_https_get(lab.denied_ip(), name, &[]).await;
        assert!(
            refused.is_err(),
            "{name} must be refused, got {:?}",
            refused.map(|r| r.status)
        );
    }
    let deep = get(&lab, lab.denied_ip(), "deep.sub.test-internet.example.").await;
    assert_eq!(
        served_by(&deep),
        Some(IpAddr::V4(lab.api_ip())),
        "any depth, trailing dot ignored"
    );
    assert_eq!(lab.seen.connections_to(lab.denied_ip()), 0);
    let counters = egress.counters();
    assert_eq!(counters.tls_allowed, 2);
    assert_eq!(counters.refused(RefuseReason::DomainNotAllowed), 2);
}

#[tokio::test]
async fn names_resolving_to_denied_addresses_are_refused() {
    let (lab, policies, egress) = setup().await;
    let denied_host = format!("{}/32", lab.denied_ip()).parse().unwrap();
    let ceiling = lab.ceiling().deny([denied_host]);
    policies.set(
        sandbox(&lab),
        lab.policy_with(
            &[&format!("*.{DOMAIN}")],
            &["0.0.0.0/0"],
            Vec::new(),
            ceiling,
        ),
    );

    // private.* resolves to 127.0.0.1 (built-in denied), denied.* to an operator-denied
    // test host: neither is dialed.
    for name in [
        "private.test-internet.example",
        "denied.test-internet.example",
    ] {
        let response = get(&lab, lab.api_ip(), name).await;
        assert_eq!(response.status, 403, "{name}");
        assert_eq!(
            response.header("x-berth-egress-refused"),
            Some("resolved_address_denied")
        );
    }
    assert_eq!(lab.seen.connections_to(lab.denied_ip()), 0);
    // A name with one denied and one allowed address dials only the allowed one.
    let mixed = get(&lab, lab.denied_ip(), "mixed.test-internet.example").await;
    assert_eq!(served_by(&mixed), Some(IpAddr::V4(lab.api_ip())));
    assert_eq!(
        egress
            .counters()
            .refused(RefuseReason::ResolvedAddressDenied),
        2
    );
}

#[tokio::test]
async fn cidr_policies_and_unrestricted_forwarding() {
    let (lab, policies, egress) = setup().await;
    policies.set(sandbox(&lab), EgressPolicy::open(Arc::new(lab.ceiling())));
    let open = get(&lab, lab.denied_ip(), "anything.example").await;
    assert_eq!(
        served_by(&open),
        Some(IpAddr::V4(lab.denied_ip())),
        "unrestricted: the original address"
    );

    policies.set(
        sandbox(&lab),
        lab.policy(&[&lab.api_ip().to_string()], &["0.0.0.0/0"]),
    );
    let allowed = get(&lab, lab.api_ip(), "whatever.example").await;
    assert_eq!(served_by(&allowed), Some(IpAddr::V4(lab.api_ip())));
    let denied = get(&lab, lab.denied_ip(), API).await;
    assert_eq!(denied.status, 403);
    assert_eq!(
        denied.header("x-berth-egress-refused"),
        Some("destination_denied")
    );

    // Deny one address, allow the rest.
    policies.set(
        sandbox(&lab),
        lab.policy(&[], &[&lab.denied_ip().to_string()]),
    );
    assert_eq!(get(&lab, lab.api_ip(), "x.example").await.status, 200);
    assert_eq!(get(&lab, lab.denied_ip(), "x.example").await.status, 403);

    // The operator ceiling wins over an unrestricted sandbox.
    let ceiling = lab
        .ceiling()
        .deny([format!("{}/32", lab.denied_ip()).parse().unwrap()]);
    policies.set(sandbox(&lab), EgressPolicy::open(Arc::new(ceiling)));
    assert_eq!(get(&lab, lab.denied_ip(), "x.example").await.status, 403);
    assert_eq!(egress.counters().http_allowed, 3);
}

#[tokio::test]
async fn no_internet_and_unknown_sandboxes_get_nothing() {
    let (lab, policies, egress) = setup().await;
    let off = EgressPolicy {
        internet: false,
        ..EgressPolicy::open(Arc::new(lab.ceiling()))
    };
    policies.set(sandbox(&lab), off);
    let response = get(&lab, lab.api_ip(), API).await;
    assert_eq!(
        response.header("x-berth-egress-refused"),
        Some("no_internet")
    );
    let answer = lab
        .sandbox_dns(API, RecordType::A)
        .await
        .expect("a DNS answer");
    assert_eq!(answer.metadata.response_code, ResponseCode::Refused);
    assert!(!lab.seen.dns_asked(API), "no query leaves the host");

    let unknown = IpAddr::V4(lab.sandbox());
    policies.remove(unknown);
    let answer = lab
        .sandbox_dns(API, RecordType::A)
        .await
        .expect("a DNS answer");
    assert_eq!(answer.metadata.response_code, ResponseCode::Refused);
    let mut stream = lab.sandbox_connect(lab.api_ip(), 80).await.unwrap();
    let refused = http_get(&mut stream, API, "/").await.unwrap();
    assert_eq!(
        refused.header("x-berth-egress-refused"),
        Some("unknown_source")
    );
    assert_eq!(lab.seen.connections_to(lab.api_ip()), 0);
    assert_eq!(egress.counters().refused(RefuseReason::UnknownSource), 1);
    assert_eq!(egress.counters().dns_refused, 2);
}

#[tokio::test]
async fn dns_forwards_only_what_the_policy_could_allow() {
    let (lab, policies, egress) = setup().await;
    policies.set(
        sandbox(&lab),
        lab.policy(&[API, &format!("*.cdn.{DOMAIN}")], &["0.0.0.0/0"]),
    );
    let allowed = lab.sandbox_dns(API, RecordType::A).await.unwrap();
    assert_eq!(allowed.metadata.response_code, ResponseCode::NoError);
    assert_eq!(a_records(&allowed), [lab.api_ip()]);
    let wildcard = lab
        .sandbox_dns("x.cdn.test-internet.example", RecordType::A)
        .await
        .unwrap();
    assert_eq!(a_records(&wildcard), [lab.api_ip()]);
    for blocked in [
        "c2VjcmV0.exfil.test-internet.example",
        "other.example",
        "cdn.test-internet.example",
    ] {
        let answer = lab.sandbox_dns(blocked, RecordType::A).await.unwrap();
        assert_eq!(
            answer.metadata.response_code,
            ResponseCode::NXDomain,
            "{blocked}"
        );
        assert!(
            !lab.seen.dns_asked(blocked),
            "{blocked} never reaches upstream"
        );
    }

    // TCP DNS, through the redirect of tcp/53.
    let mut tcp = lab.sandbox_connect(lab.gateway(), 53).await.unwrap();
    let mut query = hickory_proto::op::Message::query();
    query.add_query(hickory_proto::op::Query::query(
        hickory_proto::rr::Name::from_ascii(format!("{API}.")).unwrap(),
        RecordType::A,
    ));
    let bytes = query.to_vec().unwrap();
    tcp.write_all(&(bytes.len() as u16).to_be_bytes())
        .await
        .unwrap();
    tcp.write_all(&bytes).await.unwrap();
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).await.unwrap();
    let mut answer = vec![0u8; u16::from_be_bytes(len) as usize];
    tcp.read_exact(&mut answer).await.unwrap();
    let answer = hickory_proto::op::Message::from_vec(&answer).unwrap();
    assert_eq!(a_records(&answer), [lab.api_ip()]);

    // Unrestricted: everything is forwarded, NXDOMAIN from upstream passes through.
    policies.set(sandbox(&lab), EgressPolicy::open(Arc::new(lab.ceiling())));
    let other = lab
        .sandbox_dns("other.example", RecordType::A)
        .await
        .unwrap();
    assert_eq!(a_records(&other), [lab.api_ip()]);
    let missing = lab
        .sandbox_dns("no-such-name.invalid", RecordType::A)
        .await
        .unwrap();
    assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
    assert!(lab.seen.dns_asked("no-such-name.invalid"));
    let counters = egress.counters();
    assert_eq!(counters.dns_blocked, 3);
    assert_eq!(counters.dns_forwarded, 5);
}

#[tokio::test]
async fn policy_updates_cut_live_connections() {
    let (lab, policies, egress) = setup().await;
    policies.set(sandbox(&lab), lab.policy(&[API], &["0.0.0.0/0"]));
    let mut stream = lab.sandbox_connect(lab.denied_ip(), 80).await.unwrap();
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {API}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    policies.set(sandbox(&lab), lab.policy(&[], &["0.0.0.0/0"]));
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the keep-alive connection is cut: {closed:?}"
    );
    assert_eq!(egress.counters().refused(RefuseReason::PolicyChanged), 1);
}

#[tokio::test]
async fn connections_per_sandbox_are_limited_and_sniffing_is_bounded() {
    let (lab, policies, egress) = setup_with(|c| {
        c.max_connections_per_sandbox = 2;
        c.sniff_timeout = Duration::from_millis(800);
    })
    .await;
    policies.set(sandbox(&lab), lab.policy(&[API], &["0.0.0.0/0"]));
    // Two connections that never finish their request head hold both slots.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = lab.sandbox_connect(lab.api_ip(), 80).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = get(&lab, lab.api_ip(), API).await;
    assert_eq!(third.status, 429);
    // The slow ones are closed once the sniff timeout passes, freeing the slots.
    for mut s in held {
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&buf).contains("sniff_failed"));
    }
    assert_eq!(get(&lab, lab.api_ip(), API).await.status, 200);
    // An oversized head is refused, not buffered without bound.
    let mut big = lab.sandbox_connect(lab.api_ip(), 80).await.unwrap();
    let padding = "x".repeat(20 * 1024);
    let _ = big
        .write_all(format!("GET / HTTP/1.1\r\nX-Pad: {padding}\r\nHost: {API}\r\n\r\n").as_bytes())
        .await;
    let mut buf = Vec::new();
    let _ = big.read_to_end(&mut buf).await;
    assert!(String::from_utf8_lossy(&buf).contains("bad_request"));
    let counters = egress.counters();
    assert_eq!(counters.refused(RefuseReason::TooManyConnections), 1);
    assert_eq!(counters.refused(RefuseReason::SniffFailed), 2);
}

#[tokio::test]
async fn a_connection_that_was_not_redirected_is_not_looped() {
    let (lab, policies, egress) = setup().await;
    policies.set(sandbox(&lab), EgressPolicy::open(Arc::new(lab.ceiling())));
    // Straight to the proxy's own port: its original destination is the proxy itself.
    let mut stream = lab
        .sandbox_connect(lab.gateway(), egress.http_addr.port())
        .await
        .unwrap();
    let response = http_get(&mut stream, API, "/").await.unwrap();
    assert_eq!(response.header("x-berth-egress-refused"), Some("loop"));
}

#[tokio::test]
async fn shutdown_stops_every_listener() {
    let (lab, policies, egress) = setup().await;
    policies.set(sandbox(&lab), EgressPolicy::open(Arc::new(lab.ceiling())));
    assert_eq!(get(&lab, lab.api_ip(), API).await.status, 200);
    let (http, dns) = (egress.http_addr, egress.dns_addr);
    tokio::time::timeout(
        Duration::from_secs(5),
        egress.shutdown(Duration::from_secs(1)),
    )
    .await
    .expect("shutdown finishes");
    assert!(tokio::net::TcpStream::connect(http).await.is_err());
    assert!(
        tokio::net::TcpStream::connect(SocketAddr::new(dns.ip(), dns.port()))
            .await
            .is_err()
    );
}
