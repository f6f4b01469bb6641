//! The `base` template: a Debian rootfs made by debootstrap, then set up like E2B's base
//! image (user `user` with passwordless sudo, python3, node, git, curl).

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, TemplateError};
use crate::layer::LayerId;
use crate::manifest::TemplateConfig;
use crate::BuildProgress;

pub const BASE_TEMPLATE_ID: &str = "base";

/// Bump when the build procedure itself (not the recipe data) changes in a way that
/// changes the resulting rootfs, so existing layers are not reused.
const BUILDER_VERSION: u32 = 1;

/// dpkg config file that exists only while the build installs packages.
const DPKG_UNSAFE_IO: &str = "/etc/dpkg/dpkg.cfg.d/berth-build-unsafe-io";

/// Lines of tool output kept for error messages.
const OUTPUT_TAIL_LINES: usize = 30;

/// PATH for build tools on the host and inside the chroot (sbin included: debootstrap,
/// chroot and useradd live there, and non-login shells often lack it).
const BUILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How to build a single-layer template from Debian packages. Everything here is hashed
/// into the layer id, so changing any field makes a new layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRecipe {
    pub template_id: String,
    pub suite: String,
    /// debootstrap `--variant`.
    pub variant: String,
    pub mirror: String,
    /// Run in order inside the fresh rootfs after debootstrap.
    pub steps: Vec<SetupStep>,
    pub config: TemplateConfig,
}

/// One setup action on the rootfs being built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetupStep {
    /// Create or replace a file at an absolute path inside the rootfs.
    WriteFile {
        path: String,
        contents: String,
        mode: u32,
    },
    /// Run a command chrooted into the rootfs (with a private /proc).
    Run { argv: Vec<String> },
    /// `apt-get update` then install these packages without recommends. apt resolves
    /// dependencies that debootstrap's `--include` cannot (npm's virtual packages).
    AptInstall { packages: Vec<String> },
}

/// Where `base` comes from unless a mirror is given.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

impl Default for BaseRecipe {
    /// E2B-like base: Debian bookworm minbase plus the tools agents expect.
    fn default() -> BaseRecipe {
        BaseRecipe::with_mirror(DEFAULT_MIRROR)
    }
}

