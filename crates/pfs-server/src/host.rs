//! What a worker lends the multi-shard state machines it drives: cross-shard
//! renames ([`crate::cross`]), bigdir rmdirs ([`crate::rmdir`]), follow-ups
//! ([`crate::follow`]) and the sweep of orphaned data ([`crate::sweep`]).
//!
//! Each machine keeps its own state and takes a [`Host`] for every step: the
//! worker's shard, its clock, its way to other shards (over the worker rings
//! inside this server, over a connection to another), and its way back to a
//! waiting client. So the machines never see the worker, and the worker
//! (`worker/`) is the only module that knows them all: nothing imports it back.

use std::time::Instant;

use pfs_core::wire::{Body, Reply, Request};
use pfs_core::{FsError, FsResult, RequestId, ServerId, WorkerId};
use pfs_store::device::Device;
use pfs_store::Shard;

use crate::msg::{ConnRef, Waiter};
use crate::peers::PeerError;

/// Stops in a row of one step of a machine (below), weighed as a request's
/// (`stopped::stop_weight`: four stops, a stop at a page still being read or
/// written back, or with no room to read it, a sixteenth of one); then it
/// waits for the device, so none stops for ever (a page can be evicted again
/// before the step runs).
pub(crate) const STEP_STOPS_MAX: u8 = crate::stopped::TRIES_MAX;

/// The stops in a row of one machine's step, and the shard's background
/// progress from before the last one (`Shard::background_progress`): the
/// step runs again only once that moved. Before, it ran again in the next
/// round, a few microseconds later, found its page read still in flight,
/// and after four such rounds read it waiting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepStops {
    count: u8,
    at: Option<(u64, u64, u64, u64)>,
}

impl StepStops {
    /// Whether the step stopped and has not run through since.
    pub(crate) fn any(&self) -> bool {
        self.count > 0
    }
}

/// The worker as a multi-shard step sees it.
pub(crate) trait Host<D: Device> {
    /// The worker's number in its server (for log lines).
    fn worker_id(&self) -> u16;
    /// The time of the worker's round.
    fn now(&self) -> Instant;
    /// The worker's shard.
    fn shard(&mut self) -> &mut Shard<D>;
    /// Workers per server.
    fn workers(&self) -> u32;
    /// Servers and workers per server of the cluster, once the view came.
    fn shape(&self) -> Option<(u32, u32)>;
    /// Sends `req` to `worker` of `server`; its reply is asked for with
    /// [`poll`](Self::poll).
    fn send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError>;
    /// The reply to `id`, sent to `server`, if it came (`Ok(None)`: not yet;
    /// `Err`: the connection failed, ask again).
    fn poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String>;
    /// Drops the connection to `server` (it failed); the next send makes one.
    fn forget_conn(&mut self, server: ServerId);
    /// Whether the client behind `w` is still connected where it asked.
    fn connected(&self, w: &Waiter) -> bool;
    /// Answers the client behind `w` once what the shard logged so far is
    /// committed: a refusal told before its record is durable could be undone
    /// by recovery.
    fn answer(&mut self, w: Waiter, body: Body);
    /// The shard changed: the commit timer runs.
    fn changed(&mut self);
    /// Sends reply frame `buf` to connection `conn` of worker `origin` (a
    /// reply held until a step finished).
    fn send_reply(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>);

