//! The memcpy pool: M threads that copy large replies into their frames off the
//! workers (PeakFS III-B).
//!
//! Encoding a read reply copies its data into the frame and checksums it: for
//! 1 MiB that is a few hundred microseconds a worker would not serve anything
//! else. A worker hands such a reply to the pool through one bounded MPMC queue
//! (every worker pushes, every pool thread pops); the pool thread encodes it and
//! sends the frame back through the worker's own bounded return queue, then rings
//! the worker's doorbell. A full queue is back-pressure: the worker encodes the
//! reply itself.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use pfs_core::wire::Frame;

use crate::worker::{ConnRef, Doorbell};

/// A reply to encode, and where it goes.
#[derive(Debug)]
pub struct Job {
    /// The worker to give it back to.
    pub worker: u16,
    /// The worker whose connection the request came in on.
    pub origin: u16,
    /// That connection.
    pub conn: ConnRef,
    /// The reply frame.
    pub frame: Frame,
    /// A buffer to encode into (reused).
    pub buf: Vec<u8>,
}

/// An encoded reply on its way back to a worker.
#[derive(Debug)]
pub struct Done {
    /// The worker the request came in through.
    pub origin: u16,
    /// Its connection.
    pub conn: ConnRef,
    /// The encoded frame.
    pub buf: Vec<u8>,
}

/// A worker's end of the pool.
#[derive(Debug)]
pub struct MemcpyPort {
    jobs: Sender<Job>,
    done: Receiver<Done>,
    /// Replies with at least this many data bytes go to the pool.
    pub threshold_bytes: usize,
    /// Jobs handed out and not yet back.
    pub in_flight: usize,
}

impl MemcpyPort {
    /// Hands `job` to the pool (`None`); gives it back when the queue is full.
    pub fn offer(&mut self, job: Job) -> Option<Job> {
        match self.jobs.try_send(job) {
            Ok(()) => {
                self.in_flight += 1;
                None
            }
            Err(TrySendError::Full(j) | TrySendError::Disconnected(j)) => Some(j),
        }
    }

    /// The next finished reply, if any.
    pub fn take(&mut self) -> Option<Done> {
        let d = self.done.try_recv().ok()?;
        self.in_flight -= 1;
        Some(d)
    }

    /// Whether a finished reply waits.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }
}

/// The pool's threads; they stop once every worker dropped its port.
#[derive(Debug)]
pub struct MemcpyPool {
    threads: Vec<JoinHandle<()>>,
}

impl MemcpyPool {
    /// Starts `threads` threads for `workers` workers; returns one port per
    /// worker. `queue_depth` bounds the job queue and each return queue.
    pub fn start(
        threads: usize,
        queue_depth: usize,
        threshold_bytes: usize,
        bells: Arc<Vec<Doorbell>>,
    ) -> std::io::Result<(MemcpyPool, Vec<MemcpyPort>)> {
        assert!(threads > 0 && queue_depth > 0);
        let workers = bells.len();
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(queue_depth);
        let mut backs = Vec::with_capacity(workers);
        let mut ports = Vec::with_capacity(workers);
        for _ in 0..workers {
            // Room for every job a worker can have out: a pool thread never
            // blocks on a return queue for long.
            let (tx, rx) = crossbeam_channel::bounded::<Done>(queue_depth);
            backs.push(tx);
            ports.push(MemcpyPort {
                jobs: jobs_tx.clone(),
                done: rx,
                threshold_bytes,
                in_flight: 0,
            });
        }
        drop(jobs_tx);
        let backs = Arc::new(backs);
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let (rx, backs, bells) = (jobs_rx.clone(), backs.clone(), bells.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("pfs-memcpy-{t}"))
                    .spawn(move || copy_loop(rx, &backs, &bells))?,
            );
        }
        Ok((MemcpyPool { threads: handles }, ports))
    }

    /// Waits for the threads (after the workers stopped).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn copy_loop(jobs: Receiver<Job>, backs: &[Sender<Done>], bells: &[Doorbell]) {
    // Ends when every worker dropped its sender.
    while let Ok(mut job) = jobs.recv() {
        job.buf.clear();
        if job.frame.encode(&mut job.buf).is_err() {
            // The worker checked the size before offering: a reply that does not
            // encode is a bug in the caller.
            unreachable!("the memcpy pool got a reply that does not encode");
        }
        let done = Done { origin: job.origin, conn: job.conn, buf: job.buf };
        let w = job.worker as usize;
        // A worker that stopped has dropped its receiver: the reply is moot.
        if backs[w].send(done).is_ok() {
            bells[w].ring();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::{Body, Reply};
    use pfs_core::{ClientId, RequestId};

    #[test]
    fn a_reply_comes_back_encoded_to_its_worker_and_rings_it() {
        let bells: Arc<Vec<Doorbell>> =
            Arc::new((0..2).map(|_| Doorbell::new().unwrap()).collect());
        let (pool, mut ports) = MemcpyPool::start(2, 4, 4096, bells.clone()).unwrap();
        let frame = Frame {
            request_id: RequestId(7),
            client: ClientId(3),
            body: Body::Reply(Reply::Read(vec![0xAB; 100_000])),
        };
        let want = frame.to_bytes().unwrap();
        let conn = ConnRef { slot: 1, gen: 9 };
        assert!(ports[1]
            .offer(Job { worker: 1, origin: 0, conn, frame, buf: Vec::new() })
            .is_none());
        let done = loop {
            if let Some(d) = ports[1].take() {
                break d;
            }
            std::thread::yield_now();
        };
        assert_eq!(done.buf, want);
        assert_eq!((done.origin, done.conn), (0, conn));
        assert_eq!(ports[1].in_flight, 0);
        assert!(ports[0].take().is_none());
        drop(ports);
        pool.join();
    }

    #[test]
    fn a_full_queue_hands_the_job_back() {
        let bells: Arc<Vec<Doorbell>> = Arc::new(vec![Doorbell::new().unwrap()]);
        // No thread takes jobs while we fill the queue: a 1-slot queue and a
        // blocked pool thread (its return queue is full too).
        let (pool, mut ports) = MemcpyPool::start(1, 1, 0, bells).unwrap();
        let frame = || Frame {
            request_id: RequestId(1),
            client: ClientId(1),
            body: Body::Reply(Reply::Read(vec![1; 10])),
        };
        let conn = ConnRef { slot: 0, gen: 0 };
        let mut refused = 0;
        for _ in 0..16 {
            if ports[0]
                .offer(Job { worker: 0, origin: 0, conn, frame: frame(), buf: Vec::new() })
                .is_some()
            {
                refused += 1;
            }
        }
        assert!(refused > 0, "a bounded pool refuses work when full");
        let mut got = 0;
        while ports[0].in_flight > 0 {
            if ports[0].take().is_some() {
                got += 1;
            }
        }
        assert_eq!(got + refused, 16);
        drop(ports);
        pool.join();
    }
}
