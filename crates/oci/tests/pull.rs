//! Pulls from a local registry on loopback of images made here. Privileged: run as root
//! (layers keep their owners, whiteouts are device nodes, sandboxes need namespaces).

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use berth_oci::{
    Credentials, ImagePuller, OciError, Platform, PullProgress, PullerConfig, RegistryAuth,
};
use berth_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime, SandboxSpec};
use berth_template::TemplateStore;
use common::{Layout, Registry, RegistryAuthMode};

fn pull(
    store: &TemplateStore,
    reference: &str,
    auth: Option<&RegistryAuth>,
) -> Result<(berth_oci::PulledImage, Vec<PullProgress>), OciError> {
    let puller = ImagePuller::new(PullerConfig::default()).unwrap();
    let mut events = Vec::new();
    let image = puller.pull(
        store,
        reference,
        auth,
        &Platform::linux_amd64(),
        &AtomicBool::new(false),
        &mut |e| events.push(e),
    )?;
    Ok((image, events))
}

fn basic() -> RegistryAuth {
    RegistryAuth::Basic(Credentials {
        username: common::USER.into(),
        password: common::PASSWORD.into(),
    })
}

/// Layer 1: the base rootfs plus `/etc/d/gone`, `/opq/old`, `/keep`.
/// Layer 2 (umoci's diff): `/etc/d/gone` deleted (a `.wh.` whiteout).
/// Layer 3 (written here, as Docker writes a replaced directory): `/opq` opaque
/// (`.wh..wh..opq`) with `/opq/new`.
fn whiteout_image(tag: &str) -> Layout {
    let layout = Layout::with_base(tag);
    let rootfs = layout.rootfs();
    std::fs::create_dir_all(rootfs.join("etc/d")).unwrap();
    std::fs::write(rootfs.join("etc/d/gone"), "x").unwrap();
    std::fs::write(rootfs.join("etc/d/stays"), "s").unwrap();
    std::fs::create_dir_all(rootfs.join("opq")).unwrap();
    std::fs::write(rootfs.join("opq/old"), "o").unwrap();
    std::fs::write(rootfs.join("keep"), "k").unwrap();
    std::os::unix::fs::chown(rootfs.join("keep"), Some(1234), Some(4321)).unwrap();
    layout.repack(tag);
    std::fs::remove_file(rootfs.join("etc/d/gone")).unwrap();
    layout.repack(tag);
    let mut tar = tar::Builder::new(Vec::new());
    for (path, kind, data) in [
        ("opq/", tar::EntryType::Directory, &b""[..]),
        ("opq/.wh..wh..opq", tar::EntryType::Regular, b""),
        ("opq/new", tar::EntryType::Regular, b"n"),
    ] {
        let mut header = tar::Header::new_ustar();
        header.set_path(path).unwrap();
        header.set_entry_type(kind);
        header.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_size(data.len() as u64);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        tar.append(&header, data).unwrap();
    }
    layout.append_layer(tag, &tar.into_inner().unwrap());
    layout.config(
        tag,
        &[
            "--config.env=GREETING=hello world",
            "--config.workingdir=/srv",
            "--config.user=1234",
            "--config.entrypoint=/bin/sh",
            "--config.cmd=-c",
            "--config.cmd=echo hi",
        ],
    );
    layout
}

