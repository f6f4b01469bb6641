//! `berth-launch`: the small single-threaded program that turns a freshly cloned process
//! into a sandbox's init, and (for tests and debugging) runs a command inside a sandbox.
//!
//! The daemon is multi-threaded, so it never does setup work in a forked child. Instead it
//! clones the child straight into new user/pid/mount/uts/ipc/net namespaces, and the child
//! only switches to the namespaced root uid and execs this program (`berth-launch init`,
//! control socket on fd 3). Everything else happens here, single-threaded:
//!
//! 1. receive the launch config and the idmapped template layer mounts (SCM_RIGHTS);
//! 2. mount the overlay root (inside the user namespace, so `userxattr`, and so writes
//!    through it are charged to namespaced root, which cannot bypass the disk limit),
//!    built from descriptors only: the detached layer and disk mounts are never
//!    attached anywhere, so the launcher needs no access to the state directory (root's
//!    alone) and the overlay's options in the sandbox's `mountinfo` name no host path;
//!    it is attached on the sandbox's root directory, which the cloned child opened at
//!    [`ROOT_FD`] while it still had the daemon's credentials;
//! 3. populate `/proc`, `/sys` (read-only), a minimal `/dev`, `/tmp`, `/run`, bind the
//!    init binary read-only at `/run/berth/<name>`, and attach the resource views over
//!    their `/proc` and `/sys` files;
//! 4. `pivot_root`, then mask `/proc` paths and make `/proc/sys` and friends read-only;
//!    mount the sandbox's own boot id over the host's;
//! 5. hostname, loopback up; wait for the daemon to have moved us into the sandbox's
//!    cgroups (it does so while we mount), then a new cgroup namespace and a new time
//!    namespace whose clocks start at zero (entered at exec);
//! 6. with [`LaunchConfig::init_listen`], bind and listen on the init's TCP address and
//!    leave the socket at [`INIT_LISTEN_FD`] (named by [`INIT_LISTEN_FD_ENV`]), so the
//!    daemon's first request after the start waits in its backlog while the init starts
//!    instead of being refused and retried;
//! 7. reduce the capability bounding set, install the seccomp filter, close every
//!    other inherited fd, and exec the init as namespaced root.
//!
//! Errors are sent back over the control socket; success shows as the socket closing on
//! exec (it is close-on-exec).

use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::sys::{
    self, cpath, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
};

/// Where the control socket sits in the launcher.
pub(crate) const CONTROL_FD: RawFd = 3;
/// Where the launcher finds the directory to attach the sandbox's root on (opened by the
/// cloned child before it became namespaced root: the state directory is root's alone).
pub(crate) const ROOT_FD: RawFd = 4;
/// Where the init finds the socket of [`LaunchConfig::init_listen`] (the root directory's
/// descriptor is long closed by then).
pub(crate) const INIT_LISTEN_FD: RawFd = 4;
/// Names [`INIT_LISTEN_FD`] in the init's environment when the launcher made that socket.
/// COMPATIBILITY: berth-envd reads this name (its `INHERITED_LISTENER_ENV`); both change
/// together or not at all.
pub const INIT_LISTEN_FD_ENV: &str = "BERTH_INIT_LISTEN_FD";
/// Largest config message accepted.
const MAX_CONFIG: usize = 64 * 1024;

/// Capabilities kept in the bounding set: Docker's default set minus NET_RAW and MKNOD
/// (neither is useful without host devices or raw access to a shared network).
const KEPT_CAPS: &[u32] = &[
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    18, // SYS_CHROOT
    29, // AUDIT_WRITE
    31, // SETFCAP
];

