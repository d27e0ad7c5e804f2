//! The SPSC rings between the workers of a server: requests for another
//! worker's shard and their replies, with a bounded backlog for a full ring,
//! and the memcpy pool's finished replies.

use std::sync::atomic::Ordering;

use pfs_store::device::Device;

use crate::memcpy::MemcpyPort;
use crate::msg::{ConnRef, Task};

use super::Worker;

/// Every ring of a `workers`-worker server: `out[i][j]` carries tasks from `i` to
/// `j`, `inp[j][i]` is its other end; no ring from a worker to itself.
#[allow(clippy::type_complexity)]
pub fn ring_mesh(
    workers: usize,
    depth: usize,
) -> (Vec<Vec<Option<rtrb::Producer<Task>>>>, Vec<Vec<Option<rtrb::Consumer<Task>>>>) {
    let mut out: Vec<Vec<Option<rtrb::Producer<Task>>>> =
        (0..workers).map(|_| (0..workers).map(|_| None).collect()).collect();
    let mut inp: Vec<Vec<Option<rtrb::Consumer<Task>>>> =
        (0..workers).map(|_| (0..workers).map(|_| None).collect()).collect();
    for i in 0..workers {
        for j in 0..workers {
            if i != j {
                let (p, c) = rtrb::RingBuffer::new(depth);
                out[i][j] = Some(p);
                inp[j][i] = Some(c);
            }
        }
    }
    (out, inp)
}

impl<D: Device> Worker<D> {
    pub(super) fn serve_rings(&mut self) -> usize {
        let mut work = 0;
        for from in 0..self.ring_in.len() {
            // A bounded batch per ring keeps one busy peer from starving the rest.
            for _ in 0..64 {
                let Some(ring) = self.ring_in[from].as_mut() else { break };
                let Ok(task) = ring.pop() else { break };
                work += 1;
                match task {
                    Task::Request { from, conn, buf } => {
                        if let Some(reply) = self.process_for(from, conn, buf) {
                            self.push(from, Task::Reply { conn, buf: reply });
                        }
                    }
                    Task::Reply { conn, buf } => self.send_reply(conn, buf),
                    Task::Notify { client, buf } => self.deliver_notify(client, buf),
                }
            }
        }
        work
    }

    /// Sends a reply to connection `conn` of worker `origin` (this one or another).
    pub(super) fn route_reply(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        if origin == self.id {
            self.send_reply(conn, buf);
        } else {
            self.push(origin, Task::Reply { conn, buf });
        }
    }

    pub(super) fn push(&mut self, target: u16, task: Task) {
        if !self.backlog.is_empty() {
            self.keep_in_backlog(target, task);
            return;
        }
        let ring = self.ring_out[target as usize].as_mut().expect("no ring to self");
        match ring.push(task) {
            Ok(()) => self.bells[target as usize].ring(),
            Err(rtrb::PushError::Full(task)) => self.keep_in_backlog(target, task),
        }
    }

    /// Keeps a task for a full ring (in order behind the others), noting the
    /// backlog's high-water mark.
    fn keep_in_backlog(&mut self, target: u16, task: Task) {
        self.backlog.push_back((target, task));
        if self.backlog.len() > self.backlog_high {
            self.backlog_high = self.backlog.len();
            self.usage.backlog_high.store(self.backlog_high as u64, Ordering::Relaxed);
        }
    }

    /// Retries tasks a full ring refused, in order.
    pub(super) fn flush_backlog(&mut self) -> usize {
        let mut n = 0;
        while let Some((target, _)) = self.backlog.front() {
            let target = *target;
            let ring = self.ring_out[target as usize].as_mut().expect("no ring to self");
            if ring.is_full() {
                break;
            }
            let (_, task) = self.backlog.pop_front().expect("front exists");
            if ring.push(task).is_err() {
                unreachable!("the ring had room and only this thread pushes");
            }
            self.bells[target as usize].ring();
            n += 1;
        }
        n
    }

    /// Sends the replies the memcpy pool finished.
    pub(super) fn take_copied(&mut self) -> usize {
        let mut work = 0;
        // Bounded by the return queue's depth.
        while let Some(done) = self.memcpy.as_mut().and_then(MemcpyPort::take) {
            work += 1;
            if done.origin == self.id {
                self.send_reply(done.conn, done.buf);
            } else {
                self.push(done.origin, Task::Reply { conn: done.conn, buf: done.buf });
            }
        }
        work
    }
}
