//! Per-sandbox cgroups on cgroup v1 (one group per controller hierarchy) or cgroup v2
//! (one group in the unified hierarchy), detected at run time.
//!
//! Paths are always absolute under the controller mounts (`/sys/fs/cgroup/<ctrl>/berth/<id>`
//! or `/sys/fs/cgroup/berth/<id>`), never relative to the daemon's own group: the daemon
//! may itself live in some nested group that has nothing to do with sandboxes.
//!
//! On v1 each sandbox's `memory` and `pids` groups have a child, [`WORKLOAD_GROUP`], with
//! limits just below the sandbox's ([`CgroupLimits::workload`]). Commands run there:
//! envd starts every child from one thread, which [`Cgroups::confine_spawner`] moves into
//! the child group (v1 places threads, not only processes), so a fork bomb or a memory
//! hog exhausts the workload group and envd keeps its reserve. cgroup v2 keeps a
//! process's threads in one domain group, so there the workload shares the sandbox's
//! group and envd is protected only by its OOM score.
//!
//! **CPUs.** On v1 each sandbox also has a `cpuset` group pinning it to `cpu_count` of
//! the host's CPUs ([`pick_cpus`]: those the fewest of the parent's sandboxes are pinned
//! to), beside the CFS quota of `cpu_count` CPUs. The pin is what makes `nproc`
//! (`sched_getaffinity`), `os.cpu_count()` and the LXCFS views of `/proc/cpuinfo`,
//! `/proc/stat` and `/sys/devices/system/cpu/online` (see `views`) agree with the
//! sandbox's size: a quota alone limits CPU time but shows every host CPU, and a
//! program that starts one worker per CPU it sees gets throttled. The cost: a pinned
//! sandbox cannot borrow an idle CPU outside its set, and the spread is decided at
//! start (pinning is by count of sandboxes, not by load). A sandbox asking for as many
//! CPUs as the host has, or more, gets all of them. On v2 (berth is tested on v1) there
//! is no pin and sandboxes see the host's CPUs.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// The v1 controllers berth puts sandboxes in; `cpuset` only where it is mounted.
const V1_CONTROLLERS: &[&str] = &["cpu", "cpuacct", "cpuset", "memory", "pids", "freezer"];
const V1_CONTROLLERS_WITHOUT_CPUSET: &[&str] = &["cpu", "cpuacct", "memory", "pids", "freezer"];
const CFS_PERIOD_US: u64 = 100_000;

/// The child group (v1 `memory` and `pids`) the sandbox's commands run in.
pub(crate) const WORKLOAD_GROUP: &str = "workload";
const WORKLOAD_CONTROLLERS: [&str; 2] = ["memory", "pids"];
/// The thread of envd that starts every command (envd's `SPAWNER_THREAD_NAME`).
pub(crate) const SPAWNER_THREAD: &str = "envd-spawn";

/// Limits written into a sandbox's groups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CgroupLimits {
    pub cpu_count: u32,
    pub memory_bytes: u64,
    pub pids_max: u64,
}

impl CgroupLimits {
    /// The workload group's `(memory bytes, pids)`: the sandbox's less envd's reserve,
    /// 1/16 of each, at least 16 MiB and 8 pids, at most 64 MiB and 256 pids, and never
    /// more than half.
    pub(crate) fn workload(&self) -> (u64, u64) {
        let memory_reserve = (self.memory_bytes / 16)
            .clamp(16 << 20, 64 << 20)
            .min(self.memory_bytes / 2);
        let pids_reserve = (self.pids_max / 16).clamp(8, 256).min(self.pids_max / 2);
        (
            self.memory_bytes - memory_reserve,
            self.pids_max - pids_reserve,
        )
    }
}

/// Raw usage numbers read from a sandbox's groups.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CgroupUsage {
    pub cpu_ns: u64,
    pub mem_used: u64,
    pub mem_limit: u64,
    pub mem_cache: u64,
}

#[derive(Debug, Clone)]
pub(crate) enum Cgroups {
    /// One directory per controller: `<mount>/<ctrl>/<parent>/<id>`.
    V1 {
        mount: PathBuf,
        parent: String,
        /// [`V1_CONTROLLERS`], without `cpuset` where the host has not mounted it
        /// (sandboxes then see every CPU).
        controllers: &'static [&'static str],
    },
    /// Unified hierarchy: `<mount>/<parent>/<id>`.
    V2 { mount: PathBuf, parent: String },
}

