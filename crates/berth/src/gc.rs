//! `berth gc`: finds what no daemon owns any more and, with `--yes`, removes it.
//!
//! Ownership is what the runtime writes down machine-wide: every sandbox's uid range is
//! claimed in `/var/lib/berth/uid-slots/<uid>` by (state dir, sandbox id), and a sandbox
//! is alive exactly while `<state dir>/sandboxes/<id>/` exists (made before the claim,
//! before its cgroups and its network namespace; removed after its processes are dead).
//! So, never touching a sandbox whose directory exists, of any daemon:
//!
//! - A sandbox whose claim names a missing directory is an orphan: its cgroups
//!   (`<mount>/<ctrl>/berth/<id>`, with whatever still runs in them) and loop devices
//!   backed by deleted files under that directory are garbage.
//! - A network namespace pin (`<state dir>/net/netns/<id>`, a bind mount) whose
//!   sandbox's directory is gone holds a namespace nothing will use again.
//! - A `berth/<id>` cgroup that no claim names, whose id has a directory in no known
//!   state dir, and none of whose processes runs as a uid of any claimed range, belongs
//!   to no daemon (its claim went: a wiped `uid-slots`, a crash in an older berth). A
//!   cgroup of a sandbox being created is never one: the claim comes before the cgroup,
//!   and gc reads the cgroups before the claims.
//!
//! Facts are gathered first, then [`plan`] (pure, unit-tested) decides, then the
//! executor acts. By default only the orphans and pins of `--state-dir` are considered
//! (and unclaimed cgroups, which are no daemon's); `--all-state-dirs` widens it to every
//! daemon's. Stale claims themselves are left: the next claim of their range takes them
//! over. Network records (`net/sandboxes/<id>.json`) are berth-net's: a daemon's next
//! start reconciles them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

const SLOTS_DIR: &str = "/var/lib/berth/uid-slots";
/// Host uids per sandbox range (`berth_runtime`'s slot size).
const RANGE_SIZE: u32 = 65_536;
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// The runtime's cgroup parent (`LinuxRuntimeConfig::cgroup_parent`).
const CGROUP_PARENT: &str = "berth";

/// A uid-range claim: who holds it, and whether that sandbox's directory exists.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Claim {
    pub state_dir: PathBuf,
    pub sandbox: String,
    #[serde(skip)]
    pub live: bool,
    /// The first host uid of the range (the claim's file name).
    #[serde(skip)]
    pub first_uid: u32,
}

/// One sandbox cgroup: its directories (one per v1 controller, or one on v2) and the
/// processes in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCgroup {
    pub id: String,
    pub dirs: Vec<PathBuf>,
    pub pids: Vec<u32>,
    /// The host uids its processes run as.
    pub uids: Vec<u32>,
}

/// A network namespace pin under a state dir, and whether its sandbox's directory is
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetnsPin {
    pub state_dir: PathBuf,
    pub sandbox: String,
    pub path: PathBuf,
    pub sandbox_dir_exists: bool,
}

/// An attached loop device and its backing file, as the kernel reports it (` (deleted)`
/// appended when the file was unlinked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    pub name: String,
    pub backing_file: String,
}

#[derive(Debug, Default)]
pub struct Facts {
    pub claims: Vec<Claim>,
    pub cgroups: Vec<SandboxCgroup>,
    pub loops: Vec<LoopDevice>,
    pub pins: Vec<NetnsPin>,
    /// Ids with a sandbox directory in any known state dir.
    pub sandbox_dirs: std::collections::BTreeSet<String>,
}

/// What gc removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Garbage {
    /// An orphan sandbox's cgroups and the processes still in them.
    SandboxCgroup {
        sandbox: String,
        state_dir: PathBuf,
        dirs: Vec<PathBuf>,
        pids: Vec<u32>,
    },
    /// A loop device whose backing file, under an orphan sandbox's directory, is gone.
    LoopDevice {
        device: String,
        backing_file: String,
    },
    /// A network namespace pin whose sandbox's directory is gone.
    NetnsPin {
        sandbox: String,
        state_dir: PathBuf,
        path: PathBuf,
    },
    /// A sandbox cgroup no claim and no state dir accounts for.
    UnclaimedCgroup {
        sandbox: String,
        dirs: Vec<PathBuf>,
        pids: Vec<u32>,
    },
}