impl BaseRecipe {
    /// The `base` recipe fetching from `mirror` (debootstrap and the image's apt sources).
    pub fn with_mirror(mirror: &str) -> BaseRecipe {
        let mirror = mirror.to_string();
        let write = |path: &str, contents: &str, mode: u32| SetupStep::WriteFile {
            path: path.into(),
            contents: contents.into(),
            mode,
        };
        let run = |argv: &[&str]| SetupStep::Run {
            argv: argv.iter().map(|a| a.to_string()).collect(),
        };
        let packages = [
            "bash",
            "coreutils",
            "python3",
            "python3-pip",
            // `python` is Python 3, as in E2B's images.
            "python-is-python3",
            "nodejs",
            "npm",
            "git",
            "curl",
            "ca-certificates",
            "sudo",
            "procps",
            "iproute2",
            // Resolves whatever hostname the runtime gives a sandbox, so `sudo` does not
            // warn "unable to resolve host" (E2B's images resolve their hostname too).
            "libnss-myhostname",
        ];
        BaseRecipe {
            template_id: BASE_TEMPLATE_ID.into(),
            suite: "bookworm".into(),
            variant: "minbase".into(),
            steps: vec![
                // Sandboxes have no init system: package scripts must never start services.
                write("/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755),
                write(
                    "/etc/apt/sources.list",
                    &format!(
                        "deb {mirror} bookworm main\n\
                         deb {mirror} bookworm-updates main\n\
                         deb {mirror}-security bookworm-security main\n"
                    ),
                    0o644,
                ),
                // The finished layer is synced as a whole before it is published, so dpkg's
                // per-file fsyncs only slow the build down.
                write(DPKG_UNSAFE_IO, "force-unsafe-io\n", 0o644),
                SetupStep::AptInstall {
                    packages: packages.iter().map(|p| p.to_string()).collect(),
                },
                run(&["rm", "-f", DPKG_UNSAFE_IO]),
                run(&["groupadd", "--gid", "1000", "user"]),
                run(&[
                    "useradd",
                    "--uid",
                    "1000",
                    "--gid",
                    "1000",
                    "--create-home",
                    "--home-dir",
                    "/home/user",
                    "--shell",
                    "/bin/bash",
                    "user",
                ]),
                write(
                    "/etc/sudoers.d/user",
                    "user ALL=(ALL:ALL) NOPASSWD: ALL\n",
                    0o440,
                ),
                // Debian's /etc/profile forks `id -u` to tell root from others: every
                // `commands.run` is a `bash -l`, and that fork and exec were half of its
                // start-up (1.5 of 3 ms). Bash knows its `EUID`; `sh` and others without
                // it still ask `id`. The resulting PATH is the same.
                run(&[
                    "sed",
                    "-i",
                    "s/\"$(id -u)\"/\"${EUID:-$(id -u)}\"/",
                    "/etc/profile",
                ]),
                // E2B's image lets `pip install` work without a venv (PEP 668 off).
                write(
                    "/etc/pip.conf",
                    "[global]\nbreak-system-packages = true\n",
                    0o644,
                ),
                write("/etc/hostname", "sandbox\n", 0o644),
                write(
                    "/etc/hosts",
                    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
                    0o644,
                ),
                // debootstrap copied the build host's resolver config; sandboxes get their own.
                write("/etc/resolv.conf", "", 0o644),
                // Empty: each sandbox is a new machine, not a clone of the build host.
                write("/etc/machine-id", "", 0o444),
                run(&[
                    "sh",
                    "-c",
                    "apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old \
                     /var/log/apt/* /var/log/dpkg.log /var/log/bootstrap.log",
                ]),
            ],
            mirror,
            config: TemplateConfig {
                default_user: "user".into(),
                default_workdir: "/home/user".into(),
                // What tools expect of a terminal session: a UTF-8 locale (glibc's
                // built-in C.UTF-8, no locales package needed) and a TERM for `tput`,
                // `top`, `clear`; a PTY's own TERM wins over it.
                envs: BTreeMap::from([
                    ("LANG".to_string(), "C.UTF-8".to_string()),
                    ("TERM".to_string(), "xterm-256color".to_string()),
                ]),
                ..TemplateConfig::default()
            },
        }
    }

    /// The id of the layer this recipe builds: a hash of the recipe and builder version.
    pub fn layer_id(&self) -> LayerId {
        #[derive(Serialize)]
        struct Hashed<'a> {
            builder_version: u32,
            suite: &'a str,
            variant: &'a str,
            mirror: &'a str,
            steps: &'a [SetupStep],
        }
        let hashed = Hashed {
            builder_version: BUILDER_VERSION,
            suite: &self.suite,
            variant: &self.variant,
            mirror: &self.mirror,
            steps: &self.steps,
        };
        LayerId::of_bytes(&serde_json::to_vec(&hashed).expect("recipe serializes"))
    }

