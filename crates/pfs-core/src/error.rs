//! The error every layer reports to a client, and its errno.

use serde::{Deserialize, Serialize};

/// A file system error as seen by a client. Each variant maps to one errno.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum FsError {
    /// No such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// The name already exists.
    #[error("file exists")]
    Exists,
    /// A directory was expected.
    #[error("not a directory")]
    NotDir,
    /// A non-directory was expected.
    #[error("is a directory")]
    IsDir,
    /// The directory still has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// A name component is longer than `NAME_MAX` bytes.
    #[error("file name too long")]
    NameTooLong,
    /// An argument is invalid; the text says which.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The operation is not permitted (hard links, for instance).
    #[error("operation not permitted")]
    NotPermitted,
    /// Permission denied.
    #[error("permission denied")]
    Access,
    /// The zone is out of data pages or inode slots.
    #[error("no space left on device")]
    NoSpace,
    /// The extended attribute does not exist.
    #[error("no such attribute")]
    NoAttr,
    /// A value does not fit the caller's buffer or a limit.
    #[error("result too large")]
    Range,
    /// The file is too large for the layout.
    #[error("file too large")]
    FileTooLarge,
    /// The operation is not supported (for instance a rename flag).
    #[error("operation not supported: {0}")]
    NotSupported(String),
    /// A queue or table is full; retry later.
    #[error("resource temporarily unavailable")]
    TryAgain,
    /// The request timed out.
    #[error("timed out")]
    TimedOut,
    /// A device, network or corruption error; the text says what.
    #[error("I/O error: {0}")]
    Io(String),
    /// A file already has the most links allowed.
    #[error("too many links")]
    TooManyLinks,
    /// A new name reached a shard that its directory's current layout does
    /// not place it on: the sender routed by a layout that changed since it
    /// cached it. The client fetches the layout again and routes anew; it
    /// never reaches a program (which would see `EAGAIN` if it did).
    #[error("the name belongs to another shard: the directory's layout changed")]
    Misrouted,
    /// The directory named was removed (another client removed it, perhaps
    /// made another of the same name): the caller's name for it is stale.
    /// `ESTALE`, on which the kernel looks the path up again from the start.
    #[error("stale file handle: the directory was removed")]
    Stale,
    /// A file lock's table is full (`ENOLCK`).
    #[error("no locks available")]
    NoLocks,
}

impl FsError {
    /// The errno a POSIX caller expects for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NotPermitted => libc::EPERM,
            FsError::Access => libc::EACCES,
            FsError::NoSpace => libc::ENOSPC,
            FsError::NoAttr => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::FileTooLarge => libc::EFBIG,
            FsError::NotSupported(_) => libc::EOPNOTSUPP,
            FsError::TryAgain => libc::EAGAIN,
            FsError::TimedOut => libc::ETIMEDOUT,
            FsError::Io(_) => libc::EIO,
            FsError::TooManyLinks => libc::EMLINK,
            // On the wire only: a client turns it into `TryAgain` if it ever
            // gives up rerouting (`Cluster::rerouting`).
            FsError::Misrouted => libc::EREMCHG,
            FsError::Stale => libc::ESTALE,
            FsError::NoLocks => libc::ENOLCK,
        }
    }

    /// The text a variant carries (`Invalid`, `NotSupported`, `Io`), or `""`.
    pub fn detail(&self) -> &str {
        match self {
            FsError::Invalid(s) | FsError::NotSupported(s) | FsError::Io(s) => s,
            _ => "",
        }
    }

    /// The error for `errno`, with `detail` for the variants that carry text; the
    /// inverse of [`errno`](Self::errno) and [`detail`](Self::detail). An errno no
    /// variant maps to becomes `Io`, keeping the number in the text.
    pub fn from_errno(errno: i32, detail: &str) -> FsError {
        match errno {
            libc::ENOENT => FsError::NotFound,
            libc::EEXIST => FsError::Exists,
            libc::ENOTDIR => FsError::NotDir,
            libc::EISDIR => FsError::IsDir,
            libc::ENOTEMPTY => FsError::NotEmpty,
            libc::ENAMETOOLONG => FsError::NameTooLong,
            libc::EINVAL => FsError::Invalid(detail.to_owned()),
            libc::EPERM => FsError::NotPermitted,
            libc::EACCES => FsError::Access,
            libc::ENOSPC => FsError::NoSpace,
            libc::ENODATA => FsError::NoAttr,
            libc::ERANGE => FsError::Range,
            libc::EFBIG => FsError::FileTooLarge,
            libc::EOPNOTSUPP => FsError::NotSupported(detail.to_owned()),
            libc::EAGAIN => FsError::TryAgain,
            libc::ETIMEDOUT => FsError::TimedOut,
            libc::EIO => FsError::Io(detail.to_owned()),
            libc::EMLINK => FsError::TooManyLinks,
            libc::EREMCHG => FsError::Misrouted,
            libc::ESTALE => FsError::Stale,
            libc::ENOLCK => FsError::NoLocks,
            other => FsError::Io(format!("errno {other}: {detail}")),
        }
    }
}

/// Result type of file system operations.
pub type FsResult<T> = Result<T, FsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_is_posix() {
        assert_eq!(FsError::NotFound.errno(), libc::ENOENT);
        assert_eq!(FsError::NotEmpty.errno(), libc::ENOTEMPTY);
        assert_eq!(FsError::Invalid("x".into()).errno(), libc::EINVAL);
        assert_eq!(FsError::Io("disk".into()).errno(), libc::EIO);
    }

    #[test]
    fn from_errno_inverts_errno() {
        let all = [
            FsError::NotFound,
            FsError::Exists,
            FsError::NotDir,
            FsError::IsDir,
            FsError::NotEmpty,
            FsError::NameTooLong,
            FsError::Invalid("bad offset".into()),
            FsError::NotPermitted,
            FsError::Access,
            FsError::NoSpace,
            FsError::NoAttr,
            FsError::Range,
            FsError::FileTooLarge,
            FsError::NotSupported("rename flag".into()),
            FsError::TryAgain,
            FsError::TimedOut,
            FsError::Io("disk".into()),
            FsError::TooManyLinks,
            FsError::Misrouted,
            FsError::Stale,
            FsError::NoLocks,
        ];
        for e in all {
            assert_eq!(FsError::from_errno(e.errno(), e.detail()), e);
        }
        assert_eq!(FsError::from_errno(9999, "x"), FsError::Io("errno 9999: x".into()));
    }
}