/// Files in /proc hidden behind /dev/null.
const MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/sysrq-trigger",
    "/proc/kallsyms",
];
/// Directories hidden behind a read-only bind of [`MASK_DIR`].
const MASKED_DIRS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Directories made read-only.
const READONLY_PATHS: &[&str] = &["/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"];
/// A directory of `/run`'s tmpfs holding the sandbox's boot id, bound over [`BOOT_ID`],
/// and the empty directory [`MASK_DIR`], covered by a read-only bind of itself: archived
/// with `/run` in a memory checkpoint (so a resume with memory keeps the id), drawn anew
/// at every fresh start, a filesystem-only resume included, as a reboot would. It is not
/// a tmpfs of its own because every tmpfs costs each checkpoint and each restore a `tar`
/// (and `gzip`) run, ~5 ms apiece on a 2-CPU host. A bind's source is a path CRIU
/// resolves again at restore, so it must be one the sandbox cannot delete or replace:
/// root inside, without CAP_SYS_ADMIN, can neither write through the read-only bind,
/// nor unmount it to reach the directory beneath, nor delete or move that mountpoint (a
/// rename of `/run/berth` is followed by CRIU, as for `/dev`'s source).
const BOOT_DIR: &str = "/run/berth/boot";
/// The empty directory of [`BOOT_DIR`] bound over each of [`MASKED_DIRS`].
const MASK_DIR: &str = "/run/berth/boot/masked";
/// The host's boot id, per host boot; the sandbox sees its own instead.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// Host device nodes bound into the sandbox's /dev.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Everything the launcher needs besides the layer fds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct LaunchConfig {
    pub hostname: String,
    /// How many template layers follow the disk among the mounts sent.
    pub layers: usize,
    /// Host path of the init binary (berth-envd).
    pub init_binary: PathBuf,
    pub init_args: Vec<String>,
    pub init_env: Vec<String>,
    /// Bind and listen on this TCP address inside the sandbox and hand the socket to the
    /// init at [`INIT_LISTEN_FD`], named by [`INIT_LISTEN_FD_ENV`].
    #[serde(default)]
    pub init_listen: Option<std::net::SocketAddrV4>,
    /// Size of the /tmp, /dev/shm and /run tmpfs mounts (charged to the memory cgroup).
    pub tmpfs_bytes: u64,
    /// The last mount sent is a read-only sysfs the daemon made in the sandbox's network
    /// namespace, to attach at /sys. Needed when that namespace belongs to the host
    /// (sandbox networking): sysfs may only be mounted by a holder of CAP_SYS_ADMIN over
    /// the network namespace's owner.
    #[serde(default)]
    pub host_sysfs: bool,
    /// With sandbox networking: the resolver written to /etc/resolv.conf at every start
    /// (the gateway; the host redirects every DNS query to berth's DNS server, so a
    /// template's loopback or empty resolv.conf must not stay).
    #[serde(default)]
    pub nameserver: Option<std::net::Ipv4Addr>,
    /// Where the volume mounts sent after the layers (and before the sysfs) are attached,
    /// in the same order: absolute paths inside the sandbox, created as needed.
    #[serde(default)]
    pub volume_paths: Vec<PathBuf>,
    /// Where the resource view mounts sent after the volumes (and before the sysfs) are
    /// attached, in the same order: files of the sandbox's `/proc` and `/sys` (see
    /// `views`).
    #[serde(default)]
    pub view_paths: Vec<PathBuf>,
    /// The egress proxy's interception CA (PEM), installed in the sandbox's system trust
    /// store at every start (see [`EGRESS_CA_FILE`]).
    #[serde(default)]
    pub egress_ca_pem: Option<String>,
}

/// Where the egress interception CA is written inside a sandbox (Debian's directory of
/// local CAs, so `update-ca-certificates` inside keeps it).
pub const EGRESS_CA_FILE: &str = "/usr/local/share/ca-certificates/berth-egress-ca.crt";
/// The system bundle the CA is appended to (OpenSSL's, curl's and Python's default).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Environment that points TLS clients at the bundle holding the egress CA: OpenSSL and
/// Python's `ssl` (`SSL_CERT_FILE`), `requests` (`REQUESTS_CA_BUNDLE`, else it uses
/// certifi's), curl (`CURL_CA_BUNDLE`) and Node (`NODE_EXTRA_CA_CERTS`, added to its
/// built-in roots).
pub fn egress_ca_env() -> Vec<String> {
    vec![
        format!("SSL_CERT_FILE={SYSTEM_CA_BUNDLE}"),
        format!("REQUESTS_CA_BUNDLE={SYSTEM_CA_BUNDLE}"),
        format!("CURL_CA_BUNDLE={SYSTEM_CA_BUNDLE}"),
        format!("NODE_EXTRA_CA_CERTS={EGRESS_CA_FILE}"),
    ]
}

