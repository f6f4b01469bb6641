//! `berth up`'s operator limits from flags and a config file (`--config FILE`, TOML),
//! and the file's reload while berth runs: on SIGHUP and when its contents change.
//!
//! The flags are the defaults; a key the file sets wins over its flag, and a key the
//! file stops setting falls back to the flag at the next reload. A file that does not
//! parse, or has an unknown key or a bad value, is refused whole with an error naming
//! the key: at start `berth up` exits, on a reload the limits in force stay.

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_server::{Limits, LimitsHandle, MaxLifetime};
use clap::Args;

/// The flags of the limits (each also a config file key, named in its help).
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// TOML file of limits, quotas and retention (keys as below), re-read on SIGHUP
    /// and when it changes; a key it sets wins over its flag.
    #[arg(long = "config", env = "BERTH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Longest timeout a sandbox may be given: seconds, a duration (`90m`, `12h`,
    /// `7d`) or `unlimited` [config: max_sandbox_lifetime].
    #[arg(long, env = "BERTH_MAX_SANDBOX_LIFETIME", default_value = "86400", value_parser = parse_lifetime)]
    pub max_sandbox_lifetime: MaxLifetime,
    /// Most running sandboxes per team; creates, resumes and forks beyond it get E2B's
    /// 429 (unset: no limit) [config: team_quotas.max_sandboxes].
    #[arg(long, env = "BERTH_TEAM_MAX_SANDBOXES")]
    pub team_max_sandboxes: Option<u64>,
    /// Most CPUs a team's running sandboxes may have, summed (429 beyond)
    /// [config: team_quotas.max_cpu].
    #[arg(long, env = "BERTH_TEAM_MAX_CPU")]
    pub team_max_cpu: Option<u64>,
    /// Most memory a team's running sandboxes may have, summed, in MiB (429 beyond)
    /// [config: team_quotas.max_memory_mb].
    #[arg(long, env = "BERTH_TEAM_MAX_MEMORY_MB")]
    pub team_max_memory_mb: Option<u64>,
    /// Most MiB a team's snapshots may take; a snapshot beyond it gets 429
    /// [config: team_quotas.max_snapshot_storage_mb].
    #[arg(long, env = "BERTH_TEAM_MAX_SNAPSHOT_STORAGE_MB")]
    pub team_max_snapshot_storage_mb: Option<u64>,
    /// Kill sandboxes paused longer than this (seconds or `7d`, `12h`, …)
    /// [config: retention.paused_max_age].
    #[arg(long, env = "BERTH_PAUSED_MAX_AGE", value_parser = parse_duration)]
    pub paused_max_age: Option<Duration>,
    /// Most paused sandboxes a team keeps; the longest paused are killed first
    /// [config: retention.paused_max_count].
    #[arg(long, env = "BERTH_PAUSED_MAX_COUNT")]
    pub paused_max_count: Option<u64>,
    /// Delete snapshots older than this, unless in use [config: retention.snapshot_max_age].
    #[arg(long, env = "BERTH_SNAPSHOT_MAX_AGE", value_parser = parse_duration)]
    pub snapshot_max_age: Option<Duration>,
    /// Delete a team's oldest snapshots not in use while its snapshots take more MiB
    /// than this [config: retention.snapshot_max_storage_mb].
    #[arg(long, env = "BERTH_SNAPSHOT_MAX_STORAGE_MB")]
    pub snapshot_max_storage_mb: Option<u64>,
}

impl LimitArgs {
    /// The limits the flags alone set.
    pub fn flags(&self) -> Limits {
        let mut limits = Limits {
            max_lifetime: self.max_sandbox_lifetime,
            ..Default::default()
        };
        limits.quotas.max_sandboxes = self.team_max_sandboxes;
        limits.quotas.max_cpu = self.team_max_cpu;
        limits.quotas.max_memory_mb = self.team_max_memory_mb;
        limits.quotas.max_snapshot_storage_mb = self.team_max_snapshot_storage_mb;
        limits.retention.paused_max_age = self.paused_max_age;
        limits.retention.paused_max_count = self.paused_max_count;
        limits.retention.snapshot_max_age = self.snapshot_max_age;
        limits.retention.snapshot_max_storage_mb = self.snapshot_max_storage_mb;
        limits
    }
}

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: unknown key `{key}` (known: {known})")]
    UnknownKey {
        path: PathBuf,
        key: String,
        known: &'static str,
    },
    #[error("{path}: `{key}`: {problem}")]
    BadValue {
        path: PathBuf,
        key: String,
        problem: String,
    },
}

