//! Where each server listens, as the master lists it.
//!
//! A client fetches the view at connect. When a server cannot be reached
//! afterwards, the connection asks here, and this asks the master again (at
//! most once per [`REFETCH_EVERY`], one caller at a time): a server that came
//! back at another address (its node replaced, its config changed) is
//! followed without a remount. Servers follow the view the same way through
//! their heartbeat (docs/cluster.md, "How they find each other").

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pfs_core::wire::View;
use pfs_net::ClusterKey;

/// Least time between two fetches of the view.
pub const REFETCH_EVERY: Duration = Duration::from_secs(1);
/// Longest a caller waits for the master's answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(1);

/// The servers' addresses, fetched again from the master when one is
/// unreachable.
#[derive(Debug)]
pub struct ServerAddrs {
    master: SocketAddr,
    key: ClusterKey,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    view: View,
    fetched: Instant,
    /// A view of another shape was met and logged (logged once).
    warned: bool,
}

impl ServerAddrs {
    /// The addresses of `view`, fetched from `master` just now.
    pub fn new(master: SocketAddr, key: ClusterKey, view: View) -> ServerAddrs {
        ServerAddrs {
            master,
            key,
            state: Mutex::new(State { view, fetched: Instant::now(), warned: false }),
        }
    }

    /// The view as last fetched.
    pub fn view(&self) -> View {
        self.state.lock().expect("view lock").view.clone()
    }

    /// Where server `server` listens as far as the master knows, asking it
    /// again when the last answer is older than [`REFETCH_EVERY`], within
    /// `budget`. `None` while another caller asks, or when the view does not
    /// name the server at an `ip:port`.
    pub fn lookup(&self, server: usize, budget: Duration) -> Option<SocketAddr> {
        let mut st = self.state.try_lock().ok()?;
        if st.fetched.elapsed() >= REFETCH_EVERY {
            let timeout = budget.clamp(Duration::from_millis(10), FETCH_TIMEOUT);
            match crate::cluster::fetch_view(self.master, &self.key, timeout) {
                Ok(v) => match same_shape(&st.view, &v) {
                    Ok(()) => st.view = v,
                    Err(why) if !st.warned => {
                        st.warned = true;
                        log::error!(
                            "the master at {} lists another cluster than this client routes by \
                             ({why}): keeping the addresses fetched at connect; mount again",
                            self.master
                        );
                    }
                    Err(_) => {}
                },
                Err(e) => log::warn!("asking the master where server {server} listens: {e}"),
            }
            st.fetched = Instant::now();
        }
        st.view.servers.get(server)?.addr.parse().ok()
    }
}

/// Whether `new` routes as `old` does: the same servers, by id, with the same
/// workers (only addresses may change under a running client).
fn same_shape(old: &View, new: &View) -> Result<(), String> {
    if !new.is_complete() {
        return Err(format!(
            "{} of {} servers registered",
            new.servers.len(),
            new.servers_expected
        ));
    }
    if new.servers.len() != old.servers.len() {
        return Err(format!("{} servers, not {}", new.servers.len(), old.servers.len()));
    }
    for (a, b) in old.servers.iter().zip(&new.servers) {
        if a.id != b.id || a.workers != b.workers {
            return Err(format!(
                "server {} with {} workers where server {} had {}",
                b.id, b.workers, a.id, a.workers
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::ServerInfo;
    use pfs_core::ServerId;

    fn view(addrs: &[&str], workers: u32) -> View {
        View {
            epoch: 1,
            servers_expected: addrs.len() as u32,
            servers: addrs
                .iter()
                .enumerate()
                .map(|(i, a)| ServerInfo {
                    id: ServerId(i as u32),
                    addr: (*a).to_owned(),
                    workers,
                    up: true,
                    last_report_ms: 0,
                    usage: Default::default(),
                })
                .collect(),
        }
    }

    #[test]
    fn only_addresses_may_change_under_a_client() {
        let old = view(&["127.0.0.2:1", "127.0.0.3:1"], 2);
        assert!(same_shape(&old, &view(&["127.0.0.9:5", "127.0.0.3:1"], 2)).is_ok());
        assert!(same_shape(&old, &view(&["127.0.0.2:1"], 2)).is_err());
        assert!(same_shape(&old, &view(&["127.0.0.2:1", "127.0.0.3:1"], 3)).is_err());
        let mut incomplete = view(&["127.0.0.2:1", "127.0.0.3:1"], 2);
        incomplete.servers_expected = 3;
        assert!(same_shape(&old, &incomplete).is_err());
    }

    #[test]
    fn an_unreachable_master_leaves_the_addresses_as_they_were() {
        // Nothing listens on port 1 of 127.0.0.1.
        let key = ClusterKey::from_bytes(&[7; 32]).unwrap();
        let addrs = ServerAddrs::new(
            "127.0.0.1:1".parse().unwrap(),
            key,
            view(&["127.0.0.2:7070", "127.0.0.3:7070"], 2),
        );
        addrs.state.lock().unwrap().fetched = Instant::now() - REFETCH_EVERY;
        assert_eq!(
            addrs.lookup(1, Duration::from_millis(200)),
            Some("127.0.0.3:7070".parse().unwrap())
        );
        assert_eq!(addrs.lookup(2, Duration::from_millis(200)), None);
    }
}
