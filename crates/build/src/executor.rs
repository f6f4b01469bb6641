//! One build, start to finish: base, user setup, steps (each in its own build sandbox,
//! each change committed as a layer, each result cached), start/ready checkpoint, and
//! the template manifest written last.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use berth_oci::PullProgress;
use berth_runtime::{ExecOptions, Runtime, SandboxSpec};
use berth_template::{LayerId, TemplateConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::{Inner, LogLevel};
use crate::error::BuildError;
use crate::files::{is_gzip, sdk_files_hash};
use crate::request::{BuildBase, BuildRequest, Step};
use crate::scripts;

/// Bump when what a step does changes, so older cache entries are not reused.
const STEP_FORMAT: u32 = 1;
/// Lines of stderr kept for a failing step's reason.
const STDERR_TAIL: usize = 20;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// E2B's ready command when only a start command is given.
const DEFAULT_READY_CMD: &str = "sleep 20";
/// Where the start command's output goes inside the sandbox (tmpfs: part of the
/// checkpoint, never of a layer).
const START_LOG: &str = "/tmp/.berth-start.log";

/// The state steps run in, carried from step to step (and cached with each result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Context {
    pub user: String,
    /// None: the user's home (E2B's default).
    pub workdir: Option<String>,
    pub env: BTreeMap<String, String>,
}

/// A cached step result: the layer stack after it and the context after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheEntry {
    layers: Vec<LayerId>,
    context: Context,
}

/// Users and groups of the image (from its /etc/passwd and /etc/group).
struct Accounts {
    users: Vec<(String, u32, u32, String)>,
    groups: Vec<(String, u32)>,
    bash: bool,
}

impl Accounts {
    /// `name`, `uid`, `name:group` or `uid:gid` → (uid, gid, home).
    fn resolve(&self, spec: &str) -> Option<(u32, u32, String)> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let found = self
            .users
            .iter()
            .find(|(name, uid, _, _)| name == user || user.parse::<u32>().ok() == Some(*uid));
        let (uid, mut gid, home) = match found {
            Some((_, uid, gid, home)) => (*uid, *gid, home.clone()),
            None => {
                let uid = user.parse::<u32>().ok()?;
                (uid, uid, "/".to_string())
            }
        };
        if let Some(group) = group {
            gid = match self.groups.iter().find(|(name, _)| name == group) {
                Some((_, gid)) => *gid,
                None => group.parse().ok()?,
            };
        }
        Some((uid, gid, home))
    }

    fn shell(&self) -> Vec<String> {
        if self.bash {
            vec!["/bin/bash".into(), "-l".into(), "-c".into()]
        } else {
            vec!["/bin/sh".into(), "-c".into()]
        }
    }
}

/// A build sandbox, killed on drop unless committed.
struct BuildSandbox<'a> {
    inner: &'a Inner,
    id: String,
    armed: bool,
    _network: Option<Box<dyn std::any::Any + Send>>,
}

impl Drop for BuildSandbox<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.inner.runtime.kill(&self.id) {
                tracing::warn!(sandbox = %self.id, error = %e, "removing a build sandbox");
            }
        }
    }
}

pub(crate) struct Executor<'a> {
    pub inner: &'a Inner,
    pub request: &'a BuildRequest,
    pub cancelled: &'a AtomicBool,
    pub log: &'a dyn Fn(LogLevel, Option<&str>, String),
    pub sandbox_seq: u32,
    /// Steps that ran (not cached), for tests and logs.
    pub executed: Vec<String>,
}

/// What a finished build made.
#[derive(Debug, Clone)]
pub struct BuildOutput {
    pub template: berth_template::Template,
    /// Steps that ran (the others came from the cache): "base", "1".., "finalize".
    pub executed_steps: Vec<String>,
}

impl<'a> Executor<'a> {
    pub(crate) fn run(&mut self) -> Result<BuildOutput, BuildError> {
        let (mut layers, mut ctx) = self.base()?;
        self.check_cancel()?;
        // E2B's user phase: `user` exists with passwordless sudo, and steps run as it.
        self.sandbox_step(
            "base",
            &mut layers,
            &mut ctx,
            "berth user setup",
            self.request.force,
            |ex, sb, _| {
                let accounts = ex.accounts(sb, "base")?;
                ex.run_script(sb, "base", &accounts, "root", "/", scripts::USER_SETUP, &[])?;
                Ok(())
            },
        )?;
        ctx.user = "user".into();
        for (index, step) in self.request.steps.iter().enumerate() {
            self.check_cancel()?;
            let name = (index + 1).to_string();
            self.step(&name, step, &mut layers, &mut ctx)?;
        }
        self.check_cancel()?;
        self.finalize(layers, ctx)
    }

