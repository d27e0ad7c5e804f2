//! Group commit as steps the worker drives between requests, so the device's
//! flushes overlap with serving instead of stopping it.
//!
//! A commit makes durable every operation that finished before it started:
//!
//! 1. **Data writes.** The staged data runs are submitted; the commit waits for
//!    every data request submitted before it started (`dataio.rs` numbers
//!    them). Reads and read-aheads count too: the pages this commit frees may
//!    be reused once it is done, and a read of them still in flight then could
//!    put their old bytes in the read cache over another file's.
//! 2. **Data sync**, if data was written since the last one: a sync covers only
//!    writes that completed before it, so it follows step 1.
//! 3. **Log write** of the records appended before the commit started.
//! 4. **Log sync.** Then the records are durable: the Icache may write back
//!    what they changed, follow-ups logged with them may be sent, and pages they
//!    freed may be reused.
//!
//! Each step is one asynchronous device request ([`DevIo::submit_commit`]);
//! [`Shard::poll_commit`] moves to the next when it finished. Operations run
//! meanwhile: their records go after the ones being written and wait for the
//! next commit, which starts only after this one finished (it rewrites the
//! log's partial last sector). A failed step fails the shard, as a failed
//! synchronous commit did: a failed sync may have dropped writes the device
//! will never report again.
//!
//! Commits are numbered from 1. A reply that must wait for durability waits
//! for commit [`Shard::next_commit`] as numbered when its operation finished;
//! [`Shard::commits_done`] says how far they got.

use super::{follow::FollowUp, Run, Shard};
use crate::device::{AlignedBuf, Device, IoKind, IoRequest};
use crate::wal::{CommitEnd, Wal};
use pfs_core::{FsError, FsResult};

/// A group commit under way.
#[derive(Debug)]
pub(super) struct Committing {
    /// Its number.
    number: u64,
    step: Step,
    /// Data requests numbered below this were submitted before it started.
    requests_before: u64,
    /// Data was written since the last sync.
    sync_data: bool,
    /// The log records it writes; `None`: none were pending.
    log_end: Option<CommitEnd>,
    /// Follow-ups and freed pages of the operations it covers: sent and
    /// reusable once it is durable.
    pub(super) follow: Vec<FollowUp>,
    frees: Vec<Run>,
    /// The log it writes when it is not the shard's: the last commit of a
    /// generation a checkpoint's snapshot ended (`checkpoint.rs`).
    retired: Option<Wal>,
}

/// The request a commit waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    DataWrites,
    DataSync,
    LogWrite,
    LogSync,
}

fn sync_req() -> IoRequest {
    IoRequest { tag: 0, kind: IoKind::Sync, offset: 0, buf: AlignedBuf::zeroed(0) }
}

impl<D: Device> Shard<D> {
    /// Makes every finished operation durable, waiting for it: finishes the
    /// commit under way, then commits what came after it.
    pub fn commit(&mut self) -> FsResult<()> {
        self.check_failed()?;
        self.wait_commit()?;
        self.start_commit()?;
        self.wait_commit()
    }

    /// Starts a group commit of every operation finished so far, unless one is
    /// under way (then `Ok` and nothing happens: the caller waits for
    /// `commits_done` to reach the number it needs and starts the next one
    /// after). A commit with nothing to write finishes at once.
    pub fn start_commit(&mut self) -> FsResult<()> {
        self.check_failed()?;
        if self.committing.is_some() {
            return Ok(());
        }
        if self.wants_snapshot() {
            // A checkpoint waits for a moment without a commit: its snapshot
            // starts this one.
            self.step_checkpoint(false);
            return self.check_failed();
        }
        self.start_commit_of(None)
    }

    /// Starts a group commit, none being under way, of the operations
    /// finished so far; their records are in `retired` when given (the log a
    /// checkpoint's snapshot just replaced), else in the shard's log.
    pub(super) fn start_commit_of(&mut self, retired: Option<Wal>) -> FsResult<()> {
        assert!(self.committing.is_none(), "one commit at a time");
        if pfs_core::failpoint::fire("shard.commit") {
            let e = FsError::Io("device sync failed (failpoint shard.commit)".into());
            self.fail(format!("commit failed, the shard must be recovered from its log: {e}"));
            return Err(e);
        }
        self.commits_started += 1;
        let requests_before = self.submit_data_writes();
        let log_end = retired.as_ref().unwrap_or(&self.wal).pending_end();
        self.committing = Some(Committing {
            number: self.commits_started,
            step: Step::DataWrites,
            requests_before,
            sync_data: std::mem::take(&mut self.data_unsynced),
            log_end,
            follow: std::mem::take(&mut self.follow_pending),
            frees: std::mem::take(&mut self.pending_free),
            retired,
        });
        self.poll_commit();
        self.check_failed()
    }

