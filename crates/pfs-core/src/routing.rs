//! Request routing: the characteristic value lambda and where it sends a request.
//!
//! Every request has a characteristic value lambda (PeakFS, section III-C1), computed
//! from the request and the layout of the directory or file it touches. Client `i`
//! sends the request to server `lambda mod servers`, where communicating worker
//! `i mod workers` receives it and forwards it to processing worker
//! `(lambda / servers) mod workers`, which owns the shard that runs it.
//!
//! Lambda is xxh3-64 (seed 0) of the little-endian key bytes; clients and servers must
//! agree on these bytes, so they are part of the protocol (`docs/format.md`):
//!
//! | request | lambda |
//! |---|---|
//! | dentry op (lookup, create, mkdir, unlink, ...) in a `bigdir` | `xxh3(parent_ino ‖ name)` |
//! | dentry op in a `regular` directory | `xxh3(parent_ino)`, the parent's own placement |
//! | inode op by inode number (getattr, open, xattr, ...) | `xxh3(ino)` |
//! | data, `block` layout | `xxh3(ino ‖ block)`; block 0 goes with the inode: `xxh3(ino)` |
//! | data, `file` layout | `xxh3(ino)` |
//! | data, `io` layout | `xxh3(ino ‖ block)` for every block, block = offset / block size |
//!
//! Integers are 8 bytes little-endian and `‖` is concatenation. A request for one
//! particular shard (readdir of a bigdir visits them all) uses [`Lambda::targeting`].

use twox_hash::XxHash3_64;

use crate::{BlockIndex, ClientId, DirLayout, FileLayout, InodeId, ServerId, WorkerId, NAME_MAX};

/// The characteristic value of a request; it alone decides server and processing worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lambda(pub u64);

impl Lambda {
    /// `xxh3(ino)`: the placement of an inode and of everything that goes with it.
    pub fn of_inode(ino: InodeId) -> Lambda {
        Lambda(XxHash3_64::oneshot(&ino.0.to_le_bytes()))
    }

    /// `xxh3(parent ‖ name)`: a dentry of a bigdir and the inode created with it.
    pub fn of_name(parent: InodeId, name: &[u8]) -> Lambda {
        assert!(name.len() <= NAME_MAX, "name of {} bytes reached routing", name.len());
        // A stack buffer: routing runs per request and must not allocate.
        let mut buf = [0u8; 8 + NAME_MAX];
        buf[..8].copy_from_slice(&parent.0.to_le_bytes());
        buf[8..8 + name.len()].copy_from_slice(name);
        Lambda(XxHash3_64::oneshot(&buf[..8 + name.len()]))
    }

    /// `xxh3(ino ‖ block)`: one block of a file's data.
    pub fn of_block(ino: InodeId, block: BlockIndex) -> Lambda {
        let mut buf = [0u8; 16];
        buf[..8].copy_from_slice(&ino.0.to_le_bytes());
        buf[8..].copy_from_slice(&block.0.to_le_bytes());
        Lambda(XxHash3_64::oneshot(&buf))
    }

    /// A lambda that routes to processing worker `worker` on `server` of a cluster
    /// with `servers` servers, for requests aimed at one shard rather than a key.
    pub fn targeting(server: ServerId, worker: WorkerId, servers: u32) -> Lambda {
        assert!(servers > 0, "a cluster has at least one server");
        assert!(server.0 < servers, "server {server} outside a cluster of {servers}");
        Lambda(u64::from(server.0) + u64::from(servers) * u64::from(worker.0))
    }
}

/// What a request touches, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKey<'a> {
    /// A name in a directory: lookup, create, mkdir, mknod, symlink, unlink, rmdir, and
    /// each side of a rename.
    Dentry {
        /// The directory holding the name.
        parent: InodeId,
        /// The layout of that directory.
        layout: DirLayout,
        /// The name (at most `NAME_MAX` bytes).
        name: &'a [u8],
    },
    /// An operation on an inode by number: getattr, setattr, open, release, readlink,
    /// fsync, xattrs, layout get/set, tokens of a directory.
    Inode(InodeId),
    /// File data: read or write of one block.
    Data {
        /// The file.
        ino: InodeId,
        /// The file's data layout.
        layout: FileLayout,
        /// The block (for the `io` layout, the block the write's offset falls in).
        block: BlockIndex,
    },
}

