//! Round trips of every message, and decoding of hostile bytes.

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use crate::{
    ClientId, DirLayout, FileAttr, FileHandle, FileLayout, FileType, FsError, InodeId, RequestId,
    ServerId, SetAttr, StatFs, WorkerId,
};

fn ino() -> impl Strategy<Value = InodeId> {
    any::<u64>().prop_map(InodeId)
}

fn fh() -> impl Strategy<Value = FileHandle> {
    any::<u64>().prop_map(FileHandle)
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![vec(any::<u8>(), 0..24), vec(any::<u8>(), MAX_NAME_BYTES..=MAX_NAME_BYTES)]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=max)
}

fn perm() -> impl Strategy<Value = u16> {
    0u16..=0o7777
}

fn kind() -> impl Strategy<Value = FileType> {
    (1u8..=7).prop_map(|v| FileType::from_u8(v).unwrap())
}

fn file_layout() -> impl Strategy<Value = FileLayout> {
    (0u8..=2).prop_map(|v| FileLayout::from_u8(v).unwrap())
}

fn layout() -> impl Strategy<Value = InodeLayout> {
    (any::<bool>(), file_layout(), proptest::option::of(any::<u32>())).prop_map(
        |(big, file, group)| InodeLayout {
            dir: if big { DirLayout::BigDir } else { DirLayout::Regular },
            file,
            group,
        },
    )
}

fn attr() -> impl Strategy<Value = FileAttr> {
    (
        (ino(), kind(), perm(), any::<u32>(), any::<u32>(), any::<u64>()),
        (any::<u64>(), any::<u32>(), any::<u32>(), any::<i64>(), any::<i64>(), any::<i64>()),
    )
        .prop_map(|((ino, kind, perm, uid, gid, size), (blocks, nlink, rdev, a, m, c))| {
            FileAttr {
                ino,
                kind,
                perm,
                uid,
                gid,
                size,
                blocks,
                nlink,
                rdev,
                atime_ns: a,
                mtime_ns: m,
                ctime_ns: c,
            }
        })
}

fn set_attr() -> impl Strategy<Value = SetAttr> {
    (
        proptest::option::of(perm()),
        any::<Option<u32>>(),
        any::<Option<u32>>(),
        any::<Option<u64>>(),
        any::<Option<i64>>(),
        any::<Option<i64>>(),
    )
        .prop_map(|(perm, uid, gid, size, atime_ns, mtime_ns)| SetAttr {
            perm,
            uid,
            gid,
            size,
            atime_ns,
            mtime_ns,
        })
}

fn entry() -> impl Strategy<Value = Entry> {
    (attr(), layout()).prop_map(|(attr, layout)| Entry { attr, layout })
}

fn token_mode() -> impl Strategy<Value = TokenMode> {
    prop_oneof![
        Just(TokenMode::Read),
        Just(TokenMode::Write),
        Just(TokenMode::Rename),
        Just(TokenMode::Hold),
        Just(TokenMode::Gone),
        Just(TokenMode::RelaidRegular),
        Just(TokenMode::RelaidBigDir)
    ]
}

fn file_lock() -> impl Strategy<Value = FileLock> {
    let kind = prop_oneof![Just(LockKind::Read), Just(LockKind::Write), Just(LockKind::Unlock)];
    (kind, any::<bool>(), 0..=LOCK_END_MAX, 0..=LOCK_END_MAX, any::<u32>()).prop_map(
        |(kind, flock, a, b, pid)| FileLock { kind, flock, start: a.min(b), end: a.max(b), pid },
    )
}

fn rename_flags() -> impl Strategy<Value = RenameFlags> {
    (0u32..4).prop_map(|bits| RenameFlags::from_bits(bits).unwrap())
}

