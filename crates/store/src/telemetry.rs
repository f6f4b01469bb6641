//! What sandboxes report: log lines and metric samples.

use berth_api::LogLevel;

use crate::columns::{now, to_ms, Columns};
use crate::db::{params, Bindings, Dialect, Row, Store};
use crate::error::Result;

/// One stored log line of a sandbox.
#[derive(Debug, Clone)]
pub struct LogRecord {
    pub timestamp_ms: i64,
    pub level: LogLevel,
    pub message: String,
}

/// One stored metric sample of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricSample {
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

const LEVELS: [LogLevel; 4] = [
    LogLevel::Debug,
    LogLevel::Info,
    LogLevel::Warn,
    LogLevel::Error,
];

const METRIC_COLUMNS: &str = "sandbox_id, timestamp_unix, cpu_count, cpu_used_pct, mem_used, \
     mem_total, mem_cache, disk_used, disk_total";

fn log_from_row(row: &Row<'_>) -> Result<LogRecord> {
    let c = Columns::new(row, "sandbox_logs", &["seq"])?;
    Ok(LogRecord {
        timestamp_ms: c.get("timestamp_ms")?,
        level: c.word("level", "debug, info, warn or error", LogLevel::parse)?,
        message: c.get("message")?,
    })
}

fn metric_from_row(row: &Row<'_>) -> Result<MetricSample> {
    let c = Columns::new(row, "sandbox_metrics", &["sandbox_id", "timestamp_unix"])?;
    Ok(MetricSample {
        timestamp_unix: c.get("timestamp_unix")?,
        cpu_count: c.get("cpu_count")?,
        cpu_used_pct: c.get("cpu_used_pct")?,
        mem_used: c.get::<i64>("mem_used")? as u64,
        mem_total: c.get::<i64>("mem_total")? as u64,
        mem_cache: c.get::<i64>("mem_cache")? as u64,
        disk_used: c.get::<i64>("disk_used")? as u64,
        disk_total: c.get::<i64>("disk_total")? as u64,
    })
}

impl Store {
    pub fn append_log(&self, sandbox_id: &str, level: LogLevel, message: &str) -> Result<()> {
        self.conn()?.execute(
            "INSERT INTO sandbox_logs (sandbox_id, timestamp_ms, level, message) VALUES (?1, ?2, ?3, ?4)",
            params![sandbox_id, to_ms(now()), level.as_str(), message],
        )?;
        Ok(())
    }

    /// Log lines of a sandbox at or after `cursor_ms` (forward) or at or before it
    /// (backward), at least `min_level`, containing `search` (case-sensitive), at most
    /// `limit`.
    pub fn logs(
        &self,
        sandbox_id: &str,
        cursor_ms: Option<i64>,
        forward: bool,
        min_level: LogLevel,
        search: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LogRecord>> {
        let mut bindings = Bindings::default();
        let mut conditions = vec![format!(
            "sandbox_id = {}",
            bindings.bind(sandbox_id.to_string())
        )];
        let (cmp, order) = if forward {
            (">=", "ASC")
        } else {
            ("<=", "DESC")
        };
        if let Some(cursor) = cursor_ms {
            conditions.push(format!("timestamp_ms {cmp} {}", bindings.bind(cursor)));
        }
        if min_level > LogLevel::Debug {
            let levels = LEVELS
                .iter()
                .filter(|level| **level >= min_level)
                .map(|level| level.as_str().to_string());
            conditions.push(format!("level IN ({})", bindings.bind_list(levels)));
        }
        let mut conn = self.conn()?;
        if let Some(needle) = search {
            // A byte-wise substring test, spelled per dialect.
            let position = match conn.dialect() {
                Dialect::Sqlite => "instr",
                Dialect::Postgres => "strpos",
            };
            conditions.push(format!(
                "{position}(message, {}) > 0",
                bindings.bind(needle.to_string())
            ));
        }
        let sql = format!(
            "SELECT seq, timestamp_ms, level, message FROM sandbox_logs WHERE {} \
             ORDER BY timestamp_ms {order}, seq {order} LIMIT {}",
            conditions.join(" AND "),
            bindings.bind(i64::try_from(limit).unwrap_or(i64::MAX)),
        );
        conn.query_all(&sql, bindings.params(), log_from_row)
    }

    /// Store a sample; a second sample of the same second replaces the first.
    pub fn insert_metric(&self, sandbox_id: &str, sample: &MetricSample) -> Result<()> {
        self.conn()?.execute(
            &format!(
                "INSERT INTO sandbox_metrics ({METRIC_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT (sandbox_id, timestamp_unix) DO UPDATE SET \
                 cpu_count = excluded.cpu_count, cpu_used_pct = excluded.cpu_used_pct, \
                 mem_used = excluded.mem_used, mem_total = excluded.mem_total, \
                 mem_cache = excluded.mem_cache, disk_used = excluded.disk_used, \
                 disk_total = excluded.disk_total"
            ),
            params![
                sandbox_id,
                sample.timestamp_unix,
                sample.cpu_count,
                sample.cpu_used_pct,
                sample.mem_used as i64,
                sample.mem_total as i64,
                sample.mem_cache as i64,
                sample.disk_used as i64,
                sample.disk_total as i64
            ],
        )?;
        Ok(())
    }

    /// Samples of a sandbox in `[start, end]` (unix seconds), oldest first.
    pub fn metrics(&self, sandbox_id: &str, start: i64, end: i64) -> Result<Vec<MetricSample>> {
        self.conn()?.query_all(
            &format!(
                "SELECT {METRIC_COLUMNS} FROM sandbox_metrics WHERE sandbox_id = ?1 \
                 AND timestamp_unix BETWEEN ?2 AND ?3 ORDER BY timestamp_unix"
            ),
            params![sandbox_id, start, end],
            metric_from_row,
        )
    }

    /// The newest sample of a sandbox.
    pub fn latest_metric(&self, sandbox_id: &str) -> Result<Option<MetricSample>> {
        self.conn()?.query_opt(
            &format!(
                "SELECT {METRIC_COLUMNS} FROM sandbox_metrics WHERE sandbox_id = ?1 \
                 ORDER BY timestamp_unix DESC LIMIT 1"
            ),
            params![sandbox_id],
            metric_from_row,
        )
    }
}
