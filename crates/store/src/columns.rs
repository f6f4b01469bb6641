//! Column encodings shared by every table: times as milliseconds since the epoch, maps
//! and lists as JSON text, and a row reader that turns any undecodable value into
//! [`StoreError::CorruptColumn`] naming the table, column and row.

use rusqlite::types::{FromSql, Value};
use rusqlite::Row;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;
use time::OffsetDateTime;

use crate::error::{Corruption, Result, StoreError};

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

/// Reads the columns of one row by name, attributing failures to `table` and the row's
/// key.
pub(crate) struct Columns<'r, 's> {
    row: &'r Row<'s>,
    table: &'static str,
    key: String,
}

impl<'r, 's> Columns<'r, 's> {
    /// `key_columns` identify the row in error messages (its primary key).
    pub(crate) fn new(
        row: &'r Row<'s>,
        table: &'static str,
        key_columns: &[&'static str],
    ) -> Result<Self> {
        let mut parts = Vec::with_capacity(key_columns.len());
        for column in key_columns {
            parts.push(match row.get::<_, Value>(*column)? {
                Value::Text(text) => text,
                Value::Integer(number) => number.to_string(),
                Value::Real(number) => number.to_string(),
                Value::Null => "NULL".to_string(),
                Value::Blob(bytes) => format!("<{} bytes>", bytes.len()),
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

    pub(crate) fn get<T: FromSql>(&self, column: &'static str) -> Result<T> {
        self.row.get(column).map_err(|err| match err {
            // A stored value of the wrong type or range; a missing column is our bug.
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => {
                self.corrupt(column, Corruption::Type(err))
            }
            other => StoreError::from(other),
        })
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
