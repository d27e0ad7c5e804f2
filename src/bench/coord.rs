//! The coordinator: sets the run up, starts the workers (this binary again),
//! runs each phase behind a barrier (`Prepare` to all, every `Prepared`, then
//! `Go` to all), stonewalls a timed phase with `Stop`, shows a progress bar,
//! checks between phases, cleans up, and reports.

use std::io::BufReader;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::proto::{recv, send, FromWorker, Outcome, ToWorker};
use super::report::{PhaseReport, RunReport, FORMAT_VERSION};
use super::target::{NativeTarget, PosixTarget, Target, TargetSpec};
use super::{cpu, plot, workload, BenchArgs, Params, WORKER_ENV};

/// How long workers may take to open the target or set a phase up.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long workers may take to exit once told to.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the coordinator looks at the clock while a phase runs.
const TICK: Duration = Duration::from_millis(50);
/// A phase shorter than this shows no progress bar.
const BAR_AFTER: Duration = Duration::from_millis(500);

/// `pfs bench` as the user runs it.
pub fn main(args: &BenchArgs) -> Result<(), String> {
    let params = Params::from_args(args)?;
    let spec = TargetSpec::parse(&args.target)?;
    if !args.compare.is_empty() && args.plot.is_none() {
        return Err("--compare draws into the --plot chart: give --plot FILE.svg".into());
    }
    let mut runs = Vec::with_capacity(args.compare.len() + 1);
    for path in &args.compare {
        let r = RunReport::load(path)?;
        if r.workload != args.workload {
            return Err(format!(
                "--compare {}: a {} run, this is {}",
                path.display(),
                r.workload.name(),
                args.workload.name()
            ));
        }
        runs.push(r);
    }
    let report = match &spec {
        TargetSpec::Posix(dir) => run_on(&PosixTarget::new(dir)?, args, &params, &spec)?,
        TargetSpec::Native { master, dir } => {
            run_on(&NativeTarget::connect(*master, &args.key, dir)?, args, &params, &spec)?
        }
    };
    print!("{}", report.table());
    if let Some(path) = &args.json {
        report.save(path)?;
    }
    if let Some(path) = &args.plot {
        runs.push(report);
        plot::draw(path, &runs)?;
    }
    Ok(())
}

fn run_on<T: Target>(
    t: &T,
    args: &BenchArgs,
    params: &Params,
    spec: &TargetSpec,
) -> Result<RunReport, String> {
    let w = args.workload;
    let run = format!("pfs-bench.{}.{}", w.name(), std::process::id());
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    workload::setup(w, t, &run, params).map_err(|e| format!("set-up: {e}"))?;
    let left =
        |e: String| format!("{e}\n(the run's files are left in {run} under {})", args.target);
    let mut workers = Workers::spawn(params.procs, &run).map_err(left)?;
    let phases = match drive(&mut workers, t, args, params, &run) {
        Ok(p) => p,
        Err(e) => {
            workers.kill();
            return Err(left(e));
        }
    };
    workers.quit().map_err(left)?;
    workload::cleanup(w, t, &run, params).map_err(|e| left(format!("clean-up: {e}")))?;
    Ok(RunReport {
        format_version: FORMAT_VERSION,
        pfs_version: env!("CARGO_PKG_VERSION").into(),
        workload: w,
        label: args.label.clone().unwrap_or_else(|| args.target.clone()),
        target: args.target.clone(),
        target_kind: spec.kind().into(),
        started_unix_s,
        params: params.clone(),
        phases,
    })
}

