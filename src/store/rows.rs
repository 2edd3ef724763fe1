//! The rows the stores read, as named structs decoded by column name: every backend's
//! SQL names its columns (`AS status`, `AS seq`, …) to match.

/// An entity row: its status and version.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Entity {
    /// The stored status.
    pub status: String,
    /// The stored version.
    pub version: i64,
}

/// A recorded application of the request being judged.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Prior {
    /// Version after it.
    pub seq: i64,
    /// State before it.
    #[sqlx(rename = "from_status")]
    pub from: String,
    /// State after it.
    #[sqlx(rename = "to_status")]
    pub to: String,
    /// Payload fingerprint recorded with it.
    pub payload_hash: Option<String>,
    /// The write id of the call that recorded it (`None` for rows written before write
    /// ids were recorded): a call that finds its own id on the row it is judged by
    /// wrote that row, and is told `Applied`.
    #[sqlx(default)]
    pub write_id: Option<i64>,
}

/// A row of a batched read: the position of the request it answers, counted from 0, and
/// that request's history row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PositionedPrior {
    /// The request's position in the batch.
    pub i: i64,
    /// Its history row.
    #[sqlx(flatten)]
    pub prior: Prior,
}

/// A history row found by its reference (an operator's search), its names as stored
/// (read lossily, as [`RawTransition`]'s).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RefRow {
    /// The entity.
    pub order_id: i64,
    /// Version of the entity after this transition.
    pub seq: i64,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Event name.
    pub event: String,
}

crate::support::text::shown_row!(RefRow {
    order_id: plain,
    seq: plain,
    from: text = "from_status",
    to: text = "to_status",
    event: text,
});

/// A history row as stored, before its names are parsed into the machine's types. Its
/// texts read lossily: bytes that are not UTF-8 (which SQLite stores as given) become
/// U+FFFD, so one bad byte never hides a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTransition {
    /// Version of the entity after this transition.
    pub seq: i64,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Event name.
    pub event: String,
    /// Caller's reference.
    pub ref_id: String,
    /// SHA-256 of the payload, hex, if one was given.
    pub payload_hash: Option<String>,
    /// The payload as JSON text, if one was given.
    pub payload: Option<String>,
    /// Who asked for it, if the request said.
    pub actor: Option<String>,
    /// Why, if the request said.
    pub reason: Option<String>,
    /// When it was recorded.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl<'r, R> sqlx::FromRow<'r, R> for RawTransition
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    chrono::DateTime<chrono::Utc>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        use crate::support::text::{lossy, lossy_or_none};
        Ok(RawTransition {
            seq: row.try_get("seq")?,
            from: lossy(row, "from_status")?,
            to: lossy(row, "to_status")?,
            event: lossy(row, "event")?,
            ref_id: lossy(row, "ref_id")?,
            payload_hash: lossy_or_none(row, "payload_hash")?,
            payload: lossy_or_none(row, "payload")?,
            actor: lossy_or_none(row, "actor")?,
            reason: lossy_or_none(row, "reason")?,
            created_at: row.try_get("created_at")?,
        })
    }
}
