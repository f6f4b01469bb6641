//! berth-bench: start-latency and density benchmark for berth's Linux runtime, with
//! `unshare`, `bwrap` and `crun` starting an equivalent sandbox over the same rootfs as
//! peer baselines. Not a test: it prints a report (markdown) to stdout.
//!
//! `cargo build --release -p berth-envd -p berth-runtime -p berth-bench` then run
//! `berth-bench runtime` as root (the `base` template must be buildable or cached).
//! `berth-bench interpreter` measures the code interpreter through a running berth
//! (see `interpreter.rs` and BENCHMARKS.md).

mod interpreter;
mod peers;
mod sandboxes;
mod stateful;
mod stats;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use peers::{Peer, PeerBench};
use sandboxes::SandboxBench;
use stats::{ms, run_concurrently, Samples};

#[derive(Parser)]
#[command(about = "Benchmark berth's sandbox runtime against bwrap, crun and unshare")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start latency at several concurrencies, peer baselines, and density.
    Runtime(RuntimeArgs),
    /// Pause/resume with memory, checkpoint sizes and fork, each beside the CRIU run it made.
    Checkpoint(stateful::CheckpointArgs),
    /// The code interpreter through a running berth: create → first `run_code`, round
    /// trips, a plot, beside `commands.run` in the same sandbox.
    Interpreter(interpreter::InterpreterArgs),
}

#[derive(clap::Args)]
struct RuntimeArgs {
    /// Samples per system and concurrency level.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    concurrency: Vec<usize>,
    /// Stop the density run at this many idle sandboxes.
    #[arg(long, default_value_t = 1000)]
    density_max: usize,
    /// Skip the density run.
    #[arg(long)]
    skip_density: bool,
    /// Only run the peers (unshare, bwrap, crun), not berth.
    #[arg(long)]
    peers_only: bool,
    /// berth state dir holding the template cache (`base` is built there if missing).
    #[arg(long, default_value = berth_template::DEFAULT_STATE_DIR)]
    templates: PathBuf,
    /// Scratch state dir for the benchmark's runtime; removed at the end.
    #[arg(long, default_value = "/var/lib/berth-bench")]
    state_dir: PathBuf,
    /// berth-envd binary (default: next to this executable).
    #[arg(long)]
    envd: Option<PathBuf>,
    /// berth-launch binary (default: next to this executable).
    #[arg(long)]
    launcher: Option<PathBuf>,
    /// Give berth's sandboxes networking (a netns owned by the host, veth, nftables) as
    /// `berth up` does by default.
    #[arg(long)]
    network: bool,
}

/// Results of one system at every concurrency level.
struct Row {
    name: String,
    timed: &'static str,
    levels: Vec<Samples>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    mark_inherited_fds_cloexec();
    if let Command::Interpreter(args) = &cli.command {
        return interpreter::run(args);
    }
    if !rustix_is_root() {
        bail!("berth-bench needs root (namespaces, cgroups, mounts)");
    }
    match cli.command {
        Command::Runtime(args) => runtime(&args),
        Command::Checkpoint(args) => stateful::run(&args),
        Command::Interpreter(args) => interpreter::run(&args),
    }
}

fn runtime(args: &RuntimeArgs) -> anyhow::Result<()> {
    let store = berth_template::TemplateStore::open(&args.templates)?;
    let base = store.ensure_base(|event| eprintln!("base: {event:?}"))?;
    let rootfs = base.layers[0].clone();
    eprintln!("rootfs: {}", rootfs.display());

    let mut rows = Vec::new();
    let peer_bench = PeerBench::new(&rootfs)?;
    for peer in Peer::ALL {
        if !PeerBench::available(peer) {
            eprintln!(
                "{} is not installed; skipped (apt-get install bubblewrap crun)",
                peer.name()
            );
            continue;
        }
        for i in 0..3 {
            peer_bench
                .run_once(peer, 1_000_000 + i)
                .with_context(|| format!("warm-up of {}", peer.name()))?;
        }
        let mut levels = Vec::new();
        for &concurrency in &args.concurrency {
            eprintln!("{} at concurrency {concurrency}", peer.name());
            levels.push(run_concurrently(concurrency, args.samples, |i| {
                peer_bench.run_once(peer, i)
            }));
        }
        rows.push(Row {
            name: peer.name().into(),
            timed: "spawn → `/bin/true` exited",
            levels,
        });
    }
    drop(peer_bench);

    let mut density = None;
    if !args.peers_only {
        let (envd, launcher) = binaries(args.envd.as_deref(), args.launcher.as_deref())?;
        let max_sandboxes =
            args.density_max
                .max(args.concurrency.iter().copied().max().unwrap_or(1)) as u32
                + 8;
        let bench = SandboxBench::new(
            &args.state_dir,
            &envd,
            &launcher,
            base.layers.clone(),
            max_sandboxes,
            None,
            args.network,
        )?;
        for i in 0..3 {
            let (id, _) = bench.start(&format!("w{i}")).context("warm-up sandbox")?;
            bench.kill(&id)?;
        }
        let mut ready_levels = Vec::new();
        let mut create_levels = Vec::new();
        let mut kill_levels = Vec::new();
        for &concurrency in &args.concurrency {
            eprintln!("berth at concurrency {concurrency}");
            let times = std::sync::Mutex::new((Vec::new(), Vec::new()));
            let ready = run_concurrently(concurrency, args.samples, |i| {
                let (id, start) = bench.start(&format!("c{concurrency}-{i}"))?;
                let kill = bench.kill(&id)?;
                let mut times = times.lock().unwrap_or_else(|e| e.into_inner());
                times.0.push(start.create);
                times.1.push(kill);
                Ok(start.ready)
            });
            let (creates, kills) = times.into_inner().unwrap_or_else(|e| e.into_inner());
            ready_levels.push(ready);
            create_levels.push(Samples {
                durations: creates,
                ..Samples::default()
            });
            kill_levels.push(Samples {
                durations: kills,
                ..Samples::default()
            });
        }
        rows.insert(
            0,
            Row {
                name: if args.network {
                    "berth (networking)".into()
                } else {
                    "berth".into()
                },
                timed: "create → envd `/health` 2xx",
                levels: ready_levels,
            },
        );
        rows.insert(
            1,
            Row {
                name: "berth create only".into(),
                timed: "`Runtime::create` returned",
                levels: create_levels,
            },
        );
        rows.insert(
            2,
            Row {
                name: "berth kill".into(),
                timed: "`Runtime::kill` returned",
                levels: kill_levels,
            },
        );
        if !args.skip_density {
            eprintln!("density: up to {} idle sandboxes", args.density_max);
            density = Some(bench.density(args.density_max, |n| eprintln!("density: {n} up"))?);
        }
    }

    print_report(args, &rows, density.as_ref());
    Ok(())
}