/// Decides what is garbage. `scope`: only claims of this state dir; `None`: all.
pub fn plan(facts: &Facts, scope: Option<&Path>) -> Vec<Garbage> {
    let orphans: Vec<&Claim> = facts
        .claims
        .iter()
        .filter(|claim| !claim.live)
        .filter(|claim| scope.is_none_or(|dir| claim.state_dir == dir))
        // The same id live elsewhere (a claim of another daemon) is not an orphan.
        .filter(|claim| {
            !facts
                .claims
                .iter()
                .any(|other| other.live && other.sandbox == claim.sandbox)
        })
        .collect();
    let mut garbage = Vec::new();
    let in_claimed_range = |uid: u32| {
        facts.claims.iter().any(|claim| {
            (claim.first_uid..claim.first_uid.saturating_add(RANGE_SIZE)).contains(&uid)
        })
    };
    for group in &facts.cgroups {
        let claimed = facts.claims.iter().any(|claim| claim.sandbox == group.id);
        if !claimed
            && !facts.sandbox_dirs.contains(&group.id)
            && !group.uids.iter().any(|uid| in_claimed_range(*uid))
        {
            garbage.push(Garbage::UnclaimedCgroup {
                sandbox: group.id.clone(),
                dirs: group.dirs.clone(),
                pids: group.pids.clone(),
            });
        }
    }
    for claim in &orphans {
        if let Some(group) = facts.cgroups.iter().find(|g| g.id == claim.sandbox) {
            garbage.push(Garbage::SandboxCgroup {
                sandbox: claim.sandbox.clone(),
                state_dir: claim.state_dir.clone(),
                dirs: group.dirs.clone(),
                pids: group.pids.clone(),
            });
        }
        let under = format!(
            "{}/",
            claim
                .state_dir
                .join("sandboxes")
                .join(&claim.sandbox)
                .display()
        );
        for device in &facts.loops {
            if device.backing_file.starts_with(&under)
                && device.backing_file.ends_with(" (deleted)")
            {
                garbage.push(Garbage::LoopDevice {
                    device: device.name.clone(),
                    backing_file: device.backing_file.clone(),
                });
            }
        }
    }
    for pin in &facts.pins {
        if !pin.sandbox_dir_exists && scope.is_none_or(|dir| pin.state_dir == dir) {
            garbage.push(Garbage::NetnsPin {
                sandbox: pin.sandbox.clone(),
                state_dir: pin.state_dir.clone(),
                path: pin.path.clone(),
            });
        }
    }
    garbage
}

fn read_claims() -> Vec<Claim> {
    let Ok(entries) = std::fs::read_dir(SLOTS_DIR) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let first_uid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let mut claim =
                serde_json::from_slice::<Claim>(&std::fs::read(entry.path()).ok()?).ok()?;
            claim.first_uid = first_uid;
            claim.live = claim
                .state_dir
                .join("sandboxes")
                .join(&claim.sandbox)
                .is_dir();
            Some(claim)
        })
        .collect()
}

