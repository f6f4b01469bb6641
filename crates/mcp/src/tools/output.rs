//! Bounded text for tool results: `e2b_exec` output capped per stream with a visible
//! marker, and `e2b_read_file`'s line window.

use crate::config::OutputLimits;

/// Accumulates one output stream, keeping at most `max_lines` lines and `max_bytes` bytes
/// from the start while still counting every line that went by.
#[derive(Debug)]
pub struct CappedText {
    limits: OutputLimits,
    kept: Vec<u8>,
    kept_lines: usize,
    total_newlines: usize,
    total_bytes: usize,
    ends_with_newline: bool,
    truncated: bool,
}

impl CappedText {
    pub fn new(limits: OutputLimits) -> Self {
        Self {
            limits,
            kept: Vec::new(),
            kept_lines: 0,
            total_newlines: 0,
            total_bytes: 0,
            ends_with_newline: true,
            truncated: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        self.total_bytes += chunk.len();
        self.total_newlines += chunk.iter().filter(|&&byte| byte == b'\n').count();
        self.ends_with_newline = chunk.last() == Some(&b'\n');
        if self.truncated {
            return;
        }
        for &byte in chunk {
            if self.kept.len() >= self.limits.max_bytes || self.kept_lines >= self.limits.max_lines
            {
                self.truncated = true;
                return;
            }
            self.kept.push(byte);
            if byte == b'\n' {
                self.kept_lines += 1;
            }
        }
    }

    /// Lines seen in total; a final line without a newline counts.
    pub fn total_lines(&self) -> usize {
        if self.total_bytes == 0 {
            0
        } else {
            self.total_newlines + usize::from(!self.ends_with_newline)
        }
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept text (lossy UTF-8), followed by a marker line when something was cut.
    pub fn finish(self) -> String {
        let total_lines = self.total_lines();
        let total_bytes = self.total_bytes;
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.truncated {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[... output truncated: showed the first {} bytes of {total_bytes}, {} of {total_lines} lines ...]\n",
                self.kept.len(),
                self.kept_lines
            ));
        }
        text
    }
}

/// `offset` lines skipped (0-based), then at most `limit` lines; line endings are kept.
pub fn line_window(text: &str, offset: usize, limit: Option<usize>) -> String {
    let lines = text.split_inclusive('\n').skip(offset);
    match limit {
        Some(limit) => lines.take(limit).collect(),
        None => lines.collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_lines: usize, max_bytes: usize) -> OutputLimits {
        OutputLimits {
            max_lines,
            max_bytes,
        }
    }

    #[test]
    fn short_output_is_untouched() {
        let mut text = CappedText::new(limits(10, 100));
        text.push(b"a\nb");
        text.push(b"\nc");
        assert_eq!(text.total_lines(), 3);
        assert!(!text.truncated());
        assert_eq!(text.finish(), "a\nb\nc");
    }

    #[test]
    fn line_cap_keeps_head_counts_all_and_marks() {
        let mut text = CappedText::new(limits(2, 1000));
        for line in 0..5 {
            text.push(format!("line{line}\n").as_bytes());
        }
        assert_eq!(text.total_lines(), 5);
        assert!(text.truncated());
        let finished = text.finish();
        assert!(finished.starts_with("line0\nline1\n["));
        assert!(finished.contains("2 of 5 lines"));
        assert!(!finished.contains("line2"));
    }

    #[test]
    fn byte_cap_applies_inside_a_line() {
        let mut text = CappedText::new(limits(100, 4));
        text.push(b"abcdefgh");
        assert!(text.truncated());
        assert_eq!(text.total_lines(), 1);
        let finished = text.finish();
        assert!(finished.starts_with("abcd\n[... output truncated: showed the first 4 bytes of 8"));
    }

    #[test]
    fn empty_output_has_no_lines() {
        let text = CappedText::new(limits(1, 1));
        assert_eq!(text.total_lines(), 0);
        assert_eq!(text.finish(), "");
    }

    #[test]
    fn line_window_offsets_and_limits() {
        let text = "l0\nl1\nl2\nl3";
        assert_eq!(line_window(text, 0, None), text);
        assert_eq!(line_window(text, 1, Some(2)), "l1\nl2\n");
        assert_eq!(line_window(text, 3, Some(5)), "l3");
        assert_eq!(line_window(text, 4, None), "");
        assert_eq!(line_window(text, 0, Some(0)), "");
    }
}
