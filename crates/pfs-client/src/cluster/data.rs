//! Data: reads and writes cut at block boundaries (`placement`), writes
//! pipelined through each handle's window (`files`), and what makes them
//! visible: a handle's writes are waited for and the end written on other
//! shards is published to the home (`ExtendSize`) at flush, close, fsync, and
//! whenever this client looks at the file's size (commit consistency:
//! docs/reliability.md; close is not fsync).

use std::sync::Arc;
use std::time::Duration;

use pfs_core::wire::{
    Body, Frame, FrameHeader, Opcode, Reply, Request, WriteRef, WriteTarget, ALL_BLOCKS,
    FLAG_ERROR, FLAG_REPLY, HEADER_LEN, MAX_IO_BYTES, READ_REPLY_PREFIX,
};
use pfs_core::{FileHandle, FileLayout, FsError, FsResult, InodeId, TimeNs};

use super::files::{OpenFile, OpenState, Pending};
use super::placement::{by_shard, Piece, ShardRead};
use super::Cluster;
use crate::conn::{Sent, Waited};

impl Cluster {
    /// Tells the version observer of a change this client made at `ino`'s home
    /// (`None`: one whose outcome is unknown).
    fn changed_version(&self, ino: InodeId, change: Option<(TimeNs, TimeNs)>) {
        if let Some(observe) = self.versions.get() {
            observe(ino, change);
        }
    }

    /// Completes the oldest pending write of `state` (a write to `ino`).
    fn complete_one(&self, ino: InodeId, state: &mut OpenState) {
        if let Some(p) = state.pending.pop_front() {
            let result = self.conns[p.server].wait_boot(p.sent);
            self.conns[p.server].release_pipelined();
            match result {
                Ok((reply, boot)) => {
                    if let Reply::Write { ctime_before, ctime, .. } = reply {
                        self.changed_version(ino, Some((ctime_before, ctime)));
                    }
                    self.note_unsynced(&[ino], p.server as u32, p.worker, boot)
                }
                Err(e) => {
                    self.changed_version(ino, None);
                    // Acknowledged to the caller already: the error waits for its
                    // next write, flush, fsync or close, and the log says so now.
                    log::warn!("a write to inode {ino} failed: {e} (reported at the next call)");
                    state.first_error.get_or_insert(e);
                }
            }
        }
    }