/// The state dirs gc knows of: the given one and every one a claim names.
fn known_state_dirs(state_dir: &Path, claims: &[Claim]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = claims.iter().map(|claim| claim.state_dir.clone()).collect();
    dirs.push(state_dir.to_path_buf());
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Names of the entries of `dir` (none when it cannot be read).
fn entry_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn read_pins(state_dirs: &[PathBuf]) -> Vec<NetnsPin> {
    let mut pins = Vec::new();
    for state_dir in state_dirs {
        let netns = state_dir.join("net").join("netns");
        for sandbox in entry_names(&netns) {
            pins.push(NetnsPin {
                sandbox_dir_exists: state_dir.join("sandboxes").join(&sandbox).is_dir(),
                path: netns.join(&sandbox),
                state_dir: state_dir.clone(),
                sandbox,
            });
        }
    }
    pins
}

/// The real uid of process `pid`, if it still runs.
fn process_uid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Every `berth/<id>` group under every hierarchy, merged by id.
fn read_cgroups() -> Vec<SandboxCgroup> {
    let mut parents: Vec<PathBuf> = vec![
        Path::new(CGROUP_MOUNT).join(CGROUP_PARENT),
        Path::new(CGROUP_MOUNT).join("unified").join(CGROUP_PARENT),
    ];
    if let Ok(controllers) = std::fs::read_dir(CGROUP_MOUNT) {
        for controller in controllers.flatten() {
            parents.push(controller.path().join(CGROUP_PARENT));
        }
    }
    parents.sort();
    parents.dedup();
    let mut groups: Vec<SandboxCgroup> = Vec::new();
    for parent in parents {
        let Ok(children) = std::fs::read_dir(&parent) else {
            continue;
        };
        for child in children.flatten() {
            if !child.path().is_dir() {
                continue;
            }
            let id = child.file_name().to_string_lossy().into_owned();
            let pids = cgroup_pids(&child.path());
            match groups.iter_mut().find(|g| g.id == id) {
                Some(group) => {
                    group.dirs.push(child.path());
                    group.pids.extend(pids);
                    group.pids.sort_unstable();
                    group.pids.dedup();
                }
                None => groups.push(SandboxCgroup {
                    id,
                    dirs: vec![child.path()],
                    pids,
                    uids: Vec::new(),
                }),
            }
        }
    }
    for group in &mut groups {
        group.uids = group
            .pids
            .iter()
            .filter_map(|pid| process_uid(*pid))
            .collect();
        group.uids.sort_unstable();
        group.uids.dedup();
    }
    groups
}

/// Processes in `dir` and every group below it.
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect();
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            pids.extend(cgroup_pids(&child.path()));
        }
    }
    pids
}

fn read_loops() -> Vec<LoopDevice> {
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    devices
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|d| {
            let backing = std::fs::read_to_string(d.path().join("loop/backing_file")).ok()?;
            Some(LoopDevice {
                name: d.file_name().to_string_lossy().into_owned(),
                backing_file: backing.trim_end_matches('\n').to_owned(),
            })
        })
        .collect()
}

pub fn facts(state_dir: &Path) -> Facts {
    // Read in the reverse of the order a sandbox's parts are made (directory, claim,
    // cgroups): a group seen here then has its claim and directory seen below, so a
    // sandbox being created while gc runs (another daemon's, which no claim read earlier
    // would name) is never taken for an unclaimed group.
    let cgroups = read_cgroups();
    let claims = read_claims();
    let state_dirs = known_state_dirs(state_dir, &claims);
    Facts {
        cgroups,
        loops: read_loops(),
        pins: read_pins(&state_dirs),
        sandbox_dirs: state_dirs
            .iter()
            .flat_map(|dir| entry_names(&dir.join("sandboxes")))
            .collect(),
        claims,
    }
}

