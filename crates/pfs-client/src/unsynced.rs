//! What this client changed that no commit has covered yet: for each inode, the
//! shards holding acknowledged and not yet durable changes to it, and the boot
//! id of each shard's server when the first of them was acknowledged.
//!
//! `fsync` and `fsyncdir` take an inode's marks, ask each shard to commit, and
//! compare the boot id the commit's reply came with: a server that restarted in
//! between may have lost what it had acknowledged (a crash loses up to one
//! commit interval), so the call fails with `EIO` instead of claiming
//! durability; this is the write verifier of NFS. The marks of one inode are at
//! most one per shard, and the table holds at most `max_inodes` inodes; when it
//! is full the client commits everything it holds first ([`Unsynced::take_all`]).
//!
//! Marks do not wait for an `fsync` to go: a background check
//! ([`Unsynced::sweep`], [`Unsynced::confirm`]) asks the shards of marks
//! older than a sweep period whether what they acknowledged is durable, and
//! drops the marks their server answered from the same boot. So a server
//! that restarts reports `EIO` to an `fsync` only for the changes of the last
//! second or two, not for every change since the file's last `fsync`.

use std::collections::HashMap;

use pfs_core::hash::NumMap;
use pfs_core::InodeId;

/// One shard holding unsynced changes to an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Server index in the view.
    pub server: u32,
    /// Worker (shard) on that server.
    pub worker: u32,
    /// Boot id of the server when the first change was acknowledged.
    pub boot: u64,
    /// A later change came from another boot: the earlier ones may be lost.
    pub lost: bool,
    /// The sweep generation of its last change ([`Unsynced::sweep`]).
    pub gen: u64,
}

/// The marks of one inode: most inodes change on one shard only (a file's
/// home, a directory's), kept in place; a file striped over several gets a
/// list. (A list for every inode was an allocation for every file a client
/// created: 5% of a create's time through the library, `perf`.)
#[derive(Debug)]
enum Marks {
    One(Mark),
    Many(Vec<Mark>),
}

impl Marks {
    fn as_mut_slice(&mut self) -> &mut [Mark] {
        match self {
            Marks::One(m) => std::slice::from_mut(m),
            Marks::Many(v) => v,
        }
    }

    fn push(&mut self, m: Mark) {
        match self {
            Marks::One(first) => *self = Marks::Many(vec![*first, m]),
            Marks::Many(v) => v.push(m),
        }
    }

    fn into_vec(self) -> Vec<Mark> {
        match self {
            Marks::One(m) => vec![m],
            Marks::Many(v) => v,
        }
    }
}

/// Merges `m` into `marks` as [`Unsynced::restore`] does (or as a new
/// acknowledgement, `restored` false, which only marks a boot change lost).
fn merge(marks: &mut Marks, m: Mark, restored: bool) {
    let same = |x: &Mark| (x.server, x.worker) == (m.server, m.worker);
    match marks.as_mut_slice().iter_mut().find(|x| same(x)) {
        Some(x) if restored => {
            x.lost |= m.lost || x.boot != m.boot;
            x.boot = m.boot;
            x.gen = x.gen.max(m.gen);
        }
        Some(x) => {
            x.lost |= x.boot != m.boot;
            x.gen = m.gen;
        }
        None => marks.push(m),
    }
}

/// The table; see the module docs.
#[derive(Debug)]
pub struct Unsynced {
    by_ino: NumMap<InodeId, Marks>,
    max_inodes: usize,
    /// The current sweep generation: marks noted now get it.
    gen: u64,
}

/// Marks taken for a commit: (inode, mark).
pub type Taken = Vec<(InodeId, Mark)>;

impl Unsynced {
    /// An empty table of at most `max_inodes` inodes (at least 1).
    pub fn new(max_inodes: usize) -> Unsynced {
        Unsynced { by_ino: NumMap::default(), max_inodes: max_inodes.max(1), gen: 0 }
    }

    /// Notes a change to `ino` acknowledged by shard (`server`, `worker`) whose
    /// server has boot id `boot`. `false` when the table is full and `ino` is
    /// not in it: commit everything ([`take_all`](Self::take_all)), then note again.
    pub fn note(&mut self, ino: InodeId, server: u32, worker: u32, boot: u64) -> bool {
        let mark = Mark { server, worker, boot, lost: false, gen: self.gen };
        if let Some(marks) = self.by_ino.get_mut(&ino) {
            merge(marks, mark, false);
            return true;
        }
        if self.by_ino.len() >= self.max_inodes {
            return false;
        }
        self.by_ino.insert(ino, Marks::One(mark));
        true
    }

    /// Takes the marks of `inos`.
    pub fn take(&mut self, inos: &[InodeId]) -> Taken {
        let mut out = Vec::new();
        for ino in inos {
            if let Some(marks) = self.by_ino.remove(ino) {
                out.extend(marks.into_vec().into_iter().map(|m| (*ino, m)));
            }
        }
        out
    }

    /// Takes every mark.
    pub fn take_all(&mut self) -> Taken {
        self.by_ino
            .drain()
            .flat_map(|(ino, marks)| marks.into_vec().into_iter().map(move |m| (ino, m)))
            .collect()
    }

    /// Puts marks back (their commit could not be asked for); they merge with
    /// marks noted since. Past the table's limit they are kept anyway: they
    /// came out of it, so the table never holds more than it did.
    pub fn restore(&mut self, taken: Taken) {
        for (ino, m) in taken {
            match self.by_ino.get_mut(&ino) {
                Some(marks) => merge(marks, m, true),
                None => {
                    self.by_ino.insert(ino, Marks::One(m));
                }
            }
        }
    }