#[test]
fn multi_layer_image_with_whiteouts_runs_as_a_sandbox() {
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = whiteout_image("v1");
    registry.push(&layout.dir, "v1", "test/whiteouts:v1", false);
    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();
    let reference = format!("{}/test/whiteouts:v1", registry.host());

    let (image, events) = pull(&store, &reference, None).unwrap();
    // The base+files layer, the deletion layer and the opaque layer.
    assert_eq!(image.layers.len(), 3, "{events:?}");
    let downloads = events
        .iter()
        .filter(|e| matches!(e, PullProgress::LayerDownloading { .. }))
        .count();
    assert_eq!(downloads, 3);
    assert_eq!(image.config.env, vec!["GREETING=hello world".to_string()]);
    assert_eq!(image.config.working_dir.as_deref(), Some("/srv"));
    assert_eq!(image.config.user.as_deref(), Some("1234"));
    assert_eq!(image.config.entrypoint, vec!["/bin/sh".to_string()]);
    assert_eq!(
        image.config.cmd,
        vec!["-c".to_string(), "echo hi".to_string()]
    );

    // The top layer holds the converted markers.
    let deletion = store.layer_rootfs(&image.layers[1]);
    let whiteout = std::fs::symlink_metadata(deletion.join("etc/d/gone")).unwrap();
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0);
    let mut value = [0u8; 4];
    let top = store.layer_rootfs(&image.layers[2]);
    let n = rustix::fs::lgetxattr(top.join("opq"), "user.overlay.opaque", &mut value).unwrap();
    assert_eq!(&value[..n], b"y");
    let keep = std::fs::metadata(store.layer_rootfs(&image.layers[0]).join("keep")).unwrap();
    assert_eq!(
        (keep.uid(), keep.gid()),
        (1234, 4321),
        "owners kept as in the image"
    );

    // A second pull finds every layer in the store.
    let (again, events) = pull(&store, &reference, None).unwrap();
    assert_eq!(again.layers, image.layers);
    assert!(events
        .iter()
        .all(|e| !matches!(e, PullProgress::LayerDownloading { .. })));

    // The real runtime mounts the layers (idmapped, userxattr, in a user namespace)
    // and the sandbox sees the merged tree.
    let sandbox = TestSandbox::start(image.layers.iter().map(|l| store.layer_rootfs(l)).collect());
    let listing =
        sandbox.sh("ls /etc/d /opq; cat /keep; stat -c %u:%g /keep 2>/dev/null || ls -n /keep");
    assert!(listing.contains("stays"), "{listing}");
    assert!(
        !listing.contains("gone"),
        "whiteout not honoured: {listing}"
    );
    assert!(listing.contains("new"), "{listing}");
    assert!(
        !listing.contains("old"),
        "opaque dir not honoured: {listing}"
    );
    assert!(listing.contains("1234"), "owner not mapped: {listing}");
}