fn xattr_mode() -> impl Strategy<Value = XattrSetMode> {
    prop_oneof![Just(XattrSetMode::Any), Just(XattrSetMode::Create), Just(XattrSetMode::Replace)]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (ino(), name()).prop_map(|(parent, name)| Request::Lookup { parent, name }),
        (ino(), name()).prop_map(|(parent, name)| Request::LookupData { parent, name }),
        ino().prop_map(|ino| Request::GetAttr { ino }),
        (ino(), set_attr()).prop_map(|(ino, set)| Request::SetAttr { ino, set }),
        (ino(), name(), perm(), any::<u32>(), any::<u32>(), any::<u32>(), file_layout()).prop_map(
            |(parent, name, perm, uid, gid, flags, layout)| Request::Create {
                parent,
                name,
                perm,
                uid,
                gid,
                flags,
                layout
            }
        ),
        (ino(), name(), perm(), any::<u32>(), any::<u32>(), layout()).prop_map(
            |(parent, name, perm, uid, gid, layout)| Request::Mkdir {
                parent,
                name,
                perm,
                uid,
                gid,
                layout
            }
        ),
        (ino(), name(), kind(), perm(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(parent, name, kind, perm, uid, gid, rdev)| Request::Mknod {
                parent,
                name,
                kind,
                perm,
                uid,
                gid,
                rdev
            }
        ),
        (ino(), name(), bytes(MAX_SYMLINK_BYTES), any::<u32>(), any::<u32>()).prop_map(
            |(parent, name, target, uid, gid)| Request::Symlink { parent, name, target, uid, gid }
        ),
        ino().prop_map(|ino| Request::ReadLink { ino }),
        (ino(), name()).prop_map(|(parent, name)| Request::Unlink { parent, name }),
        (ino(), name()).prop_map(|(parent, name)| Request::Rmdir { parent, name }),
        (ino(), name(), ino(), name(), rename_flags()).prop_map(
            |(parent, name, new_parent, new_name, flags)| Request::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags
            }
        ),
        (ino(), name(), any::<u32>(), any::<u32>(), any::<bool>(), any::<bool>()).prop_map(
            |(ino, after, max_entries, max_bytes, plus, big)| Request::ReadDir {
                ino,
                after,
                max_entries,
                max_bytes,
                plus,
                layout: if big { DirLayout::BigDir } else { DirLayout::Regular },
            }
        ),
        (ino(), any::<u32>()).prop_map(|(ino, flags)| Request::Open { ino, flags }),
        (ino(), fh(), any::<u32>()).prop_map(|(ino, fh, flags)| Request::Release {
            ino,
            fh,
            flags
        }),
        (ino(), fh(), any::<u64>(), 0..=MAX_IO_BYTES as u32, any::<u32>()).prop_map(
            |(ino, fh, offset, size, blocks)| Request::Read { ino, fh, offset, size, blocks }
        ),
        (ino(), fh(), any::<u64>(), bytes(4096))
            .prop_map(|(ino, fh, offset, data)| Request::Write { ino, fh, offset, data }),
        (ino(), fh(), any::<bool>()).prop_map(|(ino, fh, datasync)| Request::Fsync {
            ino,
            fh,
            datasync
        }),
        Just(Request::StatFs),
        Just(Request::Durable),
        Just(Request::LockRenew),
        (ino(), any::<u64>(), file_lock(), any::<bool>(), any::<bool>()).prop_map(
            |(ino, owner, lock, test, reclaim)| Request::Lock { ino, owner, lock, test, reclaim }
        ),
        (ino(), name()).prop_map(|(ino, name)| Request::GetXattr { ino, name }),
        (ino(), name(), bytes(512), xattr_mode())
            .prop_map(|(ino, name, value, mode)| Request::SetXattr { ino, name, value, mode }),
        ino().prop_map(|ino| Request::ListXattr { ino }),
        (ino(), name()).prop_map(|(ino, name)| Request::RemoveXattr { ino, name }),
        ino().prop_map(|ino| Request::LayoutGet { ino }),
        (ino(), layout()).prop_map(|(ino, layout)| Request::LayoutSet { ino, layout }),
        (ino(), token_mode()).prop_map(|(dir, mode)| Request::TokenAcquire { dir, mode }),
        (ino(), token_mode()).prop_map(|(dir, mode)| Request::TokenRelease { dir, mode }),
        ino().prop_map(|dir| Request::TokenInvalidate { dir }),
        (ino(), file_layout(), any::<u64>(), bytes(4096)).prop_map(
            |(ino, layout, offset, data)| Request::WriteData { ino, layout, offset, data }
        ),
        (ino(), file_layout(), any::<u64>(), 0..=MAX_IO_BYTES as u32, any::<u32>()).prop_map(
            |(ino, layout, offset, size, blocks)| Request::ReadData {
                ino,
                layout,
                offset,
                size,
                blocks
            }
        ),
        (ino(), file_layout(), any::<u64>(), any::<u64>()).prop_map(
            |(ino, layout, size, old_size)| Request::TruncateData { ino, layout, size, old_size }
        ),
        (ino(), any::<u64>()).prop_map(|(ino, size)| Request::ExtendSize { ino, size }),
        (ino(), any::<u64>(), any::<bool>()).prop_map(|(ino, len, kill_suidgid)| Request::Append {
            ino,
            len,
            kill_suidgid
        }),
        (proptest::option::of(0u32..u32::MAX), addr(), any::<u32>(), usage()).prop_map(
            |(server, addr, workers, usage)| Request::Register {
                server: server.map(ServerId),
                addr,
                workers,
                usage
            }
        ),
        (any::<u32>(), usage())
            .prop_map(|(s, usage)| Request::Heartbeat { server: ServerId(s), usage }),
        Just(Request::GetView),
        (ino(), name(), ino(), name(), rename_flags(), any::<u32>(), any::<u32>()).prop_map(
            |(parent, name, new_parent, new_name, flags, s, w)| Request::RenameCross {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                target_server: ServerId(s),
                target_worker: WorkerId(w),
            }
        ),
        (any::<u64>(), ino(), name(), any::<u64>(), rename_flags()).prop_map(
            |(txn, parent, name, value, flags)| Request::XRenameTarget {
                txn,
                parent,
                name,
                value,
                flags
            }
        ),
        (any::<u64>(), any::<bool>())
            .prop_map(|(txn, dir_removed)| Request::TxnForget { txn, dir_removed }),
        ino().prop_map(|ino| Request::DropInode { ino }),
        (ino(), name()).prop_map(|(parent, name)| Request::RmdirBigDir { parent, name }),
        (any::<u64>(), ino()).prop_map(|(txn, dir)| Request::SealDir { txn, dir }),
        (ino(), kind(), ino(), name()).prop_map(|(ino, kind, new_parent, new_name)| {
            Request::Link { ino, kind, new_parent, new_name }
        }),
        ino().prop_map(|ino| Request::AddLink { ino }),
        (ino(), -2i32..=2).prop_map(|(dir, nlink_delta)| Request::AdjustDir { dir, nlink_delta }),
        (any::<u32>(), proptest::collection::vec((any::<u64>(), follow_op()), 0..8))
            .prop_map(|(from, ops)| Request::FollowUps { from: crate::ShardId(from), ops }),
        (ino(), any::<u64>()).prop_map(|(ino, end)| Request::ReserveData { ino, end }),
        ino().prop_map(|ino| Request::GetParent { ino }),
    ]
}

fn follow_op() -> impl Strategy<Value = super::FollowOp> {
    use super::FollowOp;
    prop_oneof![
        ino().prop_map(|ino| FollowOp::Drop { ino }),
        (ino(), file_layout(), any::<u64>())
            .prop_map(|(ino, layout, old_size)| FollowOp::FreeData { ino, layout, old_size }),
        (ino(), file_layout(), any::<u64>(), any::<u64>()).prop_map(
            |(ino, layout, size, old_size)| FollowOp::CutData { ino, layout, size, old_size }
        ),
        (ino(), -2i32..=2).prop_map(|(dir, nlink_delta)| FollowOp::AdjustDir { dir, nlink_delta }),
        ino().prop_map(|ino| FollowOp::AddLink { ino }),
        any::<u64>().prop_map(|txn| FollowOp::Forget { txn }),
        (ino(), ino()).prop_map(|(ino, parent)| FollowOp::Reparent { ino, parent }),
    ]
}

