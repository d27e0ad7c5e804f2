//! Where a request goes (docs/cluster.md, "Routing"): the shard of each key in a
//! view of `servers` x `workers`, and a byte range of a file cut into the pieces
//! one shard holds. Pure: no connection, no lock.

use pfs_core::routing::home_of;
use pfs_core::wire::read_block_bit;
use pfs_core::{
    ClientId, FileLayout, InodeId, Route, RouteKey, ServerId, WorkerId, BLOCK_SIZE_BYTES,
};

/// The shape of the cluster this client routes by, and its id (which picks the
/// communicating worker of each server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    servers: u32,
    workers: u32,
    client: ClientId,
}

/// A run of a file's bytes that one shard holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The shard.
    pub route: Route,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The shard is the file's home: `Read`/`Write` there, `ReadData`/`WriteData`
    /// elsewhere.
    pub home: bool,
}

impl Placement {
    /// Routing for client `client` in a view of `servers` x `workers`.
    pub fn new(servers: u32, workers: u32, client: ClientId) -> Placement {
        assert!(servers > 0 && workers > 0, "a view has at least one server and worker");
        Placement { servers, workers, client }
    }

    /// Servers in the view.
    pub fn servers(&self) -> u32 {
        self.servers
    }

    /// Workers (shards) per server.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// The route of `key`.
    pub fn route(&self, key: RouteKey<'_>) -> Route {
        Route::new(key.lambda(self.servers, self.workers), self.client, self.servers, self.workers)
    }

    /// The shard that holds inode `ino`.
    pub fn home(&self, ino: InodeId) -> (ServerId, WorkerId) {
        home_of(ino, self.servers, self.workers)
    }

    /// Whether `route` runs on the home shard of `ino`.
    pub fn is_home(&self, ino: InodeId, route: &Route) -> bool {
        let (s, w) = self.home(ino);
        route.server == s && route.proc_worker == w
    }

    /// Every shard, in shard order.
    pub fn all_shards(&self) -> impl Iterator<Item = (ServerId, WorkerId)> {
        let workers = self.workers;
        (0..self.servers).flat_map(move |s| (0..workers).map(move |w| (ServerId(s), WorkerId(w))))
    }

    /// Cuts `offset..offset + len` of file `ino` into the runs one shard holds,
    /// in file order: consecutive blocks on one shard make one piece, except in
    /// the `io` layout, where each block's piece is one write's extent.
    pub fn pieces(&self, ino: InodeId, layout: FileLayout, offset: u64, len: u64) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        let end = offset.saturating_add(len);
        let mut at = offset;
        while at < end {
            let block_end = (at / BLOCK_SIZE_BYTES + 1) * BLOCK_SIZE_BYTES;
            let n = block_end.min(end) - at;
            let route = self.route(RouteKey::data_at(ino, layout, at, BLOCK_SIZE_BYTES));
            match out.last_mut() {
                Some(p) if p.route == route && layout != FileLayout::Io => p.len += n,
                _ => out.push(Piece { route, offset: at, len: n, home: self.is_home(ino, &route) }),
            }
            at += n;
        }
        out
    }
}

/// The pieces of one read that one shard holds: one request asks for all of
/// them (`blocks` of the read's range, `pfs_core::wire::read_segments`), and
/// its reply holds their bytes one after the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRead {
    /// The shard.
    pub route: Route,
    /// The shard is the file's home (`Read` there, `ReadData` elsewhere).
    pub home: bool,
    /// The blocks of the read's range the pieces lie in.
    pub blocks: u32,
    /// `(offset, len)` of each piece, in file order.
    pub pieces: Vec<(u64, u64)>,
}