#[test]
fn an_index_resolves_to_the_linux_amd64_image() {
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = Layout::with_base("amd");
    std::fs::write(layout.rootfs().join("arch"), "amd64").unwrap();
    layout.repack("amd");
    layout.unpack("amd");
    std::fs::write(layout.rootfs().join("arch"), "arm64").unwrap();
    layout.repack("arm");
    layout.config("arm", &["--architecture=arm64"]);
    layout.index_of(&[("arm", "arm64"), ("amd", "amd64")], "multi");
    registry.push(&layout.dir, "multi", "test/multi:latest", false);
    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();

    let (image, _) = pull(&store, &format!("{}/test/multi", registry.host()), None).unwrap();
    let top = store.layer_rootfs(image.layers.last().unwrap());
    assert_eq!(std::fs::read_to_string(top.join("arch")).unwrap(), "amd64");

    let puller = ImagePuller::new(PullerConfig::default()).unwrap();
    let err = puller
        .pull(
            &store,
            &format!("{}/test/multi", registry.host()),
            None,
            &Platform {
                architecture: "riscv64".into(),
                os: "linux".into(),
                variant: None,
            },
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(
        matches!(&err, OciError::NoMatchingPlatform { available, .. } if available.contains("linux/arm64")),
        "{err}"
    );
}

#[test]
fn zstd_layers_pull_and_share_layers_with_gzip() {
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = whiteout_image("gz");
    layout.zstd_copy("gz", "zst");
    registry.push(&layout.dir, "zst", "test/zst:latest", false);
    registry.push(&layout.dir, "gz", "test/gz:latest", false);
    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();

    let (zst, events) = pull(&store, &format!("{}/test/zst", registry.host()), None).unwrap();
    assert!(events
        .iter()
        .any(|e| matches!(e, PullProgress::LayerDownloading { .. })));
    let deletion = store.layer_rootfs(&zst.layers[1]);
    assert!(std::fs::symlink_metadata(deletion.join("etc/d/gone"))
        .unwrap()
        .file_type()
        .is_char_device());
    // Same uncompressed layers: the gzip image needs no download at all.
    let (gz, events) = pull(&store, &format!("{}/test/gz", registry.host()), None).unwrap();
    assert_eq!(gz.layers, zst.layers);
    assert!(events
        .iter()
        .all(|e| !matches!(e, PullProgress::LayerDownloading { .. })));
}

#[test]
fn basic_auth_registries_need_the_credentials() {
    let registry = Registry::start(RegistryAuthMode::Basic);
    let layout = Layout::with_base("v1");
    layout.repack("v1");
    registry.push(&layout.dir, "v1", "private/app:v1", true);
    auth_cases(&registry, "private/app:v1");
}

#[test]
fn token_auth_registries_hand_out_bearer_tokens_for_the_credentials() {
    let registry = Registry::start(RegistryAuthMode::Token);
    let layout = Layout::with_base("v1");
    layout.repack("v1");
    registry.push(&layout.dir, "v1", "private/app:v1", true);
    auth_cases(&registry, "private/app:v1");
}

fn auth_cases(registry: &Registry, name: &str) {
    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();
    let reference = format!("{}/{name}", registry.host());
    let err = pull(&store, &reference, None).unwrap_err();
    assert!(matches!(err, OciError::Unauthorized { .. }), "{err}");
    let wrong = RegistryAuth::Basic(Credentials {
        username: common::USER.into(),
        password: "wrong".into(),
    });
    let err = pull(&store, &reference, Some(&wrong)).unwrap_err();
    assert!(matches!(err, OciError::Unauthorized { .. }), "{err}");
    let (image, _) = pull(&store, &reference, Some(&basic())).unwrap();
    assert!(store
        .layer_rootfs(image.layers.last().unwrap())
        .join("bin/sh")
        .exists());
}

#[test]
fn concurrent_pulls_of_one_image_download_each_layer_once() {
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = whiteout_image("v1");
    registry.push(&layout.dir, "v1", "test/shared:v1", false);
    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();
    let reference = format!("{}/test/shared:v1", registry.host());
    let events = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (store, reference, events) = (store.clone(), reference.clone(), events.clone());
            std::thread::spawn(move || {
                let (image, mine) = pull(&store, &reference, None).unwrap();
                events.lock().unwrap().extend(mine);
                image.layers
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    let downloads = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, PullProgress::LayerDownloading { .. }))
        .count();
    assert_eq!(
        downloads,
        results[0].len(),
        "each layer downloaded exactly once"
    );
}

#[test]
fn a_corrupted_blob_is_refused_and_leaves_no_layer() {
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = whiteout_image("v1");
    registry.push(&layout.dir, "v1", "test/corrupt:v1", false);
    // Flip bytes of the largest layer blob in the registry's own storage.
    let manifest = layout.manifest("v1");
    let layer = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|l| l["size"].as_u64().unwrap())
        .unwrap();
    let hex = layer["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap();
    let data: PathBuf = registry
        .dir
        .path()
        .join("data/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();

    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();
    let err = pull(
        &store,
        &format!("{}/test/corrupt:v1", registry.host()),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            OciError::DigestMismatch { .. } | OciError::BadArchive { .. }
        ),
        "{err}"
    );
    let layer_id =
        ImagePuller::layer_id(layer_diff_id(&layout, layer["digest"].as_str().unwrap()).as_str());
    assert!(!store.has_layer(&layer_id));
    assert_eq!(
        std::fs::read_dir(store.root().join("staging"))
            .unwrap()
            .count(),
        0,
        "staging cleaned"
    );
}

fn layer_diff_id(layout: &Layout, digest: &str) -> String {
    let manifest = layout.manifest("v1");
    let config: serde_json::Value =
        serde_json::from_slice(&layout.blob(manifest["config"]["digest"].as_str().unwrap()))
            .unwrap();
    let index = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .position(|l| l["digest"] == digest)
        .unwrap();
    config["rootfs"]["diff_ids"][index]
        .as_str()
        .unwrap()
        .to_string()
}

/// A real berth sandbox on `layers` (init: the host's `sleep`, as the runtime tests do),
/// killed with its state on drop.
struct TestSandbox {
    rt: LinuxRuntime,
    id: String,
    _cleanup: Cleanup,
}

struct Cleanup {
    state: PathBuf,
    cgroup_parent: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for ctrl in ["cpu", "cpuacct", "cpuset", "memory", "pids", "freezer", ""] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(&self.cgroup_parent),
            );
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

impl TestSandbox {
    fn start(layers: Vec<PathBuf>) -> TestSandbox {
        let name = format!("berth-oci-test-{}", std::process::id());
        let state = PathBuf::from("/var/lib/berth-test").join(&name);
        std::fs::create_dir_all(&state).unwrap();
        let cleanup = Cleanup {
            state: state.clone(),
            cgroup_parent: name.clone(),
        };
        let mut config = LinuxRuntimeConfig::new(&state, "/usr/bin/sleep");
        config.envd_args = vec!["infinity".into()];
        config.init_listen = None;
        config.launcher_binary = launcher_binary();
        config.cgroup_parent = name;
        config.disk_pool_size = 0;
        let rt = LinuxRuntime::new(config).unwrap();
        let id = format!("ocitest{}", std::process::id());
        rt.create(&SandboxSpec {
            id: id.clone(),
            template: "oci-test".into(),
            layers,
            cpu_count: 1,
            memory_mb: 128,
            disk_size_mb: 64,
            volumes: Vec::new(),
        })
        .unwrap();
        TestSandbox {
            rt,
            id,
            _cleanup: cleanup,
        }
    }

    fn sh(&self, script: &str) -> String {
        let output = self
            .rt
            .exec_command(&self.id, 0, 0, &["/bin/sh", "-c", script])
            .unwrap()
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }
}

impl Drop for TestSandbox {
    fn drop(&mut self) {
        let _ = self.rt.kill(&self.id);
    }
}

/// berth-launch from this workspace's build (built if missing).
fn launcher_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let built = exe.parent().unwrap().parent().unwrap().join("berth-launch");
    if !built.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "-p", "berth-runtime", "--bin", "berth-launch"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    built
}

