//! A test "internet" and a test "sandbox", each in its own network namespace, with the
//! egress services running on the host side between them.
//!
//! Layout (X picked per lab so parallel labs never share addresses):
//! - internet netns: 198.18.X.10 (the `*.test-internet.example` web host), .20 (a host
//!   the sandbox's policy denies), .30 (a web host with an untrusted certificate), .53
//!   (the authoritative DNS for the test names); host side 198.18.X.1.
//! - sandbox netns: 198.19.X.2, default route via the gateway 198.19.X.1 (host side).
//! - an nft table redirecting the sandbox's TCP 80/443 and DNS to the egress ports, and
//!   dropping anything the host would forward from the sandbox link.
//!
//! Every netns, link and table is removed by [`Lab`]'s Drop. Traffic goes only to these
//! addresses and loopback.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_egress::{
    Ceiling, EgressConfig, EgressHandle, EgressPolicy, HeaderRule, PolicySource, SecretResolver,
    SecretValue,
};
use bytes::Bytes;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use http_body_util::Full;
use hyper::service::service_fn;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub const DOMAIN: &str = "test-internet.example";
pub const API: &str = "api.test-internet.example";

static NEXT_LAB: AtomicU32 = AtomicU32::new(0);

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run_stdin(cmd: &str, args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread inside netns `ns`: sockets it creates stay in that netns.
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("netns exists");
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("netns thread")
    })
}

/// Policies by sandbox address, changed live by tests.
#[derive(Default)]
pub struct Policies(Mutex<HashMap<IpAddr, Arc<EgressPolicy>>>);

impl Policies {
    pub fn set(&self, addr: IpAddr, policy: EgressPolicy) {
        self.0.lock().unwrap().insert(addr, Arc::new(policy));
    }
    pub fn remove(&self, addr: IpAddr) {
        self.0.lock().unwrap().remove(&addr);
    }
}

impl PolicySource for Policies {
    fn lookup(&self, sandbox_addr: IpAddr) -> Option<Arc<EgressPolicy>> {
        self.0.lock().unwrap().get(&sandbox_addr).cloned()
    }
}

/// (local address it arrived on, headers with lower-cased names, path)
pub type SeenRequest = (SocketAddr, Vec<(String, String)>, String);

/// What the test internet saw.
#[derive(Default)]
pub struct Seen {
    /// (local address the request arrived on, request headers lower-cased, path)
    pub requests: Mutex<Vec<SeenRequest>>,
    /// Every TCP connection accepted, by local address.
    pub connections: Mutex<Vec<SocketAddr>>,
    /// Every DNS question name.
    pub dns_names: Mutex<Vec<String>>,
}

impl Seen {
    pub fn connections_to(&self, ip: Ipv4Addr) -> usize {
        self.connections
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.ip() == ip)
            .count()
    }
    pub fn dns_asked(&self, name: &str) -> bool {
        self.dns_names
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.trim_end_matches('.') == name)
    }
}

pub struct Lab {
    pub id: String,
    pub x: u8,
    pub inet_ns: String,
    pub sbx_ns: String,
    pub table: String,
    pub seen: Arc<Seen>,
    pub test_ca_pem: String,
    pub test_ca: CertificateDer<'static>,
    links: Vec<String>,
}

