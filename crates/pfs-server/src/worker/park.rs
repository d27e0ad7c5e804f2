//! Parking an idle worker: arming the doorbell and connections, a last look
//! for work, and how long to sleep in the epoll set.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pfs_net::QueuePair;
use pfs_store::device::Device;

use crate::memcpy::MemcpyPort;

use super::Worker;

/// Longest park, so the stop flag and the commit timer are seen.
pub(super) const PARK_MAX: Duration = Duration::from_millis(100);

impl<D: Device> Worker<D> {
    /// Whether a cross-shard step waits for a peer server's reply.
    pub(super) fn awaiting_peers(&self) -> bool {
        self.cross.awaiting_peer()
            || self.rmdirs.awaiting_peer()
            || self.outbox.awaiting_peer()
            || self.sweep.awaiting_peer()
    }

    /// Prepares to sleep until work arrives: arms the doorbell and the
    /// connections and looks once more. Returns how long to sleep in the epoll
    /// set (the caller lets go of the worker's lock meanwhile), or `None` when
    /// work is waiting or the worker waited for the device itself here.
    /// [`park_end`](Self::park_end) follows either way.
    pub(super) fn park_begin(&mut self) -> Option<Duration> {
        self.tokens.expire(self.now);
        let bell = &self.bells[self.id as usize];
        bell.parked.store(true, Ordering::SeqCst);
        // Re-check after announcing the park: a producer that pushed before it saw
        // the flag did not ring.
        let rings_busy = self.ring_in.iter().flatten().any(|r| !r.is_empty());
        let conns_busy = self.conns.iter_mut().flatten().any(|c| !c.qp.prepare_wait());
        let copied = self.memcpy.as_ref().is_some_and(MemcpyPort::has_done);
        // Finished device requests are collected first, so the device's
        // descriptor wakes the park only for new ones; then the commit takes
        // its step (a request it submits now wakes the park when it finishes).
        // A device without a descriptor cannot wake it: then a commit under
        // way is polled, not slept on.
        self.shard.poll_device();
        self.shard.poll_commit();
        self.shard.poll_checkpoint();
        self.shard.poll_data_writes();
        let read = self.shard.has_finished_reads()
            || (!self.stopped.is_empty() && {
                let now = self.progress();
                self.stopped.moved(now)
            });
        let done = self.shard.commits_done();
        let released = self.after_commit.iter().any(|h| h.0 <= done);
        let device_wakes = self.shard.completion_fd().is_some();
        let device_polled = self.awaits_device() && !device_wakes;
        if !rings_busy
            && !conns_busy
            && !copied
            && self.backlog.is_empty()
            && !released
            && !read
            && !device_polled
            && !self.shard.checkpoint_wants_cpu()
            && self.shard.failure().is_none()
        {
            if self.awaits_device() && self.shard.wait_device() {
                // Nothing to serve but the commit's step or reads: wait for
                // the device itself, as a blocking commit or read did. A
                // request that arrives meanwhile waits for one device request.
                return None;
            }
            let timeout = match self.dirty_since {
                Some(t) => (t + self.opts.commit_interval).saturating_duration_since(self.now),
                None => PARK_MAX,
            };
            return Some(timeout.min(PARK_MAX));
        } else if device_polled || self.waits_for_peers_rings(rings_busy, conns_busy, copied) {
            std::thread::yield_now();
        }
        None
    }

    /// Whether the only work left is the backlog, which waits for the peers
    /// to take tasks from their full rings (connections with requests do not
    /// count while the backlog is at its bound: they wait for it): yield the
    /// core, which a peer may need to do so.
    fn waits_for_peers_rings(&self, rings_busy: bool, conns_busy: bool, copied: bool) -> bool {
        let paused = self.backlog.len() >= self.backlog_max;
        !self.backlog.is_empty() && !rings_busy && !copied && (paused || !conns_busy)
    }

    /// Ends a park begun by [`park_begin`](Self::park_begin).
    pub(super) fn park_end(&mut self) {
        let bell = &self.bells[self.id as usize];
        bell.parked.store(false, Ordering::SeqCst);
        bell.wake.drain();
    }

    /// Whether a commit step or a read waits for the device.
    pub(super) fn awaits_device(&self) -> bool {
        self.shard.committing()
            || self.shard.checkpointing()
            || !self.reads.is_empty()
            || !self.stopped.is_empty()
            || self.cross.has_stopped()
            || self.rmdirs.has_stopped()
            || self.outbox.has_stopped()
            || self.sweep.has_stopped()
    }
}