const TOP_KEYS: &str = "max_sandbox_lifetime, [team_quotas], [retention]";
const QUOTA_KEYS: &str = "max_sandboxes, max_cpu, max_memory_mb, max_snapshot_storage_mb";
const RETENTION_KEYS: &str =
    "paused_max_age, paused_max_count, snapshot_max_age, snapshot_max_storage_mb";

/// The limits config text `text` (read from `path`) sets over `base`.
pub fn parse(path: &Path, text: &str, base: &Limits) -> Result<Limits, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: err.to_string(),
        })?;
    let reader = Reader { path };
    let mut limits = base.clone();
    for (key, value) in &table {
        match key.as_str() {
            "max_sandbox_lifetime" => {
                limits.max_lifetime = match reader.limit(key, value, Reader::duration)? {
                    None => MaxLifetime::Unlimited,
                    Some(duration) => {
                        lifetime(duration).map_err(|problem| reader.bad(key, problem))?
                    }
                }
            }
            "team_quotas" => {
                for (name, value) in reader.table(key, value)? {
                    let full = format!("team_quotas.{name}");
                    let quota = reader.limit(&full, value, Reader::count)?;
                    match name.as_str() {
                        "max_sandboxes" => limits.quotas.max_sandboxes = quota,
                        "max_cpu" => limits.quotas.max_cpu = quota,
                        "max_memory_mb" => limits.quotas.max_memory_mb = quota,
                        "max_snapshot_storage_mb" => limits.quotas.max_snapshot_storage_mb = quota,
                        _ => return Err(reader.unknown(&full, QUOTA_KEYS)),
                    }
                }
            }
            "retention" => {
                for (name, value) in reader.table(key, value)? {
                    let full = format!("retention.{name}");
                    let retention = &mut limits.retention;
                    match name.as_str() {
                        "paused_max_age" => {
                            retention.paused_max_age =
                                reader.limit(&full, value, Reader::duration)?
                        }
                        "snapshot_max_age" => {
                            retention.snapshot_max_age =
                                reader.limit(&full, value, Reader::duration)?
                        }
                        "paused_max_count" => {
                            retention.paused_max_count =
                                reader.limit(&full, value, Reader::count)?
                        }
                        "snapshot_max_storage_mb" => {
                            retention.snapshot_max_storage_mb =
                                reader.limit(&full, value, Reader::count)?
                        }
                        _ => return Err(reader.unknown(&full, RETENTION_KEYS)),
                    }
                }
            }
            _ => return Err(reader.unknown(key, TOP_KEYS)),
        }
    }
    Ok(limits)
}

/// Reads values of one file, naming it and the key in every refusal.
struct Reader<'a> {
    path: &'a Path,
}

impl Reader<'_> {
    fn bad(&self, key: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::BadValue {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    fn unknown(&self, key: &str, known: &'static str) -> ConfigError {
        ConfigError::UnknownKey {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            known,
        }
    }

    fn table<'v>(&self, key: &str, value: &'v toml::Value) -> Result<&'v toml::Table, ConfigError> {
        value
            .as_table()
            .ok_or_else(|| self.bad(key, "expected a table ([section])"))
    }

    /// `"unlimited"` (None), or what `read` makes of the value.
    fn limit<T>(
        &self,
        key: &str,
        value: &toml::Value,
        read: impl Fn(&Self, &str, &toml::Value) -> Result<T, ConfigError>,
    ) -> Result<Option<T>, ConfigError> {
        match value.as_str() {
            Some(text) if text.eq_ignore_ascii_case("unlimited") => Ok(None),
            _ => read(self, key, value).map(Some),
        }
    }

    fn count(&self, key: &str, value: &toml::Value) -> Result<u64, ConfigError> {
        match value {
            toml::Value::Integer(n) if *n >= 0 => Ok(*n as u64),
            other => Err(self.bad(
                key,
                format!("expected a whole number ≥ 0 or \"unlimited\", got {other}"),
            )),
        }
    }

    fn duration(&self, key: &str, value: &toml::Value) -> Result<Duration, ConfigError> {
        match value {
            toml::Value::Integer(n) if *n > 0 => Ok(Duration::from_secs(*n as u64)),
            toml::Value::String(text) => {
                parse_duration(text).map_err(|problem| self.bad(key, problem))
            }
            other => Err(self.bad(
                key,
                format!(
                    "expected seconds, a duration such as \"12h\" or \"unlimited\", got {other}"
                ),
            )),
        }
    }
}

