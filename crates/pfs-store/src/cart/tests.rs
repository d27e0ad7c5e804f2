//! Unit tests per node kind and transition, and a proptest model against `BTreeMap`.

use std::collections::BTreeMap;

use pfs_core::InodeId;
use proptest::prelude::*;

use super::node::{Inner, Node16, Node256, Node64};
use super::{Cart, MAX_VALUE};

const DIR: InodeId = InodeId(7);

/// Entries of `parent` in visiting order.
fn entries(c: &Cart, parent: InodeId, after: Option<&[u8]>) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    c.for_each_from(parent, after, |k, v| {
        out.push((k.to_vec(), v));
        true
    });
    out
}

/// Checks the tree invariants of every directory against the entry counts.
fn check(c: &Cart) {
    let mut total = 0;
    for (ino, root) in c.roots.iter() {
        let n = c.arena.check(root.node, true);
        assert_eq!(n, root.entry_count as usize, "entry count of {ino:?}");
        total += n;
    }
    assert_eq!(total, c.len());
}

#[test]
fn node16_keys_sorted_and_prefix_in_tail() {
    let mut n = Node16::EMPTY;
    for b in [b'c', b'a', b'b', 0] {
        n.add(b, u64::from(b) + 1);
    }
    n.write_prefix(b"data");
    assert_eq!(n.room(), 12 * 8);
    assert_eq!((0..4).map(|i| n.prefix_byte(i)).collect::<Vec<_>>(), b"data");
    assert_eq!(n.find(b'b'), Some(u64::from(b'b') + 1));
    assert_eq!(n.find(b'z'), None);
    // A split keeps the tail without moving bytes.
    n.drop_prefix_front(2);
    assert_eq!((0..2).map(|i| n.prefix_byte(i)).collect::<Vec<_>>(), b"ta");
    let keys: Vec<u8> =
        std::iter::successors(n.next(0), |&(c, _, _)| n.next(c)).map(|(_, b, _)| b).collect();
    assert_eq!(keys, vec![0, b'a', b'b', b'c']);
    n.remove(b'a');
    assert_eq!(n.find(b'a'), None);
    assert_eq!(n.find(b'c'), Some(u64::from(b'c') + 1));
    assert_eq!(n.prefix_byte(1), b'a', "prefix survives child moves");
}

#[test]
fn node16_search_ignores_unused_keys() {
    let mut n = Node16::EMPTY;
    n.add(5, 1);
    // Unused key bytes are 0; a lookup of 0 must not see them.
    assert_eq!(n.find(0), None);
    for b in 1..=15u8 {
        if b != 5 {
            n.add(b * 3, u64::from(b));
        }
    }
    assert_eq!(n.count(), 15);
    assert_eq!(n.find(45), Some(15));
}

#[test]
fn node64_and_node256_find_and_iterate() {
    let mut n = Node64::EMPTY;
    for b in (0..64u8).rev() {
        n.add(b * 2, u64::from(b));
    }
    assert_eq!(n.find(126), Some(63));
    assert_eq!(n.find(127), None);
    assert_eq!(n.seek(3), 2);
    let mut m = Node256::EMPTY;
    m.add(200, 9);
    m.add(3, 8);
    assert_eq!(m.next(0), Some((4, 3, 8)));
    assert_eq!(m.next(4), Some((201, 200, 9)));
    assert_eq!(m.next(201), None);
    m.write_prefix(b"xyz");
    m.drop_prefix_front(1);
    assert_eq!(m.prefix_byte(0), b'y');
}

#[test]
fn grows_16_64_256_and_shrinks_back() {
    let mut c = Cart::new();
    for b in 1..=255u8 {
        if b != b'/' {
            assert_eq!(c.insert(DIR, &[b'p', b], u64::from(b)), None);
        }
        let [n16, n64, n256] = c.node_counts();
        let n = c.child_count(DIR);
        match n {
            1..=15 => assert_eq!((n16, n64, n256), (1, 0, 0), "n={n}"),
            // A full Node16 has no free tail for its prefix "p": it moves into a
            // one-child Node16 above (two Node16s are still smaller than a Node64).
            16 => assert_eq!((n16, n64, n256), (2, 0, 0), "n={n}"),
            17..=63 => assert_eq!((n16, n64, n256), (0, 1, 0), "n={n}"),
            // Likewise for a full Node64; the chain folds back once it grows.
            64 => assert_eq!((n16, n64, n256), (1, 1, 0), "n={n}"),
            _ => assert_eq!((n16, n64, n256), (0, 0, 1), "n={n}"),
        }
        check(&c);
    }
    assert_eq!(c.len(), 254);
    for b in (1..=255u8).rev() {
        if b != b'/' {
            assert_eq!(c.remove(DIR, &[b'p', b]), Some(u64::from(b)));
        }
        check(&c);
    }
    assert!(c.is_empty());
    assert_eq!(c.node_counts(), [0, 0, 0]);
    assert_eq!(c.parents().count(), 0);
}