/// Not a test: the pull of a ~100 MiB image from the local registry beside `skopeo copy`
/// of the same image (download + verify, no unpack) in the same run.
/// `cargo test -p berth-oci --test pull -- --ignored --nocapture measure`
#[test]
#[ignore = "benchmark: run by hand with --ignored"]
fn measure_pull_of_a_100_mib_image_against_skopeo() {
    use std::io::Read;
    use std::time::Instant;
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = Layout::with_base("big");
    let mut random = std::fs::File::open("/dev/urandom").unwrap();
    for i in 0..4 {
        let mut bytes = vec![0u8; 25 << 20];
        random.read_exact(&mut bytes).unwrap();
        std::fs::write(layout.rootfs().join(format!("blob{i}")), bytes).unwrap();
    }
    layout.repack("big");
    registry.push(&layout.dir, "big", "bench/big:latest", false);
    let reference = format!("{}/bench/big:latest", registry.host());
    let mut best = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let state = tempfile::tempdir_in("/var/lib").unwrap();
        let store = TemplateStore::open(state.path()).unwrap();
        let started = Instant::now();
        let (image, _) = pull(&store, &reference, None).unwrap();
        best.0 = best.0.min(started.elapsed().as_secs_f64());
        assert_eq!(image.layers.len(), 1);
        let out = tempfile::tempdir_in("/var/lib").unwrap();
        let started = Instant::now();
        common::run(
            std::process::Command::new("skopeo")
                .args(["copy", "--quiet", "--src-tls-verify=false"])
                .arg(format!("docker://{reference}"))
                .arg(format!("dir:{}", out.path().join("img").display())),
        );
        best.1 = best.1.min(started.elapsed().as_secs_f64());
    }
    let size: u64 = layout.manifest("big")["layers"][0]["size"]
        .as_u64()
        .unwrap();
    eprintln!(
        "MEASURE pull of a {:.1} MiB image (best of 3): berth {:.2} s (download, verify, unpack), skopeo copy to dir: {:.2} s (download, verify)",
        size as f64 / 1048576.0,
        best.0,
        best.1
    );
}

#[test]
fn a_mirror_serves_docker_hub_references_without_contacting_docker_hub() {
    let registry = Registry::start(RegistryAuthMode::None);
    let layout = Layout::with_base("v1");
    std::fs::write(layout.rootfs().join("mirrored"), "yes").unwrap();
    layout.repack("v1");
    registry.push(&layout.dir, "v1", "library/mirrored:v1", false);
    let puller = ImagePuller::new(PullerConfig {
        mirrors: [(
            "docker.io".to_string(),
            format!("http://{}", registry.host()),
        )]
        .into(),
        insecure_registries: Vec::new(),
    })
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = TemplateStore::open(state.path()).unwrap();
    // `mirrored:v1` names docker.io/library/mirrored:v1.
    let image = puller
        .pull(
            &store,
            "mirrored:v1",
            None,
            &Platform::linux_amd64(),
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(image.reference.registry, "docker.io");
    let top = store.layer_rootfs(image.layers.last().unwrap());
    assert_eq!(
        std::fs::read_to_string(top.join("mirrored")).unwrap(),
        "yes"
    );
}
