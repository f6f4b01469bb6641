//! `berth doctor`: does this host have what `berth up` needs? Each check reads a fact
//! of the host (kernel version, `/proc`, `/sys`, `/dev`, the tools berth runs), judges
//! it in a pure function and, when it falls short, prints the exact fix. Exit status 1
//! when any check fails; warnings (things berth runs without, degraded) do not fail.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use serde::Serialize;

/// Free space below which the state directory is a failure (a base template, a few
/// sandboxes' disks and checkpoints).
const MIN_FREE_BYTES: u64 = 5 * 1024 * 1024 * 1024;
/// Controllers berth limits sandboxes with.
const CONTROLLERS: [&str; 4] = ["memory", "cpu", "pids", "freezer"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub verdict: Verdict,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(name: &'static str, detail: String) -> Check {
    Check {
        name,
        verdict: Verdict::Ok,
        detail,
        fix: None,
    }
}

fn bad(name: &'static str, verdict: Verdict, detail: String, fix: &str) -> Check {
    Check {
        name,
        verdict,
        detail,
        fix: Some(fix.to_owned()),
    }
}

/// The kernel's version as (major, minor) from a release string like `6.18.0-1-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn check_kernel(release: &str) -> Check {
    match kernel_version(release) {
        // Idmapped mounts (mount_setattr) came in 5.12; overlay in user namespaces 5.11.
        Some(version) if version >= (5, 12) => ok("kernel", format!("{release} (>= 5.12)")),
        _ => bad(
            "kernel",
            Verdict::Fail,
            format!("{release}: idmapped mounts need Linux >= 5.12"),
            "boot a newer kernel (Debian: apt-get install -t bookworm-backports linux-image-amd64)",
        ),
    }
}

fn check_userns(max_user_namespaces: Option<u64>) -> Check {
    match max_user_namespaces {
        Some(0) => bad(
            "user namespaces",
            Verdict::Fail,
            "user.max_user_namespaces is 0".into(),
            "sysctl -w user.max_user_namespaces=65536 (and put it in /etc/sysctl.d/)",
        ),
        Some(max) => ok("user namespaces", format!("up to {max}")),
        None => bad(
            "user namespaces",
            Verdict::Fail,
            "/proc/sys/user/max_user_namespaces is missing".into(),
            "use a kernel built with CONFIG_USER_NS=y",
        ),
    }
}

fn check_overlay(filesystems: &str) -> Check {
    if filesystems
        .lines()
        .any(|line| line.trim_end().ends_with("overlay"))
    {
        ok("overlayfs", "available".into())
    } else {
        bad(
            "overlayfs",
            Verdict::Fail,
            "overlay is not in /proc/filesystems".into(),
            "modprobe overlay (and add `overlay` to /etc/modules-load.d/berth.conf)",
        )
    }
}

/// `v1`: controllers mounted as `/sys/fs/cgroup/<name>`; `v2`: the unified hierarchy's
/// `cgroup.controllers`.
fn check_cgroups(v1: &[String], v2: &[String]) -> Check {
    // cgroup2 has no freezer controller: `cgroup.freeze` is in every group.
    let available = |controller: &str| {
        v1.iter().chain(v2).any(|m| m == controller) || (controller == "freezer" && !v2.is_empty())
    };
    let missing: Vec<&str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|controller| !available(controller))
        .collect();
    let version = match (v1.is_empty(), v2.is_empty()) {
        (false, false) => "v1 and v2 (hybrid)",
        (false, true) => "v1",
        (true, false) => "v2",
        (true, true) => "none",
    };
    if missing.is_empty() {
        ok("cgroups", format!("{version}: {}", CONTROLLERS.join(", ")))
    } else {
        bad(
            "cgroups",
            Verdict::Fail,
            format!("{version}: missing controllers {}", missing.join(", ")),
            "enable them: on cgroup v2, echo '+memory +cpu +pids' > /sys/fs/cgroup/cgroup.subtree_control; on v1, mount each (mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory)",
        )
    }
}

