//! The deb822 control-file syntax shared by Release, Packages, `.sources` and DEP-5 copyright
//! files: paragraphs separated by blank lines, `Field: value` lines, continuation lines that
//! start with whitespace, and `#` comment lines. Pure and borrowing; it knows no field meanings.
//! Spec: <https://manpages.debian.org/trixie/dpkg-dev/deb822.5.en.html>.

use std::borrow::Cow;

/// One paragraph (stanza): fields in file order, values trimmed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Paragraph<'a> {
    fields: Vec<(&'a str, Cow<'a, str>)>,
}

impl<'a> Paragraph<'a> {
    /// The value of `name` (field names are case-insensitive). A multi-line value has its lines
    /// joined with `\n`; its first line is empty when the field starts on the next line.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_ref())
    }

    /// Whether the paragraph has no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    fn push_line(&mut self, line: &'a str) {
        if line.starts_with([' ', '\t']) {
            // A continuation line extends the previous field; a stray one before any field is
            // malformed input and carries nothing we need, so it is dropped.
            if let Some((_, value)) = self.fields.last_mut() {
                let value = value.to_mut();
                value.push('\n');
                value.push_str(line.trim());
            }
        } else if let Some((key, value)) = line.split_once(':') {
            self.fields.push((key.trim(), Cow::Borrowed(value.trim())));
        }
    }
}

/// Splits `text` into its non-empty paragraphs.
pub fn paragraphs(text: &str) -> impl Iterator<Item = Paragraph<'_>> {
    let mut lines = text.lines().peekable();
    std::iter::from_fn(move || {
        // Skip the blank lines (and comments) between paragraphs.
        while lines
            .peek()
            .is_some_and(|line| line.trim().is_empty() || line.starts_with('#'))
        {
            lines.next();
        }
        let mut paragraph = Paragraph::default();
        for line in lines.by_ref() {
            if line.trim().is_empty() {
                break;
            }
            if !line.starts_with('#') {
                paragraph.push_line(line);
            }
        }
        (!paragraph.is_empty()).then_some(paragraph)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_lines_extend_the_previous_field_and_comments_are_skipped() {
        let text = "Package: a\nDescription: short\n long one\n .\n# comment\nSize: 3\n\n\n\
                    SHA256:\n 0a 1 x\n 0b 2 y\n";
        let all: Vec<_> = paragraphs(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].get("package"), Some("a"));
        assert_eq!(all[0].get("Description"), Some("short\nlong one\n."));
        assert_eq!(all[0].get("Size"), Some("3"));
        assert_eq!(all[1].get("SHA256"), Some("\n0a 1 x\n0b 2 y"));
        assert_eq!(all[1].get("Missing"), None);
    }

    #[test]
    fn crlf_and_trailing_blank_lines_are_tolerated() {
        let all: Vec<_> = paragraphs("A: 1\r\nB: 2\r\n\r\n \r\n").collect();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].get("a"), Some("1"));
        assert_eq!(all[0].get("b"), Some("2"));
    }
}
