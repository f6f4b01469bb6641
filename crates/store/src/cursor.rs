//! Keyset cursors. A listing is ordered by a total key (a time in ms, then the row id);
//! a page's cursor is the key of its last row, and the next page is the rows strictly
//! after it. Rows inserted or removed between pages therefore never shift the rest: no
//! row is returned twice or skipped. Cursors are base64url text so clients treat them as
//! opaque; each names the listing and order it belongs to, and anything else is refused
//! as [`StoreError::InvalidCursor`].

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::error::{Result, StoreError};

/// Which ordered listing a cursor walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    /// Live sandboxes by (started_at_ms, id).
    Sandboxes { ascending: bool },
    /// Snapshots by (created_at_ms, id), newest first.
    Snapshots,
    /// Templates by (created_at_ms, id), installed ones first, then newest first.
    Templates,
    /// A template's builds by (created_at_ms, id), newest first.
    TemplateBuilds,
    /// Secrets by (created_at_ms, id), newest first.
    Secrets,
}

impl Listing {
    fn tag(self) -> &'static str {
        match self {
            Listing::Sandboxes { ascending: true } => "sandboxes-asc",
            Listing::Sandboxes { ascending: false } => "sandboxes-desc",
            Listing::Snapshots => "snapshots-desc",
            Listing::Templates => "templates-desc",
            Listing::TemplateBuilds => "template-builds-desc",
            Listing::Secrets => "secrets-desc",
        }
    }

    pub(crate) fn ascending(self) -> bool {
        match self {
            Listing::Sandboxes { ascending } => ascending,
            Listing::Snapshots
            | Listing::Secrets
            | Listing::Templates
            | Listing::TemplateBuilds => false,
        }
    }
}

/// The sort key of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Position {
    pub ms: i64,
    pub id: String,
}

pub(crate) fn encode(listing: Listing, position: &Position) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}:{}", listing.tag(), position.ms, position.id))
}

pub(crate) fn decode(listing: Listing, cursor: &str) -> Result<Position> {
    let invalid = |reason| StoreError::InvalidCursor { reason };
    let bytes = URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| invalid("not a cursor issued by berth"))?;
    let text = String::from_utf8(bytes).map_err(|_| invalid("not a cursor issued by berth"))?;
    let (tag, rest) = text
        .split_once(':')
        .ok_or(invalid("not a cursor issued by berth"))?;
    if tag != listing.tag() {
        return Err(invalid(
            "it belongs to another listing or sort order than this request",
        ));
    }
    let (ms, id) = rest
        .split_once(':')
        .ok_or(invalid("its position is malformed"))?;
    let ms = ms
        .parse::<i64>()
        .map_err(|_| invalid("its position is malformed"))?;
    if id.is_empty() {
        return Err(invalid("its position is malformed"));
    }
    Ok(Position {
        ms,
        id: id.to_string(),
    })
}

/// The keyset condition "strictly after `position`" on `(ms_column, id_column)`, in the
/// listing's order. Row values are standard SQL (SQLite ≥ 3.15, Postgres).
pub(crate) fn after(
    listing: Listing,
    ms_column: &str,
    id_column: &str,
    ms_param: &str,
    id_param: &str,
) -> String {
    let cmp = if listing.ascending() { ">" } else { "<" };
    format!("({ms_column}, {id_column}) {cmp} ({ms_param}, {id_param})")
}

/// `ORDER BY` of the listing on `(ms_column, id_column)`.
pub(crate) fn order_by(listing: Listing, ms_column: &str, id_column: &str) -> String {
    let order = if listing.ascending() { "ASC" } else { "DESC" };
    format!("ORDER BY {ms_column} {order}, {id_column} {order}")
}

/// Split `rows` (fetched with a limit of `limit + 1`) into the page and the cursor of
/// the next page, which exists only when more rows followed.
pub(crate) fn paginate<T>(
    listing: Listing,
    mut rows: Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> Position,
) -> (Vec<T>, Option<String>) {
    if rows.len() <= limit {
        return (rows, None);
    }
    rows.truncate(limit);
    let next = rows.last().map(|last| encode(listing, &key(last)));
    (rows, next)
}

/// The SQL `LIMIT` that fetches one row beyond a page of `limit`.
pub(crate) fn fetch_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_listings() {
        let position = Position {
            ms: -5,
            id: "a:b".into(),
        };
        let listing = Listing::Sandboxes { ascending: false };
        let cursor = encode(listing, &position);
        assert_eq!(decode(listing, &cursor).unwrap(), position);
        for other in [Listing::Sandboxes { ascending: true }, Listing::Snapshots] {
            assert!(matches!(
                decode(other, &cursor),
                Err(StoreError::InvalidCursor { .. })
            ));
        }
    }

    #[test]
    fn garbage_is_refused() {
        let listing = Listing::Snapshots;
        let malformed = [
            "\0garbage".to_string(),
            "ia0".to_string(),
            URL_SAFE_NO_PAD.encode("snapshots-desc:12"),
            URL_SAFE_NO_PAD.encode("snapshots-desc:x:id"),
            URL_SAFE_NO_PAD.encode("snapshots-desc:12:"),
            URL_SAFE_NO_PAD.encode([0xff, 0xfe]),
        ];
        for cursor in malformed {
            assert!(
                matches!(
                    decode(listing, &cursor),
                    Err(StoreError::InvalidCursor { .. })
                ),
                "{cursor:?} accepted"
            );
        }
    }
}
