//! [`FrameServer`]: a single-threaded request loop over a [`Listener`], for tests,
//! benchmarks and simple tools (the storage server runs its own RingSched loop).
//!
//! Each connection owns `credits` buffers that circulate: a receive buffer holds a
//! request, is reused to encode the reply, and is posted for receiving again once
//! the reply has been sent. So requests in service plus unsent replies never exceed
//! the credits, and a client that does not read its replies only holds itself back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pfs_core::Frame;

use crate::link::Link;
use crate::listener::Listener;
use crate::poller::{wait_readable, Epoll, READ};
use crate::transport::{Completion, QueuePair, WorkId};

/// Empty rounds before the loop parks.
const IDLE_SPINS: u32 = 64;
/// Longest park, so a stop request is seen.
const PARK_MAX: Duration = Duration::from_millis(200);

/// A request loop: accept, receive, call the handler, send its reply.
#[derive(Debug)]
pub struct FrameServer {
    listener: Listener,
    conns: Vec<Link>,
    accepted: Vec<Link>,
    completions: Vec<Completion>,
    epoll: Epoll,
}

impl FrameServer {
    /// A loop over `listener`.
    pub fn new(listener: Listener) -> std::io::Result<FrameServer> {
        let epoll = Epoll::new()?;
        epoll.add(listener.wait_fd(), READ, 0)?;
        Ok(FrameServer {
            listener,
            conns: Vec::new(),
            accepted: Vec::new(),
            completions: Vec::with_capacity(crate::POLL_BATCH),
            epoll,
        })
    }

    /// The listener.
    pub fn listener(&self) -> &Listener {
        &self.listener
    }

    /// Connections being served.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// One round over the listener and every connection; returns the work done.
    /// `handler` answers a request frame with a reply (`None`: no reply).
    pub fn run_once(&mut self, handler: &mut impl FnMut(Frame) -> Option<Frame>) -> usize {
        let mut work = 0;
        if let Err(e) = self.listener.accept(&mut self.accepted) {
            log::warn!("{e}");
        }
        for mut qp in self.accepted.drain(..) {
            work += 1;
            for _ in 0..qp.credits() {
                if qp.post_recv(Vec::new()).is_err() {
                    break;
                }
            }
            if let Err(e) = self.epoll.add(qp.wait_fd(), READ, 0) {
                log::warn!("cannot watch {}: {e}", qp.peer());
                continue;
            }
            self.conns.push(qp);
        }
        let mut i = 0;
        while i < self.conns.len() {
            match serve_conn(&mut self.conns[i], &mut self.completions, handler) {
                Some(n) => {
                    work += n;
                    i += 1;
                }
                None => {
                    let qp = self.conns.swap_remove(i);
                    let _ = self.epoll.delete(qp.wait_fd());
                }
            }
        }
        work
    }

    /// Serves until `stop` is set, spinning while busy and parking when idle.
    pub fn run_until(
        &mut self,
        stop: &AtomicBool,
        mut handler: impl FnMut(Frame) -> Option<Frame>,
    ) {
        let mut idle = 0u32;
        while !stop.load(Ordering::Acquire) {
            if self.run_once(&mut handler) > 0 {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle < IDLE_SPINS {
                std::hint::spin_loop();
                continue;
            }
            if self.conns.iter_mut().all(|qp| qp.prepare_wait()) {
                let _ = wait_readable(self.epoll.raw(), Some(PARK_MAX));
            }
            idle = 0;
        }
    }
}

/// Serves one connection; `None` when it is down and must be dropped.
fn serve_conn(
    qp: &mut Link,
    completions: &mut Vec<Completion>,
    handler: &mut impl FnMut(Frame) -> Option<Frame>,
) -> Option<usize> {
    completions.clear();
    let n = qp.poll_cq(completions).ok()?;
    for c in completions.drain(..) {
        match c {
            Completion::Send { buf, .. } => {
                let _ = qp.post_recv(buf);
            }
            Completion::Recv { mut buf } => {
                let request = match Frame::decode(&buf) {
                    Ok(f) => f,
                    Err(e) => {
                        qp.close(&format!("undecodable request frame: {e}"));
                        return None;
                    }
                };
                let (id, client) = (request.request_id, request.client);
                buf.clear();
                match handler(request) {
                    Some(mut reply) => {
                        reply.request_id = id;
                        reply.client = client;
                        if let Err(e) = reply.encode(&mut buf) {
                            qp.close(&format!("cannot encode the reply: {e}"));
                            return None;
                        }
                        if let Err(r) = qp.post_send(WorkId(id.0), buf) {
                            qp.close(&format!("cannot send the reply: {}", r.error));
                            return None;
                        }
                    }
                    None => {
                        let _ = qp.post_recv(buf);
                    }
                }
            }
            Completion::Write { .. } | Completion::Read { .. } | Completion::Imm { .. } => {}
        }
    }
    Some(n)
}