    fn check_cancel(&self) -> Result<(), BuildError> {
        if self.cancelled.load(Ordering::Relaxed) {
            Err(BuildError::Cancelled)
        } else {
            Ok(())
        }
    }

    fn say(&self, step: &str, message: impl Into<String>) {
        (self.log)(LogLevel::Info, Some(step), message.into());
    }

    /// The base layers and the context steps start in.
    fn base(&mut self) -> Result<(Vec<LayerId>, Context), BuildError> {
        match &self.request.base {
            BuildBase::Template(id) => {
                self.say("base", format!("FROM template {id}"));
                let template = self.inner.store.get(id)?;
                let ctx = Context {
                    user: template.default_user.clone(),
                    workdir: Some(template.default_workdir.clone()),
                    env: template.envs.clone(),
                };
                Ok((template.layer_ids, ctx))
            }
            BuildBase::Image { reference, auth } => {
                self.say("base", format!("FROM {reference}"));
                let log = self.log;
                let image = self.inner.puller.pull(
                    &self.inner.store,
                    reference,
                    auth.as_ref(),
                    &self.inner.config.platform,
                    self.cancelled,
                    &mut |event| {
                        let message = match event {
                            PullProgress::Resolved {
                                manifest_digest,
                                layers,
                            } => format!("resolved {manifest_digest} ({layers} layers)"),
                            PullProgress::LayerCached { digest, .. } => {
                                format!("layer {digest} cached")
                            }
                            PullProgress::LayerWaiting { digest } => {
                                format!("layer {digest}: waiting for another pull")
                            }
                            PullProgress::LayerDownloading { digest, size } => {
                                format!("layer {digest}: downloading {size} bytes")
                            }
                            PullProgress::LayerReady {
                                digest, elapsed, ..
                            } => format!("layer {digest} ready in {:.1} s", elapsed.as_secs_f64()),
                        };
                        log(LogLevel::Info, Some("base"), message);
                    },
                )?;
                // As E2B: the image's environment is kept; steps run as root until the
                // user phase, in the user's home.
                let env = image
                    .config
                    .env
                    .iter()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let ctx = Context {
                    user: "root".into(),
                    workdir: None,
                    env,
                };
                Ok((image.layers, ctx))
            }
        }
    }

    fn step(
        &mut self,
        name: &str,
        step: &Step,
        layers: &mut Vec<LayerId>,
        ctx: &mut Context,
    ) -> Result<(), BuildError> {
        let kind = step.kind.to_ascii_uppercase();
        let force = self.request.force || step.force == Some(true);
        let args = &step.args;
        self.say(name, format!("{kind} {}", args.join(" ")));
        match kind.as_str() {
            "ENV" | "ARG" => {
                if args.is_empty() || !args.len().is_multiple_of(2) {
                    return Err(BuildError::step(name, format!("{kind} needs key/value pairs")));
                }
                for pair in args.chunks(2) {
                    // As E2B evaluates values in the build sandbox: the variables of the
                    // steps' environment (PATH, HOME, USER) are visible too.
                    let mut visible = process_env(&ctx.user, None);
                    visible.extend(ctx.env.clone());
                    let value = expand(&pair[1], &visible);
                    ctx.env.insert(pair[0].clone(), value);
                }
                Ok(())
            }
            "RUN" => {
                let Some(command) = args.first().cloned() else {
                    return Err(BuildError::step(name, "RUN needs a command"));
                };
                let user = args.get(1).cloned().unwrap_or_else(|| ctx.user.clone());
                let identity = format!("RUN\0{command}\0{user}");
                self.sandbox_step(name, layers, ctx, &identity, force, |ex, sb, ctx| {
                    let accounts = ex.accounts(sb, name)?;
                    let mut argv = accounts.shell();
                    argv.push(command.clone());
                    ex.run_as(sb, name, &accounts, &user, ctx, argv, None)
                })
            }
            "USER" => {
                let Some(user) = args.first().cloned() else {
                    return Err(BuildError::step(name, "USER needs a user name"));
                };
                let sudo = args.get(1).is_some_and(|a| a == "true");
                let identity = format!("USER\0{user}\0{sudo}");
                self.sandbox_step(name, layers, ctx, &identity, force, |ex, sb, ctx| {
                    let accounts = ex.accounts(sb, name)?;
                    let script = if sudo {
                        scripts::CREATE_SUDO_USER
                    } else {
                        scripts::CREATE_USER
                    };
                    ex.run_script(sb, name, &accounts, "root", "/", script, &[("BERTH_USER", &user)])?;
                    ctx.user = user.clone();
                    Ok(())
                })
            }
            "WORKDIR" => {
                let Some(path) = args.first() else {
                    return Err(BuildError::step(name, "WORKDIR needs a path"));
                };
                let base = ctx.workdir.clone().unwrap_or_else(|| "/".into());
                let absolute = normalize(&if path.starts_with('/') {
                    path.clone()
                } else {
                    format!("{base}/{path}")
                });
                let identity = format!("WORKDIR\0{absolute}");
                self.sandbox_step(name, layers, ctx, &identity, force, |ex, sb, ctx| {
                    let accounts = ex.accounts(sb, name)?;
                    let owner = ctx.user.clone();
                    ex.run_script(
                        sb,
                        name,
                        &accounts,
                        "root",
                        "/",
                        scripts::WORKDIR,
                        &[("BERTH_TARGET", &absolute), ("BERTH_OWNER", &owner)],
                    )?;
                    ctx.workdir = Some(absolute.clone());
                    Ok(())
                })
            }
            "COPY" | "ADD" => self.copy(name, step, force, layers, ctx),
            other => Err(BuildError::step(
                name,
                format!("unsupported step type {other:?} (berth runs RUN, COPY, ADD, ENV, ARG, WORKDIR, USER)"),
            )),
        }
    }

