//! Group commit beside the requests: replies that wait for a commit are held
//! and sent when it finished; the next one starts when they wait or the
//! oldest change is `commit_interval` old.

use pfs_core::wire::FrameHeader;
use pfs_core::FsError;
use pfs_store::device::Device;

use crate::msg::ConnRef;

use super::{error_reply, Worker};

impl<D: Device> Worker<D> {
    /// Moves the group commit along beside the requests: answers what a
    /// finished commit covered, and starts the next one when replies wait for
    /// it or the oldest change is `commit_interval` old. Returns the work done.
    pub(super) fn drive_commit(&mut self) -> usize {
        let mut work = 0;
        // Also starts the checkpoint a short log needs when the requests that
        // found it full stopped for it instead of starting it.
        self.shard.poll_checkpoint();
        if self.shard.committing() {
            self.shard.poll_commit();
            if self.shard.committing() {
                return 0;
            }
            self.publish_usage();
            work += 1;
        }
        work += self.release_committed();
        let due = !self.after_commit.is_empty()
            || self.outbox.holds_wait_for_commit(&self.shard)
            || self.intents_wait_for_commit()
            || self
                .dirty_since
                .is_some_and(|t| self.now.duration_since(t) >= self.opts.commit_interval);
        if due && self.shard.failure().is_none() {
            self.dirty_since = None;
            // A failure is seen by the caller (`Shard::failure`).
            let _ = self.shard.start_commit();
            work += 1;
            if !self.shard.committing() {
                // Nothing to write: finished at once.
                work += self.release_committed();
            }
        }
        work
    }

    /// Whether a cross-shard rename or bigdir rmdir waits for its intent to
    /// be durable before it asks another shard.
    pub(super) fn intents_wait_for_commit(&self) -> bool {
        let done = self.shard.commits_done();
        self.cross.wait_for_commit(done) || self.rmdirs.wait_for_commit(done)
    }

    /// Sends the held replies whose commit finished.
    pub(super) fn release_committed(&mut self) -> usize {
        let done = self.shard.commits_done();
        let mut ready = take_committed(&mut self.after_commit, done);
        ready.extend(take_committed(&mut self.after_natural_commit, done));
        let n = ready.len();
        for (_, origin, conn, buf) in ready {
            self.route_reply(origin, conn, buf);
        }
        n
    }

    /// Answers a `Durable` request: at once when nothing acknowledged waits
    /// for a commit (the shard is clean and no commit is in flight), else
    /// once the commit that covers what was logged so far finished, at the
    /// commit interval's pace: it does not make the commit due, so clients'
    /// background checks add no device flushes. `None`: held.
    pub(super) fn serve_durable(
        &mut self,
        origin: u16,
        conn: ConnRef,
        buf: Vec<u8>,
    ) -> Option<Vec<u8>> {
        // What was logged since the last commit started goes into the next
        // one, which the commit interval starts; with nothing logged since,
        // the one in flight covers it all.
        let covering = match (self.dirty_since.is_some(), self.shard.committing()) {
            (true, _) => self.shard.next_commit(),
            (false, true) => self.shard.next_commit() - 1,
            (false, false) => return Some(buf),
        };
        self.after_natural_commit.push((covering, origin, conn, buf));
        None
    }

    /// Holds `buf` until the commit that covers what happened so far finished.
    pub(super) fn reply_after_commit(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        self.after_commit.push((self.shard.next_commit(), origin, conn, buf));
    }

    /// Commits the shard, waiting for it, and sends every reply that waited
    /// for a commit (on a failed shard: an error instead). For the drain.
    pub(super) fn commit_and_release(&mut self) {
        let result = self.shard.commit();
        self.dirty_since = None;
        self.publish_usage();
        let mut held = std::mem::take(&mut self.after_commit);
        held.append(&mut self.after_natural_commit);
        for (_, origin, conn, mut buf) in held {
            if let Err(e) = &result {
                // The change may not be durable: the caller must not be told it is.
                let header = FrameHeader::decode(&buf).expect("encoded here");
                let failed = error_reply(header, FsError::Io(format!("commit failed: {e}")));
                buf = failed;
            }
            self.route_reply(origin, conn, buf);
        }
    }

    /// Notes that the shard changed, so the commit timer runs.
    pub(super) fn mark_dirty(&mut self) {
        self.dirty_since.get_or_insert(self.now);
    }
}

/// A reply held until commit number `.0` finished: (commit, origin worker,
/// connection, frame).
pub(super) type HeldReply = (u64, u16, ConnRef, Vec<u8>);

/// Takes out of `held` the replies whose commit is among the `done` first.
fn take_committed(held: &mut Vec<HeldReply>, done: u64) -> Vec<HeldReply> {
    // Every round asks: most find nothing ready, and need not rebuild the list.
    if !held.iter().any(|h| h.0 <= done) {
        return Vec::new();
    }
    let (ready, waiting) = std::mem::take(held).into_iter().partition(|h| h.0 <= done);
    *held = waiting;
    ready
}