/// Groups `pieces` of a read at `offset` (in file order, within
/// `MAX_IO_BYTES` of it) by shard, in the order each shard first appears.
pub fn by_shard(pieces: &[Piece], offset: u64) -> Vec<ShardRead> {
    let mut out: Vec<ShardRead> = Vec::new();
    for p in pieces {
        let blocks = (p.offset..p.offset + p.len)
            .step_by(BLOCK_SIZE_BYTES as usize)
            .chain(std::iter::once(p.offset + p.len - 1))
            .fold(0, |m, at| m | read_block_bit(offset, at));
        match out.iter_mut().find(|r| r.route == p.route) {
            Some(r) => {
                r.blocks |= blocks;
                r.pieces.push((p.offset, p.len));
            }
            None => out.push(ShardRead {
                route: p.route,
                home: p.home,
                blocks,
                pieces: vec![(p.offset, p.len)],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::ShardId;

    const B: u64 = BLOCK_SIZE_BYTES;

    fn file(shard: u32) -> InodeId {
        InodeId::compose(ShardId(shard), 42)
    }

    /// The pieces tile the range exactly, in order.
    fn assert_tiles(pieces: &[Piece], offset: u64, len: u64) {
        let mut at = offset;
        for p in pieces {
            assert_eq!(p.offset, at, "{pieces:?}");
            assert!(p.len > 0);
            at += p.len;
        }
        assert_eq!(at, offset + len, "{pieces:?}");
    }

    #[test]
    fn a_file_layout_file_is_one_piece_at_its_home() {
        let p = Placement::new(3, 4, ClientId(7));
        let ino = file(5);
        let pieces = p.pieces(ino, FileLayout::File, 100, 10 * B);
        assert_eq!(pieces.len(), 1);
        assert!(pieces[0].home);
        assert_eq!((pieces[0].route.server, pieces[0].route.proc_worker), p.home(ino));
        assert_tiles(&pieces, 100, 10 * B);
    }

    #[test]
    fn block_layout_pieces_merge_neighbours_on_one_shard_and_start_at_home() {
        let p = Placement::new(2, 2, ClientId(1));
        let ino = file(3);
        let pieces = p.pieces(ino, FileLayout::Block, 10, 40 * B);
        assert_tiles(&pieces, 10, 40 * B);
        assert!(pieces[0].home, "block 0 lives with the inode");
        for w in pieces.windows(2) {
            assert_ne!(w[0].route, w[1].route, "neighbours on one shard were not merged");
        }
        for piece in &pieces {
            assert_eq!(piece.home, p.is_home(ino, &piece.route));
            // Each piece starts on a block boundary, except the first.
            assert!(piece.offset == 10 || piece.offset % B == 0);
        }
        // Some data lands away from the home in a cluster of 4 shards.
        assert!(pieces.iter().any(|piece| !piece.home));
    }

    #[test]
    fn io_layout_pieces_are_one_per_block() {
        let p = Placement::new(1, 1, ClientId(1));
        let pieces = p.pieces(file(0), FileLayout::Io, B - 1, 3 * B);
        assert_eq!(pieces.len(), 4, "one shard, yet one piece per block: {pieces:?}");
        assert_eq!(pieces[0].len, 1);
        assert_tiles(&pieces, B - 1, 3 * B);
    }

    #[test]
    fn an_empty_range_has_no_pieces_and_all_shards_lists_each_once() {
        let p = Placement::new(2, 3, ClientId(9));
        assert!(p.pieces(file(1), FileLayout::Block, 5, 0).is_empty());
        let shards: Vec<_> = p.all_shards().collect();
        assert_eq!(shards.len(), 6);
        assert_eq!(shards[4], (ServerId(1), WorkerId(1)));
        let (s, w) = p.home(file(4));
        assert_eq!((s, w), (ServerId(1), WorkerId(1)), "shard 4 of 2 x 3");
    }

    /// Each shard's blocks pick exactly its pieces of the read: the segments
    /// of its `blocks` are its pieces, merged where they touch.
    #[test]
    fn a_read_asks_each_shard_once_for_exactly_its_pieces() {
        use pfs_core::wire::{read_segments, MAX_IO_BYTES};
        let p = Placement::new(2, 3, ClientId(4));
        let ino = file(2);
        for (layout, offset, len) in [
            (FileLayout::Block, 0, MAX_IO_BYTES as u64),
            (FileLayout::Block, B - 1, MAX_IO_BYTES as u64),
            (FileLayout::Block, 7 * B + 100, 3 * B),
            (FileLayout::Io, B / 2, MAX_IO_BYTES as u64 - B),
            (FileLayout::File, 12345, MAX_IO_BYTES as u64),
        ] {
            let pieces = p.pieces(ino, layout, offset, len);
            let reads = by_shard(&pieces, offset);
            let shards: std::collections::HashSet<_> = pieces.iter().map(|x| x.route).collect();
            assert_eq!(reads.len(), shards.len(), "one request per shard");
            let mut covered = 0;
            for r in &reads {
                let mut merged: Vec<(u64, u64)> = Vec::new();
                for &(o, n) in &r.pieces {
                    match merged.last_mut() {
                        Some((mo, mn)) if *mo + *mn == o => *mn += n,
                        _ => merged.push((o, n)),
                    }
                }
                assert_eq!(read_segments(offset, len, r.blocks), merged, "{layout:?} at {offset}");
                assert_eq!(r.home, p.is_home(ino, &r.route));
                covered += r.pieces.iter().map(|x| x.1).sum::<u64>();
            }
            assert_eq!(covered, len);
        }
    }
}