#[test]
fn prefix_split_and_merge() {
    let mut c = Cart::new();
    c.insert(DIR, b"data1", 1);
    c.insert(DIR, b"data2", 2);
    assert_eq!(c.node_counts(), [1, 0, 0], "one node: prefix \"data\", leaves 1 and 2");
    c.insert(DIR, b"dxyz", 3);
    check(&c);
    assert_eq!(c.get(DIR, b"data1"), Some(1));
    assert_eq!(c.get(DIR, b"dxyz"), Some(3));
    assert_eq!(c.get(DIR, b"dat"), None);
    assert_eq!(c.get(DIR, b"data"), None);
    assert_eq!(c.get(DIR, b"data12"), None);
    assert_eq!(c.remove(DIR, b"dxyz"), Some(3));
    check(&c);
    assert_eq!(c.node_counts(), [1, 0, 0], "merged back into one node");
    assert_eq!(c.get(DIR, b"data2"), Some(2));
}

#[test]
fn names_that_are_prefixes_of_each_other() {
    let mut c = Cart::new();
    let names: [&[u8]; 6] = [b"a.1", b"a.10", b"a.100", b"a", b"a.", b"b"];
    for (i, n) in names.iter().enumerate() {
        assert_eq!(c.insert(DIR, n, i as u64), None);
        check(&c);
    }
    for (i, n) in names.iter().enumerate() {
        assert_eq!(c.get(DIR, n), Some(i as u64));
    }
    let got: Vec<Vec<u8>> = entries(&c, DIR, None).into_iter().map(|(k, _)| k).collect();
    let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(entries(&c, DIR, Some(b"a.1")).len(), 3);
    assert_eq!(entries(&c, DIR, Some(b"a.0")).len(), 4);
    for n in names {
        c.remove(DIR, n);
        check(&c);
    }
    assert_eq!(c.node_counts(), [0, 0, 0]);
}

#[test]
fn long_names_chain_prefixes() {
    let mut c = Cart::new();
    let long = vec![b'x'; 255];
    let mut long2 = long.clone();
    long2[254] = b'y';
    let mut short = long.clone();
    short.truncate(1);
    c.insert(DIR, &long, 1);
    check(&c);
    c.insert(DIR, &long2, 2);
    c.insert(DIR, &short, 3);
    let mut mid = long.clone();
    mid[100] = b'm';
    c.insert(DIR, &mid, 4);
    check(&c);
    assert_eq!(c.get(DIR, &long), Some(1));
    assert_eq!(c.get(DIR, &long2), Some(2));
    assert_eq!(c.get(DIR, &short), Some(3));
    assert_eq!(c.get(DIR, &mid), Some(4));
    assert_eq!(c.get(DIR, &long[..254]), None);
    assert_eq!(entries(&c, DIR, Some(&long)).len(), 1);
    for n in [&long, &long2, &short, &mid] {
        assert!(c.remove(DIR, n).is_some());
        check(&c);
    }
    assert!(c.is_empty());
}

#[test]
fn directories_are_separate_and_max_value_fits() {
    let mut c = Cart::new();
    c.insert(InodeId(1), b"same", 1);
    c.insert(InodeId(2), b"same", MAX_VALUE);
    assert_eq!(c.insert(InodeId(2), b"same", 5), Some(MAX_VALUE));
    assert_eq!(c.get(InodeId(1), b"same"), Some(1));
    assert_eq!(c.child_count(InodeId(2)), 1);
    assert_eq!(c.len(), 2);
    let mut p: Vec<u64> = c.parents().map(|i| i.0).collect();
    p.sort();
    assert_eq!(p, vec![1, 2]);
    assert!(c.heap_bytes() > 0);
}

#[test]
#[should_panic(expected = "reserved top bit")]
fn value_with_top_bit_is_a_bug() {
    Cart::new().insert(DIR, b"x", 1 << 63);
}

#[test]
fn iteration_stops_when_asked() {
    let mut c = Cart::new();
    for i in 0..100u64 {
        c.insert(DIR, format!("f{i}").as_bytes(), i);
    }
    let mut seen = 0;
    c.for_each_from(DIR, None, |_, _| {
        seen += 1;
        seen < 10
    });
    assert_eq!(seen, 10);
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, Vec<u8>, u64),
    Remove(u64, Vec<u8>),
    Get(u64, Vec<u8>),
    Scan(u64, Vec<u8>),
}

