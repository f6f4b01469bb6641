//! Builds (or reuses) the real `base` template with debootstrap and checks its files.
//!
//! Uses berth's shared template cache: `$BERTH_STATE_DIR`, default /var/lib/berth. The
//! cache is berth state other tests rely on, so it is kept; the first run needs root and
//! the Debian mirror (about 2-3 minutes).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use berth_template::{BuildProgress, TemplateStore, BASE_TEMPLATE_ID, DEFAULT_STATE_DIR};

fn state_dir() -> PathBuf {
    std::env::var_os("BERTH_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

fn print_progress(event: BuildProgress) {
    match event {
        BuildProgress::Output { .. } | BuildProgress::PackageRetrieved { .. } => {}
        other => eprintln!("{other:?}"),
    }
}

/// Run a program from the layer without writing to it (chroot, no bytecode caches).
fn run_in(rootfs: &Path, argv: &[&str]) -> String {
    let output = Command::new("chroot")
        .arg(rootfs)
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("chroot runs");
    assert!(
        output.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn base_template_is_built_once_and_looks_like_e2b_base() {
    let store = TemplateStore::open(state_dir()).expect("open store");
    let base = store.ensure_base(print_progress).expect("ensure base");
    assert_eq!(base.id, BASE_TEMPLATE_ID);
    assert_eq!(base.layers.len(), 1);
    assert_eq!(base.default_user, "user");
    assert_eq!(base.default_workdir, "/home/user");

    // A second call reuses the layer: no build stage, same layer.
    let mut events = Vec::new();
    let again = store
        .ensure_base(|e| events.push(e))
        .expect("ensure base again");
    assert_eq!(again.layer_ids, base.layer_ids);
    assert!(events.is_empty(), "unexpected rebuild: {events:?}");
    assert_eq!(store.get(BASE_TEMPLATE_ID).unwrap().layers, base.layers);
    assert!(store.base_is_current());

    let rootfs = &base.layers[0];
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l == "user:x:1000:1000::/home/user:/bin/bash"),
        "no user 1000 in /etc/passwd:\n{passwd}"
    );
    let group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap();
    assert!(group.lines().any(|l| l.starts_with("user:x:1000:")));

    let home = std::fs::metadata(rootfs.join("home/user")).unwrap();
    assert_eq!((home.uid(), home.gid()), (1000, 1000));

    let sudoers = rootfs.join("etc/sudoers.d/user");
    assert_eq!(
        std::fs::read_to_string(&sudoers).unwrap(),
        "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
    );
    let meta = std::fs::metadata(&sudoers).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o440);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    // sudo accepts the whole policy (syntax, owners, modes); visudo -c writes nothing.
    run_in(rootfs, &["visudo", "--check", "--quiet"]);
    let sudo = std::fs::metadata(rootfs.join("usr/bin/sudo")).unwrap();
    assert_ne!(sudo.permissions().mode() & 0o4000, 0, "sudo is not setuid");

    for binary in [
        "python3", "pip3", "node", "npm", "git", "curl", "ps", "ip", "bash",
    ] {
        let found = ["usr/bin", "usr/sbin", "bin", "sbin"]
            .iter()
            .any(|dir| rootfs.join(dir).join(binary).exists());
        assert!(found, "{binary} missing from base");
    }
    assert_eq!(
        run_in(rootfs, &["python3", "-c", "print(6 * 7)"]).trim(),
        "42"
    );
    assert!(run_in(rootfs, &["node", "--version"]).starts_with('v'));

    let nsswitch = std::fs::read_to_string(rootfs.join("etc/nsswitch.conf")).unwrap();
    assert!(
        nsswitch
            .lines()
            .any(|l| l.starts_with("hosts:") && l.contains("myhostname")),
        "hostname not resolvable: {nsswitch}"
    );
    assert!(!rootfs
        .join("etc/dpkg/dpkg.cfg.d/berth-build-unsafe-io")
        .exists());

    let policy = std::fs::metadata(rootfs.join("usr/sbin/policy-rc.d")).unwrap();
    assert_eq!(policy.permissions().mode() & 0o777, 0o755);
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/hostname")).unwrap(),
        "sandbox\n"
    );
    // Nothing of the build host's resolver config or package caches is baked in.
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/resolv.conf")).unwrap(),
        ""
    );
    let debs = std::fs::read_dir(rootfs.join("var/cache/apt/archives"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "deb")
        })
        .count();
    assert_eq!(debs, 0);
}

/// A scratch state dir removed on drop, even when the test fails.
struct ScratchState(PathBuf);

impl Drop for ScratchState {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn unreachable_mirror_is_a_network_error_and_leaves_nothing() {
    let state = ScratchState(
        std::env::temp_dir().join(format!("berth-template-netfail-{}", std::process::id())),
    );
    let store = TemplateStore::open(&state.0).expect("open store");
    // Nothing listens on loopback port 9, so every fetch is refused at once.
    let recipe = berth_template::BaseRecipe {
        template_id: "unreachable".into(),
        ..berth_template::BaseRecipe::with_mirror("http://127.0.0.1:9/debian")
    };
    let mut stages = Vec::new();
    let err = store
        .ensure_recipe(&recipe, |e| {
            if let BuildProgress::Stage { name, .. } = e {
                stages.push(name)
            }
        })
        .expect_err("a build from a refused mirror cannot succeed");
    eprintln!("{err}");
    assert!(
        matches!(err, berth_template::TemplateError::Network { .. }),
        "not a network error: {err}"
    );
    assert!(err.to_string().contains("127.0.0.1:9"), "{err}");
    assert_eq!(stages, vec!["debootstrap".to_string()]);
    assert!(!store.has_layer(&recipe.layer_id()));
    assert!(matches!(
        store.get("unreachable"),
        Err(berth_template::TemplateError::NotFound(_))
    ));
    let staging = std::fs::read_dir(store.root().join("staging"))
        .unwrap()
        .count();
    assert_eq!(staging, 0, "a failed build left staging behind");
}