impl Cgroups {
    /// Detects the cgroup layout mounted at `mount` (normally `/sys/fs/cgroup`) and makes
    /// sure berth's parent group exists with the needed controllers.
    pub(crate) fn detect(mount: &Path, parent: &str) -> io::Result<Self> {
        let c = crate::sys::cpath(mount)?;
        // SAFETY: statfs is plain data; zeroed is valid.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and out-pointer.
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let cgroups = if st.f_type as i64 == CGROUP2_SUPER_MAGIC {
            Self::V2 {
                mount: mount.to_owned(),
                parent: parent.to_owned(),
            }
        } else {
            let cpuset = mount.join("cpuset").join("tasks").exists();
            Self::V1 {
                mount: mount.to_owned(),
                parent: parent.to_owned(),
                controllers: if cpuset {
                    V1_CONTROLLERS
                } else {
                    V1_CONTROLLERS_WITHOUT_CPUSET
                },
            }
        };
        cgroups.prepare_parent()?;
        Ok(cgroups)
    }

    fn prepare_parent(&self) -> io::Result<()> {
        match self {
            Self::V1 {
                mount,
                parent,
                controllers,
            } => {
                for ctrl in *controllers {
                    mkdir_ok_if_exists(&mount.join(ctrl).join(parent))?;
                }
                if !controllers.contains(&"cpuset") {
                    return Ok(());
                }
                // A new cpuset group has no CPUs and no memory nodes, and takes no task
                // until it has both: berth's parent gets all of the root's.
                let cpuset = mount.join("cpuset");
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let dir = cpuset.join(parent);
                    if fs::read_to_string(dir.join(file))?.trim().is_empty() {
                        fs::write(dir.join(file), fs::read_to_string(cpuset.join(file))?)?;
                    }
                }
                Ok(())
            }
            Self::V2 { mount, parent } => {
                // Controllers must be enabled top-down; the root may refuse some (e.g. when
                // the daemon runs in a delegated subtree), which `create` then reports.
                let _ = fs::write(mount.join("cgroup.subtree_control"), "+cpu +memory +pids");
                let dir = mount.join(parent);
                mkdir_ok_if_exists(&dir)?;
                fs::write(dir.join("cgroup.subtree_control"), "+cpu +memory +pids")
            }
        }
    }

    /// What keeps task moves in this layout cheap while sandboxes start.
    pub(crate) fn attach_warmth(&self) -> crate::attach_warmth::AttachWarmth {
        match self {
            Self::V1 { mount, .. } => crate::attach_warmth::AttachWarmth::v1(mount, "pids"),
            Self::V2 { mount, .. } => crate::attach_warmth::AttachWarmth::v2(mount),
        }
    }

    /// All directories making up sandbox `id`'s cgroup (one per v1 hierarchy).
    pub(crate) fn dirs(&self, id: &str) -> Vec<PathBuf> {
        match self {
            Self::V1 {
                mount,
                parent,
                controllers,
            } => controllers
                .iter()
                .map(|c| mount.join(c).join(parent).join(id))
                .collect(),
            Self::V2 { mount, parent } => vec![mount.join(parent).join(id)],
        }
    }

    /// Sandbox `id`'s group as CRIU's `--cgroup-root` names it: `(controller, path in
    /// that hierarchy)` per v1 controller berth manages, or `(None, path)` for v2.
    pub(crate) fn criu_roots(&self, id: &str) -> Vec<(Option<&'static str>, String)> {
        match self {
            Self::V1 {
                parent,
                controllers,
                ..
            } => controllers
                .iter()
                .map(|c| (Some(*c), format!("/{parent}/{id}")))
                .collect(),
            Self::V2 { parent, .. } => vec![(None, format!("/{parent}/{id}"))],
        }
    }

    fn dir(&self, ctrl: &str, id: &str) -> PathBuf {
        match self {
            Self::V1 { mount, parent, .. } => mount.join(ctrl).join(parent).join(id),
            Self::V2 { mount, parent } => mount.join(parent).join(id),
        }
    }

    /// Ids of all sandbox groups that exist (for recovery sweeps).
    pub(crate) fn list_ids(&self) -> Vec<String> {
        let base = match self {
            Self::V1 { mount, parent, .. } => mount.join("memory").join(parent),
            Self::V2 { mount, parent } => mount.join(parent),
        };
        let Ok(entries) = fs::read_dir(base) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }

    /// Makes sandbox `id`'s groups and writes their limits. Idempotent: a resume makes
    /// the kept groups of a paused sandbox again, and [`Cgroups::attach`] remakes groups
    /// a cgroup manager removed. berth's parent is made again where it is missing, for
    /// the same reason.
    pub(crate) fn create(&self, id: &str, limits: CgroupLimits) -> io::Result<()> {
        for dir in self.dirs(id) {
            match mkdir_ok_if_exists(&dir) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.prepare_parent()?;
                    mkdir_ok_if_exists(&dir)?;
                }
                other => other?,
            }
        }
        let quota = u64::from(limits.cpu_count.max(1)) * CFS_PERIOD_US;
        match self {
            Self::V1 { .. } => {
                fs::write(
                    self.dir("cpu", id).join("cpu.cfs_period_us"),
                    CFS_PERIOD_US.to_string(),
                )?;
                fs::write(
                    self.dir("cpu", id).join("cpu.cfs_quota_us"),
                    quota.to_string(),
                )?;
                let mem = self.dir("memory", id);
                fs::write(
                    mem.join("memory.limit_in_bytes"),
                    limits.memory_bytes.to_string(),
                )?;
                // Present only with swap accounting; keeps swap from extending the limit.
                let _ = fs::write(
                    mem.join("memory.memsw.limit_in_bytes"),
                    limits.memory_bytes.to_string(),
                );
                fs::write(
                    self.dir("pids", id).join("pids.max"),
                    limits.pids_max.to_string(),
                )?;
                let (workload_memory, workload_pids) = limits.workload();
                let mem = mem.join(WORKLOAD_GROUP);
                mkdir_ok_if_exists(&mem)?;
                fs::write(
                    mem.join("memory.limit_in_bytes"),
                    workload_memory.to_string(),
                )?;
                let _ = fs::write(
                    mem.join("memory.memsw.limit_in_bytes"),
                    workload_memory.to_string(),
                );
                let pids = self.dir("pids", id).join(WORKLOAD_GROUP);
                mkdir_ok_if_exists(&pids)?;
                fs::write(pids.join("pids.max"), workload_pids.to_string())?;
                self.pin_cpus(id, limits.cpu_count)?;
            }
            Self::V2 { .. } => {
                let dir = self.dir("", id);
                fs::write(dir.join("cpu.max"), format!("{quota} {CFS_PERIOD_US}"))?;
                fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                fs::write(dir.join("pids.max"), limits.pids_max.to_string())?;
            }
        }
        Ok(())
    }

    /// Gives sandbox `id`'s new cpuset group `cpu_count` CPUs (see the module docs) and
    /// the parent's memory nodes. A group that has CPUs already keeps them: a resume
    /// creates the groups of a paused sandbox again, which survive unless the host
    /// rebooted.
    fn pin_cpus(&self, id: &str, cpu_count: u32) -> io::Result<()> {
        let Self::V1 {
            mount,
            parent,
            controllers,
        } = self
        else {
            return Ok(());
        };
        if !controllers.contains(&"cpuset") {
            return Ok(());
        }
        let parent_dir = mount.join("cpuset").join(parent);
        let dir = parent_dir.join(id);
        if !fs::read_to_string(dir.join("cpuset.cpus"))?
            .trim()
            .is_empty()
        {
            return Ok(());
        }
        // One choice at a time, so concurrent starts see each other's pins.
        static PICKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = PICKING.lock().unwrap_or_else(|e| e.into_inner());
        let host = parse_cpu_list(&fs::read_to_string(
            parent_dir.join("cpuset.effective_cpus"),
        )?);
        let count = cpu_count.max(1) as usize;
        // The other sandboxes' pins only matter when there is a choice: reading them
        // costs a few kernfs reads per sandbox (2.7 ms of a create with 200 running).
        let pinned: Vec<Vec<u32>> = if count >= host.len() {
            Vec::new()
        } else {
            fs::read_dir(&parent_dir)?
                .flatten()
                .filter(|entry| entry.file_name() != id && entry.path().is_dir())
                .filter_map(|entry| fs::read_to_string(entry.path().join("cpuset.cpus")).ok())
                .map(|cpus| parse_cpu_list(&cpus))
                .collect()
        };
        let cpus = pick_cpus(&host, &pinned, count);
        let write = |file: &str, value: &str| {
            fs::write(dir.join(file), value)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.join(file).display())))
        };
        write(
            "cpuset.mems",
            &fs::read_to_string(parent_dir.join("cpuset.effective_mems"))?,
        )?;
        write("cpuset.cpus", &format_cpu_list(&cpus))
    }

    /// The groups a command joins: the workload group where there is one, else the
    /// sandbox's own (one per v1 hierarchy).
    pub(crate) fn workload_dirs(&self, id: &str) -> Vec<PathBuf> {
        match self {
            Self::V1 {
                mount,
                parent,
                controllers,
            } => controllers
                .iter()
                .map(|c| {
                    let dir = mount.join(c).join(parent).join(id);
                    if WORKLOAD_CONTROLLERS.contains(c) {
                        dir.join(WORKLOAD_GROUP)
                    } else {
                        dir
                    }
                })
                .collect(),
            Self::V2 { .. } => self.dirs(id),
        }
    }

    /// Moves the thread of init `pid` named [`SPAWNER_THREAD`] into sandbox `id`'s
    /// workload groups, so every command it forks starts there. False when there is
    /// nothing to do: no such thread (an init that is not envd) or no workload group (v2).
    /// A workload group that vanished while empty is made again (see [`Cgroups::attach`]).
    pub(crate) fn confine_spawner(
        &self,
        id: &str,
        pid: libc::pid_t,
        limits: CgroupLimits,
    ) -> io::Result<bool> {
        if let Self::V2 { .. } = self {
            return Ok(false);
        }
        let Some(tid) = thread_named(pid, SPAWNER_THREAD)? else {
            return Ok(false);
        };
        // A move costs a few ms on v1 (the attach waits out an RCU grace period), and
        // the thread is often there already: a warm pool's sandbox was confined when
        // it was prepared, and CRIU restores each thread into its own groups.
        let current = fs::read_to_string(format!("/proc/{pid}/task/{tid}/cgroup"))?;
        let suffix = format!("/{id}/{WORKLOAD_GROUP}");
        for ctrl in WORKLOAD_CONTROLLERS {
            if in_group(&current, ctrl, &suffix) {
                continue;
            }
            let tasks = self.dir(ctrl, id).join(WORKLOAD_GROUP).join("tasks");
            self.remaking(id, limits, || {
                fs::write(&tasks, tid.to_string())
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", tasks.display())))
            })?;
        }
        Ok(true)
    }

    /// Moves process `pid` into every group of sandbox `id`, making a missing group again
    /// (with `limits`) and retrying. Groups berth made can vanish while they are empty: on
    /// a cgroup v1 host, systemd removes every empty group of a hierarchy its units do not
    /// use when it boots or reloads (measured with systemd 252: the whole `cpu`
    /// hierarchy, berth's parent included), and a new sandbox's groups stay empty until
    /// this move.
    pub(crate) fn attach(
        &self,
        id: &str,
        pid: libc::pid_t,
        limits: CgroupLimits,
    ) -> io::Result<()> {
        self.remaking(id, limits, || self.move_into(id, pid))
    }

    /// Runs `move_task`, making sandbox `id`'s groups again (with `limits`) and retrying
    /// while it fails because a group is missing (see [`Cgroups::attach`]).
    fn remaking(
        &self,
        id: &str,
        limits: CgroupLimits,
        move_task: impl Fn() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut remade = 0;
        loop {
            match move_task() {
                Err(e) if e.kind() == io::ErrorKind::NotFound && remade < 3 => {
                    tracing::warn!(sandbox = %id, %e, "a group of the sandbox vanished while empty; making it again");
                    self.create(id, limits)?;
                    remade += 1;
                }
                other => return other,
            }
        }
    }

    fn move_into(&self, id: &str, pid: libc::pid_t) -> io::Result<()> {
        let pid = pid.to_string();
        for dir in self.dirs(id) {
            let procs = dir.join("cgroup.procs");
            fs::write(&procs, &pid)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", procs.display())))?;
        }
        Ok(())
    }

    /// Host pids currently in the sandbox's groups, its workload group included.
    pub(crate) fn pids(&self, id: &str) -> Vec<libc::pid_t> {
        let dir = self.dir("pids", id);
        let mut pids: Vec<libc::pid_t> = [
            dir.join("cgroup.procs"),
            dir.join(WORKLOAD_GROUP).join("cgroup.procs"),
        ]
        .iter()
        .flat_map(|procs| {
            fs::read_to_string(procs)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<_>>()
        })
        .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// True when any of the sandbox's groups (on any v1 hierarchy, workload groups
    /// included) holds a process. `pids.current` counts the group's whole subtree
    /// whatever pid namespace reads it, where `cgroup.procs` lists only the processes
    /// the reader's namespace can see (a containerised daemon sees none of its
    /// neighbours'); the lists are the fallback where there is no count.
    pub(crate) fn has_processes(&self, id: &str) -> bool {
        let counted = fs::read_to_string(self.dir("pids", id).join("pids.current"))
            .ok()
            .and_then(|count| count.trim().parse::<u64>().ok());
        if counted.is_some_and(|count| count > 0) {
            return true;
        }
        self.dirs(id)
            .iter()
            .flat_map(|dir| [dir.join(WORKLOAD_GROUP), dir.clone()])
            .any(|dir| {
                fs::read_to_string(dir.join("cgroup.procs"))
                    .is_ok_and(|procs| procs.lines().any(|line| !line.trim().is_empty()))
            })
    }

    /// Kills every process in the groups (v2: `cgroup.kill`; v1: SIGKILL each listed pid,
    /// freezing first so nothing can fork in between).
    pub(crate) fn kill_all(&self, id: &str) -> io::Result<()> {
        match self {
            Self::V2 { .. } => {
                let kill = self.dir("", id).join("cgroup.kill");
                match fs::write(kill, "1") {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    other => other,
                }
            }
            Self::V1 { .. } => {
                if !self.dir("freezer", id).exists() {
                    return Ok(());
                }
                let _ = self.set_frozen(id, true);
                for pid in self.pids(id) {
                    // SAFETY: plain kill(2); pids come from the sandbox's own cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                self.set_frozen(id, false)
            }
        }
    }

    /// Removes sandbox `id`'s groups if they hold no process, in one attempt and without
    /// killing anything: a group a process entered meanwhile (EBUSY) is left, with the
    /// groups above it, and so is one already gone. True when all of them are gone.
    pub(crate) fn remove_if_empty(&self, id: &str) -> io::Result<bool> {
        let dirs = self
            .dirs(id)
            .into_iter()
            .flat_map(|dir| [dir.join(WORKLOAD_GROUP), dir]);
        for dir in dirs {
            match fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(false),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("rmdir {}: {e}", dir.display()),
                    ))
                }
            }
        }
        Ok(true)
    }

    /// Removes the groups (workload groups first), waiting briefly for exiting tasks to
    /// leave them.
    pub(crate) fn remove(&self, id: &str) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let dirs = self
            .dirs(id)
            .into_iter()
            .flat_map(|dir| [dir.join(WORKLOAD_GROUP), dir]);
        for dir in dirs {
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("rmdir {}: {e}", dir.display()),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// The group whose freezer holds sandbox `id` (v1: its `freezer` group; v2: its
    /// group), for CRIU's `--freeze-cgroup`.
    pub(crate) fn freezer_dir(&self, id: &str) -> PathBuf {
        match self {
            Self::V1 { .. } => self.dir("freezer", id),
            Self::V2 { .. } => self.dir("", id),
        }
    }

    /// Whether sandbox `id`'s group is frozen (or freezing); false when it has no group.
    pub(crate) fn is_frozen(&self, id: &str) -> bool {
        match self {
            Self::V1 { .. } => fs::read_to_string(self.dir("freezer", id).join("freezer.state"))
                .is_ok_and(|state| state.trim() != "THAWED"),
            Self::V2 { .. } => fs::read_to_string(self.dir("", id).join("cgroup.freeze"))
                .is_ok_and(|state| state.trim() == "1"),
        }
    }

    /// Freezes or thaws every process in the sandbox and waits until the state settles.
    pub(crate) fn set_frozen(&self, id: &str, frozen: bool) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        match self {
            Self::V1 { .. } => {
                let state = self.dir("freezer", id).join("freezer.state");
                let want = if frozen { "FROZEN" } else { "THAWED" };
                fs::write(&state, want)?;
                // The v1 freezer can stay FREEZING for good when a task forks or sleeps
                // uninterruptibly during the freeze pass (a busy shell loop does): the
                // write is repeated, and every 500 polls the group is thawed and the
                // freeze started over, as runc does.
                let mut polls = 0u32;
                while fs::read_to_string(&state)?.trim() != want {
                    if Instant::now() > deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("cgroup did not reach {want}"),
                        ));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                    polls += 1;
                    if frozen && polls.is_multiple_of(500) {
                        fs::write(&state, "THAWED")?;
                    }
                    fs::write(&state, want)?;
                }
            }
            Self::V2 { .. } => {
                let dir = self.dir("", id);
                fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
                let want = if frozen { "frozen 1" } else { "frozen 0" };
                while !fs::read_to_string(dir.join("cgroup.events"))?
                    .lines()
                    .any(|l| l == want)
                {
                    if Instant::now() > deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("cgroup did not reach {want}"),
                        ));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn usage(&self, id: &str) -> io::Result<CgroupUsage> {
        match self {
            Self::V1 { .. } => {
                let mem = self.dir("memory", id);
                let stat = fs::read_to_string(mem.join("memory.stat"))?;
                Ok(CgroupUsage {
                    cpu_ns: read_u64(&self.dir("cpuacct", id).join("cpuacct.usage"))?,
                    mem_used: read_u64(&mem.join("memory.usage_in_bytes"))?,
                    mem_limit: read_u64(&mem.join("memory.limit_in_bytes"))?,
                    mem_cache: stat_field(&stat, "total_cache")
                        .or_else(|| stat_field(&stat, "cache"))
                        .unwrap_or(0),
                })
            }
            Self::V2 { .. } => {
                let dir = self.dir("", id);
                let cpu = fs::read_to_string(dir.join("cpu.stat"))?;
                let stat = fs::read_to_string(dir.join("memory.stat"))?;
                let max = fs::read_to_string(dir.join("memory.max"))?;
                Ok(CgroupUsage {
                    cpu_ns: stat_field(&cpu, "usage_usec").unwrap_or(0) * 1000,
                    mem_used: read_u64(&dir.join("memory.current"))?,
                    mem_limit: max.trim().parse().unwrap_or(u64::MAX),
                    mem_cache: stat_field(&stat, "file").unwrap_or(0),
                })
            }
        }
    }
}

