//! TOML parse errors on one line: `line 3, column 1: unknown field
//! `surprise`, expected one of …`. The toml crate's own rendering draws the
//! offending source over several lines, which does not fit the rule that a
//! bad input is one clear line naming the file and the key.

/// `error` (from parsing `text`) as one line with its position.
pub fn one_line(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().replace('\n', " ");
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_become_one_line_with_their_position() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct S {
            name: String,
        }
        let text = "name = \"x\"\nsurprise = 1\n";
        let err = toml::from_str::<S>(text).unwrap_err();
        let line = one_line(text, &err);
        assert!(
            line.starts_with("line 2, column 1: unknown field `surprise`"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        let text = "name = ";
        let err = toml::from_str::<S>(text).unwrap_err();
        assert!(
            one_line(text, &err).starts_with("line 1, column 8"),
            "{}",
            one_line(text, &err)
        );
    }
}
