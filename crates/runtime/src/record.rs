//! The on-disk record of one sandbox, replaced atomically (write a temp file, rename) so a
//! restarted daemon can find what an earlier one created.
//!
//! There is deliberately no fsync: a record only has to outlive the daemon process (the
//! page cache does that), not the host. After a host crash every sandbox is dead anyway and
//! recovery cleans each sandbox directory whatever its record says, while an fsync costs
//! ~16 ms per call on this machine's disk, several times the whole create budget.

use std::fs;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use crate::SandboxSpec;

pub(crate) const RECORD_FILE: &str = "record.json";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Record {
    pub spec: SandboxSpec,
    /// Index of the sandbox's host uid/gid range (see the crate docs).
    pub slot: u32,
    pub created_at: SystemTime,
    /// Host pid of the init, once started.
    pub init_pid: Option<i32>,
    /// The init's start time in clock ticks since boot (/proc/<pid>/stat field 22), which
    /// tells a live init from an unrelated process that reused its pid.
    pub init_start_ticks: Option<u64>,
    /// First host id of the range owning the files on its disk, when that is not its
    /// slot's range: a fork's disk copy keeps its source's owners and is idmapped into
    /// this sandbox's range (see `pause::idmap_disk`). Absent in records of an older
    /// berth, whose disks were always re-owned into the slot's range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_uid_base: Option<u32>,
}

impl Record {
    pub(crate) fn write(&self, dir: &Path) -> io::Result<()> {
        crate::perms::replace_private(
            dir,
            RECORD_FILE,
            &serde_json::to_vec_pretty(self).map_err(io::Error::other)?,
            false,
        )
    }

    pub(crate) fn read(dir: &Path) -> io::Result<Self> {
        let bytes = fs::read(dir.join(RECORD_FILE))?;
        serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Start time (clock ticks since boot) of `pid`, or None if it does not exist or has
/// already exited (a zombie waiting to be reaped).
pub(crate) fn process_start_ticks(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat_fields_from_state(&stat)?;
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The fields of a `/proc/<pid>/stat` line from the state (field 3) on: the command name
/// (field 2) may contain spaces, so they follow its last ')'.
fn stat_fields_from_state(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat.get(stat.rfind(')')? + 2..)?.split_whitespace())
}

/// `PF_EXITING` of the task flags in `/proc/<pid>/stat` (field 9).
const PF_EXITING: u64 = 0x4;
/// SIGKILL's bit in the pending-signal masks of `/proc/<pid>/status`.
const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);

/// True when `pid` is on its way out: SIGKILL is pending for it, or it is exiting (a
/// process freeing a large memory stays visible for a while after its SIGKILL).
pub(crate) fn process_being_killed(pid: i32) -> bool {
    let (Ok(stat), Ok(status)) = (
        fs::read_to_string(format!("/proc/{pid}/stat")),
        fs::read_to_string(format!("/proc/{pid}/status")),
    ) else {
        return false;
    };
    being_killed(&stat, &status)
}

fn being_killed(stat: &str, status: &str) -> bool {
    let exiting = stat_fields_from_state(stat)
        .and_then(|mut fields| fields.nth(6)?.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0);
    let kill_pending = status.lines().any(|line| {
        ["SigPnd:", "ShdPnd:"].iter().any(|field| {
            line.strip_prefix(field)
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & SIGKILL_BIT != 0)
        })
    });
    exiting || kill_pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_sigkill_or_an_exit_is_being_killed() {
        let me = std::process::id() as i32;
        assert!(!process_being_killed(me));
        assert!(!process_being_killed(i32::MAX));
        let stat = |flags: u64| format!("42 (a (b) c) S 1 42 42 0 -1 {flags} 0 0 0 0");
        let status = |shd: &str| {
            format!(
                "Name:\tx\nSigPnd:\t0000000000000000\nShdPnd:\t{shd}\nSigBlk:\t0000000000000100\n"
            )
        };
        let none = status("0000000000000000");
        assert!(!being_killed(&stat(0x400100), &none));
        assert!(being_killed(&stat(0x400104), &none));
        assert!(being_killed(&stat(0x400100), &status("0000000000000100")));
        assert!(!being_killed(&stat(0x400100), &status("0000000000000200")));
    }

    #[test]
    fn start_ticks_of_self_is_stable() {
        let pid = std::process::id() as i32;
        let a = process_start_ticks(pid).unwrap();
        assert_eq!(process_start_ticks(pid), Some(a));
        assert_eq!(process_start_ticks(i32::MAX), None);
    }

    #[test]
    fn record_round_trips() {
        let dir = std::env::temp_dir().join(format!("berth-record-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let record = Record {
            spec: SandboxSpec {
                id: "itest".into(),
                template: "base".into(),
                layers: vec!["/a".into()],
                cpu_count: 1,
                memory_mb: 256,
                disk_size_mb: 512,
                volumes: Vec::new(),
            },
            slot: 7,
            created_at: SystemTime::now(),
            init_pid: Some(42),
            init_start_ticks: Some(99),
            disk_uid_base: Some(300_000),
        };
        record.write(&dir).unwrap();
        let back = Record::read(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back.slot, 7);
        assert_eq!(back.init_pid, Some(42));
        assert_eq!(back.spec.id, "itest");
        assert_eq!(back.disk_uid_base, Some(300_000));
    }

    #[test]
    fn a_record_without_a_disk_range_reads_as_the_slots_own() {
        let json = r#"{"spec":{"id":"old","template":"base","layers":[],"cpu_count":1,
            "memory_mb":256,"disk_size_mb":512,"volumes":[]},"slot":3,
            "created_at":{"secs_since_epoch":1,"nanos_since_epoch":0},
            "init_pid":null,"init_start_ticks":null}"#;
        let record: Record = serde_json::from_str(json).unwrap();
        assert_eq!(record.disk_uid_base, None);
        assert!(!serde_json::to_string(&record)
            .unwrap()
            .contains("disk_uid_base"));
    }
}
