//! The one place envd waits for child processes.
//!
//! A single SIGCHLD listener reaps exited children and hands each status to whoever
//! spawned that pid through [`Reaper::spawn`]. Spawning and reaping take the same
//! lock, so a child that exits at once is still registered before any reap pass can
//! see it, and the wait for a child whose `exec` failed (in [`Launch::start`]) cannot
//! lose its child to us.
//!
//! When envd is PID 1 it also reaps every orphan re-parented to it (`waitpid(-1)`),
//! discarding their statuses; otherwise it only waits for the pids it registered, so
//! nothing else in the process can lose a child to it. Either way: every child envd
//! starts must be spawned through [`Reaper::spawn`]; never use `std::process`,
//! `tokio::process` or `Child::wait` in envd.
//!
//! Every child is cloned (see [`Launch`]) on one dedicated thread, named
//! [`SPAWNER_THREAD_NAME`]. A child starts in the cgroups of the thread that cloned it,
//! so the host moves that one thread into the sandbox's workload group (limits just
//! below the sandbox's) and every command lands there, while envd's other threads keep
//! the headroom above it: a fork bomb or a memory hog exhausts the workload group,
//! never envd.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

use crate::process::launch::{ChildStack, Launch};

/// The name (`comm`) of the thread every child is cloned from. A contract with the
/// host: berth's runtime finds the thread by this name in `/proc/<init>/task` and moves
/// it into the workload cgroup (`berth_runtime`'s `SPAWNER_THREAD`).
pub const SPAWNER_THREAD_NAME: &str = "envd-spawn";

/// A child for the spawner thread to start and where its pid goes.
type SpawnJob = (Launch, mpsc::SyncSender<io::Result<i32>>);

/// Dispatches child exit statuses by pid.
#[derive(Debug)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
    reap_orphans: bool,
    spawner: Mutex<mpsc::Sender<SpawnJob>>,
}

impl Reaper {
    /// Starts listening for SIGCHLD; call inside the tokio runtime before spawning.
    /// `reap_orphans` should be true when envd is PID 1.
    pub fn start(reap_orphans: bool) -> io::Result<Arc<Self>> {
        let (jobs, queue) = mpsc::channel::<SpawnJob>();
        let mut stack = ChildStack::new()?;
        let (running, started) = mpsc::sync_channel::<()>(0);
        std::thread::Builder::new()
            .name(SPAWNER_THREAD_NAME.into())
            .spawn(move || {
                let _ = running.send(());
                for (launch, result) in queue {
                    // Before each child: a restored envd has lost the slice (see
                    // `sched`). Without it the spawner only answers later.
                    if let Err(error) = crate::sched::request_short_slice() {
                        tracing::debug!(%error, "asking for a short time slice");
                    }
                    let pid = launch.start(&mut stack);
                    // The parent's copies of the child's stdio (a PTY slave) close here.
                    drop(launch);
                    let _ = result.send(pid);
                }
            })?;
        // The thread takes its name when it first runs. The host looks for that name
        // once envd answers, so envd answers nothing before the thread runs.
        started
            .recv()
            .map_err(|_| io::Error::other("envd's spawner thread did not start"))?;
        let reaper = Arc::new(Self {
            waiters: Mutex::new(HashMap::new()),
            reap_orphans,
            spawner: Mutex::new(jobs),
        });
        let mut sigchld = signal(SignalKind::child())?;
        let listener = Arc::clone(&reaper);
        tokio::spawn(async move {
            while sigchld.recv().await.is_some() {
                listener.reap();
            }
        });
        // Children that exited before the listener existed (e.g. inherited at exec).
        reaper.reap();
        Ok(reaper)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, oneshot::Sender<ExitStatus>>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts `launch` on the spawner thread and returns the child's pid with a receiver
    /// of its exit status. The launch (and the parent's copies of the child's stdio) is
    /// dropped once the child runs.
    pub(crate) fn spawn(&self, launch: Launch) -> io::Result<(i32, oneshot::Receiver<ExitStatus>)> {
        let mut waiters = self.lock();
        let (result, child) = mpsc::sync_channel(1);
        let gone = || io::Error::other("envd's spawner thread is gone");
        self.spawner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send((launch, result))
            .map_err(|_| gone())?;
        let pid = child.recv().map_err(|_| gone())??;
        let (sender, receiver) = oneshot::channel();
        waiters.insert(pid, sender);
        Ok((pid, receiver))
    }

    /// One reap pass: collects every exited child without blocking.
    fn reap(&self) {
        let mut waiters = self.lock();
        if self.reap_orphans {
            loop {
                let mut status = 0;
                // SAFETY: waitpid with a valid out-pointer; WNOHANG never blocks.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                if let Some(sender) = waiters.remove(&pid) {
                    // The spawner may have stopped caring; the status is then moot.
                    let _ = sender.send(ExitStatus::from_raw(status));
                }
            }
        } else {
            let pids: Vec<i32> = waiters.keys().copied().collect();
            for pid in pids {
                let mut status = 0;
                // SAFETY: waitpid on our own registered child; WNOHANG never blocks.
                let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if reaped == pid {
                    if let Some(sender) = waiters.remove(&pid) {
                        let _ = sender.send(ExitStatus::from_raw(status));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::OwnedFd;

    use super::*;
    use crate::process::child::SpawnSpec;

    fn launch(program: &str, args: &[&str]) -> Launch {
        let spec = SpawnSpec {
            program: program.into(),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/".into(),
            credentials: None,
            stdin: false,
            pty: None,
        };
        let null = || OwnedFd::from(File::open("/dev/null").unwrap());
        Launch::new(&spec, [null(), null(), null()]).unwrap()
    }

    #[tokio::test]
    async fn statuses_reach_their_spawners() {
        let reaper = Reaper::start(false).unwrap();
        let (_ok, ok_status) = reaper.spawn(launch("true", &[])).unwrap();
        let (_fail, fail_status) = reaper.spawn(launch("sh", &["-c", "exit 3"])).unwrap();
        assert_eq!(ok_status.await.unwrap().code(), Some(0));
        assert_eq!(fail_status.await.unwrap().code(), Some(3));
    }

    #[tokio::test]
    async fn failed_exec_is_an_error_not_a_panic() {
        let reaper = Reaper::start(false).unwrap();
        let err = reaper
            .spawn(launch("/nonexistent/berth-test-binary", &[]))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn the_spawner_thread_runs_under_its_contract_name() {
        let reaper = Reaper::start(false).unwrap();
        // The host looks for the thread by this name as soon as envd answers, before any
        // command: it must be there once `start` returns. Which thread cloned a child is
        // proved end to end by the sandbox tests (commands run in the workload cgroup).
        let names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
            .map(|name| name.trim_end().to_owned())
            .collect();
        assert!(names.iter().any(|n| n == SPAWNER_THREAD_NAME), "{names:?}");
        let (_child, status) = reaper.spawn(launch("true", &[])).unwrap();
        assert!(status.await.unwrap().success());
    }
}
