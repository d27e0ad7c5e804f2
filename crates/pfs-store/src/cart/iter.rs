//! Ordered traversal of one directory's tree, optionally resuming after a name.
//!
//! Children are visited in key-byte order and key byte 0 (a name ending at the node)
//! comes first, which is exactly ascending byte order of the names. The only buffer is
//! the caller's fixed 256-byte name buffer; nothing is allocated.

use super::arena::Arena;
use super::node::{NodeRef, Slot};

/// Name buffer of a traversal (names are at most 255 bytes).
pub(crate) type NameBuf = [u8; 256];

impl Arena {
    /// Calls `f` on the entries below `r` whose name is greater than `after` (`None`:
    /// all), in ascending order, until `f` returns false. `depth` bytes of `buf` hold the
    /// path to `r` and `after` is relative to it. Returns false if `f` stopped.
    pub fn visit<F>(
        &self,
        r: NodeRef,
        buf: &mut NameBuf,
        depth: usize,
        after: Option<&[u8]>,
        f: &mut F,
    ) -> bool
    where
        F: FnMut(&[u8], u64) -> bool,
    {
        let plen = self.copy_prefix(r, &mut buf[depth..]);
        let d = depth + plen;
        let node = self.node(r);
        let mut cursor = 0;
        if let Some(a) = after {
            let k = (0..plen.min(a.len())).position(|i| buf[depth + i] != a[i]);
            match k {
                // The prefix differs from `after` at byte i: all or nothing.
                Some(i) if buf[depth + i] < a[i] => return true,
                Some(_) => {}
                // `after` ends inside the prefix: every name here extends it.
                None if a.len() < plen => {}
                None => {
                    let a = &a[plen..];
                    match a.split_first() {
                        // `after` is the name ending here: skip the terminator leaf.
                        None => cursor = node.seek(1),
                        Some((&c, a_rest)) => {
                            cursor = node.seek(c);
                            if let Some((next, b, slot)) = node.next(cursor) {
                                if b == c {
                                    cursor = next;
                                    // A leaf under `c` is `path + c`, which is <= `after`.
                                    if let Slot::Node(child) = Slot::decode(slot) {
                                        buf[d] = c;
                                        if !self.visit(child, buf, d + 1, Some(a_rest), f) {
                                            return false;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        while let Some((next, b, slot)) = node.next(cursor) {
            cursor = next;
            let keep_going = match Slot::decode(slot) {
                Slot::Leaf(v) if b == 0 => f(&buf[..d], v),
                Slot::Leaf(v) => {
                    buf[d] = b;
                    f(&buf[..d + 1], v)
                }
                Slot::Node(child) => {
                    buf[d] = b;
                    self.visit(child, buf, d + 1, None, f)
                }
            };
            if !keep_going {
                return false;
            }
        }
        true
    }
}