    /// Build the rootfs into `rootfs` (an empty directory).
    pub(crate) fn build(
        &self,
        rootfs: &Path,
        progress: &mut dyn FnMut(BuildProgress),
    ) -> Result<(), TemplateError> {
        if !rustix::process::geteuid().is_root() {
            return Err(TemplateError::NotRoot);
        }
        let debootstrap = find_tool("debootstrap", "debootstrap")?;
        let unshare = find_tool("unshare", "util-linux")?;
        let chroot = find_tool("chroot", "coreutils")?;

        progress(BuildProgress::Stage {
            name: "debootstrap".into(),
            detail: format!(
                "debootstrap --variant={} {} from {}",
                self.variant, self.suite, self.mirror
            ),
        });
        // A private mount namespace: debootstrap mounts /proc and /sys inside the
        // target, and those mounts must vanish with it even if it is killed.
        let mut command = Command::new(&unshare);
        command
            .args(["--mount", "--propagation", "private", "--"])
            .arg(&debootstrap)
            .arg(format!("--variant={}", self.variant))
            .arg(&self.suite)
            .arg(rootfs)
            .arg(&self.mirror)
            .env("PATH", BUILD_PATH)
            .env("LANG", "C.UTF-8");
        run_streaming(command, "debootstrap", &self.mirror, progress)?;

        let step_count = self.steps.len();
        for (index, step) in self.steps.iter().enumerate() {
            let label = format!("setup {}/{step_count}", index + 1);
            match step {
                SetupStep::WriteFile {
                    path,
                    contents,
                    mode,
                } => {
                    progress(BuildProgress::Stage {
                        name: label,
                        detail: format!("write {path}"),
                    });
                    write_inside(rootfs, path, contents.as_bytes(), *mode)?;
                }
                SetupStep::Run { argv } => {
                    progress(BuildProgress::Stage {
                        name: label,
                        detail: argv.join(" "),
                    });
                    let command = chroot_command(&unshare, &chroot, rootfs, argv);
                    run_streaming(command, &argv.join(" "), &self.mirror, progress)?;
                }
                SetupStep::AptInstall { packages } => {
                    progress(BuildProgress::Stage {
                        name: label.clone(),
                        detail: "apt-get update".into(),
                    });
                    let update = chroot_command(&unshare, &chroot, rootfs, &["apt-get", "update"]);
                    run_streaming(update, "apt-get update", &self.mirror, progress)?;
                    progress(BuildProgress::Stage {
                        name: label,
                        detail: format!("apt-get install {}", packages.join(" ")),
                    });
                    let mut argv = vec![
                        "apt-get",
                        "install",
                        "--yes",
                        "--no-install-recommends",
                        "-o",
                        "Dpkg::Use-Pty=0",
                    ];
                    argv.extend(packages.iter().map(String::as_str));
                    let install = chroot_command(&unshare, &chroot, rootfs, &argv);
                    run_streaming(install, "apt-get install", &self.mirror, progress)?;
                }
            }
        }
        Ok(())
    }
}

/// `unshare --mount --pid --fork --mount-proc=<rootfs>/proc chroot <rootfs> argv…` with
/// a clean environment: the command sees its own /proc, and nothing it mounts outlives it.
fn chroot_command(
    unshare: &Path,
    chroot: &Path,
    rootfs: &Path,
    argv: &[impl AsRef<str>],
) -> Command {
    let mut command = Command::new(unshare);
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
        ])
        .arg(format!("--mount-proc={}", rootfs.join("proc").display()))
        .arg("--")
        .arg(chroot)
        .arg(rootfs)
        .args(argv.iter().map(AsRef::as_ref))
        .env_clear()
        .env("PATH", BUILD_PATH)
        .env("LANG", "C.UTF-8")
        .env("HOME", "/root")
        .env("DEBIAN_FRONTEND", "noninteractive");
    command
}

/// Run `command`, reporting each output line, and turn failure into a typed error.
fn run_streaming(
    mut command: Command,
    stage: &str,
    mirror: &str,
    progress: &mut dyn FnMut(BuildProgress),
) -> Result<(), TemplateError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A build outlives nothing: if berth is stopped mid-build, the tool stops too. What
    // it writes is the template's filesystem, so it gets the usual umask, not berth's
    // owner-only one.
    // SAFETY: the hook only makes async-signal-safe syscalls (prctl, umask).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(std::io::Error::from)
        });
    }
    let program = PathBuf::from(command.get_program());
    let mut child = command.spawn().ctx("spawn", &program)?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers = [
        spawn_line_reader(child.stdout.take().expect("stdout piped"), tx.clone()),
        spawn_line_reader(child.stderr.take().expect("stderr piped"), tx),
    ];
    let mut tail = VecDeque::with_capacity(OUTPUT_TAIL_LINES);
    let mut fetched = 0usize;
    for line in rx {
        if let Some(name) = fetched_package(&line) {
            fetched += 1;
            progress(BuildProgress::PackageRetrieved {
                count: fetched,
                name: name.to_string(),
            });
        }
        if tail.len() == OUTPUT_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        progress(BuildProgress::Output { line });
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child.wait().ctx("wait for", &program)?;
    if status.success() {
        return Ok(());
    }
    let output_tail = tail.into_iter().collect::<Vec<_>>().join("\n");
    if let Some(detail) = network_failure(&output_tail) {
        return Err(TemplateError::Network {
            stage: stage.to_string(),
            mirror: mirror.to_string(),
            detail: detail.to_string(),
        });
    }
    Err(TemplateError::BuildFailed {
        stage: stage.to_string(),
        status: status.to_string(),
        output_tail,
    })
}

