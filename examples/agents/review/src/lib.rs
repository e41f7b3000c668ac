//! A tiny crate for the code-review demo agent to look at.

use std::collections::HashMap;

/// Counts how often each word occurs in `text`.
pub fn word_counts(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split(' ') {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
    }
    counts
}

/// Reads the configured limit.
pub fn limit(config: &HashMap<String, String>) -> usize {
    config.get("limit").unwrap().parse().unwrap()
}