/// The `count` CPUs of `host` to pin a new sandbox to: all of them when it asks for as
/// many or more, else those the fewest of `pinned` (the CPU sets of the other sandboxes)
/// hold, lower numbers first among equals. Returned in ascending order.
fn pick_cpus(host: &[u32], pinned: &[Vec<u32>], count: usize) -> Vec<u32> {
    if count >= host.len() {
        return host.to_vec();
    }
    let load = |cpu: u32| pinned.iter().filter(|set| set.contains(&cpu)).count();
    let mut by_load: Vec<u32> = host.to_vec();
    by_load.sort_by_key(|cpu| (load(*cpu), *cpu));
    let mut chosen: Vec<u32> = by_load.into_iter().take(count).collect();
    chosen.sort_unstable();
    chosen
}

/// The CPUs of a kernel CPU list (`0-3,6`); unreadable parts are skipped.
fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                if let (Ok(first), Ok(last)) = (first.parse::<u32>(), last.parse::<u32>()) {
                    cpus.extend(first..=last);
                }
            }
            None => cpus.extend(part.parse::<u32>().ok()),
        }
    }
    cpus
}

/// `cpus` (ascending) as a kernel CPU list.
fn format_cpu_list(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        parts.push(if cpus[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", cpus[i])
        });
        i += 1;
    }
    parts.join(",")
}