impl RouteKey<'_> {
    /// The data key for byte `offset` of a file whose blocks are `block_size_bytes`.
    pub fn data_at(
        ino: InodeId,
        layout: FileLayout,
        offset: u64,
        block_size_bytes: u64,
    ) -> RouteKey<'static> {
        RouteKey::Data { ino, layout, block: BlockIndex::of_offset(offset, block_size_bytes) }
    }

    /// The characteristic value of this key in a cluster of `servers` x `workers`.
    /// Keys that live with an inode (inode operations, names in a regular
    /// directory, block 0 of a `block` file, all of a `file` file) target the shard
    /// that inode number names (docs/cluster.md); the others are hashed.
    pub fn lambda(&self, servers: u32, workers: u32) -> Lambda {
        let home = |ino: InodeId| {
            let (server, worker) = home_of(ino, servers, workers);
            Lambda::targeting(server, worker, servers)
        };
        match *self {
            RouteKey::Dentry { parent, layout: DirLayout::BigDir, name } => {
                Lambda::of_name(parent, name)
            }
            RouteKey::Dentry { parent, layout: DirLayout::Regular, .. } => home(parent),
            RouteKey::Inode(ino) => home(ino),
            RouteKey::Data { ino, layout: FileLayout::Block, block } if block.0 == 0 => home(ino),
            RouteKey::Data { ino, layout: FileLayout::Block | FileLayout::Io, block } => {
                Lambda::of_block(ino, block)
            }
            RouteKey::Data { ino, layout: FileLayout::File, .. } => home(ino),
        }
    }
}

/// The server and worker owning inode `ino`: its number names the global shard
/// `g = server * workers + worker` that allocated it (the root lives on shard 0).
pub fn home_of(ino: InodeId, servers: u32, workers: u32) -> (ServerId, WorkerId) {
    assert!(servers > 0 && workers > 0, "a cluster has at least one server and worker");
    let shards = u64::from(servers) * u64::from(workers);
    let g = ino.shard().map_or(0, |s| u64::from(s.0)) % shards;
    (ServerId((g / u64::from(workers)) as u32), WorkerId((g % u64::from(workers)) as u32))
}

/// The global shard that holds name `name` of directory `parent` (of
/// metadata layout `layout`) in a cluster of `servers` x `workers`: where
/// lookups and listings look for it.
pub fn dentry_shard(
    parent: InodeId,
    layout: DirLayout,
    name: &[u8],
    servers: u32,
    workers: u32,
) -> crate::ShardId {
    let key = RouteKey::Dentry { parent, layout, name };
    let at = Route::new(key.lambda(servers, workers), ClientId(0), servers, workers);
    shard_of(at.server, at.proc_worker, workers)
}

/// The global shard id of `worker` on `server`.
pub fn shard_of(server: ServerId, worker: WorkerId, workers: u32) -> crate::ShardId {
    crate::ShardId(server.0 * workers + worker.0)
}

/// Every shard but `ino`'s home that may hold bytes `size..old_size` of a file
/// of `layout` with blocks of `block_size` bytes, in shard order: where a
/// truncate or the removal of the file must free data. Block 0 of a `block`
/// file and all of a `file` file are at the home. A range of more blocks than
/// 16 per shard names every shard rather than hash each block (a sparse file
/// of 1 PiB must not cost 2^34 hashes).
pub fn data_shards(
    ino: InodeId,
    layout: FileLayout,
    size: u64,
    old_size: u64,
    block_size: u64,
    servers: u32,
    workers: u32,
) -> Vec<(ServerId, WorkerId)> {
    let home = home_of(ino, servers, workers);
    let home_holds = if layout == FileLayout::Block { block_size } else { 0 };
    if layout == FileLayout::File || block_size == 0 || old_size <= size.max(home_holds) {
        return Vec::new();
    }
    let all = (0..servers).flat_map(|s| (0..workers).map(move |w| (ServerId(s), WorkerId(w))));
    let others = (servers as usize * workers as usize).saturating_sub(1);
    let (first, last) = (size / block_size, old_size.div_ceil(block_size));
    if last - first > 16 * (others as u64 + 1) {
        return all.filter(|&sw| sw != home).collect();
    }
    let mut found = std::collections::BTreeSet::new();
    for b in first..last {
        let key = RouteKey::Data { ino, layout, block: BlockIndex(b) };
        let r = Route::new(key.lambda(servers, workers), ClientId(0), servers, workers);
        if (r.server, r.proc_worker) != home {
            found.insert((r.server.0, r.proc_worker.0));
        }
        if found.len() == others {
            break;
        }
    }
    found.into_iter().map(|(s, w)| (ServerId(s), WorkerId(w))).collect()
}

