//! A worker process: `pfs bench` run again by the coordinator with
//! [`WORKER_ENV`](super::WORKER_ENV) set and the same arguments. It opens the
//! target, then runs the phases it is told to on stdin, answering on stdout.
//! A thread reads stdin so that a stonewall `Stop` lands while a phase runs;
//! another reports progress every [`PROGRESS_INTERVAL`].

use std::io::{BufReader, Stdout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::phases::{self, Control, Ctx};
use super::proto::{now_ns, recv, send, FromWorker, ToWorker};
use super::target::{NativeTarget, PosixTarget, Target, TargetSpec};
use super::{BenchArgs, BenchError, Params, Workload};

/// How often a running phase reports its progress.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// The worker's side of the pipes.
struct Link {
    rx: Receiver<ToWorker>,
    out: Arc<Mutex<Stdout>>,
    stop: Arc<AtomicBool>,
    /// Items done in the running phase.
    items: Arc<AtomicU64>,
    /// Whether a phase runs (between `Go` and its `Done`).
    active: Arc<AtomicBool>,
}

impl Link {
    fn send(&self, msg: &FromWorker) -> Result<(), BenchError> {
        let mut out = self.out.lock().expect("stdout lock");
        send(&mut *out, msg).map_err(|e| BenchError::Setup(format!("coordinator pipe: {e}")))
    }

    /// Ends a phase: no progress report can follow this message.
    fn finish(&self, msg: &FromWorker) -> Result<(), BenchError> {
        let mut out = self.out.lock().expect("stdout lock");
        self.active.store(false, Ordering::Relaxed);
        send(&mut *out, msg).map_err(|e| BenchError::Setup(format!("coordinator pipe: {e}")))
    }
}

impl Control for Link {
    fn go(&self) -> Result<u64, BenchError> {
        self.send(&FromWorker::Prepared)?;
        match self.rx.recv() {
            Ok(ToWorker::Go) => {
                self.active.store(true, Ordering::Relaxed);
                Ok(now_ns())
            }
            Ok(other) => Err(BenchError::Setup(format!("expected Go, got {other:?}"))),
            Err(_) => Err(BenchError::Setup("coordinator went away".into())),
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn progress(&self, items: u64) {
        self.items.store(items, Ordering::Relaxed);
    }
}

/// Runs this process as a worker; returns when told to quit.
pub fn main(args: &BenchArgs) -> Result<(), String> {
    let params = Params::from_args(args)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let stop_in = stop.clone();
    std::thread::Builder::new()
        .name("bench-stdin".into())
        .spawn(move || {
            let mut input = BufReader::new(std::io::stdin());
            loop {
                match recv::<_, ToWorker>(&mut input) {
                    Ok(Some(ToWorker::Stop)) => stop_in.store(true, Ordering::Relaxed),
                    Ok(Some(m)) => {
                        if tx.send(m).is_err() {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        let _ = tx.send(ToWorker::Quit);
                        return;
                    }
                }
            }
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    let link = Link {
        rx,
        out: Arc::new(Mutex::new(std::io::stdout())),
        stop,
        items: Arc::new(AtomicU64::new(0)),
        active: Arc::new(AtomicBool::new(false)),
    };
    let (rank, run) = match link.rx.recv() {
        Ok(ToWorker::Hello { rank, run }) if rank < params.procs => (rank, run),
        Ok(ToWorker::Quit) | Err(_) => return Ok(()),
        Ok(other) => return Err(format!("worker: expected Hello, got {other:?}")),
    };
    start_progress_thread(&link)?;
    let served = match TargetSpec::parse(&args.target) {
        Ok(TargetSpec::Posix(dir)) => PosixTarget::new(&dir)
            .and_then(|t| serve(&t, args.workload, rank, &run, &params, &link)),
        Ok(TargetSpec::Native { master, dir }) => NativeTarget::connect(master, &args.key, &dir)
            .and_then(|t| serve(&t, args.workload, rank, &run, &params, &link)),
        Err(e) => Err(e),
    };
    if let Err(e) = served {
        // The coordinator prints it, and stops the others.
        let _ = link.finish(&FromWorker::Failed { error: format!("rank {rank}: {e}") });
    }
    Ok(())
}

fn start_progress_thread(link: &Link) -> Result<(), String> {
    let (out, items, active) = (link.out.clone(), link.items.clone(), link.active.clone());
    std::thread::Builder::new()
        .name("bench-progress".into())
        .spawn(move || loop {
            std::thread::sleep(PROGRESS_INTERVAL);
            let mut o = out.lock().expect("stdout lock");
            if active.load(Ordering::Relaxed) {
                let msg = FromWorker::Progress { items: items.load(Ordering::Relaxed) };
                if send(&mut *o, &msg).is_err() {
                    return;
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start a thread: {e}"))
}

/// Answers `Prepare` with a phase run until `Quit`.
fn serve<T: Target>(
    t: &T,
    w: Workload,
    rank: u32,
    run: &str,
    p: &Params,
    link: &Link,
) -> Result<(), String> {
    link.send(&FromWorker::Ready).map_err(|e| e.to_string())?;
    loop {
        match link.rx.recv() {
            Ok(ToWorker::Prepare { phase, counts }) => {
                if phase >= w.phases().len() || counts.len() != p.procs as usize {
                    return Err(format!("bad Prepare: phase {phase}, {} counts", counts.len()));
                }
                link.stop.store(false, Ordering::Relaxed);
                link.items.store(0, Ordering::Relaxed);
                let cx = Ctx { t, rank, run, p, counts: &counts, ctl: link };
                let outcome = phases::run(w, phase, &cx).map_err(|e| e.to_string())?;
                link.finish(&FromWorker::Done(outcome)).map_err(|e| e.to_string())?;
            }
            Ok(ToWorker::Quit) | Err(_) => return Ok(()),
            Ok(other) => return Err(format!("unexpected {other:?}")),
        }
    }
}
