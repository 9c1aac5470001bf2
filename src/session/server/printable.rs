//! What a client reports about itself (its label, its host) made safe to
//! print: control characters (a newline that would forge a log line, an
//! escape sequence a terminal would obey) are written out as escapes.

/// `text` with every control character escaped (`\n`, `\u{1b}`).
pub(crate) fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped_the_rest_kept() {
        assert_eq!(printable("gpu0 ünïcode"), "gpu0 ünïcode");
        assert_eq!(
            printable("a\nWARN forged\u{1b}[2J\u{7}"),
            "a\\nWARN forged\\u{1b}[2J\\u{7}"
        );
        assert!(!printable("\r\n\t\u{0}\u{9b}").chars().any(char::is_control));
    }
}