fn check_loop(loop_control: bool) -> Check {
    if loop_control {
        ok("loop devices", "/dev/loop-control present".into())
    } else {
        bad(
            "loop devices",
            Verdict::Fail,
            "/dev/loop-control is missing: sandbox disks and volumes are loop-mounted ext4 images"
                .into(),
            "modprobe loop (containers: pass /dev/loop-control and /dev/loop* through)",
        )
    }
}

fn check_disk(state_dir: &Path, free: Option<u64>) -> Check {
    match free {
        Some(bytes) if bytes >= MIN_FREE_BYTES => ok(
            "disk space",
            format!("{} GiB free under {}", bytes >> 30, state_dir.display()),
        ),
        Some(bytes) => bad(
            "disk space",
            Verdict::Fail,
            format!("only {} MiB free under {}", bytes >> 20, state_dir.display()),
            "free space there or point --state-dir/BERTH_STATE_DIR at a larger filesystem (>= 5 GiB)",
        ),
        None => bad(
            "disk space",
            Verdict::Warn,
            format!("cannot stat {} or its parents", state_dir.display()),
            "create the state directory (mkdir -p) and run doctor again",
        ),
    }
}

/// What the time sync tools said: `Some(true)` synchronised, `Some(false)` not,
/// `None` no tool could tell.
fn check_time(synchronized: Option<bool>) -> Check {
    match synchronized {
        Some(true) => ok("time sync", "the clock is synchronised".into()),
        Some(false) => bad(
            "time sync",
            Verdict::Warn,
            "the clock is not synchronised: sandbox end times, logs and TLS drift".into(),
            "apt-get install chrony (or timedatectl set-ntp true)",
        ),
        None => bad(
            "time sync",
            Verdict::Warn,
            "cannot tell: neither timedatectl (systemd) nor chronyc answered".into(),
            "apt-get install chrony, or make sure the host (VM) keeps the clock in sync",
        ),
    }
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

fn time_synchronized() -> Option<bool> {
    if let Some(answer) =
        command_output("timedatectl", &["show", "-p", "NTPSynchronized", "--value"])
    {
        return Some(answer.trim() == "yes");
    }
    let tracking = command_output("chronyc", &["tracking"])?;
    Some(!tracking.contains("Not synchronised"))
}

fn check_nftables() -> Check {
    match command_output("nft", &["--version"]) {
        Some(version) => ok("nftables", version.trim().to_owned()),
        None => bad(
            "nftables",
            Verdict::Fail,
            "`nft` did not run: sandbox networking enforces policies with nftables".into(),
            "apt-get install nftables libnftables1 (or run berth up --no-network)",
        ),
    }
}

fn check_criu(criu_state_dir: &Path) -> Check {
    match berth_checkpoint::Criu::locate(criu_state_dir) {
        Ok(criu) => ok(
            "CRIU",
            format!(
                "{} ({})",
                criu.version(),
                if criu.is_private() { "private copy" } else { "host" }
            ),
        ),
        Err(err) => bad(
            "CRIU",
            Verdict::Warn,
            format!("{err}: pause with memory, snapshots and fork are unavailable until provisioned"),
            "berth provision (fetches Debian forky's CRIU into <state>/criu), or install CRIU >= 4.2",
        ),
    }
}

/// The resource views (`free`, `nproc`, `/proc/meminfo` … sized to each sandbox, served
/// by LXCFS): `lxcfs_version` from `lxcfs --version` (None: not installed), whether
/// `/dev/fuse` exists, whether a v1 `cpuset` hierarchy is mounted (berth pins each
/// sandbox to its CPUs there), and whether the state dir's LXCFS (its files in
/// `views`) serves.
/// Sandboxes run without them, so every shortfall is a warning.
fn check_views(
    lxcfs_version: Option<&str>,
    fuse: bool,
    cpuset: bool,
    views: &Path,
    mounted: berth_runtime::ViewsProbe,
) -> Check {
    const NAME: &str = "resource views";
    let host_view = "sandboxes see the host's memory and CPUs in free, nproc and /proc";
    let Some(version) = lxcfs_version else {
        return bad(
            NAME,
            Verdict::Warn,
            format!("lxcfs is not installed: {host_view}"),
            "apt-get install lxcfs (berth starts its own; the lxcfs service is not needed)",
        );
    };
    if !fuse {
        return bad(
            NAME,
            Verdict::Warn,
            format!("/dev/fuse is missing, so lxcfs cannot run: {host_view}"),
            "modprobe fuse (containers: pass /dev/fuse through)",
        );
    }
    if !cpuset {
        return bad(
            NAME,
            Verdict::Warn,
            "no cgroup v1 cpuset hierarchy: sandboxes are not pinned to their CPUs, so nproc and /proc/cpuinfo show the host's".into(),
            "mount -t cgroup -o cpuset cgroup /sys/fs/cgroup/cpuset (on cgroup v2 berth does not pin yet)",
        );
    }
    match mounted {
        berth_runtime::ViewsProbe::Dead => bad(
            NAME,
            Verdict::Warn,
            format!(
                "the LXCFS serving {} has died: running sandboxes' /proc/meminfo and CPU views fail (Transport endpoint is not connected)",
                views.display()
            ),
            "berth starts a new one at the next sandbox start and re-attaches running sandboxes' views; to do it now, restart berth up",
        ),
        berth_runtime::ViewsProbe::Alive => ok(
            NAME,
            format!("lxcfs {version} serving {}", views.display()),
        ),
        berth_runtime::ViewsProbe::Absent => ok(
            NAME,
            format!("lxcfs {version} (berth starts it with the first sandbox)"),
        ),
    }
}

/// `lxcfs --version` (printed on stderr, quoted), or None when lxcfs is not installed.
fn lxcfs_version() -> Option<String> {
    let binary = berth_runtime::find_lxcfs()?;
    let printed = Command::new(binary)
        .arg("--version")
        .output()
        .map(|output| {
            let text = String::from_utf8_lossy(&output.stderr).into_owned()
                + &String::from_utf8_lossy(&output.stdout);
            text.trim().trim_matches('"').to_owned()
        })
        .unwrap_or_default();
    Some(if printed.is_empty() {
        "(version unknown)".to_owned()
    } else {
        printed
    })
}

/// Free bytes for unprivileged users at `dir`, or at its nearest existing parent.
fn free_bytes(dir: &Path) -> Option<u64> {
    let mut at: PathBuf = dir.to_path_buf();
    loop {
        if let Ok(stat) = rustix::fs::statvfs(&at) {
            return Some(stat.f_bavail.saturating_mul(stat.f_frsize));
        }
        if !at.pop() {
            return None;
        }
    }
}

fn v1_controllers() -> Vec<String> {
    CONTROLLERS
        .iter()
        .filter(|c| Path::new("/sys/fs/cgroup").join(c).join("tasks").exists())
        .map(|c| (*c).to_owned())
        .collect()
}

fn v2_controllers() -> Vec<String> {
    [
        "/sys/fs/cgroup/cgroup.controllers",
        "/sys/fs/cgroup/unified/cgroup.controllers",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .flat_map(|text| {
        text.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    })
    .collect()
}

/// Runs every check against this host.
pub fn checks(state_dir: &Path, criu_state_dir: &Path) -> Vec<Check> {
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let max_userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    let (views, views_mounted) = berth_runtime::probe_views(state_dir);
    vec![
        check_kernel(&release),
        check_userns(max_userns),
        check_overlay(&filesystems),
        check_cgroups(&v1_controllers(), &v2_controllers()),
        check_criu(criu_state_dir),
        check_nftables(),
        check_loop(Path::new("/dev/loop-control").exists()),
        check_views(
            lxcfs_version().as_deref(),
            Path::new("/dev/fuse").exists(),
            Path::new("/sys/fs/cgroup/cpuset/tasks").exists(),
            &views,
            views_mounted,
        ),
        check_disk(state_dir, free_bytes(state_dir)),
        check_time(time_synchronized()),
    ]
}

/// Prints the checks; returns whether none failed.
pub fn run(state_dir: &Path, criu_state_dir: &Path, json: bool) -> Result<bool> {
    let checks = checks(state_dir, criu_state_dir);
    if json {
        crate::remote::print_json(&checks)?;
    } else {
        for check in &checks {
            let mark = match check.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            println!("{mark}  {:<16} {}", check.name, check.detail);
            if let Some(fix) = &check.fix {
                println!("      {:<16} fix: {fix}", "");
            }
        }
    }
    Ok(checks.iter().all(|check| check.verdict != Verdict::Fail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_before_idmapped_mounts_fail() {
        assert_eq!(kernel_version("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(check_kernel("5.12.0").verdict, Verdict::Ok);
        assert_eq!(check_kernel("5.10.0-28-amd64").verdict, Verdict::Fail);
        assert_eq!(check_kernel("garbage").verdict, Verdict::Fail);
    }

    #[test]
    fn each_missing_feature_names_its_fix() {
        assert_eq!(check_userns(Some(0)).verdict, Verdict::Fail);
        assert!(check_overlay("nodev\tproc\n")
            .fix
            .unwrap()
            .contains("modprobe overlay"));
        assert_eq!(check_overlay("nodev\toverlay\n").verdict, Verdict::Ok);
        assert!(check_loop(false).fix.unwrap().contains("modprobe loop"));
        assert_eq!(
            check_disk(Path::new("/x"), Some(1 << 20)).verdict,
            Verdict::Fail
        );
        assert_eq!(check_time(None).verdict, Verdict::Warn);
    }

    #[test]
    fn missing_or_dead_views_warn_with_their_fix() {
        use berth_runtime::ViewsProbe;
        let at = Path::new("/var/lib/berth/views");
        let missing = check_views(None, true, true, at, ViewsProbe::Absent);
        assert_eq!(missing.verdict, Verdict::Warn);
        assert!(missing.fix.unwrap().contains("apt-get install lxcfs"));
        let no_fuse = check_views(Some("5.0.3"), false, true, at, ViewsProbe::Absent);
        assert_eq!(no_fuse.verdict, Verdict::Warn);
        assert!(no_fuse.fix.unwrap().contains("modprobe fuse"));
        let dead = check_views(Some("5.0.3"), true, true, at, ViewsProbe::Dead);
        assert_eq!(dead.verdict, Verdict::Warn);
        assert!(dead.detail.contains("has died"));
        assert!(dead.fix.unwrap().contains("restart berth up"));
        let unpinned = check_views(Some("5.0.3"), true, false, at, ViewsProbe::Alive);
        assert_eq!(unpinned.verdict, Verdict::Warn);
        assert!(unpinned.fix.unwrap().contains("cpuset"));
        for probe in [ViewsProbe::Alive, ViewsProbe::Absent] {
            assert_eq!(
                check_views(Some("5.0.3"), true, true, at, probe).verdict,
                Verdict::Ok
            );
        }
    }

    #[test]
    fn cgroup_controllers_may_come_from_either_hierarchy() {
        let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let v1 = owned(&["memory", "cpu", "pids", "freezer"]);
        assert_eq!(
            check_cgroups(&v1, &owned(&["hugetlb"])).verdict,
            Verdict::Ok
        );
        // cgroup2 freezes through cgroup.freeze, without a controller.
        assert_eq!(
            check_cgroups(&[], &owned(&["cpu", "memory", "pids"])).verdict,
            Verdict::Ok
        );
        let missing = check_cgroups(&owned(&["cpu"]), &[]);
        assert_eq!(missing.verdict, Verdict::Fail);
        assert!(missing.detail.contains("memory"));
    }
}
