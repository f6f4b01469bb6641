//! `berth gc`: finds what no daemon owns any more and, with `--yes`, removes it.
//!
//! Ownership is what the runtime writes down machine-wide: every sandbox's uid range is
//! claimed in `/var/lib/berth/uid-slots/<uid>` by (state dir, sandbox id), and a sandbox
//! is alive exactly while `<state dir>/sandboxes/<id>/` exists (made before the claim,
//! removed after its processes are dead). A sandbox whose claim names a missing
//! directory is an orphan: its cgroups (`<mount>/<ctrl>/berth/<id>`, with whatever still
//! runs in them) and loop devices backed by deleted files under that directory are
//! garbage. Sandboxes of live directories, of any daemon, are never touched, and neither
//! is a cgroup no claim accounts for (it may be a sandbox being created right now).
//!
//! Facts are gathered first, then [`plan`] (pure, unit-tested) decides, then the
//! executor acts. By default only the orphans of `--state-dir` are considered;
//! `--all-state-dirs` widens it to every daemon's. Stale claims themselves are left:
//! the next claim of their range takes them over.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

const SLOTS_DIR: &str = "/var/lib/berth/uid-slots";
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
}

/// One sandbox cgroup: its directories (one per v1 controller, or one on v2) and the
/// processes in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCgroup {
    pub id: String,
    pub dirs: Vec<PathBuf>,
    pub pids: Vec<u32>,
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
    garbage
}

fn read_claims() -> Vec<Claim> {
    let Ok(entries) = std::fs::read_dir(SLOTS_DIR) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| std::fs::read(entry.path()).ok())
        .filter_map(|bytes| serde_json::from_slice::<Claim>(&bytes).ok())
        .map(|mut claim| {
            claim.live = claim
                .state_dir
                .join("sandboxes")
                .join(&claim.sandbox)
                .is_dir();
            claim
        })
        .collect()
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
                }),
            }
        }
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

pub fn facts() -> Facts {
    Facts {
        claims: read_claims(),
        cgroups: read_cgroups(),
        loops: read_loops(),
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
    let garbage = plan(&facts(), scope);
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
        if let Garbage::SandboxCgroup { sandbox, dirs, .. } = item {
            remove_cgroup(dirs).with_context(|| format!("collecting sandbox {sandbox}"))?;
            eprintln!("removed sandbox {sandbox}'s processes and cgroups");
        }
    }
    for item in &garbage {
        if let Garbage::LoopDevice { device, .. } = item {
            detach_loop(device)?;
            eprintln!("detached /dev/{device}");
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
        }
    }

    fn group(id: &str) -> SandboxCgroup {
        SandboxCgroup {
            id: id.into(),
            dirs: vec![format!("/sys/fs/cgroup/pids/berth/{id}").into()],
            pids: vec![42],
        }
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
                group("unclaimed"),
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
            loops: Vec::new(),
        };
        assert!(plan(&facts, None).is_empty());
    }
}