/// Seconds (`3600`) or a number with a unit: `s`, `m`, `h`, `d` (`90m`, `7d`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "expected seconds or a duration such as 90m, 12h, 7d, got {text:?}"
            ))
        }
    };
    match number.parse::<u64>() {
        Ok(n) if n > 0 => n
            .checked_mul(scale)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{text:?} is too long")),
        _ => Err(format!(
            "expected a positive duration such as 90m, 12h, 7d, got {text:?}"
        )),
    }
}

/// A sandbox lifetime: [`parse_duration`] or `unlimited`.
pub fn parse_lifetime(text: &str) -> Result<MaxLifetime, String> {
    if text.eq_ignore_ascii_case("unlimited") || text.eq_ignore_ascii_case("none") {
        return Ok(MaxLifetime::Unlimited);
    }
    lifetime(parse_duration(text)?)
}

fn lifetime(duration: Duration) -> Result<MaxLifetime, String> {
    let seconds = duration.as_secs();
    if seconds > i32::MAX as u64 {
        return Err(format!(
            "a lifetime is at most {} seconds (or \"unlimited\"), got {seconds}",
            i32::MAX
        ));
    }
    Ok(MaxLifetime::Seconds(seconds as i64))
}

/// One line saying what `limits` are, for berth's log.
pub fn describe(limits: &Limits) -> String {
    fn show<T: std::fmt::Display>(value: Option<T>) -> String {
        value.map_or_else(|| "unlimited".to_string(), |v| v.to_string())
    }
    fn age(value: Option<Duration>) -> String {
        value.map_or_else(|| "unlimited".to_string(), |d| format!("{}s", d.as_secs()))
    }
    let lifetime = match limits.max_lifetime {
        MaxLifetime::Unlimited => "unlimited".to_string(),
        MaxLifetime::Seconds(seconds) => format!("{seconds}s"),
    };
    let (q, r) = (&limits.quotas, &limits.retention);
    format!(
        "max_sandbox_lifetime={lifetime} team_quotas: max_sandboxes={} max_cpu={} \
         max_memory_mb={} max_snapshot_storage_mb={} retention: paused_max_age={} \
         paused_max_count={} snapshot_max_age={} snapshot_max_storage_mb={}",
        show(q.max_sandboxes),
        show(q.max_cpu),
        show(q.max_memory_mb),
        show(q.max_snapshot_storage_mb),
        age(r.paused_max_age),
        show(r.paused_max_count),
        age(r.snapshot_max_age),
        show(r.snapshot_max_storage_mb),
    )
}

/// How often the config file is read to see whether it changed.
const CHANGE_POLL: Duration = Duration::from_secs(2);