/// Writes the CA file and appends the CA to the system bundle unless it is there already
/// (a resume or restart boots on a disk that has it).
fn install_egress_ca(pem: &str) -> io::Result<()> {
    let pem = format!("{}\n", pem.trim());
    let ca_file = Path::new(EGRESS_CA_FILE);
    if let Some(dir) = ca_file.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(ca_file, &pem)?;
    let bundle = Path::new(SYSTEM_CA_BUNDLE);
    if let Some(dir) = bundle.parent() {
        fs::create_dir_all(dir)?;
    }
    let current = match fs::read_to_string(bundle) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    if current.contains(pem.trim()) {
        return Ok(());
    }
    let separator = if current.is_empty() || current.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    fs::write(bundle, format!("{current}{separator}{pem}"))
}

/// Sends `config` and the mounts (the disk, the layers topmost first, the volumes, the
/// resource views, then the sysfs if any) over the control socket.
pub(crate) fn send_config(
    sock: BorrowedFd<'_>,
    config: &LaunchConfig,
    layers: &[OwnedFd],
) -> io::Result<()> {
    let bytes = serde_json::to_vec(config).map_err(io::Error::other)?;
    let fds: Vec<RawFd> = layers.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )?;
    Ok(())
}

fn recv_config(sock: BorrowedFd<'_>) -> io::Result<(LaunchConfig, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_CONFIG];
    let mut cmsg_space = nix::cmsg_space!([RawFd; 64]);
    let (len, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: SCM_RIGHTS just installed these fds in our table; we own them.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, fds)
    };
    let config = serde_json::from_slice(&buf[..len]).map_err(io::Error::other)?;
    Ok((config, fds))
}

/// The name the launcher is always invoked under (`argv[0]`).
pub const LAUNCHER_ARGV0: &str = "berth-launch";

/// For a daemon that is its own launcher (`launcher_binary` = its own executable): call
/// first thing in `main`; when the process was started as the launcher it runs it and
/// never returns, otherwise it returns at once.
pub fn run_if_launcher() {
    let invoked_as = std::env::args_os().next();
    let name = invoked_as
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name);
    if name == Some(OsStr::new(LAUNCHER_ARGV0)) {
        launcher_main()
    }
}

/// Entry point of the `berth-launch` binary.
pub fn launcher_main() -> ! {
    // The daemon's umask keeps its state root's alone; the sandbox's processes (and the
    // directories mounted over here) get the usual one.
    // SAFETY: umask(2) cannot fail.
    unsafe { libc::umask(0o022) };
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("init") => init_main(),
        Some("exec") => exec_main(&args[2..]),
        Some("check-dump") => crate::restorable::check_dump_main(&args[2..]),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "usage: berth-launch init | exec ... | check-dump ...",
        )),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("berth-launch: {e}");
            std::process::exit(125)
        }
    }
}

fn init_main() -> io::Result<i32> {
    // SAFETY: the daemon put the control socket at CONTROL_FD before exec; we own it now.
    let sock = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    // Close-on-exec from here on, so the daemon sees EOF exactly when the init is exec'd.
    nix::fcntl::fcntl(
        &sock,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let err = match recv_config(sock.as_fd())
        .and_then(|(config, layers)| become_init(&config, layers, sock.as_fd()))
    {
        Ok(never) => match never {},
        Err(e) => e,
    };
    let _ = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(err.to_string().as_bytes())],
        &[],
        MsgFlags::empty(),
        None,
    );
    Ok(1)
}

/// Context for an error: "what: cause".
fn ctx<T>(what: impl std::fmt::Display, r: io::Result<T>) -> io::Result<T> {
    r.map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = source.map(cpath).transpose()?;
    let tgt = cpath(target)?;
    let fst = fstype
        .map(CString::new)
        .transpose()
        .map_err(io::Error::other)?;
    let dat = data
        .map(CString::new)
        .transpose()
        .map_err(io::Error::other)?;
    // SAFETY: every pointer is null or a valid NUL-terminated string for the call.
    let ret = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            fst.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            dat.as_ref().map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("mount {}: {err}", target.display()),
        ));
    }
    Ok(())
}

fn bind(source: &Path, target: &Path) -> io::Result<()> {
    mount(Some(source), target, None, libc::MS_BIND, None)
}

/// Makes the mount at `path` read-only, nosuid, nodev and noexec.
fn seal_read_only(path: &Path) -> io::Result<()> {
    ctx(
        path.display(),
        sys::mount_setattr_flags(
            &cpath(path)?,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            0,
        ),
    )
}

fn touch(path: &Path) -> io::Result<()> {
    ctx(
        path.display(),
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map(drop),
    )
}