    fn copy(
        &mut self,
        name: &str,
        step: &Step,
        force: bool,
        layers: &mut Vec<LayerId>,
        ctx: &mut Context,
    ) -> Result<(), BuildError> {
        let args = &step.args;
        let (Some(src), Some(dest)) = (args.first(), args.get(1)) else {
            return Err(BuildError::step(
                name,
                "COPY needs a source and a destination",
            ));
        };
        let Some(hash) = step.files_hash.clone() else {
            return Err(BuildError::step(
                name,
                "COPY needs the filesHash of its upload",
            ));
        };
        let scope = &self.request.files_scope;
        let blob = self.inner.files.path(scope, &hash)?;
        if !blob.is_file() {
            return Err(BuildError::step(
                name,
                format!("the files of hash {hash} were never uploaded (GET /templates/{{id}}/files/{hash} gives the upload URL)"),
            ));
        }
        let owner = match args.get(2).filter(|o| !o.is_empty()) {
            Some(o) if o.contains(':') => o.clone(),
            Some(o) => format!("{o}:{o}"),
            None => format!("{0}:{0}", ctx.user),
        };
        let mode = args.get(3).cloned().unwrap_or_default();
        let identity = format!("COPY\0{src}\0{dest}\0{owner}\0{mode}\0{hash}\0{scope}");
        let source = copy_source(src);
        self.sandbox_step(name, layers, ctx, &identity, force, |ex, sb, ctx| {
            let actual = sdk_files_hash(src, dest, &blob)
                .map_err(|e| BuildError::step(name, format!("reading the upload: {e}")))?;
            if actual != hash {
                let _ = ex.inner.files.remove(scope, &hash);
                return Err(BuildError::step(
                    name,
                    format!("the upload does not match filesHash {hash} (it hashes to {actual}); it was removed, upload it again"),
                ));
            }
            let gzip = is_gzip(&blob).map_err(|e| BuildError::io("read", &blob, e))?;
            let accounts = ex.accounts(sb, name)?;
            let workdir = ctx.workdir.clone().unwrap_or_default();
            let stdin = File::open(&blob).map_err(|e| BuildError::io("open", &blob, e))?;
            let argv = vec!["/bin/sh".to_string(), "-c".to_string(), scripts::COPY.to_string()];
            let env = [
                ("BERTH_GZIP", if gzip { "1" } else { "" }),
                ("BERTH_HASH", hash.as_str()),
                ("BERTH_SOURCE", source.as_str()),
                ("BERTH_TARGET", dest.as_str()),
                ("BERTH_OWNER", owner.as_str()),
                ("BERTH_MODE", mode.as_str()),
                ("BERTH_WORKDIR", workdir.as_str()),
                ("BERTH_USER", ctx.user.as_str()),
            ];
            let mut root_ctx = ctx.clone();
            for (k, v) in env {
                root_ctx.env.insert(k.to_string(), v.to_string());
            }
            root_ctx.workdir = Some("/".into());
            ex.run_as(sb, name, &accounts, "root", &root_ctx, argv, Some(stdin))
        })
    }

