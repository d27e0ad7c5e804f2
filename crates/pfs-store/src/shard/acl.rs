//! POSIX access control lists, as far as pfs keeps them: in the mode bits.
//!
//! The kernel hands a FUSE file system that does not claim ACL support the
//! ACL extended attributes as they are (`system.posix_acl_access`, a
//! little-endian `u32` version 2, then 8-byte entries: `u16` tag, `u16`
//! permissions, `u32` id). `cp -a`, `tar --acls` and `rsync -A` copy a file's
//! permissions by setting its access ACL, one the mode expresses (owner, group
//! and other entries only) for a file that has no ACL. Kept as an opaque
//! attribute, such a set left the mode of every copied file at `cp`'s
//! creation mode (0600, 0700). ext4 does what this module does: an ACL the
//! mode expresses sets the mode and is not stored. pfs stores no other ACL:
//! one with named users or groups or a mask, and every default ACL, is refused
//! with `EOPNOTSUPP`, as by ext4 mounted `noacl` (the kernel does not check
//! ACLs for pfs, so keeping them would show access rules nothing enforces).

use pfs_core::{FsError, FsResult};
pub use pfs_core::{XATTR_ACL_ACCESS, XATTR_ACL_DEFAULT};

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// Whether `name` is one of the POSIX ACL attributes.
pub fn is_acl(name: &[u8]) -> bool {
    name == XATTR_ACL_ACCESS || name == XATTR_ACL_DEFAULT
}

/// The permission bits (`0o777`) an access ACL stands for: `Invalid` for a
/// value that is no ACL, `NotSupported` for one the mode cannot express.
pub fn access_perm(value: &[u8]) -> FsResult<u16> {
    let bad = |why: &str| FsError::Invalid(format!("system.posix_acl_access: {why}"));
    let Some((header, entries)) = value.split_first_chunk::<4>() else {
        return Err(bad("shorter than its header"));
    };
    if u32::from_le_bytes(*header) != VERSION {
        return Err(bad("not version 2"));
    }
    if entries.len() % 8 != 0 {
        return Err(bad("not whole 8-byte entries"));
    }
    let (mut user, mut group, mut other) = (None, None, None);
    let mut extended = false;
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        if perm & !0o7 != 0 {
            return Err(bad("permissions beyond rwx"));
        }
        let slot = match tag {
            USER_OBJ => &mut user,
            GROUP_OBJ => &mut group,
            OTHER => &mut other,
            USER | GROUP | MASK => {
                extended = true;
                continue;
            }
            _ => return Err(bad("an unknown entry tag")),
        };
        if slot.replace(perm).is_some() {
            return Err(bad("a repeated owner, group or other entry"));
        }
    }
    let (Some(u), Some(g), Some(o)) = (user, group, other) else {
        return Err(bad("no owner, group or other entry"));
    };
    if extended {
        return Err(FsError::NotSupported(
            "pfs keeps no POSIX ACL beyond the mode bits: named users, named groups and \
             masks are not supported"
                .into(),
        ));
    }
    Ok(u << 6 | g << 3 | o)
}

/// The refusal of a default ACL.
pub fn default_refused() -> FsError {
    FsError::NotSupported(
        "pfs keeps no POSIX ACL beyond the mode bits: default ACLs are not supported".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    #[test]
    fn an_acl_the_mode_expresses_gives_its_bits() {
        let any = u32::MAX;
        let v = acl(&[(USER_OBJ, 6, any), (GROUP_OBJ, 4, any), (OTHER, 4, any)]);
        assert_eq!(access_perm(&v).unwrap(), 0o644);
        // What `cp -a` sends for a 0751 directory, in another order.
        let v = acl(&[(OTHER, 1, any), (USER_OBJ, 7, any), (GROUP_OBJ, 5, any)]);
        assert_eq!(access_perm(&v).unwrap(), 0o751);
    }

    #[test]
    fn named_entries_and_masks_are_not_supported() {
        let any = u32::MAX;
        let base = [(USER_OBJ, 6, any), (GROUP_OBJ, 4, any), (OTHER, 0, any)];
        for extra in [(USER, 6, 1000), (GROUP, 4, 100), (MASK, 6, any)] {
            let mut e = base.to_vec();
            e.push(extra);
            assert!(matches!(access_perm(&acl(&e)), Err(FsError::NotSupported(_))), "{extra:?}");
        }
        assert!(matches!(default_refused(), FsError::NotSupported(_)));
    }

    #[test]
    fn malformed_values_are_invalid() {
        let any = u32::MAX;
        let good = acl(&[(USER_OBJ, 6, any), (GROUP_OBJ, 4, any), (OTHER, 4, any)]);
        let mut bad_version = good.clone();
        bad_version[0] = 1;
        let cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            vec![2, 0],
            bad_version,
            good[..good.len() - 1].to_vec(),
            acl(&[(USER_OBJ, 6, any), (GROUP_OBJ, 4, any)]),
            acl(&[(USER_OBJ, 6, any), (USER_OBJ, 6, any), (GROUP_OBJ, 4, any), (OTHER, 4, any)]),
            acl(&[(USER_OBJ, 8, any), (GROUP_OBJ, 4, any), (OTHER, 4, any)]),
            acl(&[(USER_OBJ, 6, any), (GROUP_OBJ, 4, any), (OTHER, 4, any), (0x40, 0, any)]),
        ];
        for v in cases {
            assert!(matches!(access_perm(&v), Err(FsError::Invalid(_))), "{v:?}");
        }
    }
}
