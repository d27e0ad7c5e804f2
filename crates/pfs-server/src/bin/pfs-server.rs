//! `pfs-server serve --config server.toml` and `pfs-server master --config master.toml`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pfs_core::config::ConfigFile;
use pfs_core::{MasterConfig, ServerConfig};
use pfs_server::signals;

/// The pfs storage daemon and cluster master.
#[derive(Debug, Parser)]
#[command(name = "pfs-server", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a storage server: one worker (and shard) per configured core on the data
    /// file or device. SIGTERM drains, checkpoints and exits 0.
    Serve {
        /// Server config file (TOML); see deploy/server.toml.
        #[arg(long, short)]
        config: PathBuf,
        /// Seconds to keep trying to register with the master at start.
        #[arg(long, default_value_t = 60)]
        register_timeout: u64,
    },
    /// Run the cluster master (the view of servers). SIGTERM stops it.
    Master {
        /// Master config file (TOML); see deploy/master.toml.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Write a new random cluster key file (mode 0600); copy it to every node.
    Keygen {
        /// Where to write it.
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    signals::install();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            eprintln!("pfs-server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Serve { config, register_timeout } => {
            let cfg = ServerConfig::load(&config).map_err(|e| e.to_string())?;
            let server = pfs_server::start(&cfg, Duration::from_secs(register_timeout))
                .map_err(|e| e.to_string())?;
            let stop = server.stop_flag();
            std::thread::spawn(move || {
                while !signals::stop_requested() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                log::info!("stop signal: draining and checkpointing");
                stop.store(true, std::sync::atomic::Ordering::Release);
            });
            server.join().map_err(|e| e.to_string())?;
            log::info!("stopped cleanly");
            Ok(())
        }
        Command::Master { config } => {
            let cfg = MasterConfig::load(&config).map_err(|e| e.to_string())?;
            let master = pfs_server::start_master(&cfg).map_err(|e| e.to_string())?;
            while !signals::stop_requested() {
                std::thread::sleep(Duration::from_millis(50));
            }
            log::info!("stop signal: master stopping");
            master.stop();
            Ok(())
        }
        Command::Keygen { path } => {
            pfs_net::ClusterKey::generate(&path).map_err(|e| e.to_string())?;
            println!("wrote a new cluster key to {}", path.display());
            Ok(())
        }
    }
}