/// Names with shared prefixes, serial numbers, 1- and 255-byte names, prefixes of each other.
fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (0u32..300).prop_map(|i| format!("file.mdtest.{}.{}", i / 30, i % 30).into_bytes()),
        2 => proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'.')], 1..6),
        1 => (1u8..=255).prop_filter("no NUL", |b| *b != 0).prop_map(|b| vec![b]),
        1 => (0usize..4, 0u8..3).prop_map(|(cut, last)| {
            let mut v = vec![b'L'; 255 - cut];
            let n = v.len();
            v[n - 1] = b'a' + last;
            v
        }),
        1 => (1usize..200, any::<u8>()).prop_map(|(len, x)| {
            let mut v = vec![b'q'; len];
            v[len / 2] = x.max(1);
            v
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let parent = 0u64..3;
    prop_oneof![
        6 => (parent.clone(), name(), 0u64..1000).prop_map(|(p, n, v)| Op::Insert(p, n, v)),
        4 => (parent.clone(), name()).prop_map(|(p, n)| Op::Remove(p, n)),
        2 => (parent.clone(), name()).prop_map(|(p, n)| Op::Get(p, n)),
        1 => (parent, name()).prop_map(|(p, n)| Op::Scan(p, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn model_matches_btreemap(ops in proptest::collection::vec(op(), 1..400)) {
        let mut c = Cart::new();
        let mut m: BTreeMap<(u64, Vec<u8>), u64> = BTreeMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Insert(p, n, v) => {
                    prop_assert_eq!(c.insert(InodeId(p), &n, v), m.insert((p, n), v));
                }
                Op::Remove(p, n) => {
                    prop_assert_eq!(c.remove(InodeId(p), &n), m.remove(&(p, n)));
                }
                Op::Get(p, n) => {
                    prop_assert_eq!(c.get(InodeId(p), &n), m.get(&(p, n)).copied());
                }
                Op::Scan(p, after) => {
                    let want: Vec<(Vec<u8>, u64)> = m
                        .range((p, after.clone())..(p + 1, Vec::new()))
                        .filter(|((_, k), _)| *k != after)
                        .map(|((_, k), v)| (k.clone(), *v))
                        .collect();
                    prop_assert_eq!(entries(&c, InodeId(p), Some(&after)), want);
                }
            }
            if i % 8 == 0 {
                check(&c);
                prop_assert_eq!(c.len(), m.len());
                for p in 0..3u64 {
                    let want: Vec<(Vec<u8>, u64)> = m
                        .range((p, Vec::new())..(p + 1, Vec::new()))
                        .map(|((_, k), v)| (k.clone(), *v))
                        .collect();
                    prop_assert_eq!(c.child_count(InodeId(p)), want.len());
                    prop_assert_eq!(&entries(&c, InodeId(p), None), &want);
                    for (k, v) in &want {
                        prop_assert_eq!(c.get(InodeId(p), k), Some(*v));
                    }
                    // Resume from each stored name and from a name between entries.
                    if let Some((k, _)) = want.get(want.len() / 2) {
                        let pos = want.len() / 2 + 1;
                        prop_assert_eq!(&entries(&c, InodeId(p), Some(k)), &want[pos..].to_vec());
                        let mut between = k.clone();
                        if between.len() < 255 {
                            between.push(1);
                            prop_assert_eq!(&entries(&c, InodeId(p), Some(&between)), &want[pos..].to_vec());
                        }
                    }
                }
            }
        }
        // Drain everything: all nodes must be freed.
        let keys: Vec<(u64, Vec<u8>)> = m.keys().cloned().collect();
        for (p, n) in keys {
            prop_assert_eq!(c.remove(InodeId(p), &n), m.remove(&(p, n.clone())));
        }
        prop_assert!(c.is_empty());
        prop_assert_eq!(c.node_counts(), [0, 0, 0]);
    }
}

/// The table of directories is split (`slots.rs`): its parts list every
/// directory with names once, and emptied directories in none.
#[test]
fn the_parts_list_every_directory_with_names_once() {
    let mut c = Cart::new();
    for d in 1..=5000u64 {
        c.insert(InodeId(d), b"a", d);
        c.insert(InodeId(d), b"b", d);
    }
    for d in (1..=5000u64).step_by(7) {
        c.remove(InodeId(d), b"a");
        c.remove(InodeId(d), b"b");
    }
    let mut listed: Vec<u64> =
        (0..crate::slots::SPLIT).flat_map(|p| c.part_parents(p)).map(|i| i.0).collect();
    listed.sort_unstable();
    let expected: Vec<u64> = (1..=5000u64).filter(|d| (d - 1) % 7 != 0).collect();
    assert_eq!(listed, expected);
    let mut all: Vec<u64> = c.parents().map(|i| i.0).collect();
    all.sort_unstable();
    assert_eq!(all, expected);
    check(&c);
}