fn print_report(args: &RuntimeArgs, rows: &[Row], density: Option<&sandboxes::Density>) {
    let command_line: Vec<String> = std::env::args().collect();
    println!("Command: `{}`", command_line.join(" "));
    println!("Date (UTC): {}", utc_now());
    println!("Host: {}", host_summary());
    println!(
        "Samples per cell: {}; latencies in ms; each cell is p50 / p99.\n",
        args.samples
    );
    let mut header = String::from("| system | timed |");
    let mut rule = String::from("|---|---|");
    for c in &args.concurrency {
        header.push_str(&format!(" c={c} p50 / p99 |"));
        rule.push_str("---|");
    }
    println!("{}\n{rule}", header.trim_end());
    for row in rows {
        let mut line = format!("| {} | {} |", row.name, row.timed);
        for samples in &row.levels {
            let cell = match (samples.p50(), samples.p99()) {
                (Some(p50), Some(p99)) => format!("{} / {}", ms(p50), ms(p99)),
                _ => "—".into(),
            };
            let failed = if samples.failures > 0 {
                format!(" ({} failed)", samples.failures)
            } else {
                String::new()
            };
            line.push_str(&format!(" {cell}{failed} |"));
        }
        println!("{line}");
    }
    for row in rows {
        for (samples, c) in row.levels.iter().zip(&args.concurrency) {
            if let Some(error) = &samples.first_error {
                println!("\n{} at c={c}: first failure: {error}", row.name);
            }
        }
    }

    if let Some(berth) = rows.iter().find(|r| r.name == "berth") {
        println!("\nRatios, berth create→/health ÷ peer (p50 / p99 at each concurrency):\n");
        println!(
            "{header}\n{rule}",
            header = header.replace("| timed ", "").trim_end(),
            rule = rule.replacen("---|", "", 1)
        );
        for peer in rows.iter().filter(|r| !r.name.starts_with("berth")) {
            let mut line = format!("| berth ÷ {} |", peer.name);
            for (b, p) in berth.levels.iter().zip(&peer.levels) {
                let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
                    (Some(a), Some(b)) if !b.is_zero() => {
                        format!("{:.1}×", a.as_secs_f64() / b.as_secs_f64())
                    }
                    _ => "—".into(),
                };
                line.push_str(&format!(
                    " {} / {} |",
                    ratio(b.p50(), p.p50()),
                    ratio(b.p99(), p.p99())
                ));
            }
            println!("{line}");
        }
    }

    if let Some(d) = density {
        let per = |bytes: i64| {
            if d.created == 0 {
                "—".to_string()
            } else {
                format!(
                    "{:.2} MiB",
                    bytes as f64 / d.created as f64 / (1 << 20) as f64
                )
            }
        };
        println!(
            "\nDensity: {} idle sandboxes (each answering /health); stopped: {}",
            d.created, d.stopped_by
        );
        println!(
            "- host MemAvailable per sandbox: {} drop while creating, {} back after killing",
            per(d.mem_drop_on_create),
            per(d.mem_rise_on_kill)
        );
        println!(
            "- sandbox memory cgroups (usage) per sandbox: {}",
            per(d.cgroup_memory as i64)
        );
        println!("- kernel slab growth per sandbox: {}", per(d.slab_growth));
        println!("- killing all of them: {:.2} s", d.kill_all.as_secs_f64());
    }
}

/// The berth-envd and berth-launch binaries: the given paths, else the ones next to this
/// executable.
fn binaries(envd: Option<&Path>, launcher: Option<&Path>) -> anyhow::Result<(PathBuf, PathBuf)> {
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    // Absolute: CRIU runs the runtime's post-dump hook, which names the launcher, from
    // a directory of its own.
    let or_beside = |given: Option<&Path>, name: &str| {
        let path = given.map_or_else(|| exe_dir.join(name), Path::to_path_buf);
        std::fs::canonicalize(&path).with_context(|| format!("{name}: {}", path.display()))
    };
    Ok((
        or_beside(envd, "berth-envd")?,
        or_beside(launcher, "berth-launch")?,
    ))
}

fn rustix_is_root() -> bool {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The tool shell hands stray descriptors to its children; keep them out of the
/// sandboxes and peers this process starts.
fn mark_inherited_fds_cloexec() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on a descriptor number; an already-closed one just fails.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn host_summary() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "kernel {}, {cpus} CPUs, {:.0} GiB RAM, load average {} (1/5/15 min, when the report was printed)",
        kernel.trim(),
        mem_kib as f64 / (1 << 20) as f64,
        load.join(" ")
    )
}