    /// Runs `step` on the shard so that it stops, as a request does, instead
    /// of waiting for the device: at an inode page not in memory, a commit it
    /// needs first, or a full log, before it changed anything
    /// (`Shard::set_defer_misses`). `None`: it stopped and changed nothing,
    /// or stopped before and what it waits for has not moved yet (it does not
    /// run); the machine asks again in a later round. `stops` counts the stops
    /// in a row: after [`STEP_STOPS_MAX`] the step waits for the device instead.
    fn step<T>(
        &mut self,
        stops: &mut StepStops,
        step: impl FnOnce(&mut Shard<D>) -> FsResult<T>,
    ) -> Option<FsResult<T>> {
        let shard = self.shard();
        // Collected here: nothing else may collect them in a round with no
        // stopped request.
        shard.icache_reads_done();
        shard.data_requests_done();
        let before = shard.background_progress();
        if stops.at == Some(before) {
            return None;
        }
        shard.set_defer_misses(stops.count < STEP_STOPS_MAX);
        let result = step(shard);
        shard.set_defer_misses(false);
        let stopped = match &result {
            Err(FsError::TryAgain) => shard.take_deferred(),
            _ => None,
        };
        if let Some(on) = stopped {
            stops.count = stops.count.saturating_add(crate::stopped::stop_weight(on));
            stops.at = Some(before);
            return None;
        }
        *stops = StepStops::default();
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use pfs_core::{FileType, InodeId, ShardId};
    use pfs_store::device::MemDevice;
    use pfs_store::shard::{CreateArgs, FormatOptions, ShardOptions};
    use pfs_store::DeferredOn;

    use super::*;

    /// A worker lending only its shard and clock: what `step` uses.
    struct ShardOnly {
        shard: Shard<MemDevice>,
        now: Instant,
    }

    impl Host<MemDevice> for ShardOnly {
        fn worker_id(&self) -> u16 {
            0
        }
        fn now(&self) -> Instant {
            self.now
        }
        fn shard(&mut self) -> &mut Shard<MemDevice> {
            &mut self.shard
        }
        fn workers(&self) -> u32 {
            1
        }
        fn shape(&self) -> Option<(u32, u32)> {
            Some((1, 1))
        }
        fn send(&mut self, _: ServerId, _: WorkerId, _: Request) -> Result<RequestId, PeerError> {
            unreachable!("a step talks to its shard only")
        }
        fn poll(
            &mut self,
            _: ServerId,
            _: RequestId,
        ) -> Result<Option<Result<Reply, FsError>>, String> {
            unreachable!("a step talks to its shard only")
        }
        fn forget_conn(&mut self, _: ServerId) {
            unreachable!("a step talks to its shard only")
        }
        fn connected(&self, _: &Waiter) -> bool {
            unreachable!("a step talks to its shard only")
        }
        fn answer(&mut self, _: Waiter, _: Body) {
            unreachable!("a step talks to its shard only")
        }
        fn changed(&mut self) {}
        fn send_reply(&mut self, _: u16, _: ConnRef, _: Vec<u8>) {
            unreachable!("a step talks to its shard only")
        }
    }

    /// A shard whose first file's inode page is not in memory, and its
    /// device's handle.
    fn cold_shard() -> (Shard<MemDevice>, MemDevice, Vec<InodeId>) {
        let opts = ShardOptions { icache_blocks: 32, ..ShardOptions::default() };
        let dev = MemDevice::new(64 << 20, 64);
        let handle = dev.handle();
        let mut s =
            Shard::format(dev, &FormatOptions::new(ShardId(0), 64 << 20), opts.clone()).unwrap();
        let mut inos = Vec::new();
        for i in 0..2000 {
            let name = format!("f{i:04}");
            inos.push(
                s.create(InodeId::ROOT, name.as_bytes(), CreateArgs::file(0o640)).unwrap().ino,
            );
        }
        s.commit().unwrap();
        s.checkpoint().unwrap();
        drop(s);
        let dev = handle.crash(1);
        let handle = dev.handle();
        let mut shard = Shard::open(dev, 0, opts).unwrap();
        // The last 1,000 inodes (63 pages) read after the open: the first
        // file's page (32 resident at most) is not in memory.
        for &ino in &inos[1000..] {
            shard.getattr(ino).unwrap();
        }
        (shard, handle, inos)
    }

    fn rename(s: &mut Shard<MemDevice>) -> FsResult<bool> {
        s.rename(
            InodeId::ROOT,
            b"f0000",
            InodeId::ROOT,
            b"moved",
            pfs_store::RenameFlags::default(),
        )
        .map(|replaced| replaced.is_some())
    }

    /// A step whose inode page is not in memory stops with nothing changed;
    /// asked again while the read is in flight it does not run (it runs
    /// again once a background request finished, not in the next round);
    /// then it runs without waiting.
    #[test]
    fn a_step_stops_at_a_cold_page_and_runs_again_once_its_read_finished() {
        let (shard, handle, inos) = cold_shard();
        let mut h = ShardOnly { shard, now: Instant::now() };
        handle.hold(Some(0..u64::MAX));
        let mut stops = StepStops::default();
        for round in 0..10 {
            assert!(h.step(&mut stops, rename).is_none(), "round {round}");
            assert_eq!(
                stops.count,
                crate::stopped::stop_weight(DeferredOn::InodePage),
                "asked again before its read finished: not run"
            );
            assert_eq!(h.shard.lookup(InodeId::ROOT, b"f0000").unwrap().ino, inos[0]);
            assert!(h.shard.take_deferred().is_none(), "step took what it stopped at");
        }
        handle.hold(None);
        let misses = h.shard.stats().icache.misses;
        let ran = h.step(&mut stops, rename).expect("its read finished: it runs");
        assert!(!ran.unwrap(), "nothing replaced");
        assert_eq!(stops, StepStops::default(), "a step that ran starts the count again");
        assert_eq!(h.shard.stats().icache.misses, misses, "read its page waiting");
        assert_eq!(h.shard.lookup(InodeId::ROOT, b"moved").unwrap().kind, FileType::Regular);
    }

    /// A step's stop at a page still being read weighs a sixteenth of one,
    /// as a request's does: run again each time other background requests
    /// finished while its own page read is held in flight, it stops ten
    /// times and never reads its page waiting (with each stop counted whole,
    /// the fifth time it read the held page waiting, and the device panics).
    #[test]
    fn a_step_stop_at_a_page_still_being_read_weighs_a_sixteenth() {
        let (shard, handle, inos) = cold_shard();
        let mut h = ShardOnly { shard, now: Instant::now() };
        let mut stops = StepStops::default();
        handle.hold(Some(0..u64::MAX));
        assert!(h.step(&mut stops, rename).is_none());
        let page = handle.reads_in_flight().pop().expect("the step's page read");
        handle.hold(Some(page));
        let full = crate::stopped::stop_weight(DeferredOn::InodePage);
        assert_eq!(stops.count, full);
        let mut others = inos[32..1000].iter().step_by(16);
        for k in 1..=10u8 {
            // Another cold page read and finished: the background moved.
            let other = *others.next().unwrap();
            h.shard.set_defer_misses(true);
            assert_eq!(h.shard.getattr(other).unwrap_err(), FsError::TryAgain);
            h.shard.set_defer_misses(false);
            h.shard.take_deferred();
            assert!(h.step(&mut stops, rename).is_none(), "stop {k}");
            assert_eq!(stops.count, full + k, "stop {k} weighed a sixteenth");
        }
        handle.hold(None);
        let misses = h.shard.stats().icache.misses;
        let ran = loop {
            if let Some(ran) = h.step(&mut stops, rename) {
                break ran;
            }
        };
        assert!(!ran.unwrap(), "nothing replaced");
        assert_eq!(h.shard.stats().icache.misses, misses, "read its page waiting");
    }

    /// After `STEP_STOPS_MAX` stops in a row a step waits for the device and
    /// runs, so none stops for ever.
    #[test]
    fn a_step_waits_after_four_stops() {
        let (shard, _handle, _) = cold_shard();
        let mut h = ShardOnly { shard, now: Instant::now() };
        let mut stops = StepStops { count: STEP_STOPS_MAX, at: None };
        let misses = h.shard.stats().icache.misses;
        let ran = h.step(&mut stops, rename).expect("the fifth time it waits and runs");
        assert!(!ran.unwrap(), "nothing replaced");
        assert!(h.shard.stats().icache.misses > misses, "it read its page waiting");
        assert_eq!(h.shard.lookup(InodeId::ROOT, b"moved").unwrap().kind, FileType::Regular);
    }
}