fn spawn_line_reader(
    stream: impl Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if !line.is_empty() && tx.send(line).is_err() {
                break;
            }
        }
    })
}

/// The package name in debootstrap's `I: Retrieving <pkg> <version>` or apt's
/// `Get:<n> <uri> <suite>/<component> <arch> <pkg> <version> [<size>]` lines.
fn fetched_package(line: &str) -> Option<&str> {
    if let Some(rest) = line.strip_prefix("I: Retrieving ") {
        let name = rest.split_whitespace().next()?;
        // debootstrap also "retrieves" Release/Packages index files.
        let is_index = ["InRelease", "Release", "Release.gpg", "Packages"].contains(&name);
        return (!is_index).then_some(name);
    }
    if line.starts_with("Get:") {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Index downloads ("Get:1 http://… bookworm InRelease [151 kB]") have no arch field.
        if fields.len() >= 6 && ["amd64", "all", "arm64", "i386"].contains(&fields[3]) {
            return Some(fields[4]);
        }
    }
    None
}

/// A short reason if the output says the mirror could not be reached.
fn network_failure(output: &str) -> Option<&'static str> {
    const SIGNS: [(&str, &str); 8] = [
        ("Temporary failure resolving", "DNS lookup failed"),
        ("Could not resolve", "DNS lookup failed"),
        ("unable to resolve host", "DNS lookup failed"),
        (
            "Failed getting release file",
            "could not download the Release file",
        ),
        ("Couldn't download", "package download failed"),
        ("Network is unreachable", "network unreachable"),
        ("Connection refused", "connection refused"),
        ("Connection timed out", "connection timed out"),
    ];
    SIGNS
        .iter()
        .find(|(sign, _)| output.contains(sign))
        .map(|(_, reason)| *reason)
}

fn find_tool(name: &'static str, package: &'static str) -> Result<PathBuf, TemplateError> {
    let path_var = std::env::var("PATH").unwrap_or_default();
    path_var
        .split(':')
        .chain(BUILD_PATH.split(':'))
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or(TemplateError::ToolMissing {
            tool: name,
            package,
        })
}

/// Write `contents` at absolute `inner_path` inside `rootfs`, never following a symlink
/// out of it: every parent must be a real directory, and an existing file (or symlink)
/// at the target is replaced, not written through.
fn write_inside(
    rootfs: &Path,
    inner_path: &str,
    contents: &[u8],
    mode: u32,
) -> Result<(), TemplateError> {
    let relative = Path::new(inner_path)
        .strip_prefix("/")
        .map_err(|_| TemplateError::io("write", inner_path, invalid("path must be absolute")))?;
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(TemplateError::io(
            "write",
            inner_path,
            invalid("path must not contain '..'"),
        ));
    }
    let target = rootfs.join(relative);
    let mut dir = rootfs.to_path_buf();
    for component in relative.parent().into_iter().flat_map(Path::components) {
        dir.push(component);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(TemplateError::io(
                    "write",
                    &target,
                    invalid("a parent directory is a symlink"),
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir(&dir).ctx("create", &dir)?;
            }
            Err(e) => return Err(TemplateError::io("stat", &dir, e)),
        }
    }
    match fs::remove_file(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(TemplateError::io("remove", &target, e)),
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&target)
        .ctx("create", &target)?;
    std::io::Write::write_all(&mut file, contents).ctx("write", &target)?;
    // The umask may have masked bits off `mode` (e.g. 0o440 is safe, 0o755 may not be).
    fs::set_permissions(&target, fs::Permissions::from_mode(mode)).ctx("chmod", &target)?;
    Ok(())
}

