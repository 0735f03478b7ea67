//! How much of a service's answer sas reads and keeps: the byte bounds and [`cap`].

/// The most of a service's answer an agent reads, in bytes: an HTTP body is read no further
/// (a success over it is [`crate::ports::RemoteFault::TooLarge`]: the step took effect, its result cannot be
/// kept); a Lambda payload over it is not parsed. Above the result limit
/// ([`crate::domain::task::MAX_RESULT_BYTES`]), so that a success with some whitespace and a
/// refusal with a long message are still read whole.
pub const MAX_ANSWER_BYTES: usize = crate::domain::payload::MAX_PAYLOAD_BYTES + 64 * 1024;
/// The most of any text from a service (a refusal's message, a fault's error) that reaches a
/// record, a message or an event, in bytes: [`cap`] cuts the rest.
pub const MAX_TEXT_BYTES: usize = 1024;
/// The longest refusal code kept, in bytes.
pub const MAX_CODE_BYTES: usize = 64;
/// What ends a text [`cap`] cut.
pub const CUT_MARKER: &str = "…[cut]";

/// `text`, or, if it is over `max` bytes, as much of it as fits on a char boundary followed by
/// [`CUT_MARKER`] (`max` bytes at most in all).
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    if max < CUT_MARKER.len() {
        return text[..text.floor_char_boundary(max)].to_owned();
    }
    let keep = text.floor_char_boundary(max - CUT_MARKER.len());
    format!("{}{CUT_MARKER}", &text[..keep])
}
