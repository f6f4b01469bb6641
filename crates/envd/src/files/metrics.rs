//! `GET /metrics`: the sandbox's resource use, as E2B's `Metrics` schema.
//!
//! Inside a sandbox envd sits in the sandbox's cgroup (v1 controllers or v2), found via
//! `/proc/self/cgroup` and `/proc/self/mountinfo` so it works with or without a cgroup
//! namespace. Memory comes from the cgroup when it has a limit, else from
//! `/proc/meminfo`; CPU use from the cgroup's usage counter (else `/proc/stat`) between
//! two samples; CPU count honours quotas and affinity; disk from `statvfs("/")`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::{blocking, HttpError};
use crate::auth::unix_now;
use crate::state::EnvdState;

const MIB: u64 = 1024 * 1024;
/// When there is no earlier sample, CPU use is measured over this long.
const FIRST_SAMPLE_WINDOW: Duration = Duration::from_millis(100);
/// Samples closer than this reuse the previous percentage (too noisy otherwise).
const MIN_SAMPLE_WINDOW: Duration = Duration::from_millis(50);

/// The response body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    pub ts: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f32,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// CPU usage counters at one instant.
#[derive(Debug, Clone, Copy)]
enum CpuCounter {
    /// Nanoseconds of CPU time used by the cgroup.
    CgroupNanos(u64),
    /// `/proc/stat` jiffies: busy and total.
    HostJiffies { busy: u64, total: u64 },
}

#[derive(Debug, Clone, Copy)]
struct CpuSample {
    at: Instant,
    counter: CpuCounter,
    pct: f32,
}

/// Keeps the previous CPU sample between `/metrics` calls.
#[derive(Debug, Default)]
pub struct CpuSampler {
    last: Mutex<Option<CpuSample>>,
}

/// Where the calling process's cgroup files are.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CgroupDirs {
    /// v1 `memory` controller directory.
    pub memory_v1: Option<PathBuf>,
    /// v1 `cpuacct` controller directory.
    pub cpuacct_v1: Option<PathBuf>,
    /// v2 unified directory.
    pub unified: Option<PathBuf>,
}

/// Finds the process's cgroup directories from the text of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`.
pub fn locate_cgroups(self_cgroup: &str, mountinfo: &str) -> CgroupDirs {
    struct Mount<'a> {
        root: &'a str,
        point: &'a str,
        fstype: &'a str,
        options: Vec<&'a str>,
    }
    let mounts: Vec<Mount> = mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let after: Vec<&str> = after.split(' ').collect();
            Some(Mount {
                root: fields.get(3)?,
                point: fields.get(4)?,
                fstype: after.first()?,
                options: after
                    .get(2)
                    .map_or_else(Vec::new, |o| o.split(',').collect()),
            })
        })
        .collect();
    let dir_of = |mount: &Mount, cgroup_path: &str| {
        // The cgroup path is relative to the hierarchy root; the mount shows `root` of it.
        let relative = cgroup_path
            .strip_prefix(mount.root)
            .unwrap_or(cgroup_path)
            .trim_start_matches('/');
        Path::new(&unescape_mount_path(mount.point)).join(relative)
    };
    let mut dirs = CgroupDirs::default();
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            if let Some(mount) = mounts.iter().find(|m| m.fstype == "cgroup2") {
                dirs.unified = Some(dir_of(mount, path));
            }
            continue;
        }
        for controller in controllers.split(',') {
            let slot = match controller {
                "memory" => &mut dirs.memory_v1,
                "cpuacct" => &mut dirs.cpuacct_v1,
                _ => continue,
            };
            if let Some(mount) = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.options.contains(&controller))
            {
                *slot = Some(dir_of(mount, path));
            }
        }
    }
    dirs
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(path: &str) -> String {
    path.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A `key value` line of a stat file such as `memory.stat` or `/proc/meminfo`.
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let name = fields.next()?.trim_end_matches(':');
        (name == key).then(|| fields.next()?.parse().ok())?
    })
}

/// Memory figures in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memory {
    total: u64,
    used: u64,
    cache: u64,
}

fn host_memory(meminfo: &str) -> Memory {
    let kib = |key| stat_value(meminfo, key).unwrap_or(0) * 1024;
    let total = kib("MemTotal");
    Memory {
        total,
        used: total.saturating_sub(kib("MemAvailable")),
        cache: kib("Cached"),
    }
}

