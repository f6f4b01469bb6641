//! `berth-bench checkpoint`: stateful sandboxes through `LinuxRuntime` — pause with memory
//! and resume at several resident sizes, `checkpoint()` sizes, fork (one checkpoint, N
//! restores with bounded parallelism) — each beside its floor: the `criu dump` or
//! `criu restore` process that very operation ran, spawn → exit, as berth's checkpoint
//! crate reports every CRIU run (`berth_checkpoint::observe_criu`). The floor is berth's
//! own command line by construction, so it cannot drift from it; what the ratio shows is
//! everything berth does around CRIU (freezing, the disk, mounts, cgroups, envd).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use berth_checkpoint::{Criu, CriuAction, CriuObserver, CriuRun};
use berth_runtime::{LinuxRuntime, Runtime, SandboxSpec};

use crate::sandboxes::SandboxBench;
use crate::stats::{ms, run_concurrently, Samples};

#[derive(clap::Args)]
pub struct CheckpointArgs {
    /// Pause/resume iterations per memory size.
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
    /// The `criu dump` inside each pause.
    pause_criu: Samples,
    /// The `criu restore` inside each resume.
    resume_criu: Samples,
    /// The `criu dump --leave-running` inside each checkpoint.
    checkpoint_criu: Samples,
    pause_images: Vec<u64>,
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
    /// The `criu restore` inside each of the round's restores.
    restores_criu: Samples,
    kill_all: Duration,
}

/// Every CRIU run of this process, as berth's checkpoint crate reports them.
#[derive(Default)]
struct CriuRuns(Mutex<Vec<CriuRun>>);

impl CriuObserver for CriuRuns {
    fn finished(&self, run: CriuRun) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(run);
    }
}

impl CriuRuns {
    /// The runs reported since the last call.
    fn take(&self) -> Vec<CriuRun> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The CRIU run inside the operation `what` just timed: exactly one run of `action`
    /// since the last call, and it succeeded.
    fn one(&self, action: CriuAction, what: &str) -> anyhow::Result<Duration> {
        let runs: Vec<CriuRun> = self
            .take()
            .into_iter()
            .filter(|run| run.action == action)
            .collect();
        match runs.as_slice() {
            [run] if run.ok => Ok(run.duration),
            _ => bail!(
                "{what} ran {} CRIU {action:?} runs ({} failed); the floor needs exactly one that succeeded",
                runs.len(),
                runs.iter().filter(|run| !run.ok).count()
            ),
        }
    }

    /// The durations of every successful run of `action` since the last call.
    fn all(&self, action: CriuAction) -> Samples {
        let mut samples = Samples::default();
        for run in self.take().into_iter().filter(|run| run.action == action) {
            if run.ok {
                samples.durations.push(run.duration);
            } else {
                samples.failures += 1;
            }
        }
        samples
    }
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
    let runs = Arc::new(CriuRuns::default());
    berth_checkpoint::observe_criu(runs.clone());