    /// Takes room for one pipelined write to server `s`. While the connection's
    /// pipeline is full, reaps this file's oldest write, or else the writes of
    /// other open files whose owners are not running (the kernel parks a writer
    /// while another writes the same inode): their replies hold credits that
    /// nobody else would give back. With nothing to reap, it waits a little for
    /// the owners that run.
    fn reserve_pipelined(&self, s: usize, file: &Arc<OpenFile>, st: &mut OpenState) {
        let conn = &self.conns[s];
        let limit = conn.pipeline_limit();
        let mut pause = Duration::from_micros(50);
        while !conn.reserve_pipelined(limit) {
            if !st.pending.is_empty() {
                self.complete_one(file.ino, st);
                continue;
            }
            let mut reaped = false;
            for other in self.files.others(file) {
                // A file whose lock is taken has a running owner, who reaps.
                if let Ok(mut theirs) = other.state.try_lock() {
                    while theirs.pending.iter().any(|p| p.server == s) {
                        self.complete_one(other.ino, &mut theirs);
                        reaped = true;
                    }
                }
                if reaped {
                    break;
                }
            }
            if !reaped {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        }
    }

    /// Waits for every write in `st` (a handle of `ino`) and publishes the end
    /// it wrote on other shards; the first write error stays in `st`.
    fn publish(&self, ino: InodeId, st: &mut OpenState) -> FsResult<()> {
        while !st.pending.is_empty() {
            self.complete_one(ino, st);
        }
        if st.extend_to > 0 && st.first_error.is_none() {
            let size = st.extend_to;
            let published = self.call_home(ino, Request::ExtendSize { ino, size }).and_then(|r| {
                expect_reply!(r, Reply::ExtendSize { attr, ctime_before } => (attr, ctime_before))
            });
            let (attr, before) = published.inspect_err(|_| self.changed_version(ino, None))?;
            self.changed_version(ino, Some((before, attr.ctime_ns)));
            st.size = Some(attr.size);
            self.files.published(st);
        }
        Ok(())
    }

    /// Waits for every write of `file`, publishes its end, and returns (and
    /// clears) the first error.
    fn drain(&self, file: &OpenFile) -> FsResult<()> {
        let mut st = file.state.lock().expect("open file lock");
        self.publish(file.ino, &mut st)?;
        match st.first_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes this client's writes to `ino`, through any of its handles, count in
    /// the size at home, so a process always sees its own writes in `stat`.
    /// Write errors stay with their handle for its next write, flush or close.
    /// Returns whether `ino` is open here.
    pub(crate) fn publish_writes(&self, ino: InodeId) -> FsResult<bool> {
        let files = self.files.of_ino(ino);
        for file in &files {
            self.publish(ino, &mut file.state.lock().expect("open file lock"))?;
        }
        Ok(!files.is_empty())
    }

    /// The current size of `ino` at its home.
    fn size_at_home(&self, ino: InodeId) -> FsResult<u64> {
        expect_reply!(self.call_home(ino, Request::GetAttr { ino })?, Reply::GetAttr(a) => a.size)
    }

    /// Has the home of `ino` reserve data past `end` for other shards before
    /// a write there, so the file's removal or truncate frees it even if this
    /// client dies before it publishes the size. Asks for up to twice `end`
    /// (at most 64 MiB more), so a growing file asks once per doubling.
    fn reserve_data(&self, ino: InodeId, end: u64) -> FsResult<u64> {
        let ask = end.saturating_mul(2).min(end.saturating_add(64 << 20)).max(end);
        let ask = ask.min(pfs_core::MAX_FILE_SIZE).max(end);
        expect_reply!(
            self.call_home(ino, Request::ReserveData { ino, end: ask })?,
            Reply::ReserveData { end: got } => got
        )
    }

    /// `FileSystem::read_with`: a read that one request to the file's home
    /// answers is handed to `f` in its reply's buffer; one across shards
    /// inside the size the handle knows is assembled in this thread's scratch
    /// buffer (kept between reads: no allocation, no clearing); any other goes
    /// through [`read_range`](Self::read_range).
    pub(crate) fn read_range_with(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        size: u32,
        f: &mut dyn FnMut(&[u8]),
    ) -> FsResult<()> {
        if size as usize <= MAX_IO_BYTES {
            let file = self.files.get(fh)?;
            let pieces = self.placement.pieces(ino, file.layout, offset, u64::from(size));
            if let [p] = pieces.as_slice() {
                if p.home && self.read_in_reply(ino, p, home_read(ino, fh, p), f)? {
                    return Ok(());
                }
            } else if within_known_size(&file, offset + u64::from(size)) {
                // Out of the thread-local while `f` runs, so nothing borrows it.
                let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
                let n = size as usize;
                if scratch.len() < n {
                    scratch.resize(n, 0);
                }
                let read =
                    self.read_pieces_into(ino, fh, file.layout, pieces, offset, &mut scratch[..n]);
                if let Ok(Some(got)) = &read {
                    f(&scratch[..*got]);
                }
                SCRATCH.with(|s| *s.borrow_mut() = scratch);
                if read?.is_some() {
                    return Ok(());
                }
            }
        }
        f(&self.read_range(ino, fh, offset, size)?);
        Ok(())
    }

    /// `FileSystem::read_into`: the pieces of a read that spans shards are
    /// asked for at once, and each reply's bytes are copied from its buffer
    /// straight to their place in `buf` (a piece answered short is a hole,
    /// zeros). A read one request to the home answers is copied from its
    /// reply's buffer; any other, and one a piece of which failed, goes
    /// through [`read_range`](Self::read_range).
    pub(crate) fn read_range_into(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<usize> {
        let size = buf.len().min(MAX_IO_BYTES);
        let file = self.files.get(fh)?;
        let pieces = self.placement.pieces(ino, file.layout, offset, size as u64);
        let mut n = 0;
        let mut copy = |d: &[u8]| {
            n = d.len().min(size);
            buf[..n].copy_from_slice(&d[..n]);
        };
        if let [p] = pieces.as_slice() {
            if p.home && self.read_in_reply(ino, p, home_read(ino, fh, p), &mut copy)? {
                return Ok(n);
            }
        } else if within_known_size(&file, offset + size as u64) {
            let into = &mut buf[..size];
            if let Some(n) = self.read_pieces_into(ino, fh, file.layout, pieces, offset, into)? {
                return Ok(n);
            }
        }
        let data = self.read_range(ino, fh, offset, size as u32)?;
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    /// `pieces` (of `buf.len()` bytes at `offset` of a file of `layout`),
    /// inside the size this handle knows, each copied into its place in
    /// `buf`: `Ok(None)` when one of them failed (the caller reads again the
    /// long way, which says why or retries).
    fn read_pieces_into(
        &self,
        ino: InodeId,
        fh: FileHandle,
        layout: FileLayout,
        pieces: Vec<Piece>,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<Option<usize>> {
        let sent = self.send_reads(ino, fh, layout, &pieces, offset, buf.len() as u64)?;
        let mut whole = true;
        // Every reply is taken, even after a failure, so none holds a credit.
        for (read, (s, x)) in sent {
            match self.conns[s].wait_raw(x) {
                Ok(raw) => match read_reply_data(raw.bytes()) {
                    Some(d) => scatter(&read.pieces, d, offset, buf),
                    None => whole = false,
                },
                Err(_) => whole = false,
            }
        }
        Ok(whole.then_some(buf.len()))
    }

    /// Sends one request to each shard that holds some of `pieces` (of the
    /// `len` bytes at `offset` of a file of `layout`), for all of its pieces.
    fn send_reads(
        &self,
        ino: InodeId,
        fh: FileHandle,
        layout: FileLayout,
        pieces: &[Piece],
        offset: u64,
        len: u64,
    ) -> FsResult<Vec<(ShardRead, (usize, Sent))>> {
        let size = len as u32;
        let mut sent = Vec::new();
        for read in by_shard(pieces, offset) {
            let blocks = read.blocks;
            let req = if read.home {
                Request::Read { ino, fh, offset, size, blocks }
            } else {
                Request::ReadData { ino, layout, offset, size, blocks }
            };
            let x = self.send_to(read.route.server, read.route.proc_worker, req)?;
            sent.push((read, x));
        }
        Ok(sent)
    }

    /// Sends `req` (the `Read` of `ino`'s piece `p`, at its home) and hands
    /// the bytes of its reply to `f` in the reply's buffer: `Ok(true)`.
    /// `Ok(false)` when the read must take the longer path instead: the
    /// server said to wait (`TryAgain`, retried there with back-off), the
    /// connection dropped (a restarted server: sent again there, once), or
    /// the reply ended short of a write of this client the home does not
    /// count yet (published there first).
    fn read_in_reply(
        &self,
        ino: InodeId,
        p: &Piece,
        req: Request,
        f: &mut dyn FnMut(&[u8]),
    ) -> FsResult<bool> {
        let s = p.route.server.0 as usize;
        let exchanged = self.conns[s].exchange_raw(
            req,
            p.route.proc_worker.0 as u16,
            self.opts.request_timeout,
        )?;
        self.count_sent(p.route.server, p.route.proc_worker);
        let raw = match exchanged {
            Ok(raw) => raw,
            Err(Waited::Dropped(_)) => return Ok(false),
            Err(Waited::Answer(r)) => return r.map(|_| false),
        };
        if let Some(data) = read_reply_data(raw.bytes()) {
            let end = p.offset + data.len() as u64;
            if (data.len() as u64) < p.len && self.files.unpublished_past(ino, end) {
                return Ok(false);
            }
            f(data);
            return Ok(true);
        }
        match Frame::decode_received(raw.bytes()) {
            Ok(Frame { body: Body::Error { error: FsError::TryAgain, .. }, .. }) => Ok(false),
            Ok(Frame { body: Body::Error { error, .. }, .. }) => Err(error),
            Ok(other) => Err(FsError::Io(format!("a read was answered with {:?}", other.opcode()))),
            Err(e) => Err(self.conns[s].bad_reply(e)),
        }
    }

    /// `FileSystem::read`.
    pub(crate) fn read_range(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> FsResult<Vec<u8>> {
        if size as usize > MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("read of {size} bytes: at most 1 MiB")));
        }
        let file = self.files.get(fh)?;
        let layout = file.layout;
        let pieces = self.placement.pieces(ino, layout, offset, u64::from(size));
        if let [p] = pieces.as_slice() {
            if p.home {
                // The home clamps the read to its size: this client's writes
                // elsewhere past the piece's start count there first.
                if self.files.unpublished_past(ino, p.offset) {
                    self.publish_writes(ino)?;
                }
                let req = home_read(ino, fh, p);
                let reply = self.call_to(p.route.server, p.route.proc_worker, req)?;
                return expect_reply!(reply, Reply::Read(d) => d);
            }
        }
        // Data on other shards reads as zeros past the end: clamp to the size.
        let known = file.state.lock().expect("open file lock").size;
        let file_size = match known {
            Some(s) if s >= offset + u64::from(size) => s,
            _ => {
                // Other handles of this client may hold writes the home does
                // not count yet: publish them first (without this lock).
                self.publish_writes(ino)?;
                let s = self.size_at_home(ino)?;
                file.state.lock().expect("open file lock").size = Some(s);
                s
            }
        };
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let len = u64::from(size).min(file_size - offset);
        let pieces = self.placement.pieces(ino, layout, offset, len);
        let sent = self.send_reads(ino, fh, layout, &pieces, offset, len)?;
        let mut out = vec![0u8; len as usize];
        for (read, (s, x)) in sent {
            let data =
                expect_reply!(self.conns[s].wait(x)?, Reply::Read(d) | Reply::ReadData(d) => d)?;
            scatter(&read.pieces, &data, offset, &mut out);
        }
        Ok(out)
    }

    /// `FileSystem::write`: returns once the pieces are sent.
    pub(crate) fn write_range(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
    ) -> FsResult<u32> {
        if data.len() > MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("write of {} bytes: at most 1 MiB", data.len())));
        }
        let file = self.files.get(fh)?;
        let layout = file.layout;
        let mut st = file.state.lock().expect("open file lock");
        if let Some(e) = st.first_error.take() {
            return Err(e);
        }
        for p in self.placement.pieces(ino, layout, offset, data.len() as u64) {
            let (o, n) = (p.offset, p.len);
            let bytes = &data[(o - offset) as usize..(o - offset + n) as usize];
            let target = if p.home {
                WriteTarget::Home(fh)
            } else {
                if o + n > st.reserved {
                    st.reserved = self.reserve_data(ino, o + n)?;
                }
                self.files.wrote_elsewhere(&mut st, o + n);
                WriteTarget::Elsewhere(layout)
            };
            let write = WriteRef { ino, target, offset: o, data: bytes };
            while st.pending.len() >= self.opts.max_unfinished_writes.max(1) {
                self.complete_one(ino, &mut st);
            }
            let server = p.route.server.0 as usize;
            self.reserve_pipelined(server, &file, &mut st);
            let (s, sent) = match self.send_write_to(p.route.server, p.route.proc_worker, &write) {
                Ok(x) => x,
                Err(e) => {
                    self.conns[server].release_pipelined();
                    return Err(e);
                }
            };
            st.pending.push_back(Pending { server: s, worker: p.route.proc_worker.0, sent });
            if self.opts.strict {
                self.complete_one(ino, &mut st);
            }
        }
        if let Some(size) = st.size.as_mut() {
            *size = (*size).max(offset + data.len() as u64);
        }
        if let Some(e) = st.first_error.take() {
            return Err(e);
        }
        Ok(data.len() as u32)
    }