fn become_init(
    config: &LaunchConfig,
    mut layers: Vec<OwnedFd>,
    sock: BorrowedFd<'_>,
) -> io::Result<std::convert::Infallible> {
    let sysfs = if config.host_sysfs {
        layers.pop()
    } else {
        None
    };
    let views = layers.split_off(layers.len().saturating_sub(config.view_paths.len()));
    if views.len() != config.view_paths.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "view count does not match view paths",
        ));
    }
    let volumes = layers.split_off(layers.len().saturating_sub(config.volume_paths.len()));
    if volumes.len() != config.volume_paths.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "volume count does not match volume paths",
        ));
    }
    let filter = crate::seccomp::build_filter()?;
    // SAFETY: the daemon's child put the root directory at ROOT_FD before exec.
    let root_dir = unsafe { OwnedFd::from_raw_fd(ROOT_FD) };
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    mount_overlay(config, &layers, root_dir.as_fd())?;
    drop(layers);
    drop(root_dir);
    // The working directory is the overlay's root now.
    let root = Path::new(".");
    populate_root(config, root, sysfs)?;
    attach_views(config, root, views)?;
    pivot_into(root)?;
    // The masks bind a directory of the boot id's read-only directory.
    ctx("a boot id of the sandbox's own", own_boot_id())?;
    mask_paths()?;

    if let Some(nameserver) = config.nameserver {
        // After pivot_root: a symlinked resolv.conf resolves inside the sandbox.
        ctx(
            "write /etc/resolv.conf",
            fs::write("/etc/resolv.conf", format!("nameserver {nameserver}\n")),
        )?;
    }
    if let Some(pem) = &config.egress_ca_pem {
        ctx("install the egress CA", install_egress_ca(pem))?;
    }
    ctx(
        "sethostname",
        nix::unistd::sethostname(&config.hostname).map_err(io::Error::from),
    )?;
    ctx("loopback up", loopback_up())?;
    ctx("wait for cgroups", wait_for_cgroups(sock))?;
    // After pivot_root, so mount paths resolve inside the sandbox (never through a
    // symlink), and after the daemon's last byte is read, so an error here reaches it.
    for (volume, path) in volumes.iter().zip(&config.volume_paths) {
        ctx(
            format!("attach volume at {}", path.display()),
            attach_volume(volume.as_fd(), path),
        )?;
    }
    drop(volumes);
    // SAFETY: plain unshare(2); the daemon has moved us into the sandbox's cgroups.
    if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } < 0 {
        return ctx("unshare cgroup namespace", Err(io::Error::last_os_error()));
    }
    ctx("clocks of the sandbox's own", own_clocks())?;
    // SAFETY: plain setsid(2); we are PID 1 of our namespace and no group leader yet.
    unsafe { libc::setsid() };
    setup_stdio()?;
    reset_signals();
    // After the cgroup move, so the socket is charged to the sandbox.
    let listen_env = match config.init_listen {
        Some(addr) => {
            ctx(
                format!("listen on {addr} for the init"),
                listen_for_init(addr),
            )?;
            Some(format!("{INIT_LISTEN_FD_ENV}={INIT_LISTEN_FD}"))
        }
        None => None,
    };
    let exe_name = config.init_binary.file_name().unwrap_or(OsStr::new("init"));
    let exe = Path::new("/run/berth").join(exe_name);
    let argv = cstrings(
        std::iter::once(exe.as_os_str().as_bytes())
            .chain(config.init_args.iter().map(|a| a.as_bytes())),
    )?;
    let envp = cstrings(
        config
            .init_env
            .iter()
            .map(|e| e.as_bytes())
            .chain(listen_env.iter().map(|e| e.as_bytes())),
    )?;
    harden(&filter)?;
    // Everything but stdio (and the init's socket) goes; the control socket is
    // close-on-exec and still reports errors.
    let first_closed = match listen_env {
        Some(_) => INIT_LISTEN_FD + 1,
        None => CONTROL_FD + 1,
    };
    sys::close_range_from(first_closed as u32, 0)?;
    let path = cpath(&exe)?;
    exec(&path, &argv, &envp)
}