/// Runs every phase of the workload; the per-phase reports.
fn drive<T: Target>(
    workers: &mut Workers,
    t: &T,
    args: &BenchArgs,
    params: &Params,
    run: &str,
) -> Result<Vec<PhaseReport>, String> {
    let w = args.workload;
    let procs = params.procs;
    let mut counts = vec![w.count(params); procs as usize];
    let mut reports = Vec::with_capacity(w.phases().len());
    for (i, def) in w.phases().iter().enumerate() {
        run_checks(w, i, t, run, params, &counts)?;
        let items: Vec<u64> = (0..procs).map(|r| w.items(i, r, params, &counts)).collect();
        workers.send_all(&ToWorker::Prepare { phase: i, counts: counts.clone() })?;
        workers.expect_all(|m| matches!(m, FromWorker::Prepared), "Prepared")?;
        let limit = params.time_s.filter(|_| def.stonewall).map(Duration::from_secs_f64);
        let mut pids = workers.pids();
        pids.extend_from_slice(&args.cpu_of);
        let cpu_before = cpu::total_cpu_ns(&pids).map_err(|e| format!("--cpu-of: {e}"))?;
        let outcomes = workers
            .run_phase(def.name, items.iter().sum(), limit)
            .map_err(|e| format!("phase {}: {e}", def.name))?;
        let cpu_ns = cpu::total_cpu_ns(&pids)
            .map_err(|e| format!("--cpu-of: {e}"))?
            .saturating_sub(cpu_before);
        let stonewalled = limit.is_some() && outcomes.iter().zip(&items).any(|(o, &n)| o.items < n);
        for (r, (o, &n)) in outcomes.iter().zip(&items).enumerate() {
            if o.items > n || (!def.stonewall && o.items != n) {
                return Err(format!("phase {}: rank {r} did {} items of {n}", def.name, o.items));
            }
        }
        let mut report = PhaseReport::new(def.name, w.metric(), stonewalled, &outcomes);
        report.set_cpu(cpu_ns);
        reports.push(report);
        if def.stonewall {
            counts = outcomes.iter().map(|o| o.items).collect();
        }
    }
    run_checks(w, w.phases().len(), t, run, params, &counts)?;
    Ok(reports)
}

/// The checks due before phase `next` (or at the end).
fn run_checks<T: Target>(
    w: workload::Workload,
    next: usize,
    t: &T,
    run: &str,
    params: &Params,
    counts: &[u64],
) -> Result<(), String> {
    for i in workload::checks_due_before(w, next) {
        let name = w.phases()[i].name;
        workload::check_after(w, i, t, run, params, counts)
            .map_err(|e| format!("after phase {name}: {e}"))?;
    }
    Ok(())
}

/// What the reader threads pass on.
enum Event {
    Msg(u32, FromWorker),
    Gone(u32, String),
}

/// The worker processes and their pipes.
struct Workers {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
    rx: Receiver<Event>,
}