    /// Starts a sweep: copies of the marks not changed since the last sweep
    /// started (so at least one sweep period old), which stay in the table;
    /// marks noted from now on are of a new generation. Ask each shard of
    /// the copies for a `Durable` answer after this, then
    /// [`confirm`](Self::confirm) them.
    pub fn sweep(&mut self) -> Taken {
        let before = self.gen;
        self.gen += 1;
        let mut out = Vec::new();
        for (ino, marks) in self.by_ino.iter_mut() {
            let old = marks.as_mut_slice().iter().filter(|m| m.gen < before && !m.lost);
            out.extend(old.map(|m| (*ino, *m)));
        }
        out
    }

    /// Ends a sweep: `boots` holds, for each shard that answered `Durable`,
    /// the boot id it answered from. A swept mark still in the table as it
    /// was (no change since, not taken by an `fsync`) goes when its shard
    /// answered from its boot (every change it stands for is durable), and
    /// is marked lost when from another (the server restarted: the next
    /// `fsync` reports it). Marks of shards that did not answer stay.
    pub fn confirm(&mut self, swept: &Taken, boots: &HashMap<(u32, u32), u64>) {
        for (ino, m) in swept {
            let Some(&boot) = boots.get(&(m.server, m.worker)) else { continue };
            let Some(marks) = self.by_ino.get_mut(ino) else { continue };
            let same = |x: &Mark| (x.server, x.worker, x.gen) == (m.server, m.worker, m.gen);
            if boot != m.boot {
                if let Some(x) = marks.as_mut_slice().iter_mut().find(|x| same(x)) {
                    x.lost = true;
                }
                continue;
            }
            let kept: Vec<Mark> = marks
                .as_mut_slice()
                .iter()
                .filter(|x| !(same(x) && x.boot == m.boot && !x.lost))
                .copied()
                .collect();
            match kept.as_slice() {
                [] => {
                    self.by_ino.remove(ino);
                }
                [one] => *marks = Marks::One(*one),
                _ => *marks = Marks::Many(kept),
            }
        }
    }

    /// Inodes with marks.
    pub fn len(&self) -> usize {
        self.by_ino.len()
    }

    /// No marks at all.
    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_boot_marks_the_first_changes_lost() {
        let mut u = Unsynced::new(4);
        let (a, b) = (InodeId(10), InodeId(11));
        assert!(u.note(a, 0, 1, 7));
        assert!(u.note(a, 0, 1, 7));
        assert!(u.note(a, 1, 0, 9));
        assert!(u.note(b, 0, 1, 8));
        let t = u.take(&[a]);
        assert_eq!(t.len(), 2);
        assert!(t.iter().all(|(_, m)| !m.lost));
        let t = u.take(&[b]);
        assert_eq!(t, vec![(b, Mark { server: 0, worker: 1, boot: 8, lost: false, gen: 0 })]);
        assert!(u.is_empty());
        u.note(a, 0, 0, 1);
        u.note(a, 0, 0, 2);
        assert!(u.take(&[a])[0].1.lost);
    }

    /// A mark is swept once a sweep period old; confirmed from its boot it
    /// goes, from another it is marked lost; one changed or taken since the
    /// sweep started is left alone, and a shard that did not answer keeps
    /// its marks.
    #[test]
    fn a_sweep_drops_old_marks_their_shard_answered_from_the_same_boot() {
        let mut u = Unsynced::new(8);
        let (a, b, c, d) = (InodeId(1), InodeId(2), InodeId(3), InodeId(4));
        for ino in [a, b, c, d] {
            u.note(ino, 0, 0, 5);
        }
        u.note(d, 1, 0, 7);
        assert!(u.sweep().is_empty(), "too new: noted since no sweep started");
        let swept = u.sweep();
        assert_eq!(swept.len(), 5);
        // Changed (b) and fsynced (c) while the answers were awaited.
        u.note(b, 0, 0, 5);
        let fsynced = u.take(&[c]);
        let boots = HashMap::from([((0, 0), 5)]);
        u.confirm(&swept, &boots);
        assert!(u.take(&[a]).is_empty(), "confirmed durable");
        assert_eq!(u.take(&[b]).len(), 1, "changed since the sweep started");
        assert!(u.take(&[c]).is_empty());
        assert_eq!(fsynced.len(), 1, "the fsync's own commit decides for it");
        assert_eq!(
            u.take(&[d]),
            vec![(d, Mark { server: 1, worker: 0, boot: 7, lost: false, gen: 0 })],
            "no answer from shard (1, 0)"
        );
        // Answered from another boot: lost, reported by the next fsync.
        u.note(a, 0, 0, 5);
        u.sweep();
        let swept = u.sweep();
        u.confirm(&swept, &HashMap::from([((0, 0), 6)]));
        assert!(u.take(&[a])[0].1.lost);
    }

    #[test]
    fn full_table_says_so_and_restore_merges() {
        let mut u = Unsynced::new(2);
        assert!(u.note(InodeId(1), 0, 0, 5));
        assert!(u.note(InodeId(2), 0, 0, 5));
        assert!(!u.note(InodeId(3), 0, 0, 5), "full");
        assert!(u.note(InodeId(2), 0, 1, 5), "a known inode still takes marks");
        let all = u.take_all();
        assert_eq!(all.len(), 3);
        assert!(u.note(InodeId(3), 0, 0, 5));
        u.note(InodeId(1), 0, 0, 6);
        u.restore(all);
        assert_eq!(u.len(), 3);
        let one = u.take(&[InodeId(1)]);
        assert_eq!(one.len(), 1);
        assert!(one[0].1.lost, "boots 5 and 6 on one shard");
    }
}