    /// `FileSystem::append`: the home grows the file by `data`'s length and
    /// says where it was (`Append`, one step on its worker), and the bytes go
    /// there as any write's. Until they land, readers on other clients may
    /// see zeros there; they are promised the bytes at this client's close
    /// (docs/reliability.md), as for any write.
    pub(crate) fn append_range(
        &self,
        ino: InodeId,
        fh: FileHandle,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<(u64, u32)> {
        if data.len() > MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("append of {} bytes: at most 1 MiB", data.len())));
        }
        let file = self.files.get(fh)?;
        if let Some(e) = file.state.lock().expect("open file lock").first_error.take() {
            return Err(e);
        }
        let len = data.len() as u64;
        let grown = self.call_home(ino, Request::Append { ino, len, kill_suidgid }).and_then(|r| {
            expect_reply!(r, Reply::Append { offset, attr, ctime_before } => (offset, attr, ctime_before))
        });
        let (offset, attr, before) = grown.inspect_err(|_| self.changed_version(ino, None))?;
        self.changed_version(ino, Some((before, attr.ctime_ns)));
        Ok((offset, self.write_range(ino, fh, offset, data)?))
    }

    /// `FileSystem::flush`.
    pub(crate) fn flush_handle(&self, fh: FileHandle) -> FsResult<()> {
        self.drain(&*self.files.get(fh)?)
    }

    /// `FileSystem::fsync`: every write of this client to the file, through
    /// any handle, made visible and then durable.
    pub(crate) fn fsync_handle(&self, ino: InodeId, fh: FileHandle) -> FsResult<()> {
        self.publish_writes(ino)?;
        let file = self.files.get(fh)?;
        self.drain(&file)?;
        self.sync_inodes(&[file.ino], &[])
    }

    /// `FileSystem::release`. Close is not fsync (docs/reliability.md): it
    /// makes the writes and the size visible to every client; they stay noted as
    /// unsynced, so a later fsync of the file (through any handle) commits them.
    pub(crate) fn release_handle(&self, fh: FileHandle) -> FsResult<()> {
        let file = self.files.close(fh)?;
        let drained = self.drain(&file);
        // A failed write left its end unpublished: it goes with the handle.
        self.files.published(&mut file.state.lock().expect("open file lock"));
        drained
    }

    /// `FileSystem::fallocate`: mode 0 grows the size; `KEEP_SIZE` allocates
    /// nothing (blocks are allocated as they are written).
    pub(crate) fn fallocate_range(
        &self,
        ino: InodeId,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> FsResult<()> {
        if keep_size {
            return Ok(());
        }
        let size = offset.checked_add(len).ok_or(FsError::FileTooLarge)?;
        expect_reply!(self.call_home(ino, Request::ExtendSize { ino, size })?, Reply::ExtendSize { .. } => ())
    }
}

