//! Text cut to fit a bounded field: at most so many bytes, never inside a
//! character. Labels, hosts, refusal messages and records are all cut so.

/// The longest prefix of `text` of at most `max` bytes that ends at a
/// character boundary.
pub(crate) fn prefix_within(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::prefix_within;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(prefix_within("abc", 10), "abc");
        assert_eq!(prefix_within("abc", 2), "ab");
        assert_eq!(prefix_within("aé", 2), "a");
        assert_eq!(prefix_within("é", 0), "");
    }
}