    /// Moves the commit under way as far as finished requests allow, without
    /// waiting. A failed step fails the shard (see `failure`).
    pub fn poll_commit(&mut self) {
        while let Some(c) = &self.committing {
            if self.failed.is_some() {
                // A data write failed meanwhile: nothing more is made durable.
                self.committing = None;
                return;
            }
            let step = c.step;
            let done = match step {
                Step::DataWrites => {
                    let before = c.requests_before;
                    !self.data_requests_before(before)
                }
                _ => match self.io.take_commit() {
                    None => false,
                    Some(done) => match done.result {
                        Ok(()) => true,
                        Err(e) => {
                            self.committing = None;
                            self.fail(format!(
                                "commit failed ({step:?}), the shard must be recovered \
                                 from its log: {e}"
                            ));
                            return;
                        }
                    },
                },
            };
            if !done {
                return;
            }
            self.next_step();
        }
    }

    /// Submits the request of the step after the one that finished, or
    /// finishes the commit.
    fn next_step(&mut self) {
        let c = self.committing.as_mut().expect("a commit under way");
        let next = match c.step {
            Step::DataWrites if c.sync_data => Some((Step::DataSync, sync_req())),
            Step::DataWrites | Step::DataSync => match c.log_end {
                // The records as they were when the commit started.
                Some(end) => {
                    let wal = c.retired.as_ref().unwrap_or(&self.wal);
                    Some((Step::LogWrite, wal.commit_write(end)))
                }
                None => None,
            },
            Step::LogWrite => Some((Step::LogSync, sync_req())),
            Step::LogSync => None,
        };
        match next {
            Some((step, req)) => {
                c.step = step;
                self.io.submit_commit(req);
            }
            None => self.finish_commit(),
        }
    }

    /// The commit's requests all finished: its operations are durable.
    fn finish_commit(&mut self) {
        let mut c = self.committing.take().expect("a commit under way");
        if let Some(end) = c.log_end {
            let lsn = c.retired.as_mut().unwrap_or(&mut self.wal).committed(end);
            self.icache.set_durable_lsn(lsn);
            self.stats.commits += 1;
        }
        let mut follow = c.follow;
        self.follow_ready.append(&mut follow);
        for run in c.frees {
            self.page_bitmap.clear_run(run.page, run.pages as u64);
        }
        self.commits_done = c.number;
        if let Err(e) = self.icache.write_back_over_cap(&mut self.io) {
            self.fail(format!("writing back inodes after a commit: {e}"));
        }
    }

    /// Waits for the commit under way, if any; fails if it failed.
    pub(super) fn wait_commit(&mut self) -> FsResult<()> {
        loop {
            self.poll_commit();
            if self.committing.is_none() {
                return self.check_failed();
            }
            if !self.io.wait_any() {
                // Every step waits for a request it submitted: none in flight
                // with the commit unfinished is a bug, not a wait.
                self.committing = None;
                self.fail("a commit waited for a request not in flight".into());
                return self.check_failed();
            }
        }
    }

    /// Whether a commit is under way.
    pub fn committing(&self) -> bool {
        self.committing.is_some()
    }

    /// The number of the commit that will cover an operation finishing now:
    /// the next to start.
    pub fn next_commit(&self) -> u64 {
        self.commits_started + 1
    }

    /// The number of the last commit that finished: every operation that
    /// finished before it started is durable.
    pub fn commits_done(&self) -> u64 {
        self.commits_done
    }

    /// Collects finished device requests without waiting, so the device's
    /// completion descriptor reads empty before the worker sleeps on it.
    pub fn poll_device(&mut self) {
        self.io.poll();
    }

    /// Waits for one device request to finish, if any is in flight; `false`
    /// if none is (a held commit step, failpoint `commit.hold_ms`, is not
    /// waited for).
    pub fn wait_device(&mut self) -> bool {
        self.io.wait_one_idle()
    }

    /// The device's completion descriptor (`Device::completion_fd`).
    pub fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        self.io.device().completion_fd()
    }
}
