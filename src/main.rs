//! `pfs`: the admin and all-in-one command.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pfs_core::config::ConfigFile;
use pfs_core::ClientConfig;

/// pfs: a parallel file system for HPC clusters.
#[derive(Debug, Parser)]
#[command(name = "pfs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the cluster's servers, their health and usage, as the master sees them.
    Status {
        /// Client config file (TOML) naming the master and the key file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The master, host:port (overrides the config).
        #[arg(long)]
        master: Option<String>,
        /// The cluster key file (overrides the config).
        #[arg(long)]
        key: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pfs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Status { config, master, key } => {
            let mut cfg = match config {
                Some(path) => ClientConfig::load(&path).map_err(|e| e.to_string())?,
                None => ClientConfig::default(),
            };
            if let Some(m) = master {
                cfg.master = m;
            }
            if let Some(k) = key {
                cfg.key_file = k;
            }
            let addr = cfg
                .master
                .to_socket_addrs()
                .map_err(|e| format!("master {:?}: {e}", cfg.master))?
                .next()
                .ok_or_else(|| format!("master {:?} resolves to no address", cfg.master))?;
            let key = pfs_net::ClusterKey::load(&cfg.key_file).map_err(|e| e.to_string())?;
            let timeout = Duration::from_millis(cfg.connect_timeout_ms);
            let view =
                pfs_client::cluster::fetch_view(addr, &key, timeout).map_err(|e| e.to_string())?;
            print!("{}", pfs::status::status_table(&view));
            Ok(())
        }
    }
}