/// Re-reads config file `path` over `base` on SIGHUP and whenever its contents change,
/// putting what it says in force through `handle`; a refused file is logged (naming the
/// key) and the limits in force stay. `config` is the file and the text in force now;
/// without one a SIGHUP only says there is nothing to reload (rather than ending berth,
/// SIGHUP's default).
pub fn spawn_reload(
    config: Option<(PathBuf, String)>,
    base: Limits,
    handle: LimitsHandle,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    let Some((path, mut in_force)) = config else {
        return Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::warn!("SIGHUP: berth up runs without --config, nothing to reload");
            }
        }));
    };
    Ok(tokio::spawn(async move {
        let mut poll = tokio::time::interval(CHANGE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let why = tokio::select! {
                _ = hangups.recv() => "SIGHUP",
                _ = poll.tick() => "a change",
            };
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(source) => {
                    if why == "SIGHUP" {
                        let err = ConfigError::Read {
                            path: path.clone(),
                            source,
                        };
                        tracing::error!(error = %err, "config refused on SIGHUP; the limits in force stay");
                    }
                    continue;
                }
            };
            if why != "SIGHUP" && text == in_force {
                continue;
            }
            match parse(&path, &text, &base) {
                Ok(limits) => {
                    eprintln!(
                        "limits reloaded from {} on {why}: {}",
                        path.display(),
                        describe(&limits)
                    );
                    handle.replace(limits);
                }
                Err(err) => tracing::error!(
                    error = %err,
                    "config refused on {why}; the limits in force stay"
                ),
            }
            // A refused text is not read again until it changes.
            in_force = text;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Result<Limits, ConfigError> {
        parse(Path::new("limits.toml"), text, &Limits::default())
    }

    #[test]
    fn every_key_is_read_with_its_units() {
        let limits = at(r#"
            max_sandbox_lifetime = "unlimited"
            [team_quotas]
            max_sandboxes = 3
            max_cpu = 8
            max_memory_mb = 4096
            max_snapshot_storage_mb = 100
            [retention]
            paused_max_age = "7d"
            paused_max_count = 5
            snapshot_max_age = 3600
            snapshot_max_storage_mb = 50
        "#)
        .unwrap();
        assert_eq!(limits.max_lifetime, MaxLifetime::Unlimited);
        assert_eq!(limits.quotas.max_sandboxes, Some(3));
        assert_eq!(limits.quotas.max_cpu, Some(8));
        assert_eq!(limits.quotas.max_memory_mb, Some(4096));
        assert_eq!(limits.quotas.max_snapshot_storage_mb, Some(100));
        assert_eq!(
            limits.retention.paused_max_age,
            Some(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(limits.retention.paused_max_count, Some(5));
        assert_eq!(
            limits.retention.snapshot_max_age,
            Some(Duration::from_secs(3600))
        );
        assert_eq!(limits.retention.snapshot_max_storage_mb, Some(50));
    }

    #[test]
    fn the_file_wins_over_flags_and_unlimited_lifts_a_flag() {
        let mut flags = Limits::default();
        flags.quotas.max_sandboxes = Some(10);
        flags.quotas.max_cpu = Some(4);
        let limits = parse(
            Path::new("f"),
            "[team_quotas]\nmax_sandboxes = 2\nmax_cpu = \"unlimited\"\n",
            &flags,
        )
        .unwrap();
        assert_eq!(limits.quotas.max_sandboxes, Some(2));
        assert_eq!(limits.quotas.max_cpu, None);
        assert_eq!(parse(Path::new("f"), "", &flags).unwrap(), flags);
    }

    #[test]
    fn refusals_name_the_key() {
        let message = |text: &str| at(text).unwrap_err().to_string();
        let unknown = message("[team_quotas]\nmax_gpus = 1\n");
        assert!(
            unknown.contains("unknown key `team_quotas.max_gpus`"),
            "{unknown}"
        );
        let negative = message("[team_quotas]\nmax_cpu = -1\n");
        assert!(negative.contains("`team_quotas.max_cpu`"), "{negative}");
        let unit = message("[retention]\npaused_max_age = \"7 weeks\"\n");
        assert!(unit.contains("`retention.paused_max_age`"), "{unit}");
        let top = message("max_lifetime = 5\n");
        assert!(top.contains("unknown key `max_lifetime`"), "{top}");
        let section = message("retention = 5\n");
        assert!(
            section.contains("`retention`: expected a table"),
            "{section}"
        );
        assert!(message("[team_quotas\n").contains("is not TOML"));
    }

    #[test]
    fn durations_and_lifetimes() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("1w").is_err());
        assert_eq!(parse_lifetime("600"), Ok(MaxLifetime::Seconds(600)));
        assert_eq!(parse_lifetime("1h"), Ok(MaxLifetime::Seconds(3600)));
        assert_eq!(parse_lifetime("unlimited"), Ok(MaxLifetime::Unlimited));
        assert!(parse_lifetime("0").is_err());
        assert!(parse_lifetime("100000d").is_err());
    }
}
