//! Server-sent events: an incremental parser ([`SseParser`]) that takes the
//! body in whatever pieces the network delivers (a line, an event or a UTF-8
//! character may be split anywhere) and hands out whole events.
//!
//! It follows the WHATWG event-stream rules: lines end in `\n`, `\r\n` or
//! `\r` (even when the `\r` and the `\n` arrive in different pieces); a
//! blank line dispatches the event; `data` lines are joined with `\n`; a
//! leading space after the colon is dropped; lines starting with `:` are
//! comments; `id` and `retry` are ignored (a model call is never resumed
//! mid-stream). An event longer than its cap is an error, so a server
//! cannot make the host buffer without bound.

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event` field; `message` when the event set none.
    pub event: String,
    /// The `data` lines, joined with `\n`.
    pub data: String,
}

/// Why the stream cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SseError {
    /// A line is not UTF-8.
    #[error("line {line} of the event stream is not UTF-8")]
    NotUtf8 {
        /// The line, counting from 1.
        line: u64,
    },
    /// An event grew past the cap.
    #[error("an event of the stream is longer than {max} bytes (at line {line})")]
    TooLong {
        /// The cap.
        max: usize,
        /// The line, counting from 1.
        line: u64,
    },
}

/// The parser. Feed it with [`push`](SseParser::push).
#[derive(Debug)]
pub(crate) struct SseParser {
    max_event_bytes: usize,
    /// The current line's bytes so far.
    line: Vec<u8>,
    /// The last piece ended in `\r`: a `\n` starting the next piece belongs
    /// to that line end.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
    lines: u64,
}

impl SseParser {
    /// A parser refusing events longer than `max_event_bytes`.
    pub(crate) fn new(max_event_bytes: usize) -> Self {
        SseParser {
            max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            event: String::new(),
            data: String::new(),
            has_data: false,
            lines: 0,
        }
    }

    /// Takes the next piece of the body; returns the events it completed.
    #[cfg(test)]
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        self.push_into(bytes, &mut events)?;
        Ok(events)
    }

    /// Takes the next piece of the body and appends the events it completed
    /// to `events`; on an error, the events completed before it are there,
    /// so a caller can tell whether the response was already whole.
    pub(crate) fn push_into(
        &mut self,
        mut bytes: &[u8],
        events: &mut Vec<SseEvent>,
    ) -> Result<(), SseError> {
        if bytes.is_empty() {
            return Ok(());
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&bytes[..end]);
            self.check_size()?;
            if bytes[end] == b'\r' {
                match bytes.get(end + 1) {
                    Some(b'\n') => bytes = &bytes[end + 2..],
                    Some(_) => bytes = &bytes[end + 1..],
                    None => {
                        self.after_cr = true;
                        bytes = &[];
                    }
                }
            } else {
                bytes = &bytes[end + 1..];
            }
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_done(&line)? {
                events.push(event);
            }
        }
        self.line.extend_from_slice(bytes);
        self.check_size()?;
        Ok(())
    }

    fn check_size(&self) -> Result<(), SseError> {
        if self.line.len() + self.data.len() > self.max_event_bytes {
            return Err(SseError::TooLong {
                max: self.max_event_bytes,
                line: self.lines + 1,
            });
        }
        Ok(())
    }

    fn line_done(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        self.lines += 1;
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let data = std::mem::take(&mut self.data);
            if !std::mem::take(&mut self.has_data) {
                return Ok(None);
            }
            return Ok(Some(SseEvent {
                event: if event.is_empty() {
                    "message".into()
                } else {
                    event
                },
                data,
            }));
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8 { line: self.lines })?;
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in(pieces: &[&[u8]]) -> Result<Vec<SseEvent>, SseError> {
        let mut p = SseParser::new(1 << 20);
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece)?);
        }
        Ok(events)
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn every_split_of_a_stream_gives_the_same_events() {
        let stream = "event: message_start\r\ndata: {\"a\":\"h\u{e9}llo \u{1f600}\"}\r\n\r\n: ping\n\ndata: one\ndata:two\n\rdata: x\r\rid: 7\nretry: 10\ndata\n\n";
        let expected = vec![
            ev("message_start", "{\"a\":\"h\u{e9}llo \u{1f600}\"}"),
            ev("message", "one\ntwo"),
            ev("message", "x"),
            ev("message", ""),
        ];
        let bytes = stream.as_bytes();
        assert_eq!(parse_in(&[bytes]).unwrap(), expected);
        // Every split into two pieces, and into three.
        for i in 0..=bytes.len() {
            assert_eq!(
                parse_in(&[&bytes[..i], &bytes[i..]]).unwrap(),
                expected,
                "split at {i}"
            );
            for j in i..=bytes.len() {
                assert_eq!(
                    parse_in(&[&bytes[..i], &bytes[i..j], &bytes[j..]]).unwrap(),
                    expected,
                    "split at {i} and {j}"
                );
            }
        }
        // One byte at a time.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_in(&singles).unwrap(), expected);
    }

    #[test]
    fn an_event_is_dispatched_only_at_its_blank_line() {
        let mut p = SseParser::new(1024);
        assert_eq!(p.push(b"data: {\"par").unwrap(), vec![]);
        assert_eq!(p.push(b"tial\"}\n").unwrap(), vec![]);
        assert_eq!(p.push(b"\n").unwrap(), vec![ev("message", "{\"partial\"}")]);
    }

    #[test]
    fn oversized_events_and_invalid_utf8_are_errors_naming_the_line() {
        let mut p = SseParser::new(16);
        assert_eq!(
            p.push(b"data: 0123456789abcdef\n").unwrap_err(),
            SseError::TooLong { max: 16, line: 1 }
        );
        let mut p = SseParser::new(16);
        p.push(b"data: 01234567\n").unwrap();
        assert!(matches!(
            p.push(b"data: 89abcdef\n").unwrap_err(),
            SseError::TooLong { line: 2, .. }
        ));
        let mut p = SseParser::new(1024);
        assert_eq!(
            p.push(b": ok\ndata: \xff\xfe\n\n").unwrap_err(),
            SseError::NotUtf8 { line: 2 }
        );
    }
}