fn invalid(message: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn recipe_changes_change_the_layer_id() {
        let recipe = BaseRecipe::default();
        assert_eq!(recipe.layer_id(), BaseRecipe::default().layer_id());

        let mut other_suite = recipe.clone();
        other_suite.suite = "trixie".into();
        assert_ne!(recipe.layer_id(), other_suite.layer_id());

        let mut more_packages = recipe.clone();
        for step in &mut more_packages.steps {
            if let SetupStep::AptInstall { packages } = step {
                packages.push("vim".into());
            }
        }
        assert_ne!(recipe.layer_id(), more_packages.layer_id());

        let mut other_mirror = recipe.clone();
        other_mirror.mirror = "http://mirror.example/debian".into();
        assert_ne!(recipe.layer_id(), other_mirror.layer_id());

        // Config is not part of the layer: changing it rewrites only the manifest.
        let mut other_config = recipe.clone();
        other_config.config.envs.insert("A".into(), "b".into());
        assert_eq!(recipe.layer_id(), other_config.layer_id());
    }

    #[test]
    fn default_recipe_installs_what_e2b_base_has() {
        let recipe = BaseRecipe::default();
        let packages: Vec<&str> = recipe
            .steps
            .iter()
            .flat_map(|s| match s {
                SetupStep::AptInstall { packages } => packages.iter().map(String::as_str).collect(),
                _ => Vec::new(),
            })
            .collect();
        for wanted in [
            "python3",
            "python3-pip",
            "python-is-python3",
            "nodejs",
            "npm",
            "git",
            "curl",
            "sudo",
        ] {
            assert!(packages.contains(&wanted), "{wanted} missing");
        }
        assert_eq!(recipe.config.default_user, "user");
        assert_eq!(recipe.config.default_workdir, "/home/user");
    }

    #[test]
    fn progress_parsing_counts_packages_not_indexes() {
        assert_eq!(fetched_package("I: Retrieving libc6 2.36-9"), Some("libc6"));
        assert_eq!(fetched_package("I: Retrieving InRelease "), None);
        assert_eq!(
            fetched_package(
                "Get:12 http://deb.debian.org/debian bookworm/main amd64 nodejs 18.19.0 [320 kB]"
            ),
            Some("nodejs")
        );
        assert_eq!(
            fetched_package("Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]"),
            None
        );
    }

    #[test]
    fn network_failures_are_recognised() {
        assert!(
            network_failure("E: Failed getting release file http://x/dists/bookworm/Release")
                .is_some()
        );
        assert!(network_failure("W: Temporary failure resolving 'deb.debian.org'").is_some());
        assert!(network_failure("dpkg: error processing package npm").is_none());
    }

    #[test]
    fn write_inside_refuses_to_escape_the_rootfs() {
        let root = std::env::temp_dir().join(format!("berth-write-inside-{}", std::process::id()));
        let outside =
            std::env::temp_dir().join(format!("berth-write-outside-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let _ = fs::remove_dir_all(&outside);
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        symlink(&outside, root.join("escape")).unwrap();
        symlink(outside.join("target"), root.join("etc/resolv.conf")).unwrap();

        // A symlinked parent is refused.
        assert!(write_inside(&root, "/escape/x", b"no", 0o644).is_err());
        // A symlink at the target is replaced, not written through.
        write_inside(&root, "/etc/resolv.conf", b"", 0o644).unwrap();
        assert!(!outside.join("target").exists());
        assert!(fs::symlink_metadata(root.join("etc/resolv.conf"))
            .unwrap()
            .is_file());
        // '..' is refused; missing parents are created; the mode is exact.
        assert!(write_inside(&root, "/etc/../../x", b"no", 0o644).is_err());
        write_inside(&root, "/etc/sudoers.d/user", b"user ALL\n", 0o440).unwrap();
        let meta = fs::metadata(root.join("etc/sudoers.d/user")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o440);

        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    }
}
