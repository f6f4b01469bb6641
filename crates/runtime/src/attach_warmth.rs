//! Keeps moving tasks between cgroups cheap while sandboxes start.
//!
//! Every move of a task named by pid into a cgroup (`cgroup.procs`, v1 `tasks`) takes
//! the kernel's global `cgroup_threadgroup_rwsem` for writing. That semaphore is biased
//! to its readers (every fork and exit on the host): a writer that comes when no other
//! came within about one RCU grace period first waits a grace period out (6–17 ms on the
//! project's machine, measured), while a writer following another within it pays ~30 µs.
//! A sandbox's start moves its init into each of its groups, envd's spawner thread into
//! the workload groups, and CRIU's restore every task into its groups: each start paid a
//! grace period, on its critical path.
//!
//! [`AttachWarmth::hold`] keeps writers coming while starts are under way: a thread of
//! its own moves itself into the group it is already in (a move that changes nothing)
//! every [`PERIOD`], from the first hold until [`LINGER`] after the last one ends, which
//! covers the `confine_workload` that follows a start. Its first move pays the grace
//! period on that thread, in parallel with the start's own work (disk, network, mounts).
//! That move waits with the kernel's `cgroup_mutex` held (a v1 `tasks` or
//! `cgroup.procs` write takes the mutex before the semaphore), and making a group takes
//! the same mutex: so a start makes its groups before it holds the warmth
//! (`LinuxRuntime::make_cgroups`), or its `mkdir`s wait the grace period out.
//! The price, only while it runs: forks and exits take the semaphore's slower path, the
//! trade the kernel's `favordynmods` cgroup mount option makes for good. berth leaves
//! the host's cgroup mounts as they are.
//!
//! Nothing here is needed for correctness: where the thread cannot start or its move
//! fails, starts just pay the grace period as before.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the warming thread moves itself: well inside the shortest grace period
/// measured (writers 10 ms apart stayed cheap; 20 ms apart paid it again).
const PERIOD: Duration = Duration::from_millis(4);
/// How long the thread keeps going after the last hold ends.
const LINGER: Duration = Duration::from_millis(100);

/// The file a task writes its own id into to move itself where it already is.
#[derive(Debug, Clone)]
enum Target {
    /// v1: `<mount>/<controller>/<own group>/tasks`, written with the thread's tid.
    V1 {
        controller_mount: PathBuf,
        controller: String,
    },
    /// v2: `<mount>/<own group>/cgroup.procs`, written with the process's pid.
    V2 { mount: PathBuf },
}

#[derive(Debug, Default)]
struct State {
    holders: usize,
    /// When the thread may stop once nobody holds it.
    linger_until: Option<Instant>,
    running: bool,
}

/// Shared by every start of one runtime; see the module doc.
#[derive(Debug)]
pub(crate) struct AttachWarmth {
    target: Target,
    state: Arc<Mutex<State>>,
}

/// Keeps the warming thread going while held.
#[must_use = "the warmth lasts only while the hold lives"]
pub(crate) struct Hold {
    state: Arc<Mutex<State>>,
}

impl AttachWarmth {
    /// For the v1 hierarchy of `controller` mounted under `mount`.
    pub(crate) fn v1(mount: &Path, controller: &str) -> Self {
        Self::with(Target::V1 {
            controller_mount: mount.join(controller),
            controller: controller.to_owned(),
        })
    }

    /// For the unified (v2) hierarchy mounted at `mount`.
    pub(crate) fn v2(mount: &Path) -> Self {
        Self::with(Target::V2 {
            mount: mount.to_owned(),
        })
    }