std::thread_local! {
    /// Where a read across shards for `read_with` is assembled: one per
    /// thread, at most `MAX_IO_BYTES`, kept for the thread's next read.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `Read` of the one piece `p` of a read, at the file's home.
fn home_read(ino: InodeId, fh: FileHandle, p: &Piece) -> Request {
    Request::Read { ino, fh, offset: p.offset, size: p.len as u32, blocks: ALL_BLOCKS }
}

/// Copies the reply `data` of one shard's pieces (`(offset, len)`, their bytes
/// one after the other, short at the end of the file) to their places in
/// `out`, the read at `offset`; what the reply lacks is zeros.
fn scatter(pieces: &[(u64, u64)], mut data: &[u8], offset: u64, out: &mut [u8]) {
    for &(o, n) in pieces {
        let dst = &mut out[(o - offset) as usize..(o - offset + n) as usize];
        let k = dst.len().min(data.len());
        dst[..k].copy_from_slice(&data[..k]);
        dst[k..].fill(0);
        data = &data[k..];
    }
}

/// Whether bytes up to `end` of `file` are inside the size its handle learned
/// from the home (reads there need no clamping).
fn within_known_size(file: &OpenFile, end: u64) -> bool {
    file.state.lock().expect("open file lock").size.is_some_and(|s| s >= end)
}

/// The data of a `Read` or `ReadData` reply frame, in place; `None` for any other frame
/// (an error, another opcode, a length that does not add up).
fn read_reply_data(frame: &[u8]) -> Option<&[u8]> {
    let header = FrameHeader::decode(frame).ok()?;
    let data_reply = [Opcode::Read as u16, Opcode::ReadData as u16].contains(&header.opcode);
    // A data reply, not an error (whatever its checksum covers).
    if header.flags & (FLAG_REPLY | FLAG_ERROR) != FLAG_REPLY || !data_reply {
        return None;
    }
    let len = u32::from_le_bytes(frame.get(HEADER_LEN..READ_REPLY_PREFIX)?.try_into().ok()?);
    let data = frame.get(READ_REPLY_PREFIX..)?;
    (data.len() == len as usize && len as usize <= MAX_IO_BYTES).then_some(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::Sum;
    use pfs_core::{ClientId, RequestId};

    fn sealed(op: Opcode, data: &[u8], sum: Sum) -> Vec<u8> {
        let mut buf = vec![0; READ_REPLY_PREFIX];
        buf.extend_from_slice(data);
        Frame::seal_read_reply(&mut buf, RequestId(3), ClientId(4), op, sum).unwrap();
        buf
    }

    /// A read reply's data is taken in place, however its checksum was summed;
    /// an error, another reply or a length that does not add up is not data.
    #[test]
    fn read_reply_data_is_the_data_of_read_replies_only() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 241) as u8).collect();
        for op in [Opcode::Read, Opcode::ReadData] {
            for sum in [Sum::Full, Sum::Header] {
                let frame = sealed(op, &data, sum);
                assert_eq!(read_reply_data(&frame), Some(&data[..]), "{op:?} {sum:?}");
                assert_eq!(read_reply_data(&sealed(op, &[], sum)), Some(&[][..]));
            }
        }
        let error = Frame {
            request_id: RequestId(3),
            client: ClientId(4),
            body: Body::Error { op: Opcode::Read, error: FsError::NotFound },
        };
        for sum in [Sum::Full, Sum::Header] {
            let mut e = Vec::new();
            error.encode_summed(&mut e, ClientId(4), RequestId(3), 0, sum).unwrap();
            assert_eq!(read_reply_data(&e), None, "an error reply, {sum:?}");
        }
        let getattr = Frame {
            request_id: RequestId(3),
            client: ClientId(4),
            body: Body::Reply(Reply::Fsync),
        };
        assert_eq!(read_reply_data(&getattr.to_bytes().unwrap()), None, "another reply");
        let mut short = sealed(Opcode::Read, &data, Sum::Full);
        short.pop();
        assert_eq!(read_reply_data(&short), None, "one byte short of its length");
        assert_eq!(read_reply_data(&short[..10]), None, "not even a header");
    }

    /// One shard's reply holds its pieces one after the other; each lands at
    /// its place in the read, and what a short reply lacks reads as zeros.
    #[test]
    fn a_shard_reply_is_scattered_to_its_pieces() {
        let offset = 1000;
        let pieces = [(1000, 10), (1030, 5), (1050, 20)];
        let data: Vec<u8> = (1..=35).collect();
        let mut out = vec![0xEE; 70];
        scatter(&pieces, &data, offset, &mut out);
        assert_eq!(&out[0..10], &data[0..10]);
        assert_eq!(&out[10..30], &[0xEE; 20][..], "not this shard's");
        assert_eq!(&out[30..35], &data[10..15]);
        assert_eq!(&out[50..70], &data[15..35]);
        // Short at the end of the file: the rest of the last piece and the
        // pieces past it are zeros.
        let mut out = vec![0xEE; 70];
        scatter(&pieces, &data[..12], offset, &mut out);
        assert_eq!(&out[0..10], &data[0..10]);
        assert_eq!(&out[30..32], &data[10..12]);
        assert_eq!(&out[32..35], &[0; 3][..]);
        assert_eq!(&out[50..70], &[0; 20][..]);
    }
}
