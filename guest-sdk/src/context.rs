//! Context sources: the [`ContextPlugin`] trait the export macro binds to the
//! WIT `context-source` interface, typed query parsing, and constructors for
//! [`ContextItem`] and [`ContextError`].

use serde::de::DeserializeOwned;

use crate::json;
use crate::types::{ContextError, ContextItem, ContextRequest, Failure, SourceSpec};

/// A plugin that turns a request into context items. Export it with
/// [`export_context_plugin!`](crate::export_context_plugin).
///
/// Both functions are plain Rust: unit-test them by calling them.
pub trait ContextPlugin {
    /// The source's name and description.
    fn describe() -> SourceSpec;

    /// The items for `request`. Use [`ContextRequest::query_as`] when the
    /// query is JSON.
    fn resolve(request: ContextRequest) -> Result<Vec<ContextItem>, ContextError>;
}

impl ContextRequest {
    /// Parses the query as JSON into a `T`. A blank query counts as `{}`.
    ///
    /// # Errors
    /// [`ContextError::InvalidRequest`] with serde's reason, naming the field.
    pub fn query_as<T: DeserializeOwned>(&self) -> Result<T, ContextError> {
        json::parse(&self.query)
            .map_err(|reason| ContextError::invalid_request(format!("invalid query: {reason}")))
    }
}

impl ContextItem {
    /// An item holding all of `content`, from `source`, with no modification
    /// time.
    pub fn new(source: impl Into<String>, content: impl Into<String>) -> Self {
        let content = content.into();
        ContextItem {
            source: source.into(),
            size: content.len() as u64,
            content,
            modified_ms: None,
            truncated: false,
        }
    }

    /// Sets the last modification time, in milliseconds since the Unix epoch.
    pub fn modified_ms(mut self, modified_ms: u64) -> Self {
        self.modified_ms = Some(modified_ms);
        self
    }

    /// Cuts `content` to at most `max_bytes` (at a character boundary) and
    /// marks the item truncated if anything was cut. `size` keeps the
    /// original size.
    pub fn truncate_to(mut self, max_bytes: usize) -> Self {
        if self.content.len() > max_bytes {
            let mut end = max_bytes;
            while !self.content.is_char_boundary(end) {
                end -= 1;
            }
            self.content.truncate(end);
            self.truncated = true;
        }
        self
    }
}

impl ContextError {
    /// The request does not fit what the source understands.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        ContextError::InvalidRequest(message.into())
    }

    /// The source refused.
    pub fn denied(message: impl Into<String>) -> Self {
        ContextError::Denied(message.into())
    }

    /// The source tried and failed; trying again will not help.
    pub fn failed(message: impl Into<String>) -> Self {
        ContextError::Failed(Failure::new(message, false))
    }

    /// The source tried and failed; trying again later may succeed.
    pub fn retryable(message: impl Into<String>) -> Self {
        ContextError::Failed(Failure::new(message, true))
    }

    /// The error's message, whatever its variant.
    pub fn message(&self) -> &str {
        match self {
            ContextError::InvalidRequest(message) | ContextError::Denied(message) => message,
            ContextError::Failed(failure) => &failure.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::request;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Query {
        topic: String,
        #[serde(default)]
        limit: Option<u32>,
    }

    #[test]
    fn query_as_parses_json_queries() {
        let query: Query = request(r#"{"topic":"rust","limit":2}"#).query_as().unwrap();
        assert_eq!(
            query,
            Query {
                topic: "rust".into(),
                limit: Some(2)
            }
        );
    }

    #[test]
    fn query_as_errors_name_the_field() {
        let err = request(r#"{"topic":"rust","limit":-1}"#)
            .query_as::<Query>()
            .unwrap_err();
        assert!(
            err.message()
                .starts_with("invalid query: field `limit`: invalid value: integer `-1`"),
            "{err:?}"
        );
        assert!(matches!(err, ContextError::InvalidRequest(_)));
        let err = request("rust please").query_as::<Query>().unwrap_err();
        assert!(
            err.message()
                .starts_with("invalid query: expected value at line 1 column 1"),
            "{err:?}"
        );
    }

    #[test]
    fn truncate_to_cuts_at_a_char_boundary_and_keeps_the_size() {
        let item = ContextItem::new("notes.md", "héllo").truncate_to(2);
        assert_eq!(item.content, "h");
        assert_eq!(item.size, 6);
        assert!(item.truncated);
        let item = ContextItem::new("a", "abc").truncate_to(3).modified_ms(5);
        assert!(!item.truncated);
        assert_eq!((item.content.as_str(), item.modified_ms), ("abc", Some(5)));
    }

    #[test]
    fn error_constructors_pick_the_variant() {
        assert_eq!(
            ContextError::denied("no"),
            ContextError::Denied("no".into())
        );
        assert_eq!(
            ContextError::retryable("later"),
            ContextError::Failed(Failure::new("later", true))
        );
        assert_eq!(ContextError::failed("x").message(), "x");
    }
}
