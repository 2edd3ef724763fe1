//! Free text from actions and downstream services (a gateway's error body), bounded
//! before it is recorded.

use std::borrow::Cow;

/// The most bytes of free text a flow records: a step's (or compensation's) error, and
/// any other message from an action or a downstream service (a gateway's long error
/// body). Longer text is cut on a character boundary and ends with a marker saying how
/// long it was (`"… [truncated, 102400 bytes]"`), the marker within the bound, so the
/// record always lands (MariaDB's `TEXT` columns hold 65,535 bytes). The cut text is what
/// the outcome answers, what a replay answers, and what the step row and the flow record
/// hold.
pub const MAX_ERROR_BYTES: usize = 16 * 1024;

/// `text` as [`bounded`] leaves it, borrowed when it is within the bound.
pub(crate) fn bounded_str(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_ERROR_BYTES {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(bounded(text.to_string()))
    }
}

/// `text`, cut to [`MAX_ERROR_BYTES`] with its marker if it is longer.
pub(crate) fn bounded(mut text: String) -> String {
    if text.len() <= MAX_ERROR_BYTES {
        return text;
    }
    let marker = format!("… [truncated, {} bytes]", text.len());
    let keep = text.floor_char_boundary(MAX_ERROR_BYTES.saturating_sub(marker.len()));
    text.truncate(keep);
    text.push_str(&marker);
    text
}

/// The text in column `col` of `row`, its bytes that are not UTF-8 (which SQLite stores
/// as given) read as U+FFFD: a row to show, never one to act on.
pub(crate) fn lossy<'r, R>(row: &'r R, col: &'static str) -> Result<String, sqlx::Error>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    lossy_or_none(row, col)?.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_owned(),
        source: "NULL where a text was expected".into(),
    })
}

/// [`lossy`] for a column that may be NULL.
pub(crate) fn lossy_or_none<'r, R>(
    row: &'r R,
    col: &'static str,
) -> Result<Option<String>, sqlx::Error>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    match row.try_get::<Option<String>, _>(col) {
        Ok(text) => Ok(text),
        Err(e @ sqlx::Error::ColumnDecode { .. }) => match row.try_get::<Option<Vec<u8>>, _>(col) {
            Ok(bytes) => Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned())),
            Err(_) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// `sqlx::FromRow` for a row shown to a person, on any backend: each field read from the
/// column of its name, a `text` or `maybe_text` field lossily ([`lossy`],
/// [`lossy_or_none`]) so that one bad byte never hides the row, any other (`plain`) field
/// as it decodes. A row something acts on reads lossily only the texts nothing acts on.
macro_rules! shown_row {
    ($ty:ident { $($field:ident: $how:ident $(= $col:literal)?),+ $(,)? }) => {
        impl<'r, R> sqlx::FromRow<'r, R> for $ty
        where
            R: sqlx::Row,
            &'static str: sqlx::ColumnIndex<R>,
            i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
                Ok($ty {
                    $($field: $crate::support::text::shown_row!(
                        @$how row, $crate::support::text::shown_row!(@col $field $($col)?)
                    ),)+
                })
            }
        }
    };
    (@col $field:ident) => { stringify!($field) };
    (@col $field:ident $col:literal) => { $col };
    (@text $row:ident, $col:expr) => { $crate::support::text::lossy($row, $col)? };
    (@maybe_text $row:ident, $col:expr) => { $crate::support::text::lossy_or_none($row, $col)? };
    (@plain $row:ident, $col:expr) => { sqlx::Row::try_get($row, $col)? };
}
pub(crate) use shown_row;