    fn with(target: Target) -> Self {
        AttachWarmth {
            target,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// Keeps task moves cheap until the hold is dropped (and [`LINGER`] after).
    pub(crate) fn hold(&self) -> Hold {
        let mut state = lock(&self.state);
        state.holders += 1;
        if !state.running {
            let shared = Arc::clone(&self.state);
            let target = self.target.clone();
            let spawned = std::thread::Builder::new()
                .name("cgroup-warmth".into())
                .spawn(move || warm(&target, &shared));
            match spawned {
                Ok(_) => state.running = true,
                Err(err) => tracing::debug!(%err, "cannot start the cgroup warming thread"),
            }
        }
        Hold {
            state: Arc::clone(&self.state),
        }
    }

    #[cfg(test)]
    fn running(&self) -> bool {
        lock(&self.state).running
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.holders -= 1;
        if state.holders == 0 {
            state.linger_until = Some(Instant::now() + LINGER);
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The warming thread: moves itself into its own group every [`PERIOD`] while held.
fn warm(target: &Target, state: &Mutex<State>) {
    let Some((file, id)) = own_group_file(target) else {
        lock(state).running = false;
        return;
    };
    loop {
        {
            let mut state = lock(state);
            let lingering = state
                .linger_until
                .is_some_and(|until| Instant::now() < until);
            if state.holders == 0 && !lingering {
                state.running = false;
                return;
            }
        }
        if let Err(err) = fs::write(&file, &id) {
            tracing::debug!(file = %file.display(), %err, "the cgroup warming move failed");
            lock(state).running = false;
            return;
        }
        std::thread::sleep(PERIOD);
    }
}

/// The calling thread's own group file and the id to write into it, from
/// `/proc/thread-self/cgroup`.
fn own_group_file(target: &Target) -> Option<(PathBuf, String)> {
    let cgroups = fs::read_to_string("/proc/thread-self/cgroup").ok()?;
    match target {
        Target::V1 {
            controller_mount,
            controller,
        } => {
            let group = group_of(&cgroups, |controllers| {
                controllers.split(',').any(|c| c == controller)
            })?;
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            Some((
                controller_mount
                    .join(group.trim_start_matches('/'))
                    .join("tasks"),
                tid.to_string(),
            ))
        }
        Target::V2 { mount } => {
            let group = group_of(&cgroups, str::is_empty)?;
            Some((
                mount
                    .join(group.trim_start_matches('/'))
                    .join("cgroup.procs"),
                std::process::id().to_string(),
            ))
        }
    }
}

/// The group path of the `/proc/…/cgroup` line whose controller list `matches`.
fn group_of(cgroups: &str, matches: impl Fn(&str) -> bool) -> Option<&str> {
    cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        matches(controllers).then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_LINES: &str = "13:hugetlb:/\n8:pids:/user.slice\n1:cpu,cpuacct:/\n0::/init.scope\n";

    #[test]
    fn the_group_is_read_from_the_controllers_line() {
        assert_eq!(group_of(V1_LINES, |c| c == "pids"), Some("/user.slice"));
        assert_eq!(
            group_of(V1_LINES, |c| c.split(',').any(|c| c == "cpuacct")),
            Some("/")
        );
        assert_eq!(group_of(V1_LINES, str::is_empty), Some("/init.scope"));
        assert_eq!(group_of(V1_LINES, |c| c == "memory"), None);
    }

    #[test]
    fn the_thread_stops_when_it_has_nowhere_to_write() {
        // No such hierarchy: the thread finds no group file and ends at once.
        let warmth = AttachWarmth::v1(Path::new("/nonexistent"), "no-such-controller");
        let hold = warmth.hold();
        let deadline = Instant::now() + Duration::from_secs(5);
        while warmth.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!warmth.running());
        drop(hold);
        // A later hold starts it again (and it ends again).
        let _again = warmth.hold();
    }

    /// On this host's own hierarchy (the privileged tier runs as root).
    #[test]
    fn while_held_the_thread_keeps_moving_itself_and_it_stops_after_the_last_hold() {
        let mount = Path::new("/sys/fs/cgroup");
        let warmth = if mount.join("pids").join("tasks").exists() {
            AttachWarmth::v1(mount, "pids")
        } else {
            AttachWarmth::v2(mount)
        };
        let first = warmth.hold();
        let second = warmth.hold();
        std::thread::sleep(PERIOD * 10);
        assert!(warmth.running(), "a move into its own group failed");
        drop(first);
        std::thread::sleep(PERIOD * 5);
        assert!(warmth.running(), "stopped while still held");
        drop(second);
        let deadline = Instant::now() + LINGER + Duration::from_secs(5);
        while warmth.running() && Instant::now() < deadline {
            std::thread::sleep(PERIOD);
        }
        assert!(!warmth.running(), "still running long after the last hold");
    }
}