/// A TCP socket listening on `addr` in the sandbox's network namespace, left at
/// [`INIT_LISTEN_FD`] without close-on-exec for the init to take over.
fn listen_for_init(addr: std::net::SocketAddrV4) -> io::Result<()> {
    let listener = OwnedFd::from(std::net::TcpListener::bind(addr)?);
    if listener.as_raw_fd() == INIT_LISTEN_FD {
        // std made it close-on-exec; a dup2 copy would not be, this one is cleared.
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(INIT_LISTEN_FD, libc::F_SETFD, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let _stays_open_for_the_init = listener.into_raw_fd();
        return Ok(());
    }
    // SAFETY: dup2 of our own socket onto a number nothing of ours holds (the root
    // directory's descriptor there was closed after the pivot); `listener` closes after.
    if unsafe { libc::dup2(listener.as_raw_fd(), INIT_LISTEN_FD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for the daemon's byte saying we are in the sandbox's cgroups.
fn wait_for_cgroups(sock: BorrowedFd<'_>) -> io::Result<()> {
    let mut byte = [0u8; 1];
    match nix::sys::socket::recv(sock.as_raw_fd(), &mut byte, MsgFlags::empty())? {
        1 if byte[0] == b'c' => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "daemon went away",
        )),
    }
}

fn cstrings<'a>(items: impl Iterator<Item = &'a [u8]>) -> io::Result<Vec<CString>> {
    items
        .map(|b| CString::new(b).map_err(io::Error::other))
        .collect()
}

fn exec(
    path: &CString,
    argv: &[CString],
    envp: &[CString],
) -> io::Result<std::convert::Infallible> {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: NUL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    Err(io::Error::new(
        io::Error::last_os_error().kind(),
        format!(
            "execve {}: {}",
            path.to_string_lossy(),
            io::Error::last_os_error()
        ),
    ))
}

/// `mounts` is the sandbox's disk followed by the layers, topmost first. overlayfs takes
/// layers only from the mounter's own mount namespace, so they are attached first, on
/// a scratch tmpfs laid on `root_dir` (the launcher never walks the state directory),
/// and named relative to it: the overlay's options (shown in the sandbox's
/// `mountinfo`) are `lowerdir+=l0,…,upperdir=d/upper,workdir=d/work`, no host path.
/// The overlay is attached on the scratch's `r` and becomes the working directory;
/// the scratch goes with the old root at `pivot_root`.
fn mount_overlay(
    config: &LaunchConfig,
    mounts: &[OwnedFd],
    root_dir: BorrowedFd<'_>,
) -> io::Result<()> {
    let Some((disk, layers)) = mounts.split_first() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no disk mount received",
        ));
    };
    if layers.len() != config.layers {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "layer count does not match the config",
        ));
    }
    let scratch = ctx("fsopen tmpfs", FsContext::open(c"tmpfs"))?;
    ctx("scratch mode", scratch.set_string(c"mode", c"0700"))?;
    let scratch = ctx("scratch tmpfs", scratch.create_mount(MOUNT_ATTR_NODEV))?;
    ctx(
        "attach scratch",
        sys::move_mount_onto(scratch.as_fd(), root_dir),
    )?;
    ctx("enter scratch", sys::fchdir(scratch.as_fd()))?;
    ctx("create d", fs::create_dir("d"))?;
    ctx("attach disk", sys::move_mount_to(disk.as_fd(), c"d"))?;
    let fsc = ctx("fsopen overlay", FsContext::open(c"overlay"))?;
    for (i, layer) in layers.iter().enumerate() {
        let name = CString::new(format!("l{i}")).map_err(io::Error::other)?;
        ctx(
            "create layer dir",
            fs::create_dir(OsStr::from_bytes(name.as_bytes())),
        )?;
        ctx("attach layer", sys::move_mount_to(layer.as_fd(), &name))?;
        ctx("overlay lowerdir+", fsc.set_string(c"lowerdir+", &name))?;
    }
    ctx("overlay upperdir", fsc.set_string(c"upperdir", c"d/upper"))?;
    ctx("overlay workdir", fsc.set_string(c"workdir", c"d/work"))?;
    ctx("overlay userxattr", fsc.set_flag(c"userxattr"))?;
    let mnt = ctx("overlay create", fsc.create_mount(MOUNT_ATTR_NODEV))?;
    ctx("create r", fs::create_dir("r"))?;
    ctx(
        "move overlay into place",
        sys::move_mount_to(mnt.as_fd(), c"r"),
    )?;
    ctx("enter the overlay", sys::fchdir(mnt.as_fd()))
}

