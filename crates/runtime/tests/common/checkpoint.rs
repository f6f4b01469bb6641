//! Fixtures for the CRIU tests (pause, fork): CRIU itself, a process holding a secret only
//! in memory, and a check that nothing of a sandbox is left on the host.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_checkpoint::Criu;
use berth_runtime::{LinuxRuntime, Runtime};

use super::TestRuntime;

/// CRIU from `BERTH_CRIU_STATE_DIR` (a state dir holding `criu/prefix`), else berth's.
pub fn criu() -> Criu {
    let state = std::env::var_os("BERTH_CRIU_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/berth"));
    Criu::ensure(&state, |p| eprintln!("{p}")).expect("CRIU >= 4")
}

/// Kills the sandbox (running or paused) when the test ends, even on failure.
pub struct KillGuard<'a> {
    pub rt: &'a LinuxRuntime,
    pub id: String,
}

impl Drop for KillGuard<'_> {
    fn drop(&mut self) {
        let _ = self.rt.kill(&self.id);
    }
}

/// A Python process holding a random secret and `mib` MiB of ballast only in its memory;
/// it writes them to /root/answer whenever /root/ask appears.
const HOLDER: &str = r#"
import os, secrets, sys, time
secret = secrets.token_hex(16)
ballast = bytearray(os.urandom(1 << 20)) * int(sys.argv[1])
while True:
    if os.path.exists('/root/ask'):
        os.remove('/root/ask')
        with open('/root/answer.tmp', 'w') as f:
            f.write('%s %d' % (secret, len(ballast)))
        os.rename('/root/answer.tmp', '/root/answer')
    time.sleep(0.005)
"#;

pub fn start_holder(t: &TestRuntime, id: &str, mib: u32) {
    t.sh_ok(
        id,
        0,
        &format!(
            "cat > /root/holder.py <<'EOF'\n{HOLDER}\nEOF\n\
             setsid python3 /root/holder.py {mib} </dev/null >/dev/null 2>&1 &"
        ),
    );
}

/// Asks the holder for its secret; "<secret> <ballast bytes>".
pub fn ask(rt: &LinuxRuntime, id: &str) -> String {
    let out = rt
        .exec_command(
            id,
            0,
            0,
            &[
                "/bin/sh",
                "-c",
                "rm -f /root/answer; touch /root/ask; \
                 i=0; while [ ! -e /root/answer ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; \
                 cat /root/answer",
            ],
        )
        .unwrap()
        .output()
        .unwrap();
    if !out.status.success() {
        let owners = rt
            .exec_command(id, 0, 0, &["/bin/sh", "-c", "id; ls -lnd / /root /root/*"])
            .map(|mut c| c.output());
        panic!("{id}: asking the holder failed: {out:?}\nowners seen inside: {owners:?}");
    }
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Everything of sandbox `id` still on the host: mounts, loop devices, cgroups (in every
/// v1 hierarchy), its directory (also in trash/), and the `extra` paths.
pub fn leftovers(t: &TestRuntime, id: &str, extra: &[&Path]) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(id))
        .map(|l| format!("mount {l}"))
        .collect();
    found.extend(
        std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .filter(|backing| backing.contains(id))
            .map(|b| format!("loop device on {}", b.trim())),
    );
    let mut hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    hierarchies.push(PathBuf::from("/sys/fs/cgroup"));
    for root in hierarchies {
        let group = root.join(t.cgroup_parent()).join(id);
        if group.exists() {
            found.push(format!("cgroup {}", group.display()));
        }
    }
    let mut paths: Vec<PathBuf> = vec![t.state.join("sandboxes").join(id)];
    paths.extend(extra.iter().map(|p| p.to_path_buf()));
    paths.extend(
        std::fs::read_dir(t.state.join("trash"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains(id)),
    );
    found.extend(
        paths
            .into_iter()
            .filter(|p| p.exists())
            .map(|p| format!("path {}", p.display())),
    );
    found
}

/// Waits for the janitor's asynchronous part of a kill, then asserts nothing is left.
pub fn assert_clean(t: &TestRuntime, id: &str, extra: &[&Path]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left = leftovers(t, id, extra);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = leftovers(t, id, extra);
    }
    assert!(left.is_empty(), "left behind: {left:#?}");
}

pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit_once(')').unwrap().1.starts_with(" Z"))
        .unwrap_or(false)
}
