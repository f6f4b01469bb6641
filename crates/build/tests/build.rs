//! Template builds on the real runtime. Privileged: run as root. Needs berth's `base`
//! template in /var/lib/berth (built on first need, as the runtime tests do) and CRIU
//! provisioned there for the start-command test.

#[path = "../../oci/tests/common/mod.rs"]
mod registry;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_build::{
    BuildBase, BuildEngine, BuildError, BuildRequest, BuildState, BuildStatus, EngineConfig, Step,
};
use berth_oci::{ImagePuller, PullerConfig};
use berth_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime, SandboxSpec};
use berth_template::TemplateStore;

/// A runtime (init: the real berth-envd), template store with `base` (hard links of
/// /var/lib/berth's), and build engine on a state dir of their own; all of it removed
/// on drop, sandboxes first.
struct Fixture {
    engine: BuildEngine,
    rt: Arc<LinuxRuntime>,
    store: TemplateStore,
    state: PathBuf,
    cgroup_parent: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for info in self.rt.list() {
            let _ = self.rt.kill(&info.id);
        }
        // Unmounts the envd binary's filesystem under the state dir before it goes.
        let _ = self.rt.release_network_if_idle();
        for ctrl in ["cpu", "cpuacct", "cpuset", "memory", "pids", "freezer", ""] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(&self.cgroup_parent),
            );
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

