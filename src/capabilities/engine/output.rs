//! The engine's output as it streams in: lines read from its pipes, and the raw log kept (head
//! and tail only) until the run's secrets are known and it can be rendered redacted.

use crate::core::redact::Scrubber;
use std::collections::VecDeque;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// At most this much of a step's output is kept in a log (head and tail; the middle is cut).
pub(super) const LOG_HEAD_BYTES: usize = 512 * 1024;
pub(super) const LOG_TAIL_BYTES: usize = 512 * 1024;

/// One output line of the engine, unredacted, without its line ending.
pub(super) struct Line(pub(super) String);

/// Send every line of `r` to `tx` until the pipe closes (or nobody listens any more).
pub(super) async fn read_lines<R: AsyncRead + Unpin>(r: R, tx: mpsc::UnboundedSender<Line>) {
    let mut reader = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                if tx
                    .send(Line(String::from_utf8_lossy(&buf).into_owned()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
}

/// Unredacted output lines kept in memory until the secrets are known; head and tail only.
#[derive(Debug, Default)]
pub(super) struct RawLog {
    head: Vec<String>,
    head_bytes: usize,
    tail: VecDeque<String>,
    tail_bytes: usize,
    cut_lines: usize,
}

impl RawLog {
    pub(super) fn push(&mut self, line: String) {
        if self.tail.is_empty() && self.head_bytes + line.len() <= LOG_HEAD_BYTES {
            self.head_bytes += line.len() + 1;
            self.head.push(line);
            return;
        }
        self.tail_bytes += line.len() + 1;
        self.tail.push_back(line);
        while self.tail_bytes > LOG_TAIL_BYTES && self.tail.len() > 1 {
            if let Some(l) = self.tail.pop_front() {
                self.tail_bytes -= l.len() + 1;
                self.cut_lines += 1;
            }
        }
    }

    pub(super) fn append_ref(&mut self, other: &RawLog) {
        for l in &other.head {
            self.push(l.clone());
        }
        if other.cut_lines > 0 {
            self.push(format!("(… {} lines left out …)", other.cut_lines));
        }
        for l in &other.tail {
            self.push(l.clone());
        }
    }

    pub(super) fn append(&mut self, other: RawLog) {
        for l in other.head {
            self.push(l);
        }
        if other.cut_lines > 0 {
            self.push(format!("(… {} lines left out …)", other.cut_lines));
        }
        for l in other.tail {
            self.push(l);
        }
    }

    pub(super) fn render(&self, scrubber: &Scrubber) -> String {
        let mut out = String::new();
        for l in &self.head {
            out.push_str(l);
            out.push('\n');
        }
        if self.cut_lines > 0 {
            out.push_str(&format!("(… {} lines left out …)\n", self.cut_lines));
        }
        for l in &self.tail {
            out.push_str(l);
            out.push('\n');
        }
        scrubber.scrub(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_logs_keep_head_and_tail() {
        let mut log = RawLog::default();
        for i in 0..200_000 {
            log.push(format!("line {i:08}"));
        }
        let text = log.render(&Scrubber::none());
        assert!(text.starts_with("line 00000000\n"));
        assert!(text.ends_with("line 00199999\n"));
        assert!(text.contains("lines left out"));
        assert!(text.len() < LOG_HEAD_BYTES + LOG_TAIL_BYTES + 100);
    }
}