    /// Runs `action` in a fresh build sandbox on `layers` and commits what it changed as
    /// a new layer, unless the cache holds this step's result for these layers and
    /// context (and `force` is off).
    fn sandbox_step(
        &mut self,
        name: &str,
        layers: &mut Vec<LayerId>,
        ctx: &mut Context,
        identity: &str,
        force: bool,
        action: impl FnOnce(&mut Self, &BuildSandbox<'_>, &mut Context) -> Result<(), BuildError>,
    ) -> Result<(), BuildError> {
        let key = cache_key(layers, ctx, identity);
        if !force {
            if let Some(entry) = self.inner.cache_get(&key) {
                self.say(name, "CACHED");
                *layers = entry.layers;
                *ctx = entry.context;
                return Ok(());
            }
        }
        let started = Instant::now();
        let inner = self.inner;
        let mut sandbox = self.start_sandbox(layers, name)?;
        let mut next = ctx.clone();
        action(self, &sandbox, &mut next)?;
        self.check_cancel()?;
        let staged = inner.store.stage_layer()?;
        // commit_upper kills the sandbox itself; if it fails first, the guard does.
        let stats = inner.runtime.commit_upper(&sandbox.id, &staged.rootfs())?;
        sandbox.armed = false;
        drop(sandbox);
        let empty = std::fs::read_dir(staged.rootfs())
            .map_err(|e| BuildError::io("read", staged.rootfs(), e))?
            .next()
            .is_none();
        if !empty {
            let layer = inner.store.commit_layer(staged)?;
            self.say(
                name,
                format!(
                    "layer {} ({} entries, {} bytes) in {:.1} s",
                    &layer.as_str()[..12],
                    stats.entries,
                    stats.bytes,
                    started.elapsed().as_secs_f64()
                ),
            );
            // A step that changed nothing yields the layer below again; the runtime
            // mounts a repeated layer once (`SandboxSpec::with_distinct_layers`).
            layers.push(layer);
        }
        if stats.dropped_xattrs > 0 {
            (self.log)(
                LogLevel::Warn,
                Some(name),
                format!(
                    "{} extended attributes (file capabilities, ACLs) were not kept",
                    stats.dropped_xattrs
                ),
            );
        }
        *ctx = next;
        inner.cache_put(
            &key,
            &CacheEntry {
                layers: layers.clone(),
                context: ctx.clone(),
            },
        );
        self.executed.push(name.to_string());
        Ok(())
    }

    fn start_sandbox(
        &mut self,
        layers: &[LayerId],
        step: &str,
    ) -> Result<BuildSandbox<'a>, BuildError> {
        self.sandbox_seq += 1;
        let id = format!(
            "{}{}-{}",
            crate::engine::SANDBOX_PREFIX,
            sandbox_tag(&self.request.build_id),
            self.sandbox_seq
        );
        let spec = SandboxSpec {
            id: id.clone(),
            template: self.request.template_id.clone(),
            layers: layers
                .iter()
                .map(|l| self.inner.store.layer_rootfs(l))
                .collect(),
            cpu_count: self.request.cpu_count.max(1),
            memory_mb: self.request.memory_mb.max(64),
            disk_size_mb: self.request.disk_size_mb.max(64),
            volumes: Vec::new(),
        };
        let info = self.inner.runtime.create(&spec)?;
        let mut sandbox = BuildSandbox {
            inner: self.inner,
            id,
            armed: true,
            _network: None,
        };
        if let Some(network) = &self.inner.config.network {
            sandbox._network = Some(network.attach(&info).map_err(BuildError::Network)?);
        }
        tracing::debug!(sandbox = %sandbox.id, step, "build sandbox started");
        Ok(sandbox)
    }

