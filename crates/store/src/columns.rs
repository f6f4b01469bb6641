//! Column encodings shared by every table: times as milliseconds since the epoch, maps
//! and lists as JSON text, and a row reader that turns any undecodable value into
//! [`StoreError::CorruptColumn`] naming the table, column and row.

use rusqlite::types::FromSql;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;
use time::OffsetDateTime;

use crate::db::Row;
use crate::error::{ColumnTypeError, Corruption, Result, StoreError};

pub(crate) fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

pub(crate) fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub(crate) fn to_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

pub(crate) fn from_ms(ms: i64) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
}

/// JSON text of a string map (the encoding of `metadata` and `env_vars`).
pub(crate) fn string_map_json(map: &berth_api::StringMap) -> String {
    Json::Object(
        map.iter()
            .map(|(key, value)| (key.clone(), Json::String(value.clone())))
            .collect(),
    )
    .to_string()
}

/// JSON text of a string list (the encoding of a webhook's `events`).
pub(crate) fn string_list_json(items: &[String]) -> String {
    Json::Array(items.iter().cloned().map(Json::String).collect()).to_string()
}

/// A field type a column decodes into, on either backend. SQLite's conversions are
/// rusqlite's own (range-checked); Postgres columns are `BIGINT`, `BOOLEAN`, `DOUBLE
/// PRECISION`, `TEXT` or `BYTEA`, narrowed to the field's type with a range check.
pub(crate) trait FromColumn: FromSql + Sized {
    /// Column `index` of a Postgres row, NULL as None.
    fn from_postgres(
        row: &tokio_postgres::Row,
        index: usize,
    ) -> std::result::Result<Option<Self>, ColumnTypeError>;
}

macro_rules! direct {
    ($($t:ty),*) => {$(
        impl FromColumn for $t {
            fn from_postgres(
                row: &tokio_postgres::Row,
                index: usize,
            ) -> std::result::Result<Option<Self>, ColumnTypeError> {
                crate::postgres::get::<$t>(row, index)
            }
        }
    )*};
}
direct!(i64, bool, f64, String, Vec<u8>);

macro_rules! narrowed {
    ($($t:ty),*) => {$(
        impl FromColumn for $t {
            fn from_postgres(
                row: &tokio_postgres::Row,
                index: usize,
            ) -> std::result::Result<Option<Self>, ColumnTypeError> {
                crate::postgres::get::<i64>(row, index)?
                    .map(|value| {
                        <$t>::try_from(value).map_err(|_| ColumnTypeError::OutOfRange {
                            value,
                            target: stringify!($t),
                        })
                    })
                    .transpose()
            }
        }
    )*};
}
narrowed!(u64, u32, u16);

impl<T: FromColumn> FromColumn for Option<T> {
    fn from_postgres(
        row: &tokio_postgres::Row,
        index: usize,
    ) -> std::result::Result<Option<Self>, ColumnTypeError> {
        T::from_postgres(row, index).map(Some)
    }
}

/// Reads the columns of one row by name, attributing failures to `table` and the row's
/// key.
pub(crate) struct Columns<'r> {
    row: &'r Row<'r>,
    table: &'static str,
    key: String,
}

impl<'r> Columns<'r> {
    /// `key_columns` identify the row in error messages (its primary key).
    pub(crate) fn new(
        row: &'r Row<'r>,
        table: &'static str,
        key_columns: &[&'static str],
    ) -> Result<Self> {
        let mut parts = Vec::with_capacity(key_columns.len());
        for column in key_columns {
            parts.push(match row {
                Row::Sqlite(row) => crate::sqlite::key_text(row, column)?,
                Row::Postgres(row) => crate::postgres::key_text(row, column)?,
            });
        }
        let key = match parts.as_slice() {
            [one] => one.clone(),
            _ => format!("({})", parts.join(", ")),
        };
        Ok(Columns { row, table, key })
    }

    pub(crate) fn corrupt(&self, column: &'static str, source: Corruption) -> StoreError {
        StoreError::CorruptColumn {
            table: self.table,
            column,
            row: self.key.clone(),
            source,
        }
    }

    pub(crate) fn get<T: FromColumn>(&self, column: &'static str) -> Result<T> {
        match self.row {
            Row::Sqlite(row) => row.get(column).map_err(|err| match err {
                // A stored value of the wrong type or range; a missing column is our bug.
                rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::IntegralValueOutOfRange(..) => {
                    self.corrupt(column, Corruption::Type(ColumnTypeError::Sqlite(err)))
                }
                other => StoreError::from(other),
            }),
            Row::Postgres(row) => {
                let index = crate::postgres::column_index(row, column)?;
                T::from_postgres(row, index)
                    .and_then(|value| value.ok_or(ColumnTypeError::Null))
                    .map_err(|err| self.corrupt(column, Corruption::Type(err)))
            }
        }
    }

    /// A JSON text column.
    pub(crate) fn json<T: DeserializeOwned>(&self, column: &'static str) -> Result<T> {
        let text: String = self.get(column)?;
        serde_json::from_str(&text).map_err(|err| self.corrupt(column, Corruption::Json(err)))
    }

    /// A nullable JSON text column.
    pub(crate) fn json_opt<T: DeserializeOwned>(&self, column: &'static str) -> Result<Option<T>> {
        let text: Option<String> = self.get(column)?;
        text.map(|text| {
            serde_json::from_str(&text).map_err(|err| self.corrupt(column, Corruption::Json(err)))
        })
        .transpose()
    }

    /// A time column (milliseconds since the epoch).
    pub(crate) fn time(&self, column: &'static str) -> Result<OffsetDateTime> {
        let ms: i64 = self.get(column)?;
        from_ms(ms).ok_or_else(|| self.corrupt(column, Corruption::Time { ms }))
    }

    /// A nullable time column.
    pub(crate) fn time_opt(&self, column: &'static str) -> Result<Option<OffsetDateTime>> {
        let ms: Option<i64> = self.get(column)?;
        ms.map(|ms| from_ms(ms).ok_or_else(|| self.corrupt(column, Corruption::Time { ms })))
            .transpose()
    }

    /// A text column holding one of a fixed set of words, decoded by `parse`.
    pub(crate) fn word<T>(
        &self,
        column: &'static str,
        expected: &'static str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T> {
        let text: String = self.get(column)?;
        parse(&text).ok_or_else(|| {
            self.corrupt(
                column,
                Corruption::UnknownValue {
                    value: text.clone(),
                    expected,
                },
            )
        })
    }
}
