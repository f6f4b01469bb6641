//! Test fixtures: a Docker registry on loopback (Debian's `docker-registry`) with
//! optional htpasswd or token auth, and images made here with umoci and pushed with
//! skopeo. Nothing ever talks to a public registry. Shared with berth-build's tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const USER: &str = "puller";
pub const PASSWORD: &str = "s3cret-pw";

/// How the registry asks clients to authenticate.
pub enum RegistryAuthMode {
    None,
    /// htpasswd (bcrypt) with [`USER`]/[`PASSWORD`].
    Basic,
    /// Bearer tokens from a token server started by the test.
    Token,
}

/// A running `docker-registry` on 127.0.0.1, killed (by pid) and removed on drop.
pub struct Registry {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    token_server: Option<TokenServer>,
}

impl Registry {
    pub fn start(auth: RegistryAuthMode) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        let mut token_server = None;
        match auth {
            RegistryAuthMode::None => {}
            RegistryAuthMode::Basic => {
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{USER}:{}\n", bcrypt(PASSWORD))).unwrap();
                config.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: berth-test\n    path: {}\n",
                    htpasswd.display()
                ));
            }
            RegistryAuthMode::Token => {
                let server = TokenServer::start(dir.path());
                config.push_str(&format!(
                    "auth:\n  token:\n    realm: http://127.0.0.1:{}/token\n    service: berth-test-registry\n    issuer: berth-test-issuer\n    rootcertbundle: {}\n",
                    server.port,
                    server.cert_path.display()
                ));
                token_server = Some(server);
            }
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry is installed (apt-get install docker-registry)");
        let registry = Registry {
            child,
            port,
            dir,
            token_server,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "registry did not start: {}",
                registry.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        registry
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Pushes `layout:tag` (an OCI layout) as `<host>/<name>`, with `--all` for indexes.
    pub fn push(&self, layout: &Path, tag: &str, name: &str, creds: bool) {
        let mut command = Command::new("skopeo");
        command.args(["copy", "--quiet", "--all", "--dest-tls-verify=false"]);
        if creds {
            command.arg(format!("--dest-creds={USER}:{PASSWORD}"));
        }
        let output = command
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{name}", self.host()))
            .output()
            .expect("skopeo is installed");
        assert!(
            output.status.success(),
            "skopeo copy failed: {}\nregistry log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn bcrypt(password: &str) -> String {
    let output = Command::new("python3")
        .args([
            "-W",
            "ignore",
            "-c",
            "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))",
            password,
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// A minimal Docker token server: Basic auth with [`USER`]/[`PASSWORD`] → an ES256 JWT
/// whose x5c header carries the self-signed certificate the registry trusts.
struct TokenServer {
    port: u16,
    cert_path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    fn start(dir: &Path) -> TokenServer {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["berth-test-issuer".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let cert_path = dir.join("token-ca.pem");
        std::fs::write(&cert_path, cert.pem()).unwrap();
        let rng = ring::rand::SystemRandom::new();
        let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
            &rng,
        )
        .unwrap();
        let x5c = base64_std(cert.der());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stop_flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        serve_token(stream, &signer, &rng, &x5c);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        TokenServer {
            port,
            cert_path,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_token(
    stream: TcpStream,
    signer: &ring::signature::EcdsaKeyPair,
    rng: &ring::rand::SystemRandom,
    x5c: &str,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut authorized = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        let expected = format!(
            "basic {}",
            base64_std(format!("{USER}:{PASSWORD}").as_bytes())
        );
        if line.to_ascii_lowercase().starts_with("authorization:")
            && line["authorization:".len()..]
                .trim()
                .eq_ignore_ascii_case(&expected)
        {
            authorized = true;
        }
    }
    let query = request_line
        .split_whitespace()
        .nth(1)
        .and_then(|target| target.split_once('?'))
        .map(|(_, q)| q.to_string())
        .unwrap_or_default();
    let scopes: Vec<String> = query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("scope="))
        .map(percent_decode)
        .collect();
    let mut stream = stream;
    if !authorized {
        let _ = stream.write_all(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        return;
    }
    let access: Vec<serde_json::Value> = scopes
        .iter()
        .filter_map(|scope| {
            let mut parts = scope.splitn(3, ':');
            let (kind, name, _actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({"type": kind, "name": name, "actions": ["pull", "push"]}))
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]});
    let claims = serde_json::json!({
        "iss": "berth-test-issuer", "sub": USER, "aud": "berth-test-registry",
        "exp": now + 600, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", scopes.len()),
        "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        base64_url(header.to_string().as_bytes()),
        base64_url(claims.to_string().as_bytes())
    );
    let signature = signer.sign(rng, signing_input.as_bytes()).unwrap();
    let token = format!("{signing_input}.{}", base64_url(signature.as_ref()));
    let body = serde_json::json!({"token": token, "expires_in": 600}).to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_std(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.len();
        let v = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= n {
                out.push(B64[(v >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_url(bytes: &[u8]) -> String {
    base64_std(bytes)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// An OCI image layout under construction with umoci.
pub struct Layout {
    pub dir: PathBuf,
    bundle: PathBuf,
    _tmp: tempfile::TempDir,
}

pub fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Layout {
    /// A layout with image `tag` whose first layer holds a tiny runnable rootfs: the
    /// host's sh, ls, cat, sleep, env, id and their libraries (Debian, like sandboxes'
    /// own), plus `/etc/passwd` and `/etc/group` with root.
    pub fn with_base(tag: &str) -> Layout {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("layout");
        let bundle = tmp.path().join("bundle");
        run(Command::new("umoci").arg("init").arg("--layout").arg(&dir));
        run(Command::new("umoci")
            .args(["new", "--image"])
            .arg(format!("{}:{tag}", dir.display())));
        let layout = Layout {
            dir,
            bundle,
            _tmp: tmp,
        };
        layout.unpack(tag);
        let rootfs = layout.rootfs();
        for binary in [
            "/bin/sh",
            "/bin/ls",
            "/bin/cat",
            "/usr/bin/sleep",
            "/usr/bin/env",
            "/usr/bin/id",
            "/bin/mkdir",
            "/bin/chown",
            "/usr/bin/touch",
        ] {
            copy_with_libs(binary, &rootfs);
        }
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").unwrap();
        std::fs::create_dir_all(rootfs.join("root")).unwrap();
        layout
    }

    pub fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }

    pub fn unpack(&self, tag: &str) {
        let _ = std::fs::remove_dir_all(&self.bundle);
        run(Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{tag}", self.dir.display()))
            .arg(&self.bundle));
    }

    /// Commits the bundle's changes as a new layer on top, tagged `tag`.
    pub fn repack(&self, tag: &str) {
        run(Command::new("umoci")
            .args(["repack", "--refresh-bundle", "--image"])
            .arg(format!("{}:{tag}", self.dir.display()))
            .arg(&self.bundle));
    }

    pub fn config(&self, tag: &str, args: &[&str]) {
        run(Command::new("umoci")
            .args(["config", "--image"])
            .arg(format!("{}:{tag}", self.dir.display()))
            .args(args));
    }

    fn index(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("index.json")).unwrap()).unwrap()
    }

    fn write_index(&self, index: &serde_json::Value) {
        std::fs::write(self.dir.join("index.json"), index.to_string()).unwrap();
    }

    fn descriptor(&self, tag: &str) -> serde_json::Value {
        self.index()["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap_or_else(|| panic!("no tag {tag}"))
            .clone()
    }

    pub fn blob(&self, digest: &str) -> Vec<u8> {
        std::fs::read(self.blob_path(digest)).unwrap()
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir
            .join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap())
    }

    /// Stores `bytes` as a blob; returns its digest.
    pub fn put_blob(&self, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", hex(&Sha256::digest(bytes)));
        std::fs::write(self.blob_path(&digest), bytes).unwrap();
        digest
    }

    /// Tags `descriptor` as `tag` in index.json.
    fn tag_descriptor(&self, mut descriptor: serde_json::Value, tag: &str) {
        descriptor["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
        let mut index = self.index();
        index["manifests"].as_array_mut().unwrap().push(descriptor);
        self.write_index(&index);
    }

    /// The manifest of `tag`.
    pub fn manifest(&self, tag: &str) -> serde_json::Value {
        let descriptor = self.descriptor(tag);
        serde_json::from_slice(&self.blob(descriptor["digest"].as_str().unwrap())).unwrap()
    }

    /// Image `tag` with `tar` (uncompressed) gzipped and stacked on top as a new layer,
    /// tagged `tag` again.
    pub fn append_layer(&self, tag: &str, tar: &[u8]) {
        let mut manifest = self.manifest(tag);
        let mut config: serde_json::Value =
            serde_json::from_slice(&self.blob(manifest["config"]["digest"].as_str().unwrap()))
                .unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(tar).unwrap();
        let gz = gz.finish().unwrap();
        let diff_id = format!("sha256:{}", hex(&Sha256::digest(tar)));
        config["rootfs"]["diff_ids"]
            .as_array_mut()
            .unwrap()
            .push(diff_id.into());
        let config_bytes = config.to_string().into_bytes();
        manifest["config"]["digest"] = self.put_blob(&config_bytes).into();
        manifest["config"]["size"] = config_bytes.len().into();
        manifest["layers"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": self.put_blob(&gz), "size": gz.len(),
            }));
        let bytes = manifest.to_string().into_bytes();
        let digest = self.put_blob(&bytes);
        let mut index = self.index();
        index["manifests"]
            .as_array_mut()
            .unwrap()
            .retain(|m| m["annotations"]["org.opencontainers.image.ref.name"] != tag);
        self.write_index(&index);
        self.tag_descriptor(
            serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": bytes.len()}),
            tag,
        );
    }

    /// Tag `new_tag`: image `tag` with every gzip layer recompressed as zstd.
    pub fn zstd_copy(&self, tag: &str, new_tag: &str) {
        let mut manifest = self.manifest(tag);
        for layer in manifest["layers"].as_array_mut().unwrap() {
            let gz = self.blob(layer["digest"].as_str().unwrap());
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .read_to_end(&mut tar)
                .unwrap();
            let zst = zstd::encode_all(&tar[..], 3).unwrap();
            layer["digest"] = self.put_blob(&zst).into();
            layer["size"] = zst.len().into();
            layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+zstd".into();
        }
        let bytes = manifest.to_string().into_bytes();
        let digest = self.put_blob(&bytes);
        self.tag_descriptor(
            serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": bytes.len()}),
            new_tag,
        );
    }

    /// Tag `new_tag`: an image index of `(tag, architecture)` entries.
    pub fn index_of(&self, entries: &[(&str, &str)], new_tag: &str) {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(tag, arch)| {
                let d = self.descriptor(tag);
                serde_json::json!({
                    "mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"],
                    "platform": {"architecture": arch, "os": "linux"},
                })
            })
            .collect();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        });
        let bytes = index.to_string().into_bytes();
        let digest = self.put_blob(&bytes);
        self.tag_descriptor(
            serde_json::json!({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest, "size": bytes.len()}),
            new_tag,
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies `binary` and the libraries `ldd` names into `rootfs` at the same paths.
pub fn copy_with_libs(binary: &str, rootfs: &Path) {
    let mut files = vec![PathBuf::from(binary)];
    let ldd = run(Command::new("ldd").arg(binary));
    for word in ldd.split_whitespace() {
        if word.starts_with('/') {
            files.push(PathBuf::from(word));
        }
    }
    for file in files {
        let real = std::fs::canonicalize(&file).unwrap();
        let dest = rootfs.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        if !dest.exists() {
            std::fs::copy(&real, &dest).unwrap();
        }
    }
}