/// Where one request goes: a server, the worker holding the client's connection there,
/// and the worker that owns the shard and runs the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// `lambda mod servers`.
    pub server: ServerId,
    /// `client mod workers`: receives the request and answers the client.
    pub comm_worker: WorkerId,
    /// `(lambda / servers) mod workers`: runs the request on its shard.
    pub proc_worker: WorkerId,
}

impl Route {
    /// Routes `lambda` from `client` in a cluster of `servers` servers with `workers`
    /// workers each. Zero servers or workers is a bug: the cluster view never has them.
    pub fn new(lambda: Lambda, client: ClientId, servers: u32, workers: u32) -> Route {
        assert!(servers > 0, "routing needs at least one server");
        assert!(workers > 0, "routing needs at least one worker per server");
        let servers = u64::from(servers);
        let workers = u64::from(workers);
        // Each result is below a u32 divisor, so the narrowing casts are lossless.
        Route {
            server: ServerId((lambda.0 % servers) as u32),
            comm_worker: WorkerId((u64::from(client.0) % workers) as u32),
            proc_worker: WorkerId(((lambda.0 / servers) % workers) as u32),
        }
    }

    /// Whether the receiving worker can run the request itself, with no ring hop.
    pub fn is_local(&self) -> bool {
        self.comm_worker == self.proc_worker
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INO: InodeId = InodeId(0x0100_0000_0042);

    #[test]
    fn lambda_bytes_are_pinned() {
        // The key encoding is protocol: a change here reroutes every file.
        assert_eq!(Lambda::of_inode(INO).0, XxHash3_64::oneshot(&INO.0.to_le_bytes()));
        let mut key = INO.0.to_le_bytes().to_vec();
        key.extend_from_slice(b"out.0001");
        assert_eq!(Lambda::of_name(INO, b"out.0001").0, XxHash3_64::oneshot(&key));
        let mut key = INO.0.to_le_bytes().to_vec();
        key.extend_from_slice(&7u64.to_le_bytes());
        assert_eq!(Lambda::of_block(INO, BlockIndex(7)).0, XxHash3_64::oneshot(&key));
    }

    #[test]
    fn dentry_lambda_follows_directory_layout() {
        let big = |name: &'static [u8]| {
            RouteKey::Dentry { parent: INO, layout: DirLayout::BigDir, name }.lambda(3, 4)
        };
        let regular = |name: &'static [u8]| {
            RouteKey::Dentry { parent: INO, layout: DirLayout::Regular, name }.lambda(3, 4)
        };
        assert_ne!(big(b"a"), big(b"b"));
        assert_eq!(regular(b"a"), regular(b"b"));
        assert_eq!(regular(b"a"), RouteKey::Inode(INO).lambda(3, 4));
        let longest = [b'x'; NAME_MAX];
        assert_eq!(Lambda::of_name(INO, &longest), Lambda::of_name(INO, &longest));
    }

    #[test]
    fn data_lambda_follows_file_layout() {
        let data = |layout, block| RouteKey::Data { ino: INO, layout, block: BlockIndex(block) };
        let inode = RouteKey::Inode(INO).lambda(3, 4);
        assert_eq!(data(FileLayout::Block, 0).lambda(3, 4), inode);
        assert_eq!(data(FileLayout::Block, 1).lambda(3, 4), Lambda::of_block(INO, BlockIndex(1)));
        assert_ne!(
            data(FileLayout::Block, 1).lambda(3, 4),
            data(FileLayout::Block, 2).lambda(3, 4)
        );
        assert_eq!(data(FileLayout::File, 0).lambda(3, 4), inode);
        assert_eq!(data(FileLayout::File, 9).lambda(3, 4), inode);
        assert_eq!(data(FileLayout::Io, 0).lambda(3, 4), Lambda::of_block(INO, BlockIndex(0)));
        let at = RouteKey::data_at(INO, FileLayout::Io, 3 * 65536 + 5, 65536);
        assert_eq!(at, data(FileLayout::Io, 3));
    }

    #[test]
    fn inode_keys_go_to_the_shard_named_by_the_inode_number() {
        let (servers, workers) = (3, 4);
        for g in 0..servers * workers {
            let ino = InodeId::compose(crate::ShardId(g), 77);
            let route = Route::new(
                RouteKey::Inode(ino).lambda(servers, workers),
                ClientId(5),
                servers,
                workers,
            );
            assert_eq!(shard_of(route.server, route.proc_worker, workers), crate::ShardId(g));
            let regular = RouteKey::Dentry { parent: ino, layout: DirLayout::Regular, name: b"x" };
            assert_eq!(
                regular.lambda(servers, workers),
                RouteKey::Inode(ino).lambda(servers, workers)
            );
        }
        assert_eq!(home_of(InodeId::ROOT, servers, workers), (ServerId(0), WorkerId(0)));
    }

    #[test]
    fn route_applies_the_paper_formulas() {
        let route = Route::new(Lambda(1000), ClientId(13), 7, 4);
        assert_eq!(route.server, ServerId(1000 % 7));
        assert_eq!(route.comm_worker, WorkerId(13 % 4));
        assert_eq!(route.proc_worker, WorkerId((1000 / 7) % 4));
        let top = Route::new(Lambda(u64::MAX), ClientId(u32::MAX), u32::MAX, u32::MAX);
        assert_eq!(top.server, ServerId((u64::MAX % u64::from(u32::MAX)) as u32));
        assert!(Route::new(Lambda(5), ClientId(0), 1, 1).is_local());
    }

    #[test]
    fn targeting_reaches_every_shard() {
        for (servers, workers) in [(1, 1), (3, 5), (64, 64)] {
            for s in 0..servers {
                for w in 0..workers {
                    let lambda = Lambda::targeting(ServerId(s), WorkerId(w), servers);
                    let route = Route::new(lambda, ClientId(0), servers, workers);
                    assert_eq!((route.server, route.proc_worker), (ServerId(s), WorkerId(w)));
                }
            }
        }
    }

    /// Mean keys per (server, processing worker) bucket in the spread test. A bucket
    /// count is binomial, close to normal with sigma = sqrt(mean); with a mean of
    /// 14 400, sigma is 120 = 0.83% of the mean, so the 5% bound is 6 sigma. Over the
    /// 4096 buckets of the largest cluster and all cases the chance that a fair hash
    /// fails is below 1e-4, while a skew of 5% in any bucket still fails.
    const KEYS_PER_BUCKET: u64 = 14_400;
    /// At least this many keys, whatever the cluster size.
    const KEYS_MIN: u64 = 1_000_000;

    /// The `i`-th key of a workload mixing the three kinds of keys, with the
    /// structured names and sequential numbers that HPC jobs produce.
    fn nth_lambda(i: u64, name_buf: &mut [u8; 24]) -> Lambda {
        let ino = InodeId::compose(crate::ShardId((i % 97) as u32), i);
        match i % 3 {
            0 => Lambda::of_inode(ino),
            1 => Lambda::of_block(InodeId(i / 64), BlockIndex(i % 64)),
            _ => {
                name_buf[..5].copy_from_slice(b"rank.");
                let mut n = i;
                for slot in name_buf[5..].iter_mut().rev() {
                    *slot = b'0' + (n % 10) as u8;
                    n /= 10;
                }
                Lambda::of_name(InodeId(7), &name_buf[..])
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5, ..ProptestConfig::default() })]

        #[test]
        fn lambdas_spread_uniformly(servers in 1u32..=64, workers in 1u32..=64) {
            let buckets = u64::from(servers) * u64::from(workers);
            let keys = (buckets * KEYS_PER_BUCKET).max(KEYS_MIN);
            let mut counts = vec![0u64; buckets as usize];
            let mut name_buf = [0u8; 24];
            for i in 0..keys {
                let route = Route::new(nth_lambda(i, &mut name_buf), ClientId(0), servers, workers);
                let bucket = route.server.0 as usize * workers as usize + route.proc_worker.0 as usize;
                counts[bucket] += 1;
            }
            let mean = keys as f64 / buckets as f64;
            let worst = counts.iter().map(|&c| (c as f64 - mean).abs()).fold(0.0, f64::max);
            prop_assert!(
                worst <= 0.05 * mean,
                "{servers} servers x {workers} workers: a bucket is off by {worst} from the mean {mean}"
            );
        }
    }
}