    /// Users, groups and shell of the sandbox's image.
    fn accounts(&self, sb: &BuildSandbox<'_>, step: &str) -> Result<Accounts, BuildError> {
        let options = ExecOptions {
            uid: 0,
            gid: 0,
            cwd: "/".into(),
            env: vec![format!("PATH={DEFAULT_PATH}")],
            argv: vec!["/bin/sh".into(), "-c".into(), scripts::PROBE.into()],
        };
        let output = self
            .inner
            .runtime
            .exec_command_as(&sb.id, &options)?
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BuildError::io("run", "berth-launch", e))?;
        if !output.status.success() {
            return Err(BuildError::step(
                step,
                format!(
                    "the image has no usable /bin/sh ({}): {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            ));
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let mut sections = text.split("@@berth@@\n");
        let passwd = sections.next().unwrap_or("");
        let group = sections.next().unwrap_or("");
        let bash = sections.next().unwrap_or("").contains("bash");
        let users = passwd
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(':').collect();
                (f.len() >= 6).then(|| {
                    Some((
                        f[0].to_string(),
                        f[2].parse().ok()?,
                        f[3].parse().ok()?,
                        f[5].to_string(),
                    ))
                })?
            })
            .collect();
        let groups = group
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(':').collect();
                (f.len() >= 3).then(|| Some((f[0].to_string(), f[2].parse().ok()?)))?
            })
            .collect();
        Ok(Accounts {
            users,
            groups,
            bash,
        })
    }

    /// Runs a berth script (`/bin/sh -c`) as `user` with extra env vars.
    #[allow(clippy::too_many_arguments)]
    fn run_script(
        &self,
        sb: &BuildSandbox<'_>,
        step: &str,
        accounts: &Accounts,
        user: &str,
        cwd: &str,
        script: &str,
        vars: &[(&str, &str)],
    ) -> Result<(), BuildError> {
        let mut ctx = Context {
            user: user.to_string(),
            workdir: Some(cwd.to_string()),
            env: BTreeMap::new(),
        };
        for (k, v) in vars {
            ctx.env.insert(k.to_string(), v.to_string());
        }
        let argv = vec!["/bin/sh".into(), "-c".into(), script.into()];
        self.run_as(sb, step, accounts, user, &ctx, argv, None)
    }

    /// Runs `argv` as `user` in `ctx`'s workdir (falling back to `/` when it does not
    /// exist) and environment, logging its output; fails on a non-zero exit.
    #[allow(clippy::too_many_arguments)]
    fn run_as(
        &self,
        sb: &BuildSandbox<'_>,
        step: &str,
        accounts: &Accounts,
        user: &str,
        ctx: &Context,
        argv: Vec<String>,
        stdin: Option<File>,
    ) -> Result<(), BuildError> {
        let (uid, gid, home) = accounts.resolve(user).ok_or_else(|| {
            BuildError::step(step, format!("user {user:?} does not exist in the image"))
        })?;
        let cwd = ctx.workdir.clone().unwrap_or_else(|| home.clone());
        let mut env = process_env(user, Some(&home));
        env.extend(ctx.env.clone());
        env.insert("BERTH_CWD".into(), cwd);
        let mut full = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            scripts::ENTER_CWD.to_string(),
            "sh".to_string(),
        ];
        full.extend(argv);
        let options = ExecOptions {
            uid,
            gid,
            cwd: "/".into(),
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            argv: full,
        };
        let mut command = self.inner.runtime.exec_command_as(&sb.id, &options)?;
        command
            .stdin(stdin.map(Stdio::from).unwrap_or_else(Stdio::null))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = command
            .spawn()
            .map_err(|e| BuildError::io("run", "berth-launch", e))?;
        self.watch(step, child)
    }

    /// Streams a command's output lines into the log until it exits (or the build is
    /// cancelled or times out); a non-zero exit fails the step with its stderr.
    fn watch(&self, step: &str, mut child: Child) -> Result<(), BuildError> {
        let (tx, rx) = mpsc::channel::<(bool, String)>();
        for (is_err, stream) in [
            (
                false,
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn Read + Send>),
            ),
            (
                true,
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn Read + Send>),
            ),
        ] {
            let Some(stream) = stream else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).split(b'\n') {
                    let Ok(line) = line else { break };
                    let line = String::from_utf8_lossy(&line).trim_end().to_string();
                    if tx.send((is_err, line)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let deadline = self.inner.config.step_timeout.map(|t| Instant::now() + t);
        let mut tail = std::collections::VecDeque::new();
        let mut streams_open = true;
        loop {
            if self.cancelled.load(Ordering::Relaxed) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BuildError::Cancelled);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BuildError::step(
                    step,
                    "the step ran longer than the build step timeout",
                ));
            }
            if streams_open {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok((is_err, line)) => {
                        if is_err {
                            if tail.len() == STDERR_TAIL {
                                tail.pop_front();
                            }
                            tail.push_back(line.clone());
                        }
                        (self.log)(LogLevel::Info, Some(step), line);
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => streams_open = false,
                }
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(status) = child
                .try_wait()
                .map_err(|e| BuildError::io("wait for", "berth-launch", e))?
            {
                // Output still in flight after the exit.
                while let Ok((is_err, line)) = rx.recv_timeout(Duration::from_millis(200)) {
                    if is_err {
                        if tail.len() == STDERR_TAIL {
                            tail.pop_front();
                        }
                        tail.push_back(line.clone());
                    }
                    (self.log)(LogLevel::Info, Some(step), line);
                }
                if status.success() {
                    return Ok(());
                }
                let stderr = tail.into_iter().collect::<Vec<_>>().join("\n");
                return Err(BuildError::CommandFailed {
                    step: step.to_string(),
                    status: status.to_string(),
                    stderr,
                });
            }
        }
    }

    /// The template: manifest with the context's user, workdir and env, and with a
    /// start command, a checkpoint of a sandbox where it is ready.
    fn finalize(&mut self, layers: Vec<LayerId>, ctx: Context) -> Result<BuildOutput, BuildError> {
        let home = if ctx.user == "root" {
            "/root".to_string()
        } else {
            format!("/home/{}", ctx.user)
        };
        let mut config = TemplateConfig {
            default_user: ctx.user.clone(),
            default_workdir: ctx.workdir.clone().unwrap_or(home),
            envs: ctx.env.clone(),
            start_cmd: self.request.start_cmd.clone(),
            ready_cmd: self.request.ready_cmd.clone(),
            checkpoint: None,
        };
        if let Some(start_cmd) = self.request.start_cmd.clone() {
            self.executed.push("finalize".into());
            config.checkpoint = Some(self.checkpoint_started(&layers, &ctx, &start_cmd)?);
        }
        self.say(
            "finalize",
            format!(
                "template {} ready ({} layers)",
                self.request.template_id,
                layers.len()
            ),
        );
        let template = self
            .inner
            .store
            .put(&self.request.template_id, layers, config)?;
        Ok(BuildOutput {
            template,
            executed_steps: self.executed.clone(),
        })
    }

    /// Starts `start_cmd` in a sandbox of the final layers, waits for the ready command,
    /// and checkpoints the sandbox with memory; returns the runtime's checkpoint id.
    fn checkpoint_started(
        &mut self,
        layers: &[LayerId],
        ctx: &Context,
        start_cmd: &str,
    ) -> Result<String, BuildError> {
        let step = "finalize";
        let ready_cmd = self
            .request
            .ready_cmd
            .clone()
            .unwrap_or_else(|| DEFAULT_READY_CMD.into());
        let inner = self.inner;
        let sandbox = self.start_sandbox(layers, step)?;
        let accounts = self.accounts(&sandbox, step)?;
        self.say(step, format!("start command: {start_cmd}"));
        let mut start_ctx = ctx.clone();
        start_ctx.env.insert("BERTH_START".into(), start_cmd.into());
        start_ctx
            .env
            .insert("BERTH_START_LOG".into(), START_LOG.into());
        start_ctx
            .env
            .insert("BERTH_SHELL".into(), accounts.shell().join(" "));
        let argv = vec!["/bin/sh".into(), "-c".into(), scripts::START.into()];
        self.run_as(&sandbox, step, &accounts, &ctx.user, &start_ctx, argv, None)?;
        self.say(step, format!("waiting for the ready command: {ready_cmd}"));
        let started = Instant::now();
        let timeout = inner.config.ready_timeout;
        loop {
            self.check_cancel()?;
            let mut argv = accounts.shell();
            argv.push(ready_cmd.clone());
            match self.run_as(&sandbox, step, &accounts, &ctx.user, ctx, argv, None) {
                Ok(()) => break,
                Err(BuildError::CommandFailed { .. }) if started.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(BuildError::CommandFailed { stderr, .. }) => {
                    let log = self.start_log(&sandbox, &accounts);
                    return Err(BuildError::ReadyTimeout {
                        seconds: timeout.as_secs(),
                        ready_cmd,
                        output: format!("{stderr}\nstart command output:\n{log}"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        let log = self.start_log(&sandbox, &accounts);
        for line in log.lines() {
            self.say(step, line.to_string());
        }
        self.say(step, "template is ready; checkpointing");
        let checkpoint = format!(
            "{TEMPLATE_CHECKPOINT_PREFIX}{}",
            sandbox_tag(&self.request.build_id)
        );
        // A retried build of the same id replaces its own checkpoint.
        inner.runtime.delete_checkpoint(&checkpoint)?;
        Runtime::checkpoint(
            &*inner.runtime,
            &sandbox.id,
            &checkpoint,
            berth_runtime::Durability::Durable,
        )?;
        drop(sandbox);
        Ok(checkpoint)
    }

    fn start_log(&self, sb: &BuildSandbox<'_>, accounts: &Accounts) -> String {
        let Some((uid, gid, _)) = accounts.resolve("root") else {
            return String::new();
        };
        let options = ExecOptions {
            uid,
            gid,
            cwd: "/".into(),
            env: vec![format!("PATH={DEFAULT_PATH}")],
            argv: vec!["/bin/cat".into(), START_LOG.into()],
        };
        self.inner
            .runtime
            .exec_command_as(&sb.id, &options)
            .ok()
            .and_then(|mut c| c.stdin(Stdio::null()).output().ok())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

/// The environment every step's process starts with, under the template's own.
fn process_env(user: &str, home: Option<&str>) -> BTreeMap<String, String> {
    let name = user.split(':').next().unwrap_or(user);
    let home = home.map(str::to_string).unwrap_or_else(|| {
        if name == "root" {
            "/root".into()
        } else {
            format!("/home/{name}")
        }
    });
    BTreeMap::from([
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("HOME".to_string(), home),
        ("USER".to_string(), name.to_string()),
        ("LOGNAME".to_string(), name.to_string()),
    ])
}

/// The part of a COPY source before any glob (the SDK expands globs itself; the
/// upload holds only what matched), as E2B's `doublestar.SplitPattern`.
fn copy_source(src: &str) -> String {
    let with_slash = if src.ends_with('/') {
        src.to_string()
    } else {
        format!("{src}/")
    };
    let meta = with_slash.find(['*', '?', '[', '{', '\\']);
    let end = match meta {
        Some(i) => with_slash[..i].rfind('/'),
        None => with_slash.rfind('/'),
    };
    let base = end.map(|i| &with_slash[..i]).unwrap_or("");
    let base = normalize_relative(base);
    if base.is_empty() {
        ".".into()
    } else {
        base
    }
}

fn normalize_relative(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// `path` with `.`/`..`/double slashes resolved lexically (absolute).
fn normalize(path: &str) -> String {
    format!("/{}", normalize_relative(path))
}

/// `$VAR` and `${VAR}` from `env` (unset: empty), `\$` for a literal dollar.
pub(crate) fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    expand_with(value, env, false)
}

/// Like [`expand`], but references to variables `env` lacks stay as written (for the
/// Dockerfile parser: the build expands them later, in the step's environment).
pub(crate) fn expand_known(value: &str, env: &BTreeMap<String, String>) -> String {
    expand_with(value, env, true)
}

fn expand_with(value: &str, env: &BTreeMap<String, String>, keep_unknown: bool) -> String {
    let mut out = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                out.push('$');
                chars.next();
            }
            '$' => {
                let braced = chars.peek() == Some(&'{');
                if braced {
                    chars.next();
                }
                let mut name = String::new();
                while let Some(&n) = chars.peek() {
                    if n.is_ascii_alphanumeric() || n == '_' {
                        name.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                if braced {
                    if chars.peek() == Some(&'}') {
                        chars.next();
                    } else {
                        out.push_str("${");
                        out.push_str(&name);
                        continue;
                    }
                }
                match env.get(&name) {
                    _ if name.is_empty() => out.push('$'),
                    Some(value) => out.push_str(value),
                    None if keep_unknown && braced => out.push_str(&format!("${{{name}}}")),
                    None if keep_unknown => out.push_str(&format!("${name}")),
                    None => {}
                }
            }
            c => out.push(c),
        }
    }
    out
}

fn cache_key(layers: &[LayerId], ctx: &Context, identity: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(format!("berth-build-step v{STEP_FORMAT}\n").as_bytes());
    for layer in layers {
        hasher.update(layer.as_str().as_bytes());
        hasher.update(b"\n");
    }
    hasher.update(serde_json::to_vec(ctx).expect("context serializes"));
    hasher.update(b"\n");
    hasher.update(identity.as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Template checkpoints' ids start with this, so whoever reconciles the runtime's
/// checkpoints can tell them from snapshots' and forks'.
pub const TEMPLATE_CHECKPOINT_PREFIX: &str = "tpl-";

/// Most characters of a build id that [`sandbox_tag`] keeps: with the prefixes and a
/// step number of up to seven digits, sandbox and checkpoint ids stay within the
/// runtime's 64.
const SANDBOX_TAG_MAX: usize = 52;

/// An id-safe tag of a build id for sandbox and checkpoint names: its letters and
/// digits, the last [`SANDBOX_TAG_MAX`] of them when there are more. It must be as
/// unique as the build id: sandbox ids name cgroups shared by every daemon on the host,
/// and a checkpoint id is replaced by the next build with the same tag. The end is
/// kept because that is where ids differ (`host-code-interpreter-v1-<uuid>`: cutting
/// its start at 24 left 3 hex digits of the uuid).
fn sandbox_tag(build_id: &str) -> String {
    let tag: String = build_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    // ASCII only, so any byte offset is a character boundary.
    tag[tag.len().saturating_sub(SANDBOX_TAG_MAX)..].to_owned()
}

impl crate::engine::Inner {
    fn cache_path(&self, key: &str) -> PathBuf {
        self.config
            .state_dir
            .join("builds")
            .join("cache")
            .join(format!("{key}.json"))
    }

    fn cache_get(&self, key: &str) -> Option<CacheEntry> {
        let bytes = std::fs::read(self.cache_path(key)).ok()?;
        let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
        entry
            .layers
            .iter()
            .all(|l| self.store.has_layer(l))
            .then_some(entry)
    }

    fn cache_put(&self, key: &str, entry: &CacheEntry) {
        let path = self.cache_path(key);
        let bytes = serde_json::to_vec(entry).expect("cache entry serializes");
        if let Err(e) = crate::files::write_atomically(&path, &bytes) {
            tracing::warn!(error = %e, "writing the build cache");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_tags_keep_what_tells_build_ids_apart() {
        let [a, b] = ["0a1b2c3d", "0a1b2c3e"]
            .map(|tail| format!("host-code-interpreter-v1-3f2a9c0d1e2f4a5b6c7d8e9f{tail}"));
        assert_ne!(sandbox_tag(&a), sandbox_tag(&b));
        assert_eq!(
            sandbox_tag("host-base-0123456789abcdef0123456789ABCDEF"),
            "hostbase0123456789abcdef0123456789abcdef"
        );
        let team = "7c1e4d2a-9b3f-4e8a-b6d5-0f1e2d3c4b5a";
        assert_eq!(sandbox_tag(team), team.replace('-', ""));
        let long = format!("{}-{}", "x".repeat(100), "end");
        assert_eq!(sandbox_tag(&long).len(), SANDBOX_TAG_MAX);
        assert!(sandbox_tag(&long).ends_with("xxend"));
        let sandbox = format!(
            "{}{}-{}",
            crate::engine::SANDBOX_PREFIX,
            sandbox_tag(&long),
            9_999_999
        );
        let checkpoint = format!("{TEMPLATE_CHECKPOINT_PREFIX}{}", sandbox_tag(&long));
        assert!(sandbox.len() <= 64 && checkpoint.len() <= 64);
    }

    #[test]
    fn copy_sources_drop_globs_like_e2b() {
        assert_eq!(copy_source("app/main.py"), "app/main.py");
        assert_eq!(copy_source("app/"), "app");
        assert_eq!(copy_source("./app"), "app");
        assert_eq!(copy_source("src/*.txt"), "src");
        assert_eq!(copy_source("*.txt"), ".");
        assert_eq!(copy_source("a/**/b"), "a");
    }

    #[test]
    fn env_values_expand_like_a_shell() {
        let env = BTreeMap::from([
            ("A".to_string(), "1".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ]);
        assert_eq!(expand("$A-${A}x", &env), "1-1x");
        assert_eq!(expand("/opt:$PATH", &env), "/opt:/bin");
        assert_eq!(expand("\\$A $B.", &env), "$A .");
        assert_eq!(expand("cost $ 5", &env), "cost $ 5");
        assert_eq!(expand_known("$A:$PATHX:${NOPE}", &env), "1:$PATHX:${NOPE}");
    }

    #[test]
    fn accounts_resolve_names_numbers_and_groups() {
        let accounts = Accounts {
            users: vec![
                ("root".into(), 0, 0, "/root".into()),
                ("user".into(), 1000, 1000, "/home/user".into()),
            ],
            groups: vec![("staff".into(), 50)],
            bash: true,
        };
        assert_eq!(
            accounts.resolve("user"),
            Some((1000, 1000, "/home/user".into()))
        );
        assert_eq!(
            accounts.resolve("user:staff"),
            Some((1000, 50, "/home/user".into()))
        );
        assert_eq!(accounts.resolve("0"), Some((0, 0, "/root".into())));
        assert_eq!(
            accounts.resolve("4000:4000"),
            Some((4000, 4000, "/".into()))
        );
        assert_eq!(accounts.resolve("nobody"), None);
    }

    #[test]
    fn cache_keys_follow_layers_context_and_step() {
        let ctx = Context {
            user: "user".into(),
            workdir: None,
            env: BTreeMap::new(),
        };
        let layers = vec![LayerId::of_bytes(b"a")];
        let key = cache_key(&layers, &ctx, "RUN\0true");
        assert_eq!(key, cache_key(&layers, &ctx, "RUN\0true"));
        assert_ne!(key, cache_key(&layers, &ctx, "RUN\0false"));
        assert_ne!(
            key,
            cache_key(&[LayerId::of_bytes(b"b")], &ctx, "RUN\0true")
        );
        let mut other = ctx.clone();
        other.env.insert("A".into(), "1".into());
        assert_ne!(key, cache_key(&layers, &other, "RUN\0true"));
    }
}
