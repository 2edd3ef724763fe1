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
