//! `berth-bench checkpoint`: stateful sandboxes through `LinuxRuntime` — pause with memory
//! and resume at several resident sizes, `checkpoint()` sizes, fork (one checkpoint, N
//! restores with bounded parallelism) — beside the floor: the raw `criu dump` and
//! `criu restore` command lines berth runs, replayed by hand against a sandbox of the same
//! shape.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use berth_checkpoint::Criu;
use berth_runtime::{LinuxRuntime, Runtime, SandboxSpec};

use crate::sandboxes::SandboxBench;
use crate::stats::{ms, run_concurrently, Samples};

#[derive(clap::Args)]
pub struct CheckpointArgs {
    /// Pause/resume (and floor) iterations per memory size.
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    /// Resident memory (MiB) held by a process in the sandbox.
    #[arg(long, value_delimiter = ',', default_value = "1,64,512")]
    sizes: Vec<u32>,
    /// Forks per round (one checkpoint, then this many restores).
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    forks: Vec<usize>,
    /// Resident memory (MiB) of the sandbox that is forked.
    #[arg(long, default_value_t = 64)]
    fork_mib: u32,
    /// Restores running at once during a fork (the control plane's limit).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// berth state dir holding the template cache (`base` is built there if missing).
    #[arg(long, default_value = berth_template::DEFAULT_STATE_DIR)]
    templates: PathBuf,
    /// State dir whose `criu/` holds berth's CRIU (provisioned there if needed).
    #[arg(long, default_value = berth_template::DEFAULT_STATE_DIR)]
    criu_state_dir: PathBuf,
    /// Scratch state dir (default /tmp/berth-bench-checkpoint-<pid>); removed at the end.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// berth-envd binary (default: next to this executable).
    #[arg(long)]
    envd: Option<PathBuf>,
    /// berth-launch binary (default: next to this executable).
    #[arg(long)]
    launcher: Option<PathBuf>,
    /// Give the sandboxes networking (as `berth up` does by default): the netns stays
    /// pinned across pause, CRIU runs inside it.
    #[arg(long)]
    pub network: bool,
}

/// The sandbox's memory limit must leave room for the holder, python and envd.
fn memory_mb_for(mib: u32) -> u64 {
    crate::sandboxes::MEMORY_MB.max(u64::from(mib) * 2)
}

/// A process holding `argv[1]` MiB only in its memory; writes /root/ready once it does.
const HOLDER: &str = r#"
import os, sys, time
ballast = bytearray(os.urandom(1 << 20)) * int(sys.argv[1])
open('/root/ready', 'w').close()
while True:
    time.sleep(3600)
"#;

/// Results at one resident size.
#[derive(Default)]
struct SizeResult {
    mib: u32,
    pause: Samples,
    resume: Samples,
    checkpoint: Samples,
    raw_dump: Samples,
    raw_restore: Samples,
    /// Preparing the root by hand for the raw restore (not part of the floor).
    root_prep: Samples,
    pause_images: Vec<u64>,
    raw_images: Vec<u64>,
    checkpoint_size: Vec<u64>,
    checkpoint_images: Vec<u64>,
    /// Memory cgroup usage of the sandbox with the holder up, before the first pause.
    cgroup_usage: u64,
}

struct ForkResult {
    count: usize,
    checkpoint: Duration,
    checkpoint_size: u64,
    restores_wall: Duration,
    restores: Samples,
    kill_all: Duration,
}