impl Workers {
    /// Starts `procs` copies of this program with the same arguments, as
    /// workers; returns once all of them opened the target.
    fn spawn(procs: u32, run: &str) -> Result<Workers, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let (tx, rx) = mpsc::channel();
        let mut w = Workers { children: Vec::new(), stdins: Vec::new(), rx };
        for rank in 0..procs {
            let mut child = Command::new(&exe)
                .args(std::env::args_os().skip(1))
                .env(WORKER_ENV, "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start worker {rank} ({}): {e}", exe.display()))?;
            let stdout = child.stdout.take().expect("piped stdout");
            w.stdins.push(child.stdin.take().expect("piped stdin"));
            w.children.push(child);
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("bench-rank-{rank}"))
                .spawn(move || {
                    let mut r = BufReader::new(stdout);
                    loop {
                        let ev = match recv::<_, FromWorker>(&mut r) {
                            Ok(Some(m)) => Event::Msg(rank, m),
                            Ok(None) => Event::Gone(rank, "exited".into()),
                            Err(e) => Event::Gone(rank, e.to_string()),
                        };
                        let last = matches!(ev, Event::Gone(..));
                        if tx.send(ev).is_err() || last {
                            return;
                        }
                    }
                })
                .map_err(|e| format!("cannot start a thread: {e}"))?;
        }
        for rank in 0..procs {
            w.send(rank, &ToWorker::Hello { rank, run: run.into() })?;
        }
        w.expect_all(|m| matches!(m, FromWorker::Ready), "Ready")?;
        Ok(w)
    }

    /// The workers' process ids.
    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    fn send(&mut self, rank: u32, msg: &ToWorker) -> Result<(), String> {
        send(&mut self.stdins[rank as usize], msg).map_err(|e| format!("worker {rank}: {e}"))
    }

    fn send_all(&mut self, msg: &ToWorker) -> Result<(), String> {
        for rank in 0..self.stdins.len() as u32 {
            self.send(rank, msg)?;
        }
        Ok(())
    }

    /// Waits for one `what` from every worker.
    fn expect_all(&mut self, want: impl Fn(&FromWorker) -> bool, what: &str) -> Result<(), String> {
        let mut got = vec![false; self.children.len()];
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        while got.iter().any(|g| !g) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Event::Msg(r, m)) if want(&m) => got[r as usize] = true,
                Ok(Event::Msg(_, FromWorker::Progress { .. })) => {}
                Ok(Event::Msg(_, FromWorker::Failed { error })) => return Err(error),
                Ok(Event::Msg(r, m)) => return Err(format!("worker {r}: {m:?}, expected {what}")),
                Ok(Event::Gone(r, why)) => return Err(format!("worker {r} {why}")),
                Err(_) => {
                    let late: Vec<usize> = (0..got.len()).filter(|&r| !got[r]).collect();
                    return Err(format!("workers {late:?}: no {what} within {ANSWER_TIMEOUT:?}"));
                }
            }
        }
        Ok(())
    }

    /// Starts the prepared phase on every worker and collects their outcomes.
    fn run_phase(
        &mut self,
        name: &str,
        total_items: u64,
        limit: Option<Duration>,
    ) -> Result<Vec<Outcome>, String> {
        let n = self.children.len();
        self.send_all(&ToWorker::Go)?;
        let started = Instant::now();
        let bar = progress_bar(name, total_items, limit);
        let mut shown = false;
        let mut stop_sent = false;
        let mut pos = vec![0u64; n];
        let mut done: Vec<Option<Outcome>> = vec![None; n];
        while done.iter().any(Option::is_none) {
            match self.rx.recv_timeout(TICK) {
                Ok(Event::Msg(r, FromWorker::Progress { items })) => pos[r as usize] = items,
                Ok(Event::Msg(r, FromWorker::Done(o))) => {
                    pos[r as usize] = o.items;
                    done[r as usize] = Some(o);
                }
                Ok(Event::Msg(_, FromWorker::Failed { error })) => return Err(error),
                Ok(Event::Msg(r, m)) => return Err(format!("worker {r}: unexpected {m:?}")),
                Ok(Event::Gone(r, why)) => return Err(format!("worker {r} {why}")),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err("all workers gone".into()),
            }
            let elapsed = started.elapsed();
            if let Some(l) = limit {
                if !stop_sent && elapsed >= l {
                    self.send_all(&ToWorker::Stop)?;
                    stop_sent = true;
                }
                bar.set_position(elapsed.min(l).as_millis() as u64);
                bar.set_message(format!("{} items", pos.iter().sum::<u64>()));
            } else {
                bar.set_position(pos.iter().sum());
            }
            if !shown && elapsed >= BAR_AFTER {
                // Draws only when stderr is a terminal.
                bar.set_draw_target(ProgressDrawTarget::stderr());
                shown = true;
            }
        }
        bar.finish_and_clear();
        Ok(done.into_iter().map(|o| o.expect("every rank done")).collect())
    }

    /// Tells every worker to exit and waits for them.
    fn quit(mut self) -> Result<(), String> {
        let _ = self.send_all(&ToWorker::Quit);
        self.stdins.clear();
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let mut first = Ok(());
        for (rank, child) in self.children.iter_mut().enumerate() {
            loop {
                match child.try_wait() {
                    Ok(Some(st)) if st.success() => break,
                    Ok(Some(st)) => {
                        first = first.and(Err(format!("worker {rank} exited with {st}")));
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) | Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        first = first.and(Err(format!("worker {rank} did not exit; killed")));
                        break;
                    }
                }
            }
        }
        self.children.clear();
        first
    }

    /// Stops every worker now (after a failure).
    fn kill(&mut self) {
        self.stdins.clear();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.kill();
    }
}

fn progress_bar(name: &str, total_items: u64, limit: Option<Duration>) -> ProgressBar {
    let (len, template) = match limit {
        Some(l) => (l.as_millis() as u64, "{prefix:>10} [{bar:40}] {elapsed} of stonewall, {msg}"),
        None => (total_items, "{prefix:>10} [{bar:40}] {pos}/{len} items, {per_sec}, eta {eta}"),
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template(template).expect("a valid template").progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    bar
}
