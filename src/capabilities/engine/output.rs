//! The engine's output as it streams in: lines read from its pipes (each at most
//! [`LINE_MAX_BYTES`]), and the raw log kept (head and tail only) until the run's secrets are
//! known and it can be rendered redacted. Whatever the engine prints, planbot holds at most
//! [`LOG_HEAD_BYTES`] + [`LOG_TAIL_BYTES`] of it, plus a line in flight, and the log says
//! what it left out.

use crate::capabilities::checkout_file::size_text;
use crate::core::redact::Scrubber;
use std::collections::VecDeque;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// At most this much of a run's output is kept in a log (head and tail; the middle is cut).
pub(super) const LOG_HEAD_BYTES: usize = 512 * 1024;
pub(super) const LOG_TAIL_BYTES: usize = 512 * 1024;

/// A line longer than this is cut (a value of megabytes printed on one line).
pub const LINE_MAX_BYTES: usize = 64 * 1024;

/// How many lines may wait between the pipes and the supervisor before the engine's writes
/// block (so a flood of output cannot pile up in planbot's memory).
pub(super) const LINES_IN_FLIGHT: usize = 256;

/// One output line of the engine, unredacted, without its line ending.
pub(super) struct Line(pub(super) String);

/// Send every line of `r` to `tx` until the pipe closes (or nobody listens any more); a line
/// longer than [`LINE_MAX_BYTES`] keeps its start and says how much was cut.
pub(super) async fn read_lines<R: AsyncRead + Unpin>(r: R, tx: mpsc::Sender<Line>) {
    let mut reader = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let (cut, ended) = match read_line_capped(&mut reader, &mut buf).await {
            Ok(r) => r,
            Err(_) => break,
        };
        if buf.is_empty() && cut == 0 && ended {
            break;
        }
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        let mut line = String::from_utf8_lossy(&buf).into_owned();
        if cut > 0 {
            line.push_str(&format!(
                " (… {} more of this line left out: planbot keeps the first {} of a line)",
                size_text(cut as u64),
                size_text(LINE_MAX_BYTES as u64)
            ));
        }
        if tx.send(Line(line)).await.is_err() || ended {
            break;
        }
    }
}

/// One line into `buf` (its end included), at most [`LINE_MAX_BYTES`] of it; the rest of the
/// line is read and dropped. Returns how many bytes were dropped, and whether the pipe ended.
async fn read_line_capped<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    buf: &mut Vec<u8>,
) -> std::io::Result<(usize, bool)> {
    let mut cut = 0usize;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok((cut, true));
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = LINE_MAX_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        cut += take.saturating_sub(room);
        reader.consume(take);
        if done {
            return Ok((cut, false));
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
    cut_bytes: usize,
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
                self.cut_bytes += l.len() + 1;
            }
        }
    }

    /// The line that stands for what was cut.
    fn cut_line(&self) -> String {
        format!(
            "(… {} lines ({}) left out: planbot keeps the first {} and the last {} of a run's output …)",
            self.cut_lines,
            size_text(self.cut_bytes as u64),
            size_text(LOG_HEAD_BYTES as u64),
            size_text(LOG_TAIL_BYTES as u64)
        )
    }

    pub(super) fn append_ref(&mut self, other: &RawLog) {
        for l in &other.head {
            self.push(l.clone());
        }
        if other.cut_lines > 0 {
            self.push(other.cut_line());
        }
        for l in &other.tail {
            self.push(l.clone());
        }
    }

    pub(super) fn append(&mut self, other: RawLog) {
        let cut = (other.cut_lines > 0).then(|| other.cut_line());
        for l in other.head {
            self.push(l);
        }
        if let Some(cut) = cut {
            self.push(cut);
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
            out.push_str(&self.cut_line());
            out.push('\n');
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
        assert!(text.contains("lines (") && text.contains("left out: planbot keeps the first 512 KiB and the last 512 KiB of a run's output"), "{}", &text[LOG_HEAD_BYTES - 50..LOG_HEAD_BYTES + 200]);
        assert!(text.len() < LOG_HEAD_BYTES + LOG_TAIL_BYTES + 200);
    }

    #[tokio::test]
    async fn a_line_of_megabytes_keeps_its_start_and_says_what_was_cut() {
        let mut text = vec![b'x'; 3 * 1024 * 1024];
        text.extend_from_slice(b"\nnext\nlast without end");
        let (tx, mut rx) = mpsc::channel(LINES_IN_FLIGHT);
        let reader = tokio::spawn(read_lines(std::io::Cursor::new(text), tx));
        let mut lines = Vec::new();
        while let Some(Line(l)) = rx.recv().await {
            lines.push(l);
        }
        reader.await.unwrap();
        assert_eq!(
            lines.len(),
            3,
            "{:?}",
            lines.iter().map(|l| l.len()).collect::<Vec<_>>()
        );
        assert!(lines[0].starts_with(&"x".repeat(LINE_MAX_BYTES)));
        assert!(
            lines[0].ends_with(
                " (… 2.9 MiB more of this line left out: planbot keeps the first 64 KiB of a line)"
            ),
            "{}",
            &lines[0][LINE_MAX_BYTES..]
        );
        assert_eq!(lines[1], "next");
        assert_eq!(lines[2], "last without end");
    }
}