/// Cgroup memory, when the cgroup has a limit below the host's memory.
fn cgroup_memory(dirs: &CgroupDirs, host_total: u64) -> Option<Memory> {
    let (limit, usage, stat, cache_key, inactive_key) = if let Some(dir) = &dirs.memory_v1 {
        (
            read_u64(&dir.join("memory.limit_in_bytes"))?,
            read_u64(&dir.join("memory.usage_in_bytes"))?,
            std::fs::read_to_string(dir.join("memory.stat")).ok()?,
            "total_cache",
            "total_inactive_file",
        )
    } else {
        let dir = dirs.unified.as_ref()?;
        // "max" (no limit) does not parse: no cgroup figures then.
        (
            read_u64(&dir.join("memory.max"))?,
            read_u64(&dir.join("memory.current"))?,
            std::fs::read_to_string(dir.join("memory.stat")).ok()?,
            "file",
            "inactive_file",
        )
    };
    if host_total > 0 && limit >= host_total {
        return None;
    }
    // Inactive page cache can be reclaimed at once: not "used", as `docker stats` counts.
    let inactive = stat_value(&stat, inactive_key).unwrap_or(0);
    Some(Memory {
        total: limit,
        used: usage.saturating_sub(inactive),
        cache: stat_value(&stat, cache_key).unwrap_or(0),
    })
}

