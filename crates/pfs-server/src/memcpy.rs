//! The memcpy pool: M threads that finish large read replies off the workers
//! (PeakFS III-B).
//!
//! A read's bytes land after room for the reply's header (the shard's
//! `ReadShape::prefix`), so the reply is a frame built around them: what is
//! left is its header and the crc32c of the data, for 1 MiB a few hundred
//! microseconds a worker would not serve anything else. A worker hands such a
//! reply to the pool through one bounded MPMC queue (every worker pushes,
//! every pool thread pops); the pool thread seals it and sends the frame back
//! through the worker's own bounded return queue, then rings the worker's
//! doorbell. A full queue is back-pressure: the worker seals the reply itself.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use pfs_core::wire::{Frame, Opcode, Sum};
use pfs_core::{ClientId, RequestId};

use crate::msg::{ConnRef, Doorbell};

/// A read reply to seal, and where it goes.
#[derive(Debug)]
pub struct Job {
    /// The worker to give it back to.
    pub worker: u16,
    /// The worker whose connection the request came in on.
    pub origin: u16,
    /// That connection.
    pub conn: ConnRef,
    /// The request answered.
    pub request_id: RequestId,
    /// Its client.
    pub client: ClientId,
    /// `Read` or `ReadData`.
    pub op: Opcode,
    /// What the reply's checksum covers (the header only through shared memory).
    pub sum: Sum,
    /// The reply laid out in place: `READ_REPLY_PREFIX` bytes of room, then
    /// the data (at most `MAX_IO_BYTES`, checked by the worker).
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
        // The worker checked the size before offering: a reply that does not
        // seal is a bug in the caller.
        if Frame::seal_read_reply(&mut job.buf, job.request_id, job.client, job.op, job.sum)
            .is_err()
        {
            unreachable!("the memcpy pool got a read reply that does not seal");
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
    use pfs_core::wire::{Body, Reply, READ_REPLY_PREFIX};

    fn job(worker: u16, conn: ConnRef, data: &[u8]) -> Job {
        let mut buf = vec![0; READ_REPLY_PREFIX];
        buf.extend_from_slice(data);
        let (request_id, client, op) = (RequestId(7), ClientId(3), Opcode::Read);
        Job { worker, origin: 0, conn, request_id, client, op, sum: Sum::Full, buf }
    }

    #[test]
    fn a_reply_comes_back_sealed_to_its_worker_and_rings_it() {
        let bells: Arc<Vec<Doorbell>> =
            Arc::new((0..2).map(|_| Doorbell::new().unwrap()).collect());
        let (pool, mut ports) = MemcpyPool::start(2, 4, 4096, bells.clone()).unwrap();
        let frame = Frame {
            request_id: RequestId(7),
            client: ClientId(3),
            body: Body::Reply(Reply::Read(vec![0xAB; 100_000])),
        };
        let want = frame.to_bytes().unwrap();
        let conn = ConnRef { slot: 1, gen: 9, sum: Sum::Full };
        assert!(ports[1].offer(job(1, conn, &[0xAB; 100_000])).is_none());
        let done = loop {
            if let Some(d) = ports[1].take() {
                break d;
            }
            std::thread::yield_now();
        };
        assert!(done.buf == want, "sealed in place: the encoded reply");
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
        let conn = ConnRef { slot: 0, gen: 0, sum: Sum::Full };
        let mut refused = 0;
        for _ in 0..16 {
            if ports[0].offer(job(0, conn, &[1; 10])).is_some() {
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