fn workspace_binary(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", package, "--bin", name])
            .status()
            .unwrap();
        assert!(status.success(), "building {name}");
    }
    path
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Fixture {
    fn new() -> Fixture {
        let name = format!(
            "berth-build-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let state = PathBuf::from("/var/lib/berth-test").join(&name);
        std::fs::create_dir_all(&state).unwrap();
        let mut config =
            LinuxRuntimeConfig::new(&state, workspace_binary("berth-envd", "berth-envd"));
        config.launcher_binary = workspace_binary("berth-launch", "berth-runtime");
        config.cgroup_parent = name.clone();
        config.disk_pool_size = 0;
        config.criu_state_dir = PathBuf::from("/var/lib/berth");
        let rt = Arc::new(LinuxRuntime::new(config).unwrap());
        let store = TemplateStore::open(&state).unwrap();
        import_base(&store);
        let mut engine_config = EngineConfig::new(&state);
        engine_config.ready_timeout = Duration::from_secs(60);
        let (engine, interrupted) = BuildEngine::new(
            engine_config,
            rt.clone(),
            store.clone(),
            ImagePuller::new(PullerConfig::default()).unwrap(),
        )
        .unwrap();
        assert!(interrupted.is_empty());
        Fixture {
            engine,
            rt,
            store,
            state,
            cgroup_parent: name,
        }
    }

    fn build(&self, id: &str, base: BuildBase, steps: Vec<Step>) -> BuildStatus {
        self.build_with(id, base, steps, None, None)
    }

    fn build_with(
        &self,
        id: &str,
        base: BuildBase,
        steps: Vec<Step>,
        start_cmd: Option<&str>,
        ready_cmd: Option<&str>,
    ) -> BuildStatus {
        self.engine
            .start(BuildRequest {
                build_id: id.into(),
                template_id: format!("t-{id}"),
                base,
                steps,
                start_cmd: start_cmd.map(str::to_string),
                ready_cmd: ready_cmd.map(str::to_string),
                force: false,
                cpu_count: 1,
                memory_mb: 512,
                disk_size_mb: 1024,
                files_scope: "team1".into(),
            })
            .unwrap();
        let status = self.engine.wait(id, Duration::from_secs(600)).unwrap();
        assert!(
            matches!(status.state, BuildState::Ready | BuildState::Error),
            "{status:?}"
        );
        status
    }

    fn logs(&self, id: &str) -> String {
        self.engine
            .logs(id, 0, 10_000)
            .iter()
            .map(|e| format!("[{}] {}", e.step.as_deref().unwrap_or("-"), e.message))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A sandbox of template `template` (killed by the fixture).
    fn sandbox(&self, template: &str) -> String {
        let t = self.store.get(template).unwrap();
        let id = format!(
            "check{}",
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        self.rt
            .create(&SandboxSpec {
                id: id.clone(),
                template: template.into(),
                layers: t.layers,
                cpu_count: 1,
                memory_mb: 256,
                disk_size_mb: 256,
                volumes: Vec::new(),
            })
            .unwrap();
        id
    }

    fn sh(&self, id: &str, uid: u32, script: &str) -> String {
        let out = self
            .rt
            .exec_command(id, uid, uid, &["/bin/sh", "-c", script])
            .unwrap()
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{script}`: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn assert_clean(&self) {
        assert!(
            self.rt.list().is_empty(),
            "build sandboxes left: {:?}",
            self.rt.list()
        );
        let staging = self.store.root().join("staging");
        assert_eq!(
            std::fs::read_dir(&staging).unwrap().count(),
            0,
            "staging left"
        );
    }
}

/// `base` from berth's default store, hard-linked into `store` (same filesystem).
fn import_base(store: &TemplateStore) {
    let shared = TemplateStore::open(berth_template::DEFAULT_STATE_DIR).unwrap();
    let base = shared
        .ensure_base(|p| eprintln!("base template: {p:?}"))
        .unwrap();
    for layer in &base.layer_ids {
        let from = shared.root().join("layers").join(layer.as_str());
        let to = store.root().join("layers").join(layer.as_str());
        registry::run(Command::new("cp").arg("-al").arg(&from).arg(&to));
    }
    store
        .put("base", base.layer_ids.clone(), base.config())
        .unwrap();
}

/// Makes the upload for `COPY src dest` exactly as SDK 2.63 does (Python tarfile,
/// gzip, sorted paths relative to the context) and its filesHash by the SDK's own
/// algorithm; returns the hash and the upload path.
fn sdk_upload(context: &Path, src: &str, dest: &str, out: &Path) -> String {
    let script = r#"
import hashlib, os, stat, sys, tarfile
ctx, src, dest, out = sys.argv[1:5]
top = os.path.join(ctx, src)
files = [top]
if os.path.isdir(top) and not os.path.islink(top):
    for root, dirs, names in os.walk(top):
        files.append(root)
        files.extend(os.path.join(root, n) for n in dirs + names)
files = sorted(set(files))
with tarfile.open(out, "w:gz") as tar:
    for f in files:
        tar.add(f, arcname=os.path.relpath(f, ctx), recursive=False)
h = hashlib.sha256(f"COPY {src} {dest}".encode())
for f in files:
    h.update(os.path.relpath(f, ctx).encode())
    if os.path.islink(f):
        st = os.lstat(f)
        h.update(str(st.st_mode).encode()); h.update(str(st.st_size).encode())
        h.update(os.readlink(f).encode()); continue
    st = os.stat(f)
    h.update(str(st.st_mode).encode())
    if not stat.S_ISDIR(st.st_mode): h.update(str(st.st_size).encode())
    if stat.S_ISREG(st.st_mode): h.update(open(f, "rb").read())
print(h.hexdigest())
"#;
    let hash = registry::run(
        Command::new("python3")
            .args(["-c", script])
            .arg(context)
            .args([src, dest])
            .arg(out),
    );
    hash.trim().to_string()
}

fn copy_step(src: &str, dest: &str, hash: &str) -> Step {
    Step {
        files_hash: Some(hash.into()),
        ..Step::new("COPY", &[src, dest, "", ""])
    }
}

fn run_as(command: &str, user: &str) -> Step {
    Step::new("RUN", &[command, user])
}

#[test]
fn steps_from_base_build_cache_and_rerun_from_the_changed_step() {
    let f = Fixture::new();
    let context = tempfile::tempdir().unwrap();
    let ctx = context.path();
    std::fs::write(ctx.join("config.json"), "{\"port\": 8000}\n").unwrap();
    std::fs::create_dir_all(ctx.join("app/lib")).unwrap();
    std::fs::write(ctx.join("app/main.py"), "print('hi')\n").unwrap();
    std::fs::write(ctx.join("app/lib/util.py"), "X = 1\n").unwrap();
    std::os::unix::fs::symlink("main.py", ctx.join("app/entry.py")).unwrap();
    std::os::unix::fs::symlink("lib", ctx.join("app/modules")).unwrap();
    let uploads = tempfile::tempdir().unwrap();
    let mut hashes = BTreeMap::new();
    for (src, dest) in [("config.json", "/etc/app/"), ("app", "app")] {
        let upload = uploads.path().join(format!("{src}.tar.gz"));
        let hash = sdk_upload(ctx, src, dest, &upload);
        assert!(!f.engine.files().has("team1", &hash));
        f.engine
            .files()
            .put("team1", &hash, std::fs::File::open(&upload).unwrap())
            .unwrap();
        hashes.insert(src, hash);
    }
    let steps = |user_cmd: &str| {
        vec![
            run_as(
                "echo root-was-here > /etc/berth-root && id -un > /etc/berth-root-user",
                "root",
            ),
            copy_step("config.json", "/etc/app/", &hashes["config.json"]),
            Step::new(
                "ENV",
                &[
                    "GREETING",
                    "hello",
                    "FULL",
                    "$GREETING world",
                    "PATH",
                    "/opt/bt:$PATH",
                ],
            ),
            Step::new("WORKDIR", &["/srv/work"]),
            copy_step("app", "app", &hashes["app"]),
            Step::new("RUN", &[user_cmd]),
            Step::new("USER", &["root"]),
            Step::new("RUN", &["whoami > /whoami"]),
            Step::new("USER", &["user"]),
        ]
    };
    let started = Instant::now();
    let status = f.build(
        "b1",
        BuildBase::Template("base".into()),
        steps("echo \"$FULL $(id -un) $(pwd)\" > out.txt"),
    );
    let cold = started.elapsed();
    assert_eq!(
        status.state,
        BuildState::Ready,
        "{status:?}\n{}",
        f.logs("b1")
    );
    f.assert_clean();

    let template = f.store.get("t-b1").unwrap();
    assert_eq!(template.default_user, "user");
    assert_eq!(template.default_workdir, "/srv/work");
    assert_eq!(
        template.envs.get("FULL").map(String::as_str),
        Some("hello world")
    );
    let sb = f.sandbox("t-b1");
    assert_eq!(
        f.sh(&sb, 0, "cat /etc/berth-root /etc/berth-root-user"),
        "root-was-here\nroot"
    );
    assert_eq!(
        f.sh(&sb, 0, "cat /srv/work/out.txt"),
        "hello world user /srv/work"
    );
    assert_eq!(f.sh(&sb, 0, "cat /whoami"), "root");
    assert_eq!(f.sh(&sb, 0, "cat /etc/app/config.json"), "{\"port\": 8000}");
    // COPY: owned by the step's user, symlinks kept as links, directories merged.
    assert_eq!(
        f.sh(
            &sb,
            0,
            "stat -c '%U %a' /srv/work/app/main.py /etc/app/config.json"
        ),
        "user 644\nuser 644"
    );
    assert_eq!(
        f.sh(
            &sb,
            0,
            "readlink /srv/work/app/entry.py /srv/work/app/modules"
        ),
        "main.py\nlib"
    );
    assert_eq!(f.sh(&sb, 0, "cat /srv/work/app/modules/util.py"), "X = 1");
    assert_eq!(
        f.sh(&sb, 1000, "sudo -n id -u && cd && pwd"),
        "0\n/home/user"
    );
    f.rt.kill(&sb).unwrap();

    // Unchanged: nothing runs.
    let started = Instant::now();
    let cached = f.build(
        "b2",
        BuildBase::Template("base".into()),
        steps("echo \"$FULL $(id -un) $(pwd)\" > out.txt"),
    );
    let warm = started.elapsed();
    assert_eq!(cached.state, BuildState::Ready);
    assert!(
        cached.executed_steps.is_empty(),
        "{:?}\n{}",
        cached.executed_steps,
        f.logs("b2")
    );
    assert_eq!(f.store.get("t-b2").unwrap().layer_ids, template.layer_ids);

    // Step 6 changed: it and the sandbox steps after it run, nothing before.
    let changed = f.build(
        "b3",
        BuildBase::Template("base".into()),
        steps("echo changed > out.txt"),
    );
    assert_eq!(changed.state, BuildState::Ready, "{}", f.logs("b3"));
    assert_eq!(
        changed.executed_steps,
        vec!["6", "7", "8", "9"],
        "{}",
        f.logs("b3")
    );
    let sb = f.sandbox("t-b3");
    assert_eq!(f.sh(&sb, 0, "cat /srv/work/out.txt"), "changed");
    f.rt.kill(&sb).unwrap();
    f.assert_clean();
    eprintln!(
        "MEASURE cold build of {} steps from base: {:.2} s; fully cached rebuild: {:.3} s",
        steps("").len(),
        cold.as_secs_f64(),
        warm.as_secs_f64()
    );
}

#[test]
fn a_three_step_build_from_base_measures_cold_and_cached() {
    let f = Fixture::new();
    let steps = || {
        vec![
            run_as("apt-get --version > /opt-apt-version", "root"),
            Step::new("WORKDIR", &["/home/user/project"]),
            Step::new("RUN", &["echo ready > state"]),
        ]
    };
    let started = Instant::now();
    let cold = f.build("m1", BuildBase::Template("base".into()), steps());
    let cold_time = started.elapsed();
    assert_eq!(cold.state, BuildState::Ready, "{}", f.logs("m1"));
    let started = Instant::now();
    let warm = f.build("m2", BuildBase::Template("base".into()), steps());
    let warm_time = started.elapsed();
    assert!(warm.executed_steps.is_empty());
    eprintln!(
        "MEASURE 3-step build from base: cold {:.2} s, fully cached {:.3} s",
        cold_time.as_secs_f64(),
        warm_time.as_secs_f64()
    );

    // force on the last step reruns only it; force on the build reruns everything.
    let mut forced = steps();
    forced[2].force = Some(true);
    let one = f.build("m3", BuildBase::Template("base".into()), forced);
    assert_eq!(one.executed_steps, vec!["3"], "{}", f.logs("m3"));
    f.engine
        .start(BuildRequest {
            build_id: "m4".into(),
            template_id: "t-m4".into(),
            base: BuildBase::Template("base".into()),
            steps: steps(),
            start_cmd: None,
            ready_cmd: None,
            force: true,
            cpu_count: 1,
            memory_mb: 256,
            disk_size_mb: 256,
            files_scope: "team1".into(),
        })
        .unwrap();
    let all = f.engine.wait("m4", Duration::from_secs(600)).unwrap();
    assert_eq!(all.state, BuildState::Ready);
    assert_eq!(
        all.executed_steps,
        vec!["base", "1", "2", "3"],
        "{}",
        f.logs("m4")
    );
}

#[test]
fn a_failing_step_reports_its_number_and_stderr_and_leaves_nothing() {
    let f = Fixture::new();
    let status = f.build(
        "fail1",
        BuildBase::Template("base".into()),
        vec![
            Step::new("RUN", &["true"]),
            Step::new(
                "RUN",
                &["echo about to fail; echo 'boom: no such thing' >&2; exit 3"],
            ),
            Step::new("RUN", &["echo never"]),
        ],
    );
    assert_eq!(status.state, BuildState::Error);
    let reason = status.reason.clone().unwrap();
    assert_eq!(reason.step.as_deref(), Some("2"), "{reason:?}");
    assert!(reason.message.contains("boom: no such thing"), "{reason:?}");
    assert!(reason.message.contains("exit status: 3"), "{reason:?}");
    let logs = f.engine.logs("fail1", 0, 1000);
    assert!(logs
        .iter()
        .any(|e| e.step.as_deref() == Some("2") && e.message == "about to fail"));
    assert!(!logs.iter().any(|e| e.message == "never"));
    assert!(f.store.get("t-fail1").is_err(), "no half template");
    f.assert_clean();
    // A restarted engine reads the finished build back.
    let (engine, interrupted) = BuildEngine::new(
        EngineConfig::new(&f.state),
        f.rt.clone(),
        f.store.clone(),
        ImagePuller::new(PullerConfig::default()).unwrap(),
    )
    .unwrap();
    assert!(interrupted.is_empty());
    assert_eq!(engine.status("fail1").unwrap().reason, status.reason);
    assert_eq!(engine.logs("fail1", 0, 1000).len(), logs.len());
}

#[test]
fn cancel_kills_the_step_and_a_restart_marks_running_builds_interrupted() {
    let f = Fixture::new();
    f.engine
        .start(BuildRequest {
            build_id: "slow".into(),
            template_id: "t-slow".into(),
            base: BuildBase::Template("base".into()),
            steps: vec![Step::new("RUN", &["echo started; sleep 600"])],
            start_cmd: None,
            ready_cmd: None,
            force: false,
            cpu_count: 1,
            memory_mb: 256,
            disk_size_mb: 256,
            files_scope: "team1".into(),
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !f
        .engine
        .logs("slow", 0, 1000)
        .iter()
        .any(|e| e.message == "started")
    {
        assert!(Instant::now() < deadline, "{}", f.logs("slow"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let cancelled_at = Instant::now();
    f.engine.cancel("slow").unwrap();
    let status = f.engine.wait("slow", Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, BuildState::Error);
    assert!(status.reason.unwrap().message.contains("cancelled"));
    assert!(
        matches!(f.engine.cancel("slow"), Err(BuildError::NotFound(_))),
        "a finished build has nothing left to cancel"
    );
    eprintln!("cancel took {:.2} s", cancelled_at.elapsed().as_secs_f64());
    f.assert_clean();

    // A status left `building` by a daemon that died is reported interrupted.
    let run = f.state.join("builds/runs/dead");
    std::fs::create_dir_all(&run).unwrap();
    let mut dead = f.engine.status("slow").unwrap();
    dead.build_id = "dead".into();
    dead.state = BuildState::Building;
    dead.reason = None;
    std::fs::write(run.join("status.json"), serde_json::to_vec(&dead).unwrap()).unwrap();
    let (engine, interrupted) = BuildEngine::new(
        EngineConfig::new(&f.state),
        f.rt.clone(),
        f.store.clone(),
        ImagePuller::new(PullerConfig::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(engine.status("dead").unwrap().state, BuildState::Error);
}

#[test]
fn a_start_cmd_template_restores_with_the_process_serving() {
    let f = Fixture::new();
    let status = f.build_with(
        "srv",
        BuildBase::Template("base".into()),
        vec![run_as(
            "mkdir -p /srv/www && echo served-from-checkpoint > /srv/www/index.html",
            "root",
        )],
        Some("python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv/www"),
        Some("curl -sf http://127.0.0.1:8000/ > /dev/null"),
    );
    assert_eq!(status.state, BuildState::Ready, "{}", f.logs("srv"));
    f.assert_clean();
    let checkpoint = f
        .engine
        .template_checkpoint("t-srv")
        .expect("checkpoint recorded");
    let template = f.store.get("t-srv").unwrap();
    assert_eq!(
        template.start_cmd.as_deref(),
        Some("python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv/www")
    );
    let restored_at = Instant::now();
    let info = f.rt.restore(&checkpoint, "fromckpt", true).unwrap();
    // The very first request is answered: no start, no wait.
    let mut stream = f.rt.connect(&info.id, 8000).unwrap();
    use std::io::{Read, Write};
    write!(stream, "GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let first_answer = restored_at.elapsed();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    assert!(response.contains("served-from-checkpoint"));
    eprintln!(
        "MEASURE restore from template checkpoint → first answer: {:.0} ms",
        first_answer.as_secs_f64() * 1000.0
    );
    f.rt.kill(&info.id).unwrap();
    assert_eq!(
        f.engine.remove_unreferenced_checkpoints().unwrap(),
        Vec::<PathBuf>::new()
    );
}

#[test]
fn a_build_from_a_local_registry_image_gets_user_and_steps() {
    let f = Fixture::new();
    let reg = registry::Registry::start(registry::RegistryAuthMode::Basic);
    let layout = registry::Layout::with_base("v1");
    for tool in [
        "/bin/tar",
        "/bin/chmod",
        "/usr/bin/dirname",
        "/usr/bin/basename",
        "/bin/mv",
        "/bin/rm",
        "/bin/cp",
        "/usr/bin/whoami",
        "/usr/bin/stat",
    ] {
        registry::copy_with_libs(tool, &layout.rootfs());
    }
    // A debug build of berth-envd (the sandboxes' init here) is dynamically linked:
    // the image gets its libraries (the binary itself is bound in by the runtime).
    let envd = workspace_binary("berth-envd", "berth-envd");
    registry::copy_with_libs(envd.to_str().unwrap(), &layout.rootfs());
    std::fs::remove_file(layout.rootfs().join(envd.strip_prefix("/").unwrap())).unwrap();
    layout.repack("v1");
    layout.config(
        "v1",
        &[
            "--config.env=GREETING=from-image",
            "--config.env=PATH=/usr/local/bin:/usr/bin:/bin",
        ],
    );
    reg.push(&layout.dir, "v1", "team/mini:v1", true);
    let base = BuildBase::Image {
        reference: format!("{}/team/mini:v1", reg.host()),
        auth: Some(berth_oci::RegistryAuth::Basic(berth_oci::Credentials {
            username: registry::USER.into(),
            password: registry::PASSWORD.into(),
        })),
    };
    let status = f.build(
        "img",
        base,
        vec![
            run_as("echo $GREETING > /hello", "root"),
            Step::new("RUN", &["whoami > ~/me && pwd >> ~/me"]),
        ],
    );
    assert_eq!(status.state, BuildState::Ready, "{}", f.logs("img"));
    let template = f.store.get("t-img").unwrap();
    assert_eq!(template.default_user, "user");
    assert_eq!(template.default_workdir, "/home/user");
    assert_eq!(
        template.envs.get("GREETING").map(String::as_str),
        Some("from-image")
    );
    let sb = f.sandbox("t-img");
    assert_eq!(f.sh(&sb, 0, "cat /hello"), "from-image");
    assert_eq!(f.sh(&sb, 0, "cat /home/user/me"), "user\n/home/user");
    assert_eq!(f.sh(&sb, 0, "stat -c %u:%g /home/user"), "1000:1000");
    assert_eq!(
        f.sh(&sb, 0, "cat /etc/sudoers.d/berth-user"),
        "user ALL=(ALL:ALL) NOPASSWD: ALL"
    );
    f.rt.kill(&sb).unwrap();
    f.assert_clean();
}