fn cpu_counter(dirs: &CgroupDirs) -> Option<CpuCounter> {
    if let Some(nanos) = dirs
        .cpuacct_v1
        .as_ref()
        .and_then(|d| read_u64(&d.join("cpuacct.usage")))
    {
        return Some(CpuCounter::CgroupNanos(nanos));
    }
    if let Some(micros) = dirs.unified.as_ref().and_then(|d| {
        let stat = std::fs::read_to_string(d.join("cpu.stat")).ok()?;
        stat_value(&stat, "usage_usec")
    }) {
        return Some(CpuCounter::CgroupNanos(micros * 1000));
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu_line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = cpu_line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is already in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Some(CpuCounter::HostJiffies {
        busy: total.saturating_sub(idle),
        total,
    })
}

fn cpu_percent(before: CpuCounter, after: CpuCounter, wall: Duration, cpus: u32) -> f32 {
    let pct = match (before, after) {
        (CpuCounter::CgroupNanos(a), CpuCounter::CgroupNanos(b)) => {
            let capacity = wall.as_nanos() as f64 * f64::from(cpus.max(1));
            if capacity <= 0.0 {
                return 0.0;
            }
            b.saturating_sub(a) as f64 / capacity * 100.0
        }
        (
            CpuCounter::HostJiffies {
                busy: b0,
                total: t0,
            },
            CpuCounter::HostJiffies {
                busy: b1,
                total: t1,
            },
        ) => {
            let total = t1.saturating_sub(t0);
            if total == 0 {
                return 0.0;
            }
            b1.saturating_sub(b0) as f64 / total as f64 * 100.0
        }
        _ => 0.0,
    };
    pct.clamp(0.0, 100.0) as f32
}

impl CpuSampler {
    /// CPU use since the previous call (or over a short window on the first call).
    async fn percent(&self, dirs: &CgroupDirs, cpus: u32) -> f32 {
        let previous = *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = match previous {
            Some(p) if p.at.elapsed() < MIN_SAMPLE_WINDOW => return p.pct,
            Some(p) => Some(p),
            None => None,
        };
        let (before_at, before) = match previous {
            Some(p) => (p.at, p.counter),
            None => {
                let Some(counter) = cpu_counter(dirs) else {
                    return 0.0;
                };
                let at = Instant::now();
                tokio::time::sleep(FIRST_SAMPLE_WINDOW).await;
                (at, counter)
            }
        };
        let Some(after) = cpu_counter(dirs) else {
            return 0.0;
        };
        let now = Instant::now();
        let pct = cpu_percent(before, after, now - before_at, cpus);
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(CpuSample {
            at: now,
            counter: after,
            pct,
        });
        pct
    }
}

fn disk_usage() -> (u64, u64) {
    match rustix::fs::statvfs("/") {
        Ok(s) => {
            let total = s.f_blocks * s.f_frsize;
            (total.saturating_sub(s.f_bfree * s.f_frsize), total)
        }
        Err(_) => (0, 0),
    }
}

/// `GET /metrics`.
pub async fn get_metrics(State(state): State<Arc<EnvdState>>) -> Result<Json<Metrics>, HttpError> {
    let dirs = blocking(|| {
        let self_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Ok(locate_cgroups(&self_cgroup, &mountinfo))
    })
    .await?;
    let cpu_count = std::thread::available_parallelism()
        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
    let cpu_used_pct = state.cpu_sampler.percent(&dirs, cpu_count).await;
    let (memory, (disk_used, disk_total)) = blocking(move || {
        let host = host_memory(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default());
        Ok((
            cgroup_memory(&dirs, host.total).unwrap_or(host),
            disk_usage(),
        ))
    })
    .await?;
    Ok(Json(Metrics {
        ts: unix_now(),
        cpu_count,
        cpu_used_pct,
        mem_total: memory.total,
        mem_used: memory.used,
        mem_cache: memory.cache,
        mem_total_mib: memory.total / MIB,
        mem_used_mib: memory.used / MIB,
        disk_used,
        disk_total,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 /sandboxes /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";

    #[test]
    fn locates_v1_and_v2_directories() {
        let self_cgroup = "\
12:memory:/process_api/abc
4:cpu,cpuacct:/process_api/abc
0::/process_api/abc
";
        let dirs = locate_cgroups(self_cgroup, MOUNTINFO);
        assert_eq!(
            dirs.memory_v1,
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            dirs.cpuacct_v1,
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/process_api/abc"))
        );
        assert_eq!(
            dirs.unified,
            Some(PathBuf::from("/sys/fs/cgroup/unified/process_api/abc"))
        );
    }

    #[test]
    fn cgroup_namespace_root_maps_to_mount_point() {
        let dirs = locate_cgroups("5:memory:/\n", MOUNTINFO);
        assert_eq!(dirs.memory_v1, Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(dirs.cpuacct_v1, None);
        assert_eq!(dirs.unified, None);
    }

    #[test]
    fn parses_host_meminfo() {
        let meminfo = "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 600 kB\nCached: 300 kB\n";
        assert_eq!(
            host_memory(meminfo),
            Memory {
                total: 1000 * 1024,
                used: 400 * 1024,
                cache: 300 * 1024
            }
        );
    }

    #[test]
    fn cgroup_memory_needs_a_limit_below_host() {
        let root = std::env::temp_dir().join(format!("berth-envd-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        struct Cleanup(PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _cleanup = Cleanup(root.clone());
        std::fs::write(root.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        std::fs::write(root.join("memory.usage_in_bytes"), "500000000\n").unwrap();
        std::fs::write(
            root.join("memory.stat"),
            "cache 1\ntotal_cache 200000000\ntotal_inactive_file 100000000\n",
        )
        .unwrap();
        let dirs = CgroupDirs {
            memory_v1: Some(root.clone()),
            ..CgroupDirs::default()
        };
        assert_eq!(
            cgroup_memory(&dirs, 8 << 30),
            Some(Memory {
                total: 1 << 30,
                used: 400_000_000,
                cache: 200_000_000
            })
        );
        // A limit at or above the host's memory is "no limit".
        assert_eq!(cgroup_memory(&dirs, 1 << 30), None);
    }

    #[tokio::test]
    async fn metrics_route_reports_this_machine() {
        use axum::body::Body;
        use axum::http::{Request, StatusCode};
        let sb = super::super::test_support::Sandbox::new("metrics");
        let get = || Request::get("/metrics").body(Body::empty()).unwrap();
        let m = super::super::test_http::json(&sb, get(), StatusCode::OK).await;
        assert!(m["ts"].as_i64().unwrap() > 1_600_000_000);
        assert!(m["cpu_count"].as_u64().unwrap() >= 1);
        let pct = m["cpu_used_pct"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&pct));
        let total = m["mem_total"].as_u64().unwrap();
        assert!(total > 0 && m["mem_used"].as_u64().unwrap() <= total);
        assert_eq!(m["mem_total_mib"].as_u64().unwrap(), total / MIB);
        assert!(m["disk_total"].as_u64().unwrap() >= m["disk_used"].as_u64().unwrap());
        assert!(m["disk_total"].as_u64().unwrap() > 0);
        // A second call reuses the sampler.
        super::super::test_http::json(&sb, get(), StatusCode::OK).await;
    }

    #[test]
    fn cpu_percent_from_counters() {
        let second = Duration::from_secs(1);
        let pct = cpu_percent(
            CpuCounter::CgroupNanos(0),
            CpuCounter::CgroupNanos(500_000_000),
            second,
            2,
        );
        assert!((pct - 25.0).abs() < 0.01, "{pct}");
        let pct = cpu_percent(
            CpuCounter::HostJiffies {
                busy: 10,
                total: 100,
            },
            CpuCounter::HostJiffies {
                busy: 60,
                total: 200,
            },
            second,
            2,
        );
        assert!((pct - 50.0).abs() < 0.01, "{pct}");
        assert_eq!(
            cpu_percent(
                CpuCounter::CgroupNanos(5),
                CpuCounter::CgroupNanos(1),
                second,
                1
            ),
            0.0
        );
    }
}