fn addr() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9.:]{0,40}", "[a-z]{255}"]
}

fn usage() -> impl Strategy<Value = Usage> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(total_bytes, used_bytes, inodes_total, inodes_used)| Usage {
            total_bytes,
            used_bytes,
            inodes_total,
            inodes_used,
        },
    )
}

fn view() -> impl Strategy<Value = View> {
    let server = (any::<u32>(), addr(), any::<u32>(), any::<bool>(), any::<u64>(), usage())
        .prop_map(|(id, addr, workers, up, last_report_ms, usage)| ServerInfo {
            id: ServerId(id),
            addr,
            workers,
            up,
            last_report_ms,
            usage,
        });
    (any::<u64>(), any::<u32>(), vec(server, 0..6))
        .prop_map(|(epoch, servers_expected, servers)| View { epoch, servers_expected, servers })
}

fn dir_entry() -> impl Strategy<Value = DirEntry> {
    (name(), ino(), kind(), any::<u64>(), proptest::option::of(attr()))
        .prop_map(|(name, ino, kind, cookie, attr)| DirEntry { name, ino, kind, cookie, attr })
}

fn statfs() -> impl Strategy<Value = StatFs> {
    (any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
        |(block_size, blocks, blocks_free, files, files_free, name_max)| StatFs {
            block_size,
            blocks,
            blocks_free,
            files,
            files_free,
            name_max,
        },
    )
}

fn replaced() -> impl Strategy<Value = Option<crate::wire::Replaced>> {
    proptest::option::of((any::<u64>(), any::<u64>(), file_layout(), any::<bool>()).prop_map(
        |(ino, size, layout, remote)| crate::wire::Replaced {
            ino: InodeId(ino),
            size,
            layout,
            remote,
        },
    ))
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        entry().prop_map(Reply::Lookup),
        (entry(), proptest::option::of(bytes(MAX_LOOKUP_DATA_BYTES)))
            .prop_map(|(entry, data)| Reply::LookupData { entry, data }),
        attr().prop_map(Reply::GetAttr),
        attr().prop_map(Reply::SetAttr),
        (entry(), fh()).prop_map(|(entry, fh)| Reply::Create { entry, fh }),
        entry().prop_map(Reply::Mkdir),
        entry().prop_map(Reply::Mknod),
        entry().prop_map(Reply::Symlink),
        bytes(MAX_SYMLINK_BYTES).prop_map(Reply::ReadLink),
        (ino(), any::<u64>(), file_layout(), any::<bool>())
            .prop_map(|(ino, size, layout, remote)| Reply::Unlink { ino, size, layout, remote }),
        (ino(), any::<bool>()).prop_map(|(ino, remote)| Reply::Rmdir { ino, remote }),
        replaced().prop_map(|replaced| Reply::Rename { replaced }),
        (vec(dir_entry(), 0..8), any::<bool>())
            .prop_map(|(entries, eof)| Reply::ReadDir { entries, eof }),
        fh().prop_map(|fh| Reply::Open { fh }),
        Just(Reply::Release),
        bytes(4096).prop_map(Reply::Read),
        (any::<u32>(), any::<i64>(), any::<i64>()).prop_map(|(written, ctime_before, ctime)| {
            Reply::Write { written, ctime_before, ctime }
        }),
        Just(Reply::Fsync),
        statfs().prop_map(Reply::StatFs),
        bytes(512).prop_map(Reply::GetXattr),
        Just(Reply::SetXattr),
        vec(name(), 0..8).prop_map(Reply::ListXattr),
        Just(Reply::RemoveXattr),
        layout().prop_map(Reply::LayoutGet),
        Just(Reply::LayoutSet),
        (token_mode(), any::<u32>())
            .prop_map(|(mode, lease_ms)| Reply::TokenAcquire(TokenGrant { mode, lease_ms })),
        Just(Reply::TokenRelease),
        Just(Reply::TokenInvalidate),
        any::<u32>().prop_map(|written| Reply::WriteData { written }),
        bytes(4096).prop_map(Reply::ReadData),
        Just(Reply::TruncateData),
        (attr(), any::<i64>())
            .prop_map(|(attr, ctime_before)| Reply::ExtendSize { attr, ctime_before }),
        (any::<u64>(), attr(), any::<i64>()).prop_map(|(offset, attr, ctime_before)| {
            Reply::Append { offset, attr, ctime_before }
        }),
        (any::<u32>(), any::<u64>()).prop_map(|(s, epoch)| Reply::Register {
            server: ServerId(s),
            epoch,
            heartbeat_ms: (epoch % 60_000) as u32,
        }),
        any::<u64>().prop_map(|epoch| Reply::Heartbeat { epoch }),
        view().prop_map(Reply::GetView),
        replaced().prop_map(|replaced| Reply::RenameCross { replaced }),
        (any::<u64>(), replaced())
            .prop_map(|(old, replaced)| Reply::XRenameTarget { old, replaced }),
        Just(Reply::TxnForget),
        (any::<u64>(), file_layout()).prop_map(|(size, layout)| Reply::DropInode { size, layout }),
        Just(Reply::SealDir),
        entry().prop_map(Reply::Link),
        attr().prop_map(Reply::AddLink),
        Just(Reply::AdjustDir),
        Just(Reply::Durable),
        (proptest::option::of(file_lock()), any::<u32>(), any::<u64>())
            .prop_map(|(conflict, lease_ms, epoch)| Reply::Lock { conflict, lease_ms, epoch }),
        (any::<u32>(), any::<u32>(), any::<u64>())
            .prop_map(|(held, lease_ms, epoch)| Reply::LockRenew { held, lease_ms, epoch }),
        (any::<u64>(), vec(any::<u64>(), 0..4))
            .prop_map(|(through, refused)| Reply::FollowUps { through, refused }),
        any::<u64>().prop_map(|end| Reply::ReserveData { end }),
        ino().prop_map(|parent| Reply::GetParent { parent }),
    ]
}

