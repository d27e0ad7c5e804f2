//! `pfs mkfs`: formats a storage server's device (or every device of a `pfs up`
//! data directory) before its first start. A server formats an empty device by
//! itself at its first start; `pfs mkfs` does it ahead of time, as a given
//! server id, and is the way to wipe a device that holds pfs zones (`--force`).

use std::path::PathBuf;

use pfs_core::config::ConfigFile;
use pfs_core::{ServerConfig, ServerId};

/// `pfs mkfs` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct MkfsArgs {
    /// A storage server's config file: formats its `data_path` (a file is created
    /// at `device_size_bytes`), one zone per worker.
    #[arg(long, short, conflicts_with = "data", requires = "server")]
    pub config: Option<PathBuf>,
    /// The server id the device gets in the cluster (0 to the master's
    /// `servers` - 1); the server registers as this one at its first start.
    #[arg(long)]
    pub server: Option<u32>,
    /// A `pfs up` data directory: formats every server's device file in it again
    /// (its cluster key and master state stay). Stop `pfs up` first.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Format devices that hold pfs zones already: every file on them is lost.
    #[arg(long)]
    pub force: bool,
}

/// Runs `pfs mkfs`.
pub fn run(args: &MkfsArgs) -> Result<(), String> {
    let targets: Vec<(ServerConfig, ServerId)> = match (&args.config, &args.data) {
        (Some(path), None) => {
            let cfg = ServerConfig::load(path).map_err(|e| e.to_string())?;
            let id = args.server.ok_or("--config needs --server N (this server's id)")?;
            vec![(cfg, ServerId(id))]
        }
        (None, Some(data)) => crate::up::server_configs(data)?
            .into_iter()
            .enumerate()
            .map(|(i, c)| (c, ServerId(i as u32)))
            .collect(),
        _ => return Err("give --config server.toml --server N, or --data DIR".into()),
    };
    for (cfg, id) in &targets {
        let shards = pfs_server::mkfs(cfg, *id, args.force)
            .map_err(|e| format!("{}: {e}", cfg.data_path.display()))?;
        println!(
            "pfs mkfs: formatted {} as server {id}: shards {}",
            cfg.data_path.display(),
            shards.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}