/// Unmounts a namespace pin and removes its file. A pin already unmounted (its daemon
/// got there first) is fine.
fn remove_pin(path: &Path) -> Result<()> {
    match rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
        Err(err) => return Err(err).with_context(|| format!("unmounting {}", path.display())),
    }
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(err).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Kills everything in a group (and its children) and removes the directories.
fn remove_cgroup(dirs: &[PathBuf]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<u32> = dirs.iter().flat_map(|dir| cgroup_pids(dir)).collect();
        if pids.is_empty() {
            break;
        }
        // cgroup.kill (v2) kills the whole subtree at once; SIGKILL each pid elsewhere.
        for dir in dirs {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
        }
        for pid in pids {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("processes in {} did not die within 10 s", dirs[0].display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for dir in dirs {
        remove_group_tree(dir).with_context(|| format!("removing cgroup {}", dir.display()))?;
    }
    Ok(())
}

/// rmdir of a cgroup and its children, deepest first (cgroup dirs hold only the kernel's
/// files, which rmdir removes with the directory).
fn remove_group_tree(dir: &Path) -> std::io::Result<()> {
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            remove_group_tree(&child.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn detach_loop(device: &str) -> Result<()> {
    // Once its sandbox's mount namespace died, an autoclear loop device is already gone.
    if !Path::new("/sys/block").join(device).join("loop").exists() {
        return Ok(());
    }
    let status = std::process::Command::new("losetup")
        .args(["-d", &format!("/dev/{device}")])
        .status()
        .context("running losetup")?;
    anyhow::ensure!(status.success(), "losetup -d /dev/{device} failed");
    Ok(())
}

pub fn run(state_dir: &Path, all_state_dirs: bool, yes: bool, json: bool) -> Result<()> {
    let scope = (!all_state_dirs).then_some(state_dir);
    let garbage = plan(&facts(state_dir), scope);
    if json {
        crate::remote::print_json(&garbage)?;
    } else if garbage.is_empty() {
        eprintln!("nothing to collect");
    } else {
        for item in &garbage {
            match item {
                Garbage::SandboxCgroup {
                    sandbox,
                    state_dir,
                    dirs,
                    pids,
                } => println!(
                    "sandbox {sandbox} (state dir {}, directory gone): {} cgroup(s), {} process(es)",
                    state_dir.display(),
                    dirs.len(),
                    pids.len()
                ),
                Garbage::LoopDevice {
                    device,
                    backing_file,
                } => println!("loop device /dev/{device}: {backing_file}"),
                Garbage::NetnsPin { sandbox, path, .. } => println!(
                    "network namespace of sandbox {sandbox} (directory gone): {}",
                    path.display()
                ),
                Garbage::UnclaimedCgroup { sandbox, dirs, pids } => println!(
                    "cgroup berth/{sandbox} (no claim, no state dir): {} cgroup(s), {} process(es)",
                    dirs.len(),
                    pids.len()
                ),
            }
        }
    }
    if !yes {
        if !garbage.is_empty() && !json {
            eprintln!("run again with --yes to remove these");
        }
        return Ok(());
    }
    // Processes first: once they are gone their mounts and loop devices usually are too.
    for item in &garbage {
        match item {
            Garbage::SandboxCgroup { sandbox, dirs, .. }
            | Garbage::UnclaimedCgroup { sandbox, dirs, .. } => {
                remove_cgroup(dirs).with_context(|| format!("collecting sandbox {sandbox}"))?;
                eprintln!("removed sandbox {sandbox}'s processes and cgroups");
            }
            Garbage::LoopDevice { .. } | Garbage::NetnsPin { .. } => {}
        }
    }
    for item in &garbage {
        match item {
            Garbage::LoopDevice { device, .. } => {
                detach_loop(device)?;
                eprintln!("detached /dev/{device}");
            }
            Garbage::NetnsPin { sandbox, path, .. } => {
                remove_pin(path)?;
                eprintln!("removed sandbox {sandbox}'s network namespace pin");
            }
            Garbage::SandboxCgroup { .. } | Garbage::UnclaimedCgroup { .. } => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(state_dir: &str, sandbox: &str, live: bool) -> Claim {
        Claim {
            state_dir: state_dir.into(),
            sandbox: sandbox.into(),
            live,
            first_uid: 1 << 30,
        }
    }

    fn group(id: &str) -> SandboxCgroup {
        SandboxCgroup {
            id: id.into(),
            dirs: vec![format!("/sys/fs/cgroup/pids/berth/{id}").into()],
            pids: vec![42],
            uids: vec![(1 << 30) + 1000],
        }
    }

    fn pin(state_dir: &str, sandbox: &str, sandbox_dir_exists: bool) -> NetnsPin {
        NetnsPin {
            state_dir: state_dir.into(),
            sandbox: sandbox.into(),
            path: format!("{state_dir}/net/netns/{sandbox}").into(),
            sandbox_dir_exists,
        }
    }

    fn kinds(garbage: &[Garbage]) -> Vec<(&'static str, &str)> {
        garbage
            .iter()
            .map(|item| match item {
                Garbage::SandboxCgroup { sandbox, .. } => ("cgroup", sandbox.as_str()),
                Garbage::UnclaimedCgroup { sandbox, .. } => ("unclaimed", sandbox.as_str()),
                Garbage::NetnsPin { sandbox, .. } => ("pin", sandbox.as_str()),
                Garbage::LoopDevice { device, .. } => ("loop", device.as_str()),
            })
            .collect()
    }

    #[test]
    fn only_sandboxes_whose_directory_is_gone_are_collected() {
        let facts = Facts {
            claims: vec![
                claim("/a", "orphan", false),
                claim("/a", "alive", true),
                claim("/b", "other-daemons-orphan", false),
            ],
            cgroups: vec![
                group("orphan"),
                group("alive"),
                group("other-daemons-orphan"),
                SandboxCgroup {
                    uids: vec![(1 << 30) + 5],
                    ..group("unclaimed-but-running-in-a-claimed-range")
                },
            ],
            loops: vec![
                LoopDevice {
                    name: "loop7".into(),
                    backing_file: "/a/sandboxes/orphan/disk.img (deleted)".into(),
                },
                LoopDevice {
                    name: "loop8".into(),
                    backing_file: "/a/sandboxes/alive/disk.img".into(),
                },
            ],
            ..Default::default()
        };
        let scoped = plan(&facts, Some(Path::new("/a")));
        assert_eq!(scoped.len(), 2);
        assert!(
            matches!(&scoped[0], Garbage::SandboxCgroup { sandbox, .. } if sandbox == "orphan")
        );
        assert!(matches!(&scoped[1], Garbage::LoopDevice { device, .. } if device == "loop7"));
        let everything = plan(&facts, None);
        assert_eq!(
            everything.len(),
            3,
            "the other daemon's orphan too, never the live or unclaimed"
        );
    }

    #[test]
    fn an_id_live_under_another_claim_is_kept() {
        let facts = Facts {
            claims: vec![claim("/a", "x", false), claim("/b", "x", true)],
            cgroups: vec![group("x")],
            ..Default::default()
        };
        assert!(plan(&facts, None).is_empty());
    }

    #[test]
    fn a_pin_goes_with_its_sandboxs_directory_and_only_in_scope() {
        let facts = Facts {
            pins: vec![
                pin("/a", "gone", false),
                pin("/a", "paused", true),
                pin("/b", "gone-elsewhere", false),
            ],
            ..Default::default()
        };
        assert_eq!(
            kinds(&plan(&facts, Some(Path::new("/a")))),
            [("pin", "gone")]
        );
        assert_eq!(
            kinds(&plan(&facts, None)),
            [("pin", "gone"), ("pin", "gone-elsewhere")]
        );
    }

    #[test]
    fn an_unclaimed_cgroup_goes_only_if_nothing_accounts_for_it() {
        let stray = |id: &str, uids: Vec<u32>| SandboxCgroup { uids, ..group(id) };
        let facts = Facts {
            claims: vec![claim("/a", "claimed", true)],
            cgroups: vec![
                stray("stray", vec![0]),
                stray("empty", Vec::new()),
                stray("has-a-directory", vec![0]),
                // Its processes run in a claimed range: some daemon's, whatever its name.
                stray("in-a-claimed-range", vec![(1 << 30) + 65_535]),
                stray("claimed", vec![0]),
            ],
            sandbox_dirs: ["has-a-directory".to_string()].into(),
            ..Default::default()
        };
        let expected = [("unclaimed", "stray"), ("unclaimed", "empty")];
        assert_eq!(kinds(&plan(&facts, Some(Path::new("/a")))), expected);
        assert_eq!(kinds(&plan(&facts, None)), expected);
    }
}