fn fs_error() -> impl Strategy<Value = FsError> {
    let text = "[ -~]{0,40}";
    prop_oneof![
        Just(FsError::NotFound),
        Just(FsError::Exists),
        Just(FsError::NotEmpty),
        Just(FsError::NoAttr),
        Just(FsError::TryAgain),
        text.prop_map(FsError::Invalid),
        text.prop_map(FsError::NotSupported),
        text.prop_map(FsError::Io),
    ]
}

fn opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        request().prop_map(Body::Request),
        reply().prop_map(Body::Reply),
        (opcode(), fs_error()).prop_map(|(op, error)| Body::Error { op, error }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u64>(), any::<u32>(), body()).prop_map(|(id, client, body)| Frame {
        request_id: RequestId(id),
        client: ClientId(client),
        body,
    })
}

/// Makes the checksum match the (edited) bytes again, to reach the field checks.
fn reseal(bytes: &mut [u8]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..28]), &bytes[HEADER_LEN..]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
}

fn sample_frame() -> Frame {
    Frame {
        request_id: RequestId(42),
        client: ClientId(7),
        body: Body::Request(Request::Lookup { parent: InodeId::ROOT, name: b"etc".to_vec() }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_message_round_trips(frame in frame()) {
        let bytes = frame.to_bytes().unwrap();
        let header = FrameHeader::decode(&bytes).unwrap();
        prop_assert_eq!(header.frame_len(), bytes.len());
        prop_assert_eq!(Frame::decode(&bytes).unwrap(), frame);
    }

    #[test]
    fn random_bytes_are_refused_with_a_reason(bytes in vec(any::<u8>(), 0..256)) {
        let err = Frame::decode(&bytes).unwrap_err();
        prop_assert!(!err.to_string().is_empty());
    }

    #[test]
    fn random_payload_behind_a_valid_header_never_panics(
        op in opcode(),
        flags in prop_oneof![Just(0u16), Just(FLAG_REPLY), Just(FLAG_REPLY | FLAG_ERROR)],
        payload in vec(any::<u8>(), 0..512),
    ) {
        // Resealing defeats the checksum, so the payload decoders see the garbage.
        let mut bytes = sample_frame().to_bytes().unwrap();
        bytes.truncate(HEADER_LEN);
        bytes[6..8].copy_from_slice(&(op as u16).to_le_bytes());
        bytes[8..10].copy_from_slice(&flags.to_le_bytes());
        bytes[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&payload);
        reseal(&mut bytes);
        if let Ok(frame) = Frame::decode(&bytes) {
            prop_assert_eq!(Frame::decode(&frame.to_bytes().unwrap()).unwrap(), frame);
        }
    }

    #[test]
    fn mutated_frames_are_refused(
        frame in frame(),
        edits in vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        cut in any::<prop::sample::Index>(),
        reseal_after in any::<bool>(),
    ) {
        let good = frame.to_bytes().unwrap();
        let mut bad = good.clone();
        for (at, xor) in &edits {
            let at = at.index(bad.len());
            bad[at] ^= xor;
        }
        if reseal_after {
            // With a matching checksum, the edit must be caught by the field checks
            // or decode to a frame that itself round-trips. (Not always to the same
            // bytes: error text of an errno whose variant has none is dropped.)
            reseal(&mut bad);
            match Frame::decode(&bad) {
                Err(err) => prop_assert!(!err.to_string().is_empty()),
                Ok(other) => {
                    prop_assert_eq!(Frame::decode(&other.to_bytes().unwrap()).unwrap(), other)
                }
            }
        } else if bad != good {
            let err = Frame::decode(&bad).unwrap_err();
            prop_assert!(!err.to_string().is_empty());
        }
        let short = &good[..cut.index(good.len())];
        prop_assert!(Frame::decode(short).is_err());
    }
}

#[test]
fn wrong_version_is_named() {
    let mut bytes = sample_frame().to_bytes().unwrap();
    bytes[4..6].copy_from_slice(&3u16.to_le_bytes());
    let err = Frame::decode(&bytes).unwrap_err();
    assert_eq!(err, WireError::Version { found: 3, expected: VERSION });
    assert_eq!(err.to_string(), format!("protocol version 3, expected {VERSION}"));
}

#[test]
fn header_faults_are_named() {
    let good = sample_frame().to_bytes().unwrap();
    let reason = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        edit(&mut bytes);
        Frame::decode(&bytes).unwrap_err().to_string()
    };
    assert_eq!(reason(&|b| b[0] = b'X'), "bad magic 0x57534658, expected 0x57534650");
    assert!(reason(&|b| b[40] ^= 1).starts_with("checksum mismatch"));
    assert_eq!(reason(&|b| b.truncate(10)), "truncated frame header: need 2 bytes, have 0");
    assert_eq!(reason(&|b| b.truncate(40)), "truncated frame: need 45 bytes, have 40");
    assert_eq!(reason(&|b| b.push(0)), "1 trailing bytes after frame");
    assert_eq!(
        reason(&|b| b[24..28].copy_from_slice(&u32::MAX.to_le_bytes())),
        format!("frame payload length {} is over the limit {MAX_FRAME_PAYLOAD}", u32::MAX)
    );
    assert_eq!(
        reason(&|b| {
            b[6..8].copy_from_slice(&999u16.to_le_bytes());
            reseal(b);
        }),
        "unknown opcode 999"
    );
    assert_eq!(reason(&|b| b[8] = 0x80), "invalid frame flags: 0x80");
    // Bytes 10..12 name the target worker: any value is a valid header, and
    // `stamp` sets it without breaking the checksum.
    let mut stamped = sample_frame().to_bytes().unwrap();
    stamp(&mut stamped, ClientId(9), RequestId(77), 513);
    let header = FrameHeader::decode(&stamped).unwrap();
    assert_eq!(
        (header.worker, header.client, header.request_id),
        (513, ClientId(9), RequestId(77))
    );
    assert_eq!(Frame::decode(&stamped).unwrap().request_id, RequestId(77));
    assert_eq!(
        reason(&|b| {
            b[24..28].copy_from_slice(&14u32.to_le_bytes());
            b.push(0);
            reseal(b);
        }),
        "1 trailing bytes after payload"
    );
}

#[test]
fn over_long_fields_are_refused_both_ways() {
    let frame =
        |req| Frame { request_id: RequestId(1), client: ClientId(1), body: Body::Request(req) };
    let long_name = Request::Lookup { parent: InodeId(2), name: vec![b'a'; MAX_NAME_BYTES + 1] };
    let err = frame(long_name).to_bytes().unwrap_err();
    assert_eq!(err.to_string(), "name length 256 is over the limit 255");

    // The same over-long name, hand-encoded, is refused by the decoder.
    let mut bytes =
        frame(Request::Lookup { parent: InodeId(2), name: vec![b'a'; 255] }).to_bytes().unwrap();
    bytes[40..42].copy_from_slice(&256u16.to_le_bytes());
    bytes.push(b'a');
    let payload_len = (bytes.len() - HEADER_LEN) as u32;
    bytes[24..28].copy_from_slice(&payload_len.to_le_bytes());
    reseal(&mut bytes);
    assert_eq!(
        Frame::decode(&bytes).unwrap_err().to_string(),
        "name length 256 is over the limit 255"
    );

    let big = Request::Write {
        ino: InodeId(2),
        fh: FileHandle(3),
        offset: 0,
        data: vec![7; MAX_IO_BYTES],
    };
    let bytes = frame(big.clone()).to_bytes().unwrap();
    assert_eq!(Frame::decode(&bytes).unwrap().body, Body::Request(big));
    let too_big = Request::Write {
        ino: InodeId(2),
        fh: FileHandle(3),
        offset: 0,
        data: vec![7; MAX_IO_BYTES + 1],
    };
    let mut out = vec![1, 2, 3];
    assert!(frame(too_big).encode(&mut out).is_err());
    assert_eq!(out, [1, 2, 3], "a failed encode leaves the buffer alone");

    let value = Request::SetXattr {
        ino: InodeId(2),
        name: b"user.x".to_vec(),
        value: vec![0; MAX_XATTR_VALUE_BYTES + 1],
        mode: XattrSetMode::Any,
    };
    assert_eq!(
        frame(value).to_bytes().unwrap_err().to_string(),
        "xattr value length 65537 is over the limit 65536"
    );
}

#[test]
fn huge_counts_do_not_allocate() {
    // A readdir reply claiming 2^32-1 entries in a few bytes is refused before any
    // vector is sized from the count.
    let reply = Frame {
        request_id: RequestId(1),
        client: ClientId(1),
        body: Body::Reply(Reply::ReadDir { entries: vec![], eof: true }),
    };
    let mut bytes = reply.to_bytes().unwrap();
    bytes[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bytes);
    let err = Frame::decode(&bytes).unwrap_err();
    assert!(matches!(err, WireError::Truncated { what: "readdir entries", .. }), "{err}");
}

#[test]
fn error_replies_carry_errno_and_text() {
    let frame = Frame {
        request_id: RequestId(9),
        client: ClientId(3),
        body: Body::Error { op: Opcode::Rename, error: FsError::NotSupported("EXCHANGE".into()) },
    };
    let bytes = frame.to_bytes().unwrap();
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), FLAG_REPLY | FLAG_ERROR);
    let errno = i32::from_le_bytes(bytes[32..36].try_into().unwrap());
    assert_eq!(errno, libc::EOPNOTSUPP);
    assert_eq!(Frame::decode(&bytes).unwrap(), frame);

    let long = FsError::Io("é".repeat(MAX_ERROR_MESSAGE_BYTES));
    let frame = Frame { body: Body::Error { op: Opcode::Read, error: long }, ..frame };
    let Body::Error { error: FsError::Io(text), .. } =
        Frame::decode(&frame.to_bytes().unwrap()).unwrap().body
    else {
        panic!("error reply decoded as something else");
    };
    assert_eq!(text.len(), MAX_ERROR_MESSAGE_BYTES, "cut at a character boundary");
    // Bad UTF-8 from a peer is replaced, and the text cut as the encoder cuts, so
    // what decodes encodes back to itself (the fuzz test found a long one that
    // grew past the limit when replaced).
    let mut bytes = FsError::Io(String::new()).errno().to_le_bytes().to_vec();
    bytes.extend_from_slice(&(MAX_ERROR_MESSAGE_BYTES as u16).to_le_bytes());
    bytes.extend(std::iter::repeat_n(0xff, MAX_ERROR_MESSAGE_BYTES));
    let mut r = super::cursor::Reader::new(&bytes);
    let e = <FsError as super::types::Codec>::get(&mut r).unwrap();
    assert!(e.detail().len() <= MAX_ERROR_MESSAGE_BYTES);
    let mut out = Vec::new();
    let mut w = super::cursor::Writer::new(&mut out);
    <FsError as super::types::Codec>::put(&e, &mut w).unwrap();
    let mut r = super::cursor::Reader::new(&out);
    assert_eq!(<FsError as super::types::Codec>::get(&mut r).unwrap(), e);
}