/// Is the task whose `/proc/…/cgroup` is `cgroups` in a group of v1 controller `ctrl`
/// whose path ends with `suffix`?
fn in_group(cgroups: &str, ctrl: &str, suffix: &str) -> bool {
    cgroups.lines().any(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next(), fields.next(), fields.next());
        controllers.is_some_and(|c| c.split(',').any(|c| c == ctrl))
            && path.is_some_and(|p| p.ends_with(suffix))
    })
}

/// The host tid of the thread of process `pid` whose `comm` is `name`.
fn thread_named(pid: libc::pid_t, name: &str) -> io::Result<Option<libc::pid_t>> {
    for task in fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return Ok(task.file_name().to_str().and_then(|tid| tid.parse().ok()));
        }
    }
    Ok(None)
}

fn mkdir_ok_if_exists(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => {
            other.map_err(|e| io::Error::new(e.kind(), format!("mkdir {}: {e}", dir.display())))
        }
    }
}

fn read_u64(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number", path.display()),
        )
    })
}

/// Value of `key` in a `key value` per line file (memory.stat, cpu.stat).
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::{
        format_cpu_list, in_group, parse_cpu_list, pick_cpus, stat_field, CgroupLimits, Cgroups,
        V1_CONTROLLERS_WITHOUT_CPUSET,
    };

    /// A sandbox's v1 groups as files in a temp dir: every `cgroup.procs` empty (as a
    /// reader in another pid namespace sees a neighbour's), `pids.current` as given.
    fn groups_seen_from_another_namespace(pids_current: &str) -> (tempfile::TempDir, Cgroups) {
        let mount = tempfile::tempdir().unwrap();
        for ctrl in V1_CONTROLLERS_WITHOUT_CPUSET {
            let dir = mount.path().join(ctrl).join("berth").join("abc");
            std::fs::create_dir_all(dir.join("workload")).unwrap();
            std::fs::write(dir.join("cgroup.procs"), "").unwrap();
            std::fs::write(dir.join("workload").join("cgroup.procs"), "").unwrap();
        }
        let pids = mount.path().join("pids").join("berth").join("abc");
        std::fs::write(pids.join("pids.current"), pids_current).unwrap();
        let cgroups = Cgroups::V1 {
            mount: mount.path().to_owned(),
            parent: "berth".into(),
            controllers: V1_CONTROLLERS_WITHOUT_CPUSET,
        };
        (mount, cgroups)
    }

    #[test]
    fn a_group_counts_its_tasks_even_where_it_lists_none() {
        let (_mount, busy) = groups_seen_from_another_namespace("3\n");
        assert!(busy.has_processes("abc"));
        let (_mount, empty) = groups_seen_from_another_namespace("0\n");
        assert!(!empty.has_processes("abc"));
    }

    fn limits(memory_mb: u64, pids_max: u64) -> CgroupLimits {
        CgroupLimits {
            cpu_count: 1,
            memory_bytes: memory_mb << 20,
            pids_max,
        }
    }

    #[test]
    fn the_workload_keeps_a_reserve_for_envd_below_every_limit() {
        // Default sandbox: 1/16 of memory and pids.
        assert_eq!(limits(512, 4096).workload(), (480 << 20, 3840));
        // Small: the minimum reserve (16 MiB, 8 pids).
        assert_eq!(limits(128, 64).workload(), (112 << 20, 56));
        // Large: the maximum reserve (64 MiB, 256 pids).
        assert_eq!(limits(8192, 100_000).workload(), (8128 << 20, 99_744));
        // Tiny: never more than half goes to the reserve.
        assert_eq!(limits(16, 10).workload(), (8 << 20, 5));
    }

    #[test]
    fn sandboxes_are_pinned_to_the_least_used_cpus() {
        let host = [0, 1, 2, 3];
        // The first one-CPU sandbox takes CPU 0, the next ones the others in turn.
        assert_eq!(pick_cpus(&host, &[], 1), vec![0]);
        assert_eq!(pick_cpus(&host, &[vec![0]], 1), vec![1]);
        assert_eq!(pick_cpus(&host, &[vec![0], vec![1], vec![2]], 1), vec![3]);
        assert_eq!(pick_cpus(&host, &[vec![0, 1], vec![0]], 2), vec![2, 3]);
        // A sandbox spanning every CPU weighs on all alike.
        assert_eq!(
            pick_cpus(&host, &[vec![0, 1, 2, 3], vec![2]], 2),
            vec![0, 1]
        );
        // As many CPUs as the host has, or more: all of them.
        assert_eq!(pick_cpus(&host, &[vec![0]], 4), host.to_vec());
        assert_eq!(pick_cpus(&[0, 1], &[], 8), vec![0, 1]);
        assert_eq!(pick_cpus(&[5, 7], &[vec![5]], 1), vec![7]);
    }

    #[test]
    fn cpu_lists_read_and_write_the_kernel_format() {
        assert_eq!(parse_cpu_list("0-3,6\n"), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("\n"), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("1"), vec![1]);
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(format_cpu_list(&[1]), "1");
        assert_eq!(format_cpu_list(&[0, 2, 3]), "0,2-3");
    }

    #[test]
    fn in_group_reads_v1_cgroup_lines() {
        let task =
            "12:pids:/berth/abc/workload\n7:cpu,cpuacct:/berth/abc\n5:memory:/berth/abc\n0::/\n";
        assert!(in_group(task, "pids", "/abc/workload"));
        assert!(!in_group(task, "memory", "/abc/workload"));
        assert!(in_group(task, "cpuacct", "/abc"));
        assert!(!in_group(task, "pids", "/other/workload"));
        assert!(!in_group("garbage", "pids", "/abc/workload"));
    }

    #[test]
    fn stat_field_finds_exact_key() {
        let text = "cache 10\ntotal_cache 20\nrss 5\n";
        assert_eq!(stat_field(text, "cache"), Some(10));
        assert_eq!(stat_field(text, "total_cache"), Some(20));
        assert_eq!(stat_field(text, "missing"), None);
    }

    /// A real group tree under a parent of its own, with a `sleep` to move; all of it
    /// removed on drop.
    struct RealGroups {
        cgroups: Cgroups,
        child: Option<std::process::Child>,
    }

    impl Drop for RealGroups {
        fn drop(&mut self) {
            if let Some(child) = &mut self.child {
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = self.cgroups.remove("s");
            for dir in self.cgroups.dirs("s") {
                let _ = std::fs::remove_dir(dir.parent().unwrap());
            }
        }
    }

    /// What a systemd booting or reloading on a v1 host does to hierarchies its units do
    /// not use (see `Cgroups::attach`): empty groups go, berth's parent included. A start
    /// makes both again and its init lands in groups with the sandbox's limits.
    #[test]
    fn groups_removed_while_empty_are_made_again() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: real cgroups need root");
            return;
        }
        let parent = format!("berth-trimmed-{}", std::process::id());
        let mut groups = RealGroups {
            cgroups: Cgroups::detect(std::path::Path::new("/sys/fs/cgroup"), &parent).unwrap(),
            child: None,
        };
        let limits = CgroupLimits {
            cpu_count: 1,
            memory_bytes: 64 << 20,
            pids_max: 64,
        };
        let cpu = groups.cgroups.dirs("s")[0].clone();
        std::fs::remove_dir(cpu.parent().unwrap()).unwrap();
        groups.cgroups.create("s", limits).unwrap();
        std::fs::remove_dir(&cpu).unwrap();

        let child = groups.child.insert(
            std::process::Command::new("sleep")
                .arg("1000")
                .spawn()
                .unwrap(),
        );
        let pid = child.id() as libc::pid_t;
        groups.cgroups.attach("s", pid, limits).unwrap();
        for dir in groups.cgroups.dirs("s") {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            assert!(
                procs.lines().any(|line| line == pid.to_string()),
                "{}: {procs}",
                dir.display()
            );
        }
        let quota = ["cpu.cfs_quota_us", "cpu.max"]
            .iter()
            .find_map(|file| std::fs::read_to_string(cpu.join(file)).ok())
            .unwrap();
        assert!(quota.starts_with("100000"), "{quota}");
    }
}