pub fn run(args: &CheckpointArgs) -> anyhow::Result<()> {
    let load_start = loadavg();
    let started = Instant::now();
    let store = berth_template::TemplateStore::open(&args.templates)?;
    let base = store.ensure_base(|event| eprintln!("base: {event:?}"))?;
    let criu = Criu::ensure(&args.criu_state_dir, |p| eprintln!("{p}"))
        .map_err(|e| anyhow!("CRIU: {e}"))?;
    let (envd, launcher) = crate::binaries(args.envd.as_deref(), args.launcher.as_deref())?;
    let state_dir = args.state_dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "/tmp/berth-bench-checkpoint-{}",
            std::process::id()
        ))
    });
    let max_forks = args.forks.iter().copied().max().unwrap_or(0);
    let bench = SandboxBench::new(
        &state_dir,
        &envd,
        &launcher,
        base.layers.clone(),
        max_forks as u32 + 16,
        Some(&args.criu_state_dir),
        args.network,
    )?;
    let scratch = state_dir.join("bench");
    fs::create_dir_all(&scratch)?;

    let mut sizes = Vec::new();
    for &mib in &args.sizes {
        eprintln!("{mib} MiB: pause/resume, checkpoint, raw CRIU floor");
        sizes.push(measure_size(&bench, &criu, &scratch, mib, args.iterations)?);
    }
    let mut forks = Vec::new();
    if !args.forks.is_empty() {
        forks = measure_forks(&bench, &scratch, args)?;
    }
    let load_end = loadavg();
    print_report(
        args,
        &criu,
        &sizes,
        &forks,
        &load_start,
        &load_end,
        started.elapsed(),
    );
    Ok(())
}

/// Create a sandbox with a holder of `mib` MiB up; returns its id.
fn start_with_holder(bench: &SandboxBench, tag: &str, mib: u32) -> anyhow::Result<String> {
    let (id, _) = bench.start_sized(tag, memory_mb_for(mib))?;
    let script = format!(
        "cat > /root/holder.py <<'EOF'\n{HOLDER}\nEOF\n\
         setsid python3 /root/holder.py {mib} </dev/null >/dev/null 2>&1 &\n\
         i=0; while [ ! -e /root/ready ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done\n\
         test -e /root/ready"
    );
    sh(bench.runtime(), &id, &script).with_context(|| format!("start holder in {id}"))?;
    Ok(id)
}

/// Runs `script` as root in sandbox `id`; fails unless it exits 0.
fn sh(rt: &LinuxRuntime, id: &str, script: &str) -> anyhow::Result<()> {
    let out = rt
        .exec_command(id, 0, 0, &["/bin/sh", "-c", script])?
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!(
            "{id}: script failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn measure_size(
    bench: &SandboxBench,
    criu: &Criu,
    scratch: &Path,
    mib: u32,
    iterations: usize,
) -> anyhow::Result<SizeResult> {
    let rt = bench.runtime();
    let mut r = SizeResult {
        mib,
        ..SizeResult::default()
    };
    let id = start_with_holder(bench, &format!("p{mib}"), mib)?;
    r.cgroup_usage = rt.stats(&id)?.mem_used;
    let init = rt
        .list()
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| anyhow!("{id} not listed"))?;
    let uid_base = uid_base_of(init.init_pid)?;
    let dir = state_sandbox_dir(rt, &id);
    let images = dir.join("checkpoint");
    for i in 0..iterations {
        // checkpoint(): the sandbox keeps running; timed and measured, then deleted.
        let dest = scratch.join(format!("ckpt-{mib}-{i}"));
        let guard = RemoveDir(dest.clone());
        let t = Instant::now();
        let info =
            rt.checkpoint_into(&rt.criu()?, &id, &dest, berth_runtime::Durability::Durable)?;
        r.checkpoint.durations.push(t.elapsed());
        r.checkpoint_size.push(info.size_bytes);
        r.checkpoint_images
            .push(allocated_bytes(&dest.join("images"))?);
        drop(guard);

        let t = Instant::now();
        rt.pause(&id, true)?;
        r.pause.durations.push(t.elapsed());
        r.pause_images.push(allocated_bytes(&images)?);

        // The floor's restore: the same `criu restore` onto a root prepared by hand,
        // from the paused sandbox's own images (only read), then the tree is killed and
        // the sandbox is still paused for berth's resume.
        let work = scratch.join(format!("restore-{mib}-{i}"));
        let _work_guard = RemoveDir(work.clone());
        let floor = raw_restore(criu, &dir, &images, &init.spec.layers, uid_base, &work)
            .with_context(|| format!("raw criu restore of {id}"))?;
        r.root_prep.durations.push(floor.prep);
        r.raw_restore.durations.push(floor.criu);

        let t = Instant::now();
        let resumed = rt.resume(&id, true)?;
        r.resume.durations.push(t.elapsed());
        if !resumed.memory_restored {
            bail!("{id}: resume did not restore memory");
        }
    }
    // The holder (and its memory) came through every pause and resume.
    sh(rt, &id, "pgrep -f holder.py >/dev/null").context("holder lost after resume")?;
    bench.kill(&id)?;

    // The floor's dump: berth's exact `criu dump` command line against a fresh sandbox
    // of the same shape each time (the dump kills the tree, as a pause does).
    for i in 0..iterations {
        let id = start_with_holder(bench, &format!("d{mib}-{i}"), mib)?;
        let pid = rt
            .list()
            .into_iter()
            .find(|s| s.id == id)
            .map(|s| s.init_pid)
            .ok_or_else(|| anyhow!("{id} not listed"))?;
        let images = scratch.join(format!("dump-{mib}-{i}"));
        let guard = RemoveDir(images.clone());
        fs::create_dir(&images)?;
        let t = Instant::now();
        let status = raw_dump_command(criu, pid, &images).status()?;
        let elapsed = t.elapsed();
        if !status.success() {
            bail!(
                "raw criu dump of {id} failed ({status}): {}",
                log_errors(&images.join("dump.log"))
            );
        }
        r.raw_dump.durations.push(elapsed);
        r.raw_images.push(allocated_bytes(&images)?);
        drop(guard);
        bench.kill(&id)?;
    }
    Ok(r)
}

