//! The write pipeline's bookkeeping (PeakFS III-D): a write returns once sent; each
//! open file counts its unfinished writes, bounded; `flush` and `fsync` wait for the
//! count to reach zero and report the first error any of those writes met.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use pfs_core::{FsError, FsResult};

#[derive(Debug, Default)]
struct State {
    unfinished: u32,
    first_error: Option<FsError>,
}

/// Unfinished writes of one open file.
#[derive(Debug)]
pub struct WriteWindow {
    state: Mutex<State>,
    changed: Condvar,
    max_unfinished: u32,
}

impl WriteWindow {
    /// A window allowing `max_unfinished` writes in flight (at least 1).
    pub fn new(max_unfinished: u32) -> WriteWindow {
        assert!(max_unfinished > 0, "a write window needs room for one write");
        WriteWindow { state: Mutex::new(State::default()), changed: Condvar::new(), max_unfinished }
    }

    /// Takes a slot for one write, waiting up to `timeout` while the window is full
    /// (back-pressure). Fails with the first error of an earlier write, so a writer
    /// learns of a failure at its next write at the latest.
    pub fn begin(&self, timeout: Duration) -> FsResult<()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().expect("write window lock");
        loop {
            if let Some(e) = st.first_error.clone() {
                return Err(e);
            }
            if st.unfinished < self.max_unfinished {
                st.unfinished += 1;
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FsError::TimedOut);
            }
            st = self.changed.wait_timeout(st, left).expect("write window lock").0;
        }
    }

    /// Ends one write begun with `begin`, with its outcome.
    pub fn end(&self, result: FsResult<()>) {
        let mut st = self.state.lock().expect("write window lock");
        assert!(st.unfinished > 0, "write ended that never began");
        st.unfinished -= 1;
        if let Err(e) = result {
            st.first_error.get_or_insert(e);
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Writes in flight now.
    pub fn unfinished(&self) -> u32 {
        self.state.lock().expect("write window lock").unfinished
    }

    /// Waits until no write is in flight; returns (and clears) the first error one
    /// of them met. `TimedOut` if they do not finish within `timeout`.
    pub fn wait_idle(&self, timeout: Duration) -> FsResult<()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().expect("write window lock");
        while st.unfinished > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FsError::TimedOut);
            }
            st = self.changed.wait_timeout(st, left).expect("write window lock").0;
        }
        match st.first_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const LONG: Duration = Duration::from_secs(5);

    #[test]
    fn full_window_blocks_until_a_write_ends() {
        let w = Arc::new(WriteWindow::new(2));
        w.begin(LONG).unwrap();
        w.begin(LONG).unwrap();
        assert_eq!(w.begin(Duration::from_millis(20)), Err(FsError::TimedOut));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            w2.end(Ok(()));
        });
        w.begin(LONG).unwrap();
        t.join().unwrap();
        assert_eq!(w.unfinished(), 2);
    }

    #[test]
    fn flush_waits_for_zero_and_reports_the_first_error() {
        let w = Arc::new(WriteWindow::new(8));
        for _ in 0..3 {
            w.begin(LONG).unwrap();
        }
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            w2.end(Ok(()));
            w2.end(Err(FsError::NoSpace));
            std::thread::sleep(Duration::from_millis(20));
            w2.end(Err(FsError::Io("later".into())));
        });
        assert_eq!(w.wait_idle(LONG), Err(FsError::NoSpace));
        t.join().unwrap();
        assert_eq!(w.unfinished(), 0);
        assert_eq!(w.wait_idle(LONG), Ok(()), "the error is reported once");
    }

    #[test]
    fn a_failed_write_fails_the_next_one() {
        let w = WriteWindow::new(4);
        w.begin(LONG).unwrap();
        w.end(Err(FsError::Io("server gone".into())));
        assert!(matches!(w.begin(LONG), Err(FsError::Io(_))));
    }

    #[test]
    fn flush_gives_up_after_its_timeout() {
        let w = WriteWindow::new(4);
        w.begin(LONG).unwrap();
        assert_eq!(w.wait_idle(Duration::from_millis(20)), Err(FsError::TimedOut));
    }
}