#[test]
fn header_layout_is_as_documented() {
    let bytes = sample_frame().to_bytes().unwrap();
    assert_eq!(&bytes[0..4], b"PFSW");
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), VERSION);
    assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), Opcode::Lookup as u16);
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 0);
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 7);
    assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 42);
    assert_eq!(u32::from_le_bytes(bytes[24..28].try_into().unwrap()), 8 + 2 + 3);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..28]), &bytes[32..]);
    assert_eq!(u32::from_le_bytes(bytes[28..32].try_into().unwrap()), crc);
    assert_eq!(&bytes[32..], [1, 0, 0, 0, 0, 0, 0, 0, 3, 0, b'e', b't', b'c']);
}

/// A small xorshift generator for the mutation loop (proptest is too slow for
/// a million cases).
struct Xs(u64);

impl Xs {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Mutates `bytes` in one of several ways; with `fix` the length field and
/// checksum are made to match again, so the payload decoders see the damage.
fn mutate(rng: &mut Xs, bytes: &mut Vec<u8>, other: &[u8]) {
    if bytes.is_empty() {
        bytes.push(rng.next() as u8);
        return;
    }
    match rng.below(7) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let at = rng.below(bytes.len());
            bytes[at] = rng.next() as u8;
        }
        2 => {
            let cut = rng.below(bytes.len());
            bytes.truncate(cut);
        }
        3 => {
            for _ in 0..1 + rng.below(64) {
                bytes.push(rng.next() as u8);
            }
        }
        4 if bytes.len() > HEADER_LEN => {
            // Lengths inside the payload: overwrite up to 4 bytes with an extreme.
            let at = HEADER_LEN + rng.below(bytes.len() - HEADER_LEN);
            let end = (at + 4).min(bytes.len());
            bytes[at..end].fill(if rng.below(2) == 0 { 0xff } else { 0 });
        }
        5 if !other.is_empty() => {
            // Splice: a header of one message, the payload of another.
            let at = HEADER_LEN.min(bytes.len());
            bytes.truncate(at);
            bytes.extend_from_slice(&other[HEADER_LEN.min(other.len())..]);
        }
        _ => {
            let at = rng.below(bytes.len());
            let n = rng.below(16).min(bytes.len() - at);
            bytes.drain(at..at + n);
        }
    }
    if bytes.len() >= HEADER_LEN && rng.below(4) != 0 {
        let len = (bytes.len() - HEADER_LEN) as u32;
        bytes[24..28].copy_from_slice(&len.to_le_bytes());
        reseal(bytes);
    }
}