impl Lab {
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.x, 1)
    }
    pub fn sandbox(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.x, 2)
    }
    pub fn api_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.x, 10)
    }
    pub fn denied_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.x, 20)
    }
    pub fn untrusted_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.x, 30)
    }
    pub fn dns_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.x, 53)
    }
    pub fn internet_net(&self) -> ipnet::IpNet {
        format!("198.18.{}.0/24", self.x).parse().unwrap()
    }

    /// A ceiling admitting only this lab's internet.
    pub fn ceiling(&self) -> Ceiling {
        Ceiling::default().allow_only_nets([self.internet_net()])
    }

    pub fn policy(&self, allow: &[&str], deny: &[&str]) -> EgressPolicy {
        self.policy_with(allow, deny, Vec::new(), self.ceiling())
    }

    pub fn policy_with(
        &self,
        allow: &[&str],
        deny: &[&str],
        rules: Vec<HeaderRule>,
        ceiling: Ceiling,
    ) -> EgressPolicy {
        let s = |v: &[&str]| v.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        EgressPolicy::from_e2b(true, &s(allow), &s(deny), rules, Arc::new(ceiling)).unwrap()
    }

    pub fn config(&self) -> EgressConfig {
        let mut config = EgressConfig::new(IpAddr::V4(self.gateway()));
        config.upstream_dns = vec![SocketAddr::new(IpAddr::V4(self.dns_ip()), 53)];
        config.connect_timeout = Duration::from_secs(3);
        config
    }

    pub fn new() -> Lab {
        let n = NEXT_LAB.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id() % 100_000;
        let id = format!("{pid}x{n}");
        let x = pick_subnet(pid, n);
        let mut lab = Lab {
            inet_ns: format!("egr{id}i"),
            sbx_ns: format!("egr{id}s"),
            table: format!("egress_test_{pid}_{n}"),
            x,
            seen: Arc::new(Seen::default()),
            test_ca_pem: String::new(),
            test_ca: CertificateDer::from(Vec::new()),
            links: Vec::new(),
            id,
        };
        let (ih, inn, sh, sn) = (
            format!("eg{}ih", lab.id),
            format!("eg{}in", lab.id),
            format!("eg{}sh", lab.id),
            format!("eg{}sn", lab.id),
        );
        run("ip", &["netns", "add", &lab.inet_ns]);
        run("ip", &["netns", "add", &lab.sbx_ns]);
        run(
            "ip",
            &["link", "add", &ih, "type", "veth", "peer", "name", &inn],
        );
        lab.links.push(ih.clone());
        run(
            "ip",
            &["link", "add", &sh, "type", "veth", "peer", "name", &sn],
        );
        lab.links.push(sh.clone());
        run("ip", &["link", "set", &inn, "netns", &lab.inet_ns]);
        run("ip", &["link", "set", &sn, "netns", &lab.sbx_ns]);
        run(
            "ip",
            &["addr", "add", &format!("198.18.{x}.1/24"), "dev", &ih],
        );
        run("ip", &["link", "set", &ih, "up"]);
        run(
            "ip",
            &["addr", "add", &format!("{}/24", lab.gateway()), "dev", &sh],
        );
        run("ip", &["link", "set", &sh, "up"]);
        let ns = |ns: &str, args: &[&str]| {
            let mut full = vec!["netns", "exec", ns, "ip"];
            full.extend_from_slice(args);
            run("ip", &full);
        };
        ns(&lab.inet_ns, &["link", "set", "lo", "up"]);
        for host in [10, 20, 30, 53] {
            ns(
                &lab.inet_ns,
                &["addr", "add", &format!("198.18.{x}.{host}/24"), "dev", &inn],
            );
        }
        ns(&lab.inet_ns, &["link", "set", &inn, "up"]);
        ns(
            &lab.inet_ns,
            &[
                "route",
                "add",
                &format!("198.19.{x}.0/24"),
                "via",
                &format!("198.18.{x}.1"),
            ],
        );
        ns(&lab.sbx_ns, &["link", "set", "lo", "up"]);
        ns(
            &lab.sbx_ns,
            &["addr", "add", &format!("{}/24", lab.sandbox()), "dev", &sn],
        );
        ns(&lab.sbx_ns, &["link", "set", &sn, "up"]);
        ns(
            &lab.sbx_ns,
            &["route", "add", "default", "via", &lab.gateway().to_string()],
        );
        lab
    }

    /// Installs the redirect of the sandbox's TCP 80/443 and DNS to `egress`.
    pub fn redirect_to(&self, egress: &EgressHandle) {
        let sh = format!("eg{}sh", self.id);
        let g = self.gateway();
        let rules = format!(
            "table inet {t} {{\n\
             chain pre {{ type nat hook prerouting priority dstnat; policy accept;\n\
               iifname \"{sh}\" tcp dport 80 redirect to :{http}\n\
               iifname \"{sh}\" tcp dport 443 redirect to :{tls}\n\
               iifname \"{sh}\" ip daddr {g} udp dport 53 redirect to :{dns}\n\
               iifname \"{sh}\" ip daddr {g} tcp dport 53 redirect to :{dns}\n\
             }}\n\
             chain guard {{ type filter hook forward priority filter; policy accept;\n\
               iifname \"{sh}\" drop\n\
               oifname \"{sh}\" drop\n\
             }}\n\
             }}\n",
            t = self.table,
            http = egress.http_addr.port(),
            tls = egress.tls_addr.port(),
            dns = egress.dns_addr.port(),
        );
        run_stdin("nft", &["-f", "-"], &rules);
    }

    /// Starts the web and DNS servers of the test internet on `runtime`'s tasks.
    pub async fn start_internet(&mut self) {
        let (ca_pem, ca_der, trusted, untrusted) = test_certificates();
        self.test_ca_pem = ca_pem;
        self.test_ca = ca_der;
        let ips = [self.api_ip(), self.denied_ip()];
        let untrusted_ip = self.untrusted_ip();
        let dns_ip = self.dns_ip();
        let (plain, tls, bad, udp) = in_ns(&self.inet_ns, move || {
            let bind = |ip: Ipv4Addr, port| {
                let l = std::net::TcpListener::bind((ip, port)).unwrap();
                l.set_nonblocking(true).unwrap();
                l
            };
            let plain: Vec<_> = ips.iter().map(|ip| bind(*ip, 80)).collect();
            let tls: Vec<_> = ips.iter().map(|ip| bind(*ip, 443)).collect();
            let bad = bind(untrusted_ip, 443);
            let udp = std::net::UdpSocket::bind((dns_ip, 53)).unwrap();
            udp.set_nonblocking(true).unwrap();
            (plain, tls, bad, udp)
        });
        for l in plain {
            tokio::spawn(serve_web(
                tokio::net::TcpListener::from_std(l).unwrap(),
                None,
                self.seen.clone(),
            ));
        }
        for l in tls {
            tokio::spawn(serve_web(
                tokio::net::TcpListener::from_std(l).unwrap(),
                Some(trusted.clone()),
                self.seen.clone(),
            ));
        }
        tokio::spawn(serve_web(
            tokio::net::TcpListener::from_std(bad).unwrap(),
            Some(untrusted),
            self.seen.clone(),
        ));
        let zone = self.zone();
        tokio::spawn(serve_dns(
            tokio::net::UdpSocket::from_std(udp).unwrap(),
            zone,
            self.seen.clone(),
        ));
    }

    fn zone(&self) -> Zone {
        let (api, denied, untrusted) = (self.api_ip(), self.denied_ip(), self.untrusted_ip());
        Arc::new(move |name: &str| {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            match name.as_str() {
                "denied.test-internet.example" => Some(vec![denied]),
                "private.test-internet.example" => Some(vec![Ipv4Addr::LOCALHOST]),
                "untrusted.test-internet.example" => Some(vec![untrusted]),
                "mixed.test-internet.example" => Some(vec![Ipv4Addr::LOCALHOST, api]),
                "other.example" => Some(vec![api]),
                n if n == DOMAIN || n.ends_with(".test-internet.example") => Some(vec![api]),
                _ => None,
            }
        })
    }

    /// A TCP connection made from inside the sandbox.
    pub async fn sandbox_connect(&self, ip: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
        let std_stream = in_ns(&self.sbx_ns, move || {
            std::net::TcpStream::connect_timeout(
                &SocketAddr::from((ip, port)),
                Duration::from_secs(5),
            )
        })?;
        std_stream.set_nonblocking(true)?;
        TcpStream::from_std(std_stream)
    }

    /// Unconnected TCP sockets of the sandbox netns, made up front so that connecting
    /// them costs what a process inside the sandbox pays (no thread or setns).
    pub fn sandbox_sockets(&self, n: usize) -> Vec<tokio::net::TcpSocket> {
        in_ns(&self.sbx_ns, || {
            (0..n)
                .map(|_| tokio::net::TcpSocket::new_v4().unwrap())
                .collect()
        })
    }

    /// A DNS query over UDP from inside the sandbox to the gateway's port 53.
    pub async fn sandbox_dns(&self, name: &str, record_type: RecordType) -> Option<Message> {
        let socket = in_ns(&self.sbx_ns, || {
            let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        });
        let socket = tokio::net::UdpSocket::from_std(socket).unwrap();
        dns_exchange(
            &socket,
            SocketAddr::from((self.gateway(), 53)),
            name,
            record_type,
        )
        .await
    }

    /// A TLS client trusting the test CA (and `extra` roots).
    pub fn tls_connector(&self, extra: &[CertificateDer<'static>]) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.test_ca.clone()).unwrap();
        for c in extra {
            roots.add(c.clone()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// HTTPS GET from the sandbox to `ip:443` with SNI and Host `name`.
    pub async fn sandbox_https_get(
        &self,
        ip: Ipv4Addr,
        name: &str,
        extra_roots: &[CertificateDer<'static>],
    ) -> std::io::Result<Response> {
        let tcp = self.sandbox_connect(ip, 443).await?;
        let server_name = ServerName::try_from(name.to_string()).unwrap();
        let mut tls = self
            .tls_connector(extra_roots)
            .connect(server_name, tcp)
            .await?;
        http_get(&mut tls, name, "/").await
    }
}

fn pick_subnet(pid: u32, n: u32) -> u8 {
    let used = String::from_utf8(
        Command::new("ip")
            .args(["-4", "addr"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let routes = String::from_utf8(
        Command::new("ip")
            .args(["-4", "route"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let start = (pid.wrapping_mul(7) + n * 13) % 240;
    (0..240)
        .map(|i| ((start + i) % 240 + 10) as u8)
        .find(|x| {
            let a = format!("198.18.{x}.");
            let b = format!("198.19.{x}.");
            !used.contains(&a) && !used.contains(&b) && !routes.contains(&a) && !routes.contains(&b)
        })
        .expect("a free 198.18.X.0/24 for the lab")
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .output();
        for link in &self.links {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.inet_ns])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.sbx_ns])
            .output();
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The whole response as received.
    pub raw: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one `GET` with `Connection: close` and reads the whole response.
pub async fn http_get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    path: &str,
) -> std::io::Result<Response> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| std::io::Error::other("response timed out"))??;
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::other(format!(
            "not an HTTP response: {:?}",
            String::from_utf8_lossy(&raw)
        ))
    })
}

pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = response.parse(raw).ok()? else {
        return None;
    };
    Some(Response {
        status: response.code?,
        headers: response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        body: String::from_utf8_lossy(&raw[head..]).into_owned(),
        raw: raw.to_vec(),
    })
}

pub async fn dns_exchange(
    socket: &tokio::net::UdpSocket,
    to: SocketAddr,
    name: &str,
    record_type: RecordType,
) -> Option<Message> {
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(
        Name::from_ascii(format!("{name}.")).unwrap(),
        record_type,
    ));
    socket.send_to(&query.to_vec().unwrap(), to).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    let answer = Message::from_vec(&buf[..n]).ok()?;
    assert_eq!(answer.metadata.id, query.metadata.id);
    Some(answer)
}

pub fn a_records(message: &Message) -> Vec<Ipv4Addr> {
    message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// The test CA (PEM and DER), a server config with a leaf for the test names signed
/// by it, and one with a self-signed certificate nobody trusts.
fn test_certificates() -> (
    String,
    CertificateDer<'static>,
    Arc<rustls::ServerConfig>,
    Arc<rustls::ServerConfig>,
) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "berth egress test internet CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![
        API.to_string(),
        format!("*.{DOMAIN}"),
        DOMAIN.to_string(),
        "other.example".to_string(),
    ])
    .unwrap()
    .signed_by(&leaf_key, &issuer)
    .unwrap();
    let server = |cert: CertificateDer<'static>, key: &KeyPair| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    };
    let trusted = server(leaf.der().clone(), &leaf_key);
    let rogue_key = KeyPair::generate().unwrap();
    let rogue = CertificateParams::new(vec!["untrusted.test-internet.example".to_string()])
        .unwrap()
        .self_signed(&rogue_key)
        .unwrap();
    let untrusted = server(rogue.der().clone(), &rogue_key);
    (ca.pem(), ca.der().clone(), trusted, untrusted)
}