fn measure_forks(
    bench: &SandboxBench,
    scratch: &Path,
    args: &CheckpointArgs,
) -> anyhow::Result<Vec<ForkResult>> {
    let rt = bench.runtime();
    let source = start_with_holder(bench, "fsrc", args.fork_mib)?;
    let mut results = Vec::new();
    for &count in &args.forks {
        eprintln!("fork x{count}");
        let dest = scratch.join(format!("fork-{count}"));
        let _guard = RemoveDir(dest.clone());
        let t = Instant::now();
        let info = rt.checkpoint_into(
            &rt.criu()?,
            &source,
            &dest,
            berth_runtime::Durability::Transient,
        )?;
        let checkpoint = t.elapsed();
        let forks = Mutex::new(Vec::new());
        let t = Instant::now();
        let restores = run_concurrently(args.parallel, count, |i| {
            let id = bench.sandbox_id(&format!("f{count}-{i}"));
            // What `Runtime::restore` does with memory; called directly so the bench
            // does not depend on the trait's exact signature.
            let t = Instant::now();
            let source = LinuxRuntime::read_checkpoint(&dest)?;
            let spec = SandboxSpec {
                id: id.clone(),
                template: source.template,
                layers: source.layers,
                cpu_count: source.cpu_count,
                memory_mb: source.memory_mb,
                disk_size_mb: source.disk_size_mb,
                volumes: Vec::new(),
            };
            rt.restore_checkpoint(&rt.criu()?, &dest, &spec)?;
            let elapsed = t.elapsed();
            bench.track(&id);
            forks.lock().unwrap_or_else(|e| e.into_inner()).push(id);
            Ok(elapsed)
        });
        let restores_wall = t.elapsed();
        let forks = forks.into_inner().unwrap_or_else(|e| e.into_inner());
        // A fork is only a fork if the holder's memory came with it.
        if let Some(first) = forks.first() {
            sh(rt, first, "pgrep -f holder.py >/dev/null").context("holder missing in fork")?;
        }
        let t = Instant::now();
        for id in &forks {
            bench.kill(id)?;
        }
        let kill_all = t.elapsed();
        results.push(ForkResult {
            count,
            checkpoint,
            checkpoint_size: info.size_bytes,
            restores_wall,
            restores,
            kill_all,
        });
    }
    bench.kill(&source)?;
    Ok(results)
}