#[test]
fn a_million_mutated_frames_decode_or_are_refused() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let seed: u64 = std::env::var("PFS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64 | 1);
    let iters: usize =
        std::env::var("PFS_FUZZ_FRAMES").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    println!("fuzz: {iters} mutated frames, seed {seed} (PFS_FUZZ_SEED={seed} replays)");
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let corpus: Vec<Vec<u8>> = (0..2000)
        .map(|_| frame().new_tree(&mut runner).unwrap().current().to_bytes().unwrap())
        .collect();
    let mut rng = Xs(seed);
    let (mut decoded, mut refused) = (0u64, 0u64);
    for i in 0..iters {
        let mut bytes = corpus[rng.below(corpus.len())].clone();
        let other = &corpus[rng.below(corpus.len())];
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut bytes, other);
        }
        match Frame::decode(&bytes) {
            Err(e) => {
                assert!(
                    !e.to_string().is_empty(),
                    "seed {seed}, case {i}: an error names its cause"
                );
                refused += 1;
            }
            Ok(f) => {
                // What decodes is a message that encodes and decodes to itself.
                let again = f.to_bytes().unwrap_or_else(|e| {
                    panic!("seed {seed}, case {i}: decoded {f:?} but cannot encode it: {e}")
                });
                assert_eq!(Frame::decode(&again).unwrap(), f, "seed {seed}, case {i}");
                decoded += 1;
            }
        }
    }
    println!("fuzz: {decoded} decoded to valid messages, {refused} refused, no panic");
    assert!(decoded > 0 && refused > 0, "the mutations reach both outcomes");
}

/// `decode_received` (for frames the transport checked) skips the checksum
/// and nothing else: a good frame decodes the same, a wrong checksum passes,
/// and a wrong length or opcode is still refused.
#[test]
fn decode_received_skips_only_the_checksum() {
    let good = sample_frame().to_bytes().unwrap();
    assert_eq!(Frame::decode_received(&good).unwrap(), Frame::decode(&good).unwrap());
    let mut bad_sum = good.clone();
    bad_sum[28] ^= 0xff;
    assert!(matches!(Frame::decode(&bad_sum), Err(WireError::Checksum { .. })));
    assert_eq!(Frame::decode_received(&bad_sum).unwrap(), sample_frame());
    assert!(matches!(
        Frame::decode_received(&good[..good.len() - 1]),
        Err(WireError::Truncated { .. })
    ));
    let mut longer = good.clone();
    longer.push(0);
    assert!(matches!(Frame::decode_received(&longer), Err(WireError::TrailingBytes { .. })));
    let mut op = good.clone();
    op[6..8].copy_from_slice(&0xfefe_u16.to_le_bytes());
    assert!(matches!(Frame::decode_received(&op), Err(WireError::UnknownOpcode(0xfefe))));
}