async fn serve_web(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    seen: Arc<Seen>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let local = stream.local_addr().unwrap();
        seen.connections.lock().unwrap().push(local);
        let (seen, tls) = (seen.clone(), tls.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let seen = seen.clone();
                async move {
                    use http_body_util::BodyExt;
                    let headers = req
                        .headers()
                        .iter()
                        .map(|(n, v)| {
                            (
                                n.as_str().to_string(),
                                String::from_utf8_lossy(v.as_bytes()).into_owned(),
                            )
                        })
                        .collect();
                    let path = req.uri().path().to_string();
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    seen.requests
                        .lock()
                        .unwrap()
                        .push((local, headers, path.clone()));
                    let text =
                        format!("served by {} path {} body {}", local.ip(), path, body.len());
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from(text))))
                }
            });
            match tls {
                None => {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                }
                Some(config) => {
                    let Ok(tls) = tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                    else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                }
            }
        });
    }
}

type Zone = Arc<dyn Fn(&str) -> Option<Vec<Ipv4Addr>> + Send + Sync>;

async fn serve_dns(socket: tokio::net::UdpSocket, zone: Zone, seen: Arc<Seen>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let Some(q) = query.queries.first().cloned() else {
            continue;
        };
        let name = q.name().to_ascii();
        seen.dns_names.lock().unwrap().push(name.clone());
        let mut reply = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
        reply.metadata.authoritative = true;
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        reply.add_query(q.clone());
        match zone(&name) {
            None => reply.metadata.response_code = ResponseCode::NXDomain,
            Some(ips) if q.query_type() == RecordType::A => {
                for ip in ips {
                    reply.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(ip))));
                }
            }
            Some(_) => {}
        }
        let _ = socket.send_to(&reply.to_vec().unwrap(), from).await;
    }
}

/// The sandbox's TCP peer as the lab's web servers see requests: by local address.
pub fn served_by(response: &Response) -> Option<IpAddr> {
    response
        .body
        .strip_prefix("served by ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// Secrets of the one test sandbox.
pub struct Secrets {
    pub sandbox: IpAddr,
    pub values: Mutex<HashMap<String, String>>,
}

impl SecretResolver for Secrets {
    fn resolve(&self, sandbox_addr: IpAddr, name: &str) -> Option<SecretValue> {
        (sandbox_addr == self.sandbox)
            .then(|| {
                self.values
                    .lock()
                    .unwrap()
                    .get(name)
                    .cloned()
                    .map(SecretValue::new)
            })
            .flatten()
    }
}

pub struct TempDir(pub std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