fn populate_root(config: &LaunchConfig, root: &Path, sysfs: Option<OwnedFd>) -> io::Result<()> {
    let nosuid_nodev_noexec = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let size = config.tmpfs_bytes;
    ensure_dir(&root.join("proc"))?;
    mount(
        Some(Path::new("proc")),
        &root.join("proc"),
        Some("proc"),
        nosuid_nodev_noexec,
        None,
    )?;
    ensure_dir(&root.join("sys"))?;
    match sysfs {
        Some(sysfs) => ctx(
            "attach sysfs",
            sys::move_mount_to(sysfs.as_fd(), &cpath(&root.join("sys"))?),
        )?,
        None => mount(
            Some(Path::new("sysfs")),
            &root.join("sys"),
            Some("sysfs"),
            nosuid_nodev_noexec | libc::MS_RDONLY,
            None,
        )?,
    }

    let run = root.join("run");
    ensure_dir(&run)?;
    mount(
        Some(Path::new("tmpfs")),
        &run,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&format!("mode=755,size={size}")),
    )?;
    make_dir(&run.join("shm"), 0o1777)?;
    fs::create_dir(run.join("berth"))?;

    // /dev is a directory of /run's tmpfs too, bound noexec (nosuid and nodev come with
    // /run's): one archive fewer per checkpoint and restore (see `BOOT_DIR`). Root inside
    // cannot delete it, the source of the bind a restore makes again: it holds the
    // device mountpoints, which no one can remove; a rename is followed by CRIU.
    let dev = root.join("dev");
    ensure_dir(&dev)?;
    let dev_source = run.join("berth").join("dev");
    make_dir(&dev_source, 0o755)?;
    bind(&dev_source, &dev)?;
    ctx(
        "/dev nosuid, noexec",
        sys::mount_setattr_flags(&cpath(&dev)?, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, 0),
    )?;
    for name in DEVICES {
        let target = dev.join(name);
        touch(&target)?;
        bind(&Path::new("/dev").join(name), &target)?;
    }
    fs::create_dir(dev.join("pts"))?;
    mount(
        Some(Path::new("devpts")),
        &dev.join("pts"),
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    // /dev/shm is a directory of /run's tmpfs as well, not a tmpfs of its own.
    fs::create_dir(dev.join("shm"))?;
    bind(&run.join("shm"), &dev.join("shm"))?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link))?;
    }

    // /tmp is the image's directory on the sandbox's disk, as in an E2B sandbox (and a
    // Docker build): sized by the disk, not the memory limit, and a pause archives
    // nothing of it (a tmpfs costs every checkpoint a gzipped tar of its contents).
    if !root.join("tmp").is_dir() {
        make_dir(&root.join("tmp"), 0o1777)?;
    }
    let berth_dir = run.join("berth");
    let exe_name = config.init_binary.file_name().unwrap_or(OsStr::new("init"));
    let exe = berth_dir.join(exe_name);
    touch(&exe)?;
    bind(&config.init_binary, &exe)?;
    ctx(
        "init binary read-only",
        sys::mount_setattr_flags(&cpath(&exe)?, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV, 0),
    )?;
    Ok(())
}

/// Attaches each resource view (a read-only clone of an LXCFS file) over the file of the
/// sandbox's fresh `/proc` or `/sys` at its path, so every process inside reads the
/// sandbox's numbers there (see `views`).
fn attach_views(config: &LaunchConfig, root: &Path, views: Vec<OwnedFd>) -> io::Result<()> {
    for (view, path) in views.iter().zip(&config.view_paths) {
        let target = root.join(path.strip_prefix("/").unwrap_or(path));
        ctx(
            format!("attach the view of {}", path.display()),
            sys::move_mount_to(view.as_fd(), &cpath(&target)?),
        )?;
    }
    Ok(())
}

/// Attaches the volume mount at absolute `path`, creating missing directories (mode 0755)
/// on the way; a symlink anywhere on the path is refused, so the mount can never land
/// outside the place the path names.
fn attach_volume(volume: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::{mkdirat, Mode};
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dir: OwnedFd = openat(nix::fcntl::AT_FDCWD, "/", flags, Mode::empty())?;
    for part in crate::volume::relative_components(path)? {
        match mkdirat(&dir, part, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = openat(&dir, part, flags, Mode::empty()).map_err(|e| match e {
            nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{:?} on the way is a symlink or not a directory", part),
            ),
            e => e.into(),
        })?;
    }
    sys::move_mount_onto(volume, dir.as_fd())
}