/// A read reply sealed in place is byte for byte the encoded `Reply::Read`
/// (or `ReadData`), and decodes to it.
#[test]
fn a_read_reply_sealed_in_place_is_the_encoded_reply() {
    for (len, op) in [
        (0, Opcode::Read),
        (1, Opcode::ReadData),
        (3901, Opcode::Read),
        (1 << 20, Opcode::ReadData),
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
        let body = if op == Opcode::Read {
            Reply::Read(data.clone())
        } else {
            Reply::ReadData(data.clone())
        };
        let frame =
            Frame { request_id: RequestId(99), client: ClientId(5), body: Body::Reply(body) };
        let mut buf = vec![0xee; READ_REPLY_PREFIX];
        buf.extend_from_slice(&data);
        let mut local = buf.clone();
        Frame::seal_read_reply(&mut buf, RequestId(99), ClientId(5), op, Sum::Full).unwrap();
        assert!(buf == frame.to_bytes().unwrap(), "{len} bytes, {op:?}");
        assert_eq!(Frame::decode(&buf).unwrap(), frame);
        // Summed over the header only: the bytes encode_summed gives.
        Frame::seal_read_reply(&mut local, RequestId(99), ClientId(5), op, Sum::Header).unwrap();
        let mut want = Vec::new();
        frame.encode_summed(&mut want, ClientId(5), RequestId(99), 0, Sum::Header).unwrap();
        assert!(local == want, "{len} bytes, {op:?}, header sum");
        assert_eq!(Frame::decode(&local).unwrap(), frame);
        // Its header alone, for data sent from elsewhere: the same bytes.
        let head = Frame::read_reply_header(len, RequestId(99), ClientId(5), op).unwrap();
        assert!(head[..] == want[..READ_REPLY_PREFIX], "{len} bytes, {op:?}, header alone");
    }
    assert!(Frame::read_reply_header(MAX_IO_BYTES + 1, RequestId(1), ClientId(1), Opcode::Read)
        .is_err());
    assert!(Frame::read_reply_header(4, RequestId(1), ClientId(1), Opcode::Write).is_err());
    let mut big = vec![0; READ_REPLY_PREFIX + MAX_IO_BYTES + 1];
    let sealed = |buf: &mut [u8], op| {
        Frame::seal_read_reply(buf, RequestId(1), ClientId(1), op, Sum::Full).is_ok()
    };
    assert!(!sealed(&mut big, Opcode::Read));
    let mut other = vec![0; READ_REPLY_PREFIX + 4];
    assert!(!sealed(&mut other, Opcode::Write));
}

/// A frame summed over its header only (shared memory): the checksum is the
/// header's, the flag says so and is accepted with every kind of frame, a
/// changed header byte is still caught, and `stamp` keeps the sum it had.
#[test]
fn a_frame_summed_over_its_header_only() {
    let frame = sample_frame();
    let mut full = Vec::new();
    frame.encode_summed(&mut full, ClientId(3), RequestId(8), 1, Sum::Full).unwrap();
    let mut head = Vec::new();
    frame.encode_summed(&mut head, ClientId(3), RequestId(8), 1, Sum::Header).unwrap();
    assert_eq!(full.len(), head.len());
    assert_eq!(full[HEADER_LEN..], head[HEADER_LEN..], "same payload");
    let flags = |f: &[u8]| u16::from_le_bytes([f[8], f[9]]);
    assert_eq!(flags(&head), flags(&full) | FLAG_HEADER_SUM);
    let stored = |f: &[u8]| u32::from_le_bytes(f[28..32].try_into().unwrap());
    assert_eq!(stored(&head), crc32c::crc32c(&head[..28]));
    assert_eq!(stored(&full), frame_checksum(&full));
    assert_ne!(stored(&full), crc32c::crc32c(&full[..28]), "the full sum covers the payload");
    assert_eq!(Frame::decode(&head).unwrap(), Frame::decode(&full).unwrap());
    let mut bad = head.clone();
    bad[16] ^= 1;
    assert!(matches!(Frame::decode(&bad), Err(WireError::Checksum { .. })), "header byte");
    // What the header-only sum gives up: a payload byte changed in memory.
    let mut changed = head.clone();
    *changed.last_mut().unwrap() ^= 1;
    assert!(!matches!(Frame::decode(&changed), Err(WireError::Checksum { .. })));
    let mut stamped = head.clone();
    stamp(&mut stamped, ClientId(4), RequestId(9), 2);
    assert_eq!(flags(&stamped), flags(&head));
    assert_eq!(stored(&stamped), crc32c::crc32c(&stamped[..28]));
    // An error reply and a write carry the flag too.
    let err = Frame {
        request_id: RequestId(1),
        client: ClientId(1),
        body: Body::Error { op: Opcode::Read, error: crate::FsError::NotFound },
    };
    let mut e = Vec::new();
    err.encode_summed(&mut e, ClientId(1), RequestId(1), 0, Sum::Header).unwrap();
    assert_eq!(Frame::decode(&e).unwrap(), err);
    assert_eq!(FrameHeader::decode(&e).unwrap().flags, FLAG_REPLY | FLAG_ERROR | FLAG_HEADER_SUM);
    let data = vec![7u8; 5000];
    let w = WriteRef {
        ino: InodeId(5),
        target: WriteTarget::Home(FileHandle(2)),
        offset: 100,
        data: &data,
    };
    let mut wb = Vec::new();
    w.encode_summed(&mut wb, ClientId(2), RequestId(3), 0, Sum::Header).unwrap();
    let (id, client, got) = Frame::decode_write(&wb).unwrap().unwrap();
    assert_eq!((id, client, got), (RequestId(3), ClientId(2), w));
    // The flag alone, or beside an unknown one, is still refused where it must be.
    let mut unknown = head.clone();
    unknown[8..10].copy_from_slice(&(FLAG_HEADER_SUM | 1 << 3).to_le_bytes());
    assert!(FrameHeader::decode(&unknown).is_err());
    let mut error_only = head;
    error_only[8..10].copy_from_slice(&(FLAG_HEADER_SUM | FLAG_ERROR).to_le_bytes());
    assert!(FrameHeader::decode(&error_only).is_err(), "an error that is not a reply");
}

