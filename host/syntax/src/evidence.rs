//! Text shown as evidence in an error's details: serde refuses a string
//! that is not UTF-8, and a lossy conversion would hide which bytes were
//! wrong, so each byte that is not valid UTF-8 is shown as `\xNN`.

use std::ffi::OsStr;
use std::path::Path;

/// `text` as UTF-8, each byte that is not valid UTF-8 shown as `\xNN`.
pub fn escaped(text: &OsStr) -> String {
    let mut shown = String::new();
    for chunk in text.as_encoded_bytes().utf8_chunks() {
        shown.push_str(chunk.valid());
        for byte in chunk.invalid() {
            shown.push_str(&format!("\\x{byte:02X}"));
        }
    }
    shown
}

/// A path as evidence (see [`escaped`]).
pub fn path(path: &Path) -> String {
    escaped(path.as_os_str())
}