/// berth's dump command line (`berth_checkpoint::Criu::dump`, as `pause` runs it).
fn raw_dump_command(criu: &Criu, pid: i32, images: &Path) -> Command {
    let mut cmd = criu.sandbox_command();
    cmd.arg("dump")
        .arg("--tree")
        .arg(pid.to_string())
        .arg("--images-dir")
        .arg(images)
        .args(["--log-file", "dump.log", "--network-lock", "skip"])
        .args(["--external", "mnt[]", "--tcp-established", "--file-locks"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

struct RawRestore {
    prep: Duration,
    criu: Duration,
}

/// berth's restore command line (`berth_checkpoint::Criu::restore`, as `resume` runs it)
/// onto the root `resume` builds, mounted here by hand at the same paths: each layer
/// idmapped to the sandbox's range, the disk image on a loop device, an overlay with
/// `userxattr`. The restored tree is killed and every mount of it gone before returning.
fn raw_restore(
    criu: &Criu,
    dir: &Path,
    images: &Path,
    layers: &[PathBuf],
    uid_base: u32,
    work: &Path,
) -> anyhow::Result<RawRestore> {
    let disk_image = dir.join("disk.img");
    // The paused sandbox's disk must be released before it is mounted again.
    wait_loop_released(&disk_image)?;
    fs::create_dir_all(work)?;
    let t = Instant::now();
    let root = HandRoot::mount(dir, layers, uid_base)?;
    let prep = t.elapsed();
    let pidfile = work.join("restore.pid");
    let log = work.join("restore.log");
    let mut cmd = criu.sandbox_command();
    cmd.arg("restore")
        .arg("--restore-detached")
        .arg("--images-dir")
        .arg(images)
        .arg("--work-dir")
        .arg(work)
        .arg("--log-file")
        .arg(&log)
        .arg("--pidfile")
        .arg(&pidfile)
        .args(["--external", "mnt[]", "--tcp-close", "--file-locks"])
        .arg("--root")
        .arg(dir.join("root"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    let status = cmd.status()?;
    let elapsed = t.elapsed();
    // The restored namespace holds its own copies of the mounts.
    drop(root);
    let pid = fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    if let Some(pid) = pid {
        kill_tree(pid)?;
    }
    if !status.success() || pid.is_none() {
        bail!("criu restore failed ({status}): {}", log_errors(&log));
    }
    wait_loop_released(&disk_image)?;
    Ok(RawRestore {
        prep,
        criu: elapsed,
    })
}

/// Root mounts made for a raw restore; detached on drop.
struct HandRoot {
    attached: Vec<PathBuf>,
}

impl HandRoot {
    fn mount(dir: &Path, layers: &[PathBuf], uid_base: u32) -> anyhow::Result<HandRoot> {
        let mut root = HandRoot {
            attached: Vec::new(),
        };
        let userns = UsernsHolder::spawn(uid_base)?;
        let mut lower = Vec::new();
        // Topmost layer first, at the mountpoints berth's resume uses.
        for (i, layer) in layers.iter().rev().enumerate() {
            let target = dir.join("layers").join(i.to_string());
            fs::create_dir_all(&target)?;
            idmapped_bind(layer, &target, &userns.ns)
                .with_context(|| format!("idmap {}", layer.display()))?;
            root.attached.push(target.clone());
            lower.push(target.display().to_string());
        }
        drop(userns);
        let disk = dir.join("disk");
        fs::create_dir_all(&disk)?;
        run_ok(Command::new("mount").args(["-t", "ext4", "-o"]).args([
            "loop,discard,noinit_itable,nosuid,nodev,noatime",
            &dir.join("disk.img").display().to_string(),
            &disk.display().to_string(),
        ]))?;
        root.attached.push(disk.clone());
        let target = dir.join("root");
        fs::create_dir_all(&target)?;
        let options = format!(
            "lowerdir={},upperdir={},workdir={},userxattr,nodev",
            lower.join(":"),
            disk.join("upper").display(),
            disk.join("work").display()
        );
        run_ok(Command::new("mount").args([
            "-t",
            "overlay",
            "overlay",
            "-o",
            &options,
            &target.display().to_string(),
        ]))?;
        root.attached.push(target);
        Ok(root)
    }
}

impl Drop for HandRoot {
    fn drop(&mut self) {
        for target in self.attached.iter().rev() {
            let Ok(path) = CString::new(target.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: umount2 with a valid NUL-terminated path.
            if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
                eprintln!(
                    "cleanup: umount {}: {}",
                    target.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

fn run_ok(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A user namespace mapping 0..65536 to `uid_base..`, held by a `sleep` child (killed on
/// drop) so its fd can idmap mounts.
struct UsernsHolder {
    child: std::process::Child,
    ns: OwnedFd,
}

impl UsernsHolder {
    fn spawn(uid_base: u32) -> anyhow::Result<UsernsHolder> {
        let child = Command::new("unshare")
            .args(["--user", "sleep", "infinity"])
            .stdin(Stdio::null())
            .spawn()
            .context("spawn unshare --user")?;
        let mut holder = ChildGuard(Some(child));
        let pid = holder.0.as_ref().map(|c| c.id()).unwrap_or_default();
        let own = fs::read_link("/proc/self/ns/user")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_link(format!("/proc/{pid}/ns/user"))? == own {
            if Instant::now() > deadline {
                bail!("unshare --user did not enter a new user namespace");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let map = format!("0 {uid_base} 65536\n");
        fs::write(format!("/proc/{pid}/uid_map"), &map)?;
        fs::write(format!("/proc/{pid}/gid_map"), &map)?;
        let ns = OwnedFd::from(fs::File::open(format!("/proc/{pid}/ns/user"))?);
        let child = holder.0.take().ok_or_else(|| anyhow!("no child"))?;
        Ok(UsernsHolder { child, ns })
    }
}

impl Drop for UsernsHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills and reaps a child if construction fails half-way.
struct ChildGuard(Option<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Binds `source` at `target` idmapped through user namespace `userns`.
fn idmapped_bind(source: &Path, target: &Path, userns: &OwnedFd) -> std::io::Result<()> {
    let source = CString::new(source.as_os_str().as_encoded_bytes())?;
    let target = CString::new(target.as_os_str().as_encoded_bytes())?;
    // SAFETY: open_tree with a valid NUL-terminated path; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new fd that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: valid fd, empty path, and a mount_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: valid fd and NUL-terminated target path.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// SIGKILL to a restored init (its pid namespace dies with it), then wait for its exit.
fn kill_tree(pid: i32) -> anyhow::Result<()> {
    // SAFETY: pidfd_open takes a pid and flags; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        // Already gone.
        return Ok(());
    }
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a pidfd polls readable once the process exited.
    let ready = unsafe { libc::poll(&mut poll, 1, 30_000) };
    if ready != 1 {
        bail!("restored init {pid} did not exit");
    }
    Ok(())
}

/// Waits until no loop device is backed by `image` (the last mount of it is gone).
fn wait_loop_released(image: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let wanted = image.display().to_string();
    loop {
        let busy = fs::read_dir("/sys/block")?
            .flatten()
            .filter_map(|e| fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .any(|b| b.trim() == wanted);
        if !busy {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{wanted} is still on a loop device");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// First host id of the process's user namespace map ("0 <base> 65536").
fn uid_base_of(pid: i32) -> anyhow::Result<u32> {
    let map = fs::read_to_string(format!("/proc/{pid}/uid_map"))?;
    map.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("unreadable uid_map of {pid}: {map:?}"))
}

fn state_sandbox_dir(rt: &LinuxRuntime, id: &str) -> PathBuf {
    rt.config().state_dir.join("sandboxes").join(id)
}

/// The error lines of a CRIU log (it is removed with its directory when the bench fails).
fn log_errors(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    errors[errors.len().saturating_sub(10)..].join("\n")
}

/// Bytes allocated to the files under `dir` (what `du` counts).
fn allocated_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += meta.blocks() * 512;
        if meta.is_dir() {
            total += allocated_bytes(&entry.path())?;
        }
    }
    Ok(total)
}

/// Removes a directory on drop (checkpoints, images, work dirs), even on error.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if self.0.exists() {
            if let Err(e) = fs::remove_dir_all(&self.0) {
                eprintln!("cleanup: remove {}: {e}", self.0.display());
            }
        }
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

fn median_bytes(values: &[u64]) -> Option<u64> {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len().checked_sub(1)? / 2).copied()
}

fn cell(s: &Samples) -> String {
    let failed = if s.failures > 0 {
        format!(" ({} failed)", s.failures)
    } else {
        String::new()
    };
    match (s.p50(), s.p99()) {
        (Some(a), Some(b)) => format!("{} / {}{failed}", ms(a), ms(b)),
        _ => format!("—{failed}"),
    }
}

fn ratio(a: Option<Duration>, b: Option<Duration>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64()),
        _ => "—".into(),
    }
}

fn ratio_cell(a: &Samples, b: &Samples) -> String {
    format!("{} / {}", ratio(a.p50(), b.p50()), ratio(a.p99(), b.p99()))
}

fn print_report(
    args: &CheckpointArgs,
    criu: &Criu,
    sizes: &[SizeResult],
    forks: &[ForkResult],
    load_start: &str,
    load_end: &str,
    took: Duration,
) {
    let command_line: Vec<String> = std::env::args().collect();
    println!("Command: `{}`", command_line.join(" "));
    println!("Date (UTC): {}", crate::utc_now());
    println!("Host: {}", crate::host_summary());
    println!(
        "Load average (1/5/15 min): {load_start} at start, {load_end} at end; run took {:.0} s",
        took.as_secs_f64()
    );
    println!(
        "CRIU {} ({}); {} iterations per size; ms, each cell p50 / p99 (nearest rank).\n",
        criu.version(),
        if criu.is_private() {
            "berth's private copy"
        } else {
            "host"
        },
        args.iterations
    );

    let mut header = String::from("| what | timed |");
    let mut rule = String::from("|---|---|");
    for s in sizes {
        header.push_str(&format!(" {} MiB |", s.mib));
        rule.push_str("---|");
    }
    println!("{header}\n{rule}");
    let row = |name: &str, timed: &str, f: &dyn Fn(&SizeResult) -> String| {
        let mut line = format!("| {name} | {timed} |");
        for s in sizes {
            line.push_str(&format!(" {} |", f(s)));
        }
        println!("{line}");
    };
    row("berth pause", "`Runtime::pause(id, true)`", &|s| {
        cell(&s.pause)
    });
    row(
        "criu dump (floor)",
        "berth's `criu dump` command line, spawn → exit",
        &|s| cell(&s.raw_dump),
    );
    row("**berth pause ÷ criu dump**", "", &|s| {
        ratio_cell(&s.pause, &s.raw_dump)
    });
    row("berth resume", "`Runtime::resume(id, true)`", &|s| {
        cell(&s.resume)
    });
    row(
        "criu restore (floor)",
        "berth's `criu restore --root` command line, spawn → exit",
        &|s| cell(&s.raw_restore),
    );
    row("**berth resume ÷ criu restore**", "", &|s| {
        ratio_cell(&s.resume, &s.raw_restore)
    });
    row(
        "berth checkpoint",
        "`Runtime::checkpoint` (keeps running; + disk copy)",
        &|s| cell(&s.checkpoint),
    );
    row(
        "root by hand (not in the floor)",
        "idmapped layers + loop disk + overlay",
        &|s| cell(&s.root_prep),
    );

    println!("\nSizes on disk (MiB, median over iterations; allocated blocks):\n");
    println!("{header}\n{rule}");
    let bytes = |values: &[u64]| median_bytes(values).map(mib).unwrap_or("—".into());
    row("sandbox memory cgroup", "usage with the holder up", &|s| {
        mib(s.cgroup_usage)
    });
    row("pause images", "`<sandbox>/checkpoint`", &|s| {
        bytes(&s.pause_images)
    });
    row("floor dump images", "raw `criu dump` images dir", &|s| {
        bytes(&s.raw_images)
    });
    row("checkpoint() images", "`<checkpoint>/images`", &|s| {
        bytes(&s.checkpoint_images)
    });
    row(
        "checkpoint() size_bytes",
        "images + disk copy + metadata",
        &|s| bytes(&s.checkpoint_size),
    );

    if !forks.is_empty() {
        let floor = sizes.iter().find(|s| s.mib == args.fork_mib);
        println!(
            "\nFork of a sandbox holding {} MiB: one `Runtime::checkpoint`, then N \
             restores (`LinuxRuntime::restore_checkpoint`, what `Runtime::restore` runs) with at most {} at once; forks killed after each round.\n",
            args.fork_mib, args.parallel
        );
        println!(
            "| N | checkpoint | restores wall | checkpoint + restores | per fork (wall ÷ N) | \
             one restore p50 / p99 | restore p50 ÷ criu restore floor p50 | kill all | checkpoint size |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for f in forks {
            let failed = if f.restores.failures > 0 {
                format!(
                    " ({} failed: {})",
                    f.restores.failures,
                    f.restores.first_error.as_deref().unwrap_or("")
                )
            } else {
                String::new()
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} MiB |{failed}",
                f.count,
                ms(f.checkpoint),
                ms(f.restores_wall),
                ms(f.checkpoint + f.restores_wall),
                ms(f.restores_wall / f.count.max(1) as u32),
                cell(&f.restores),
                floor
                    .map(|s| ratio(f.restores.p50(), s.raw_restore.p50()))
                    .unwrap_or("—".into()),
                ms(f.kill_all),
                mib(f.checkpoint_size)
            );
        }
    }

    println!("\nTargets (issue text):\n");
    println!("| target | measured p50 | |");
    println!("|---|---|---|");
    let at64 = sizes.iter().find(|s| s.mib == 64);
    let verdict = |d: Option<Duration>, limit: Duration| match d {
        Some(d) if d <= limit => "met",
        Some(_) => "missed",
        None => "not measured",
    };
    let pause = at64.and_then(|s| s.pause.p50());
    let resume = at64.and_then(|s| s.resume.p50());
    println!(
        "| pause ≤ 100 ms at 64 MiB | {} | {} |",
        pause.map(ms).unwrap_or("—".into()),
        verdict(pause, Duration::from_millis(100))
    );
    println!(
        "| resume ≤ 150 ms at 64 MiB | {} | {} |",
        resume.map(ms).unwrap_or("—".into()),
        verdict(resume, Duration::from_millis(150))
    );
    let fork10 = forks
        .iter()
        .find(|f| f.count == 10)
        .map(|f| f.checkpoint + f.restores_wall);
    println!(
        "| fork ×10 ≤ 1 s total (checkpoint + 10 restores) | {} | {} |",
        fork10.map(ms).unwrap_or("—".into()),
        verdict(fork10, Duration::from_secs(1))
    );
}