/// `decode_write` borrows the data of `Write` and `WriteData` frames and
/// decodes them as `decode` does; any other frame is not its business, and a
/// bad one is refused the same way.
#[test]
fn decode_write_borrows_what_decode_copies() {
    let writes = [
        Request::Write {
            ino: InodeId(9),
            fh: FileHandle(4),
            offset: 1 << 40,
            data: vec![7; 70_000],
        },
        Request::WriteData { ino: InodeId(3), layout: FileLayout::Io, offset: 5, data: Vec::new() },
        Request::WriteData {
            ino: InodeId(3),
            layout: FileLayout::Block,
            offset: 0,
            data: vec![1, 2],
        },
    ];
    for req in writes {
        let frame = Frame {
            request_id: RequestId(11),
            client: ClientId(2),
            body: Body::Request(req.clone()),
        };
        let bytes = frame.to_bytes().unwrap();
        let (id, client, w) = Frame::decode_write(&bytes).unwrap().unwrap();
        assert_eq!((id, client), (RequestId(11), ClientId(2)));
        assert_eq!(w.to_request(), req);
        assert_eq!(w.opcode(), req.opcode());
        assert!(Frame::decode_write(&bytes[..bytes.len() - 1]).unwrap().is_err());
        let mut bad = bytes.clone();
        // The top byte of the data's length, just before the data: past the payload.
        let at = bytes.len() - w.data.len() - 1;
        bad[at] ^= 0x80;
        reseal(&mut bad);
        assert!(Frame::decode_write(&bad).unwrap().is_err());
    }
    let other = sample_frame().to_bytes().unwrap();
    assert!(Frame::decode_write(&other).is_none());
    let reply = Frame {
        request_id: RequestId(1),
        client: ClientId(1),
        body: Body::Reply(Reply::Write { written: 1, ctime_before: 0, ctime: 0 }),
    };
    assert!(Frame::decode_write(&reply.to_bytes().unwrap()).is_none());
}

/// Encoding with an addressing is encoding and stamping it afterwards, in
/// one checksum pass; a write encoded from a borrowed slice is the encoded
/// owned request.
#[test]
fn encode_as_is_encode_then_stamp() {
    let writes = [
        Request::Write { ino: InodeId(9), fh: FileHandle(4), offset: 77, data: vec![3; 5000] },
        Request::WriteData { ino: InodeId(3), layout: FileLayout::Io, offset: 5, data: vec![] },
    ];
    for req in
        writes.iter().cloned().chain([sample_frame().body].into_iter().filter_map(|b| match b {
            Body::Request(r) => Some(r),
            _ => None,
        }))
    {
        let frame =
            Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(req) };
        let mut stamped = frame.to_bytes().unwrap();
        stamp(&mut stamped, ClientId(6), RequestId(1234), 3);
        let mut direct = Vec::new();
        frame.encode_as(&mut direct, ClientId(6), RequestId(1234), 3).unwrap();
        assert_eq!(direct, stamped);
    }
    for req in writes {
        let frame = Frame {
            request_id: RequestId(0),
            client: ClientId(0),
            body: Body::Request(req.clone()),
        };
        let mut want = Vec::new();
        frame.encode_as(&mut want, ClientId(2), RequestId(9), 1).unwrap();
        let (_, _, w) = Frame::decode_write(&want).unwrap().unwrap();
        let mut got = vec![0xaa; 3]; // appends after what is there
        w.encode_as(&mut got, ClientId(2), RequestId(9), 1).unwrap();
        assert_eq!(&got[3..], &want[..]);
    }
    // Over the limit: nothing appended.
    let big = vec![0u8; MAX_IO_BYTES + 1];
    let w = WriteRef {
        ino: InodeId(1),
        target: WriteTarget::Home(FileHandle(1)),
        offset: 0,
        data: &big,
    };
    let mut out = vec![1, 2];
    assert!(w.encode_as(&mut out, ClientId(1), RequestId(1), 0).is_err());
    assert_eq!(out, [1, 2]);
}

/// The blocks a read picks are the bytes of its range in those blocks, in
/// order, neighbours merged; each picked byte is in a picked block.
#[test]
fn read_segments_are_the_picked_blocks_of_the_range() {
    use super::{read_block_bit, read_segments, ALL_BLOCKS};
    const B: u64 = crate::BLOCK_SIZE_BYTES;
    assert_eq!(read_segments(100, 0, ALL_BLOCKS), vec![]);
    assert_eq!(read_segments(100, 5, ALL_BLOCKS), vec![(100, 5)]);
    // A 1 MiB read at B - 1 touches 17 blocks: the first has one byte.
    let (offset, size) = (B - 1, MAX_IO_BYTES as u64);
    assert_eq!(read_segments(offset, size, 1), vec![(B - 1, 1)]);
    assert_eq!(read_segments(offset, size, 1 << 16), vec![(16 * B, B - 1)]);
    assert_eq!(read_segments(offset, size, 0b110), vec![(B, 2 * B)]);
    assert_eq!(read_segments(offset, size, 0b1_0101), vec![(B - 1, 1), (2 * B, B), (4 * B, B)]);
    // Bits past the range pick nothing; the whole mask is the whole range.
    assert_eq!(read_segments(0, B, 0b10), vec![]);
    assert_eq!(read_segments(offset, size, (1 << 17) - 1), vec![(offset, size)]);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let offset = state >> 20;
        let size = (state >> 7) % (MAX_IO_BYTES as u64 + 1);
        let blocks = (state >> 32) as u32;
        let segs = read_segments(offset, size, blocks);
        let mut last_end = None;
        for &(o, n) in &segs {
            assert!(n > 0 && o >= offset && o + n <= offset + size, "{segs:?}");
            assert!(last_end.is_none_or(|e| e < o), "not merged or not in order: {segs:?}");
            last_end = Some(o + n);
            for at in [o, o + n - 1] {
                assert_ne!(blocks & read_block_bit(offset, at), 0, "{at} in {segs:?}");
            }
        }
        let picked: u64 = segs.iter().map(|s| s.1).sum();
        let expected: u64 = (0..17u64)
            .filter(|i| blocks & (1 << i) != 0)
            .map(|i| {
                let (s, e) = ((offset / B + i) * B, (offset / B + i + 1) * B);
                e.min(offset + size).saturating_sub(s.max(offset))
            })
            .sum();
        assert_eq!(picked, expected, "offset {offset} size {size} blocks {blocks:#x}");
    }
}