/// Creates directory `path` with exactly `mode` (no umask).
fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    ctx(path.display(), fs::create_dir(path))?;
    ctx(
        path.display(),
        fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)),
    )
}

fn ensure_dir(path: &Path) -> io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => ctx(path.display(), other),
    }
}

fn pivot_into(root: &Path) -> io::Result<()> {
    ctx("chdir new root", std::env::set_current_dir(root))?;
    // SAFETY: pivot_root(".", ".") stacks the old root on top of the new one; both args valid.
    if unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) } < 0 {
        return ctx("pivot_root", Err(io::Error::last_os_error()));
    }
    // SAFETY: detach the old root that now sits on top of "/".
    if unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } < 0 {
        return ctx("detach old root", Err(io::Error::last_os_error()));
    }
    ctx("chdir /", std::env::set_current_dir("/"))
}

/// Makes [`BOOT_DIR`] in `/run`'s tmpfs with a new random id and [`MASK_DIR`], binds
/// it read-only over itself, and binds the id over [`BOOT_ID`].
fn own_boot_id() -> io::Result<()> {
    let dir = Path::new(BOOT_DIR);
    make_dir(dir, 0o755)?;
    make_dir(Path::new(MASK_DIR), 0o555)?;
    // procfs draws a new random UUID at every read of this file.
    let id = ctx(
        "read a random uuid",
        fs::read_to_string("/proc/sys/kernel/random/uuid"),
    )?;
    let file = dir.join("boot_id");
    ctx(file.display(), fs::write(&file, id))?;
    ctx(
        file.display(),
        fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o444)),
    )?;
    // The read-only bind covers the directory: no path inside reaches it writable.
    bind(dir, dir)?;
    seal_read_only(dir)?;
    bind(&file, Path::new(BOOT_ID))?;
    seal_read_only(Path::new(BOOT_ID))
}

