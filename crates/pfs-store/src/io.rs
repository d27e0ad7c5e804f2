//! The shard's one path to its device: blocking batches for the operation at hand,
//! plus two kinds of asynchronous requests whose completions are collected later:
//! Icache write-backs and data writes (`shard/dataio.rs`).

use crate::device::{run_batch, Device, DeviceError, IoCompletion, IoKind, IoRequest};

/// Tags with this bit set belong to asynchronous requests.
const ASYNC_TAG: u64 = 1 << 63;
/// Asynchronous tags with this bit set as well are data writes.
const DATA_TAG: u64 = 1 << 62;

/// Completions and the count in flight of one kind of asynchronous request.
#[derive(Debug, Default)]
struct AsyncKind {
    done: Vec<IoCompletion>,
    in_flight: usize,
}

/// The device plus completion routing.
#[derive(Debug)]
pub struct DevIo<D> {
    dev: D,
    /// Icache write-backs.
    meta: AsyncKind,
    /// Data writes.
    data: AsyncKind,
}

impl<D: Device> DevIo<D> {
    /// Wraps a device.
    pub fn new(dev: D) -> DevIo<D> {
        DevIo { dev, meta: AsyncKind::default(), data: AsyncKind::default() }
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
        self.wait_data_all();
        self.dev
    }

    /// Runs `reqs` to completion; returns their completions in order. Asynchronous
    /// completions that arrive meanwhile are kept for `take_async`.
    ///
    /// Failpoints `device.read`, `device.write` and `device.sync`
    /// (`pfs_core::failpoint`) fail a request of that kind with `EIO`, as a
    /// failing device would, without submitting it.
    pub fn run(&mut self, reqs: Vec<IoRequest>) -> Vec<IoCompletion> {
        let mut injected: Vec<Option<IoCompletion>> = Vec::new();
        let mut submit = Vec::with_capacity(reqs.len());
        for req in reqs {
            let point = match req.kind {
                IoKind::Read => "device.read",
                IoKind::Write => "device.write",
                IoKind::Sync => "device.sync",
            };
            if pfs_core::failpoint::fire(point) {
                let errno = libc::EIO;
                let result = Err(DeviceError::Io { offset: req.offset, errno });
                let IoRequest { tag, kind, offset, buf } = req;
                injected.push(Some(IoCompletion { tag, kind, offset, buf, result }));
            } else {
                injected.push(None);
                submit.push(req);
            }
        }
        let (meta, data) = (&mut self.meta, &mut self.data);
        let done = run_batch(&mut self.dev, submit, |c| route(meta, data, c));
        if injected.iter().all(Option::is_none) {
            return done;
        }
        let mut done = done.into_iter();
        injected
            .into_iter()
            .map(|c| c.unwrap_or_else(|| done.next().expect("one completion per request")))
            .collect()
    }

    /// Reads `len` bytes (a multiple of the sector size) at byte `offset`, in
    /// chunks of at most 1 MiB.
    pub fn read_bytes(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, DeviceError> {
        const CHUNK: u64 = 1 << 20;
        let mut out = Vec::with_capacity(len as usize);
        let mut at = 0;
        while at < len {
            let n = CHUNK.min(len - at);
            let buf = self.dev.alloc_buf(n as usize);
            let req = IoRequest { tag: 0, kind: IoKind::Read, offset: offset + at, buf };
            let c = self.run(vec![req]).pop().expect("one completion");
            c.result?;
            out.extend_from_slice(&c.buf[..n as usize]);
            self.dev.free_buf(c.buf);
            at += n;
        }
        Ok(out)
    }

    /// Submits an asynchronous Icache write-back tagged `tag` (< 2^62); waits
    /// for room if full.
    pub fn submit_async(&mut self, mut req: IoRequest, tag: u64) {
        assert!(tag & (ASYNC_TAG | DATA_TAG) == 0, "async tag {tag} too large");
        req.tag = tag | ASYNC_TAG;
        self.submit_waiting(req);
        self.meta.in_flight += 1;
    }

    /// Submits an asynchronous data write or read tagged `tag` (< 2^62); waits
    /// for room if full. Failpoints `device.write` and `device.read` fail it as
    /// [`run`](Self::run) would.
    pub fn submit_data(&mut self, mut req: IoRequest, tag: u64) {
        assert!(tag & (ASYNC_TAG | DATA_TAG) == 0, "data tag {tag} too large");
        let point = match req.kind {
            IoKind::Read => "device.read",
            _ => "device.write",
        };
        if pfs_core::failpoint::fire(point) {
            let result = Err(DeviceError::Io { offset: req.offset, errno: libc::EIO });
            let IoRequest { kind, offset, buf, .. } = req;
            self.data.done.push(IoCompletion { tag, kind, offset, buf, result });
            return;
        }
        req.tag = tag | ASYNC_TAG | DATA_TAG;
        self.submit_waiting(req);
        self.data.in_flight += 1;
    }

    /// Submits `req`, reaping completions while the device is full.
    fn submit_waiting(&mut self, mut req: IoRequest) {
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
    }

    /// Asynchronous Icache completions so far (tags without the async bit),
    /// non-blocking; submits what was queued.
    pub fn take_async(&mut self) -> Vec<IoCompletion> {
        self.poll();
        std::mem::take(&mut self.meta.done)
    }

    /// Waits for every asynchronous Icache request; returns their completions.
    pub fn wait_async_all(&mut self) -> Vec<IoCompletion> {
        self.wait_all(|io| &mut io.meta)
    }

    /// Finished data writes so far (their tags), non-blocking; submits what
    /// was queued.
    pub fn take_data(&mut self) -> Vec<IoCompletion> {
        self.poll();
        std::mem::take(&mut self.data.done)
    }

    /// Waits for every data request; returns their completions.
    pub fn wait_data_all(&mut self) -> Vec<IoCompletion> {
        self.wait_all(|io| &mut io.data)
    }

    /// Waits until nothing of the kind `kind` picks is in flight; returns its
    /// completions.
    fn wait_all(&mut self, kind: fn(&mut DevIo<D>) -> &mut AsyncKind) -> Vec<IoCompletion> {
        let mut out = Vec::new();
        while kind(self).in_flight > 0 {
            self.dev.wait(&mut out, 1);
            self.absorb(&mut out);
        }
        std::mem::take(&mut kind(self).done)
    }

    fn poll(&mut self) {
        let mut out = Vec::new();
        self.dev.poll(&mut out);
        self.absorb(&mut out);
    }

    fn absorb(&mut self, out: &mut Vec<IoCompletion>) {
        for c in out.drain(..) {
            assert!(c.tag & ASYNC_TAG != 0, "synchronous completion {} outside run()", c.tag);
            route(&mut self.meta, &mut self.data, c);
        }
    }
}

/// Files an asynchronous completion under its kind, its tag as submitted.
fn route(meta: &mut AsyncKind, data: &mut AsyncKind, mut c: IoCompletion) {
    let kind = if c.tag & DATA_TAG != 0 { data } else { meta };
    c.tag &= !(ASYNC_TAG | DATA_TAG);
    kind.in_flight -= 1;
    kind.done.push(c);
}