    let mut sizes = Vec::new();
    for &mib in &args.sizes {
        eprintln!("{mib} MiB: pause/resume, checkpoint");
        sizes.push(measure_size(&bench, &runs, &scratch, mib, args.iterations)?);
    }
    let mut forks = Vec::new();
    if !args.forks.is_empty() {
        forks = measure_forks(&bench, &runs, &scratch, args)?;
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
    runs: &CriuRuns,
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
    let images = rt
        .config()
        .state_dir
        .join("sandboxes")
        .join(&id)
        .join("checkpoint");
    for i in 0..iterations {
        // checkpoint(): the sandbox keeps running; timed and measured, then deleted.
        let dest = scratch.join(format!("ckpt-{mib}-{i}"));
        let guard = RemoveDir(dest.clone());
        runs.take();
        let t = Instant::now();
        let info =
            rt.checkpoint_into(&rt.criu()?, &id, &dest, berth_runtime::Durability::Durable)?;
        r.checkpoint.durations.push(t.elapsed());
        r.checkpoint_criu
            .durations
            .push(runs.one(CriuAction::Dump, "checkpoint")?);
        r.checkpoint_size.push(info.size_bytes);
        r.checkpoint_images
            .push(allocated_bytes(&dest.join("images"))?);
        drop(guard);

        let t = Instant::now();
        rt.pause(&id, true)?;
        r.pause.durations.push(t.elapsed());
        r.pause_criu
            .durations
            .push(runs.one(CriuAction::Dump, "pause")?);
        r.pause_images.push(allocated_bytes(&images)?);

        let t = Instant::now();
        let resumed = rt.resume(&id, true)?;
        r.resume.durations.push(t.elapsed());
        r.resume_criu
            .durations
            .push(runs.one(CriuAction::Restore, "resume")?);
        if !resumed.memory_restored {
            bail!("{id}: resume did not restore memory");
        }
    }
    // The holder (and its memory) came through every pause and resume.
    sh(rt, &id, "pgrep -f holder.py >/dev/null").context("holder lost after resume")?;
    bench.kill(&id)?;
    Ok(r)
}

fn measure_forks(
    bench: &SandboxBench,
    runs: &CriuRuns,
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
        runs.take();
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
        let restores_criu = runs.all(CriuAction::Restore);
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
            restores_criu,
            kill_all,
        });
    }
    bench.kill(&source)?;
    Ok(results)
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
        "the `criu dump` that pause ran, spawn → exit",
        &|s| cell(&s.pause_criu),
    );
    row("**berth pause ÷ criu dump**", "", &|s| {
        ratio_cell(&s.pause, &s.pause_criu)
    });
    row("berth resume", "`Runtime::resume(id, true)`", &|s| {
        cell(&s.resume)
    });
    row(
        "criu restore (floor)",
        "the `criu restore` that resume ran, spawn → exit",
        &|s| cell(&s.resume_criu),
    );
    row("**berth resume ÷ criu restore**", "", &|s| {
        ratio_cell(&s.resume, &s.resume_criu)
    });
    row(
        "berth checkpoint",
        "`Runtime::checkpoint` (keeps running; + disk copy)",
        &|s| cell(&s.checkpoint),
    );
    row(
        "criu dump --leave-running (floor)",
        "the `criu dump` that checkpoint ran, spawn → exit",
        &|s| cell(&s.checkpoint_criu),
    );
    row("**berth checkpoint ÷ criu dump**", "", &|s| {
        ratio_cell(&s.checkpoint, &s.checkpoint_criu)
    });

    println!("\nSizes on disk (MiB, median over iterations; allocated blocks):\n");
    println!("{header}\n{rule}");
    let bytes = |values: &[u64]| median_bytes(values).map(mib).unwrap_or("—".into());
    row("sandbox memory cgroup", "usage with the holder up", &|s| {
        mib(s.cgroup_usage)
    });
    row("pause images", "`<sandbox>/checkpoint`", &|s| {
        bytes(&s.pause_images)
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
        println!(
            "\nFork of a sandbox holding {} MiB: one `Runtime::checkpoint`, then N \
             restores (`LinuxRuntime::restore_checkpoint`, what `Runtime::restore` runs) with at most {} at once; forks killed after each round.\n",
            args.fork_mib, args.parallel
        );
        println!(
            "| N | checkpoint | restores wall | checkpoint + restores | per fork (wall ÷ N) | \
             one restore p50 / p99 | its criu restore p50 / p99 | one restore ÷ criu restore p50 | kill all | checkpoint size |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
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
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} MiB |{failed}",
                f.count,
                ms(f.checkpoint),
                ms(f.restores_wall),
                ms(f.checkpoint + f.restores_wall),
                ms(f.restores_wall / f.count.max(1) as u32),
                cell(&f.restores),
                cell(&f.restores_criu),
                ratio(f.restores.p50(), f.restores_criu.p50()),
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
