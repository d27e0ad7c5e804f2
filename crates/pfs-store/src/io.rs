//! The shard's one path to its device: blocking batches for the operation at hand,
//! plus asynchronous write-backs (Icache) whose completions are collected later.

use crate::device::{Device, IoCompletion, IoRequest};

/// Tags with this bit set belong to asynchronous requests.
const ASYNC_TAG: u64 = 1 << 63;

/// The device plus completion routing.
#[derive(Debug)]
pub struct DevIo<D> {
    dev: D,
    async_done: Vec<IoCompletion>,
    async_in_flight: usize,
}

impl<D: Device> DevIo<D> {
    /// Wraps a device.
    pub fn new(dev: D) -> DevIo<D> {
        DevIo { dev, async_done: Vec::new(), async_in_flight: 0 }
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The device, mutably (buffer allocation).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Gives the device back.
    pub fn into_device(mut self) -> D {
        self.wait_async_all();
        self.dev
    }

    /// Runs `reqs` to completion; returns their completions in order.
    pub fn run(&mut self, reqs: Vec<IoRequest>) -> Vec<IoCompletion> {
        let total = reqs.len();
        let mut done: Vec<Option<IoCompletion>> = (0..total).map(|_| None).collect();
        let mut pending: std::collections::VecDeque<IoRequest> = reqs.into();
        for (i, req) in pending.iter_mut().enumerate() {
            req.tag = i as u64;
        }
        let mut out = Vec::new();
        let mut finished = 0;
        while finished < total {
            while let Some(req) = pending.pop_front() {
                if let Err(back) = self.dev.submit(req) {
                    pending.push_front(back);
                    break;
                }
            }
            out.clear();
            self.dev.wait(&mut out, 1);
            for mut c in out.drain(..) {
                if c.tag & ASYNC_TAG != 0 {
                    c.tag &= !ASYNC_TAG;
                    self.async_in_flight -= 1;
                    self.async_done.push(c);
                    continue;
                }
                let i = c.tag as usize;
                assert!(done[i].is_none(), "completion for request {i} seen twice");
                done[i] = Some(c);
                finished += 1;
            }
        }
        done.into_iter().map(|c| c.expect("every request completes")).collect()
    }

    /// Submits an asynchronous request tagged `tag` (< 2^63); waits for room if full.
    pub fn submit_async(&mut self, mut req: IoRequest, tag: u64) {
        assert!(tag & ASYNC_TAG == 0, "async tag {tag} too large");
        req.tag = tag | ASYNC_TAG;
        let mut out = Vec::new();
        loop {
            match self.dev.submit(req) {
                Ok(()) => break,
                Err(back) => {
                    req = back;
                    self.dev.wait(&mut out, 1);
                    self.absorb(&mut out);
                }
            }
        }
        self.async_in_flight += 1;
    }

    /// Asynchronous completions so far (tags without the async bit), non-blocking.
    pub fn take_async(&mut self) -> Vec<IoCompletion> {
        let mut out = Vec::new();
        self.dev.poll(&mut out);
        self.absorb(&mut out);
        std::mem::take(&mut self.async_done)
    }

    /// Waits for every asynchronous request; returns their completions.
    pub fn wait_async_all(&mut self) -> Vec<IoCompletion> {
        let mut out = Vec::new();
        while self.async_in_flight > 0 {
            self.dev.wait(&mut out, 1);
            self.absorb(&mut out);
        }
        std::mem::take(&mut self.async_done)
    }

    fn absorb(&mut self, out: &mut Vec<IoCompletion>) {
        for mut c in out.drain(..) {
            assert!(c.tag & ASYNC_TAG != 0, "synchronous completion {} outside run()", c.tag);
            c.tag &= !ASYNC_TAG;
            self.async_in_flight -= 1;
            self.async_done.push(c);
        }
    }
}