/// Enters a new time namespace (at exec: the kernel moves a process into the namespace
/// it made for its children when it execs) whose monotonic and boot clocks start at
/// zero now, so `uptime` counts from the sandbox's boot. CRIU archives the namespace's
/// offsets with a memory checkpoint and restores them so both clocks go on from where
/// they stood; a fresh start gets clocks from zero again.
fn own_clocks() -> io::Result<()> {
    // SAFETY: plain unshare(2); as namespaced root we hold CAP_SYS_ADMIN over our
    // user namespace, which owns the new time namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWTIME) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut offsets = String::new();
    for (name, clock) in [
        ("monotonic", libc::CLOCK_MONOTONIC),
        ("boottime", libc::CLOCK_BOOTTIME),
    ] {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime(2) writes the timespec we own.
        if unsafe { libc::clock_gettime(clock, &mut now) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // Whole seconds back: the clock restarts below one second, never negative
        // (which the kernel refuses).
        offsets.push_str(&format!("{name} {} 0\n", -now.tv_sec));
    }
    // One write: the offsets are fixed once a process has entered the namespace.
    ctx(
        "write /proc/self/timens_offsets",
        fs::write("/proc/self/timens_offsets", offsets),
    )
}

fn mask_paths() -> io::Result<()> {
    for path in MASKED_FILES.iter().map(Path::new).filter(|p| p.exists()) {
        bind(Path::new("/dev/null"), path)?;
    }
    for path in MASKED_DIRS.iter().map(Path::new).filter(|p| p.exists()) {
        bind(Path::new(MASK_DIR), path)?;
        seal_read_only(path)?;
    }
    for path in READONLY_PATHS.iter().map(Path::new).filter(|p| p.exists()) {
        mount(Some(path), path, None, libc::MS_BIND | libc::MS_REC, None)?;
        seal_read_only(path)?;
    }
    Ok(())
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: we own the fresh fd.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; zeroed is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: valid socket and ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        // A namespace the host made (sandbox networking) has lo up already, and the
        // sandbox's root has no CAP_NET_ADMIN over it.
        if req.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short != 0 {
            return Ok(());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn setup_stdio() -> io::Result<()> {
    let null = fs::OpenOptions::new().read(true).open("/dev/null")?;
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/run/berth/init.log")?;
    for (src, dst) in [
        (null.as_raw_fd(), 0),
        (log.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
    ] {
        // SAFETY: dup2 onto the standard descriptors.
        if unsafe { libc::dup2(src, dst) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Default dispositions and an empty signal mask for the init (the daemon's are inherited).
fn reset_signals() {
    // SAFETY: sigset operations on a local set; signal(2) with SIG_DFL is always valid.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

/// Drops every capability outside [`KEPT_CAPS`] from the bounding set and installs seccomp.
fn harden(filter: &[libc::sock_filter]) -> io::Result<()> {
    let last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in (0..=last_cap).filter(|c| !KEPT_CAPS.contains(c)) {
        // SAFETY: plain prctl(2).
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            return ctx(
                format!("drop capability {cap}"),
                Err(io::Error::last_os_error()),
            );
        }
    }
    ctx("install seccomp filter", crate::seccomp::install(filter))
}

/// `berth-launch exec --pid PID [--cgroup DIR]... [--uid N] [--gid N] [--cwd DIR] [--env K=V]... -- CMD ARGS...`
///
/// Joins every namespace of the sandbox whose init is host pid PID (and its cgroups),
/// applies the same hardening as the init, and runs CMD as uid/gid N inside. Exits with
/// CMD's status. A test and debugging aid; the control plane runs commands through envd.
fn exec_main(args: &[String]) -> io::Result<i32> {
    let mut pid: Option<i32> = None;
    let (mut uid, mut gid) = (0u32, 0u32);
    let mut cgroups = Vec::new();
    let mut env = Vec::new();
    let mut cwd = String::from("/");
    let mut it = args.iter();
    let mut command = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next().cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{arg} needs a value"))
            })
        };
        match arg.as_str() {
            "--pid" => pid = value()?.parse().ok(),
            "--uid" => uid = value()?.parse().map_err(io::Error::other)?,
            "--gid" => gid = value()?.parse().map_err(io::Error::other)?,
            "--cgroup" => cgroups.push(value()?),
            "--env" => env.push(value()?),
            "--cwd" => cwd = value()?,
            "--" => {
                command.extend(it.by_ref().cloned());
                break;
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown argument {other}"),
                ))
            }
        }
    }
    let pid =
        pid.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "--pid is required"))?;
    if command.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    }
    let filter = crate::seccomp::build_filter()?;
    let pidfd = ctx("pidfd_open", sys::pidfd_open(pid))?;
    let me = std::process::id().to_string();
    for dir in &cgroups {
        ctx(
            format!("join cgroup {dir}"),
            fs::write(Path::new(dir).join("cgroup.procs"), &me),
        )?;
    }
    let all = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWCGROUP
        | libc::CLONE_NEWTIME;
    ctx("setns", sys::setns(pidfd.as_fd(), all))?;
    drop(pidfd);
    let argv = cstrings(command.iter().map(|a| a.as_bytes()))?;
    let envp = cstrings(env.iter().map(|e| e.as_bytes()))?;
    let cwd = CString::new(cwd).map_err(io::Error::other)?;
    // SAFETY: we are single-threaded, so the child may do anything before exec.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            let err = exec_child(&filter, uid, gid, &cwd, &argv, &envp).unwrap_err();
            eprintln!("berth-launch exec: {err}");
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(126) }
        }
        child => {
            let mut status = 0;
            // SAFETY: waiting for our own child.
            if unsafe { libc::waitpid(child, &mut status, 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            })
        }
    }
}

fn exec_child(
    filter: &[libc::sock_filter],
    uid: u32,
    gid: u32,
    cwd: &CString,
    argv: &[CString],
    envp: &[CString],
) -> io::Result<std::convert::Infallible> {
    // SAFETY: chdir with a valid C string.
    if unsafe { libc::chdir(cwd.as_ptr()) } < 0 {
        return ctx("chdir", Err(io::Error::last_os_error()));
    }
    reset_signals();
    harden(filter)?;
    let groups = [gid];
    // SAFETY: plain credential syscalls with valid pointers.
    unsafe {
        if libc::setgroups(1, groups.as_ptr()) < 0
            || libc::setresgid(gid, gid, gid) < 0
            || libc::setresuid(uid, uid, uid) < 0
        {
            return ctx("switch user", Err(io::Error::last_os_error()));
        }
    }
    sys::close_range_from(3, 0)?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: NUL-terminated arrays of valid C strings; execvpe searches PATH from envp.
    unsafe { libc::execvpe(argv[0].as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    ctx(
        format!("exec {}", argv[0].to_string_lossy()),
        Err(io::Error::last_os_error()),
    )
}
