//! The open files of one client: a bounded table of handles, and each handle's
//! write window (writes in flight, the first error, the end written on other
//! shards and not yet published, the size learned from the home, the data end
//! the home reserved). What waits on connections is in `data.rs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pfs_core::hash::NumMap;
use pfs_core::{FileHandle, FileLayout, FsError, FsResult, InodeId};

use crate::conn::Sent;

/// A pipelined write sent and not yet answered.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Index of the server connection.
    pub server: usize,
    /// Its processing worker.
    pub worker: u32,
    /// The request.
    pub sent: Sent,
}

/// The write window of one handle.
#[derive(Debug, Default)]
pub(crate) struct OpenState {
    /// Writes in flight, oldest first.
    pub pending: VecDeque<Pending>,
    /// The first error of a write, for the next write, flush, fsync or close.
    pub first_error: Option<FsError>,
    /// End of the furthest write that went to a data-only shard, not yet
    /// published to the home (`ExtendSize`); 0 when none. Changed only
    /// through [`OpenFiles::wrote_elsewhere`] and [`OpenFiles::published`].
    pub extend_to: u64,
    /// The size last learned from the home (reads of other shards clamp to it).
    pub size: Option<u64>,
    /// The data end the home reserved for other shards (`ReserveData`):
    /// writes there below it need not ask again.
    pub reserved: u64,
}

/// One open handle.
#[derive(Debug)]
pub(crate) struct OpenFile {
    /// The file.
    pub ino: InodeId,
    /// Its data layout.
    pub layout: FileLayout,
    /// Its write window.
    pub state: Mutex<OpenState>,
}

/// The handles of one client, at most `max`.
#[derive(Debug)]
pub(crate) struct OpenFiles {
    files: Mutex<NumMap<u64, Arc<OpenFile>>>,
    next: AtomicU64,
    max: usize,
    /// Handles whose `extend_to` is not 0: while none, no read needs to look
    /// for writes the home does not count yet.
    unpublished: AtomicUsize,
}

