//! `pfs fsck`: its arguments; the checker is `pfs_server::fsck`.

use std::path::{Path, PathBuf};

use pfs_core::config::ConfigFile;
use pfs_core::ServerConfig;

/// `pfs fsck` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct FsckArgs {
    /// A `pfs up` data directory: checks every server in it (stop `pfs up` first).
    #[arg(long, conflicts_with = "config")]
    pub data: Option<PathBuf>,
    /// A storage server's config file (repeat for several servers whose devices
    /// this host can open); stop the servers first.
    #[arg(long, short)]
    pub config: Vec<PathBuf>,
    /// Repair what is safe to repair: dangling names, link counts, orphan inodes
    /// and data, leaked transaction records.
    #[arg(long)]
    pub repair: bool,
}

/// The server configs of a `pfs up` data directory.
fn up_configs(data: &Path) -> Result<Vec<ServerConfig>, String> {
    crate::up::server_configs(data)
}

/// Runs `pfs fsck`; `Ok(true)` when the file system is clean (after repairs,
/// with `--repair`).
pub fn run(args: &FsckArgs) -> Result<bool, String> {
    let configs = match (&args.data, args.config.is_empty()) {
        (Some(data), true) => up_configs(data)?,
        (None, false) => args
            .config
            .iter()
            .map(|p| ServerConfig::load(p).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?,
        _ => return Err("give --data DIR (a pfs up directory) or --config server.toml".into()),
    };
    pfs_server::fsck::run(&configs, args.repair, &mut std::io::stdout())
}