impl OpenFiles {
    /// A table of at most `max` handles.
    pub fn new(max: usize) -> OpenFiles {
        OpenFiles {
            files: Mutex::new(NumMap::default()),
            next: AtomicU64::new(1),
            max,
            unpublished: AtomicUsize::new(0),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, NumMap<u64, Arc<OpenFile>>> {
        self.files.lock().expect("open files lock")
    }

    /// A new handle of `ino`; `size` is the size known at open, if any.
    /// `TryAgain` while the table is full.
    pub fn open(
        &self,
        ino: InodeId,
        layout: FileLayout,
        size: Option<u64>,
    ) -> FsResult<FileHandle> {
        let mut files = self.table();
        if files.len() >= self.max {
            return Err(FsError::TryAgain);
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        let state = OpenState { size, ..OpenState::default() };
        files.insert(fh, Arc::new(OpenFile { ino, layout, state: Mutex::new(state) }));
        Ok(FileHandle(fh))
    }

    /// The open handle `fh`.
    pub fn get(&self, fh: FileHandle) -> FsResult<Arc<OpenFile>> {
        self.table().get(&fh.0).cloned().ok_or_else(|| not_open(fh))
    }

    /// Takes handle `fh` out of the table (its writes may still be in flight).
    pub fn close(&self, fh: FileHandle) -> FsResult<Arc<OpenFile>> {
        self.table().remove(&fh.0).ok_or_else(|| not_open(fh))
    }

    /// The open handles of `ino`.
    pub fn of_ino(&self, ino: InodeId) -> Vec<Arc<OpenFile>> {
        self.table().values().filter(|f| f.ino == ino).cloned().collect()
    }

    /// Notes that the handle whose state is `st` wrote up to `end` (> 0) on
    /// a shard other than the file's home.
    pub fn wrote_elsewhere(&self, st: &mut OpenState, end: u64) {
        if st.extend_to == 0 {
            self.unpublished.fetch_add(1, Ordering::AcqRel);
        }
        st.extend_to = st.extend_to.max(end);
    }

    /// Notes that the end `st` wrote on other shards is published to the
    /// home, or given up with its handle.
    pub fn published(&self, st: &mut OpenState) {
        if st.extend_to > 0 {
            self.unpublished.fetch_sub(1, Ordering::AcqRel);
            st.extend_to = 0;
        }
    }

    /// Whether a handle of `ino` wrote past byte `at` on other shards without
    /// publishing it: the home's size does not count that write yet, so a read
    /// there that ends short of what was asked may end too early. Looks at
    /// the handles only while some handle has something unpublished. The
    /// caller holds no handle's lock.
    pub fn unpublished_past(&self, ino: InodeId, at: u64) -> bool {
        self.unpublished.load(Ordering::Acquire) > 0
            && self
                .of_ino(ino)
                .iter()
                .any(|f| f.state.lock().expect("open file lock").extend_to > at)
    }

    /// Every open handle but `not`.
    pub fn others(&self, not: &Arc<OpenFile>) -> Vec<Arc<OpenFile>> {
        self.table().values().filter(|f| !Arc::ptr_eq(f, not)).cloned().collect()
    }
}

fn not_open(fh: FileHandle) -> FsError {
    FsError::Invalid(format!("file handle {} is not open", fh.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_open_find_and_close_within_the_bound() {
        let t = OpenFiles::new(2);
        let (a, b) = (InodeId(10), InodeId(11));
        let fa = t.open(a, FileLayout::Block, Some(5)).unwrap();
        let fb = t.open(b, FileLayout::Io, None).unwrap();
        assert_ne!(fa, fb);
        assert_eq!(t.open(a, FileLayout::Block, None), Err(FsError::TryAgain), "full");
        let f = t.get(fa).unwrap();
        assert_eq!((f.ino, f.layout), (a, FileLayout::Block));
        assert_eq!(f.state.lock().unwrap().size, Some(5));
        assert_eq!(t.of_ino(b).len(), 1);
        assert_eq!(t.others(&f).len(), 1);
        t.close(fa).unwrap();
        assert!(t.get(fa).is_err());
        assert!(t.close(fa).is_err(), "closed twice");
        // Room again, and handle numbers are never reused.
        let fc = t.open(a, FileLayout::Block, None).unwrap();
        assert!(fc.0 > fb.0);
        assert!(t.of_ino(a).iter().all(|f| f.state.lock().unwrap().size.is_none()));
    }

    #[test]
    fn unpublished_ends_are_counted_until_published() {
        let t = OpenFiles::new(4);
        let (a, b) = (InodeId(10), InodeId(11));
        let fa = t.get(t.open(a, FileLayout::Block, None).unwrap()).unwrap();
        let fb = t.get(t.open(a, FileLayout::Block, None).unwrap()).unwrap();
        assert!(!t.unpublished_past(a, 0));
        t.wrote_elsewhere(&mut fa.state.lock().unwrap(), 300);
        t.wrote_elsewhere(&mut fa.state.lock().unwrap(), 200);
        assert_eq!(fa.state.lock().unwrap().extend_to, 300, "the furthest end");
        assert!(t.unpublished_past(a, 299) && !t.unpublished_past(a, 300));
        assert!(!t.unpublished_past(b, 0), "another file");
        t.wrote_elsewhere(&mut fb.state.lock().unwrap(), 500);
        t.published(&mut fa.state.lock().unwrap());
        assert!(t.unpublished_past(a, 400), "the other handle's end");
        t.published(&mut fb.state.lock().unwrap());
        t.published(&mut fb.state.lock().unwrap());
        assert_eq!(t.unpublished.load(Ordering::Acquire), 0, "published twice counts once");
        assert!(!t.unpublished_past(a, 0));
    }
}
