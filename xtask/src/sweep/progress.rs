//! Where a sweep on this host stands, said after each run: runs done of the total, failures,
//! time elapsed and an estimate of the time left from the runs so far. On a terminal, with the
//! runs' output in their log files (several at once), a progress bar keeps the line in place;
//! otherwise (one run at once, whose output is the sweep's, or a log file) a plain line.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A sweep's progress, shared by the runs at once.
pub(super) struct Progress {
    total: usize,
    logged: bool,
    counts: Mutex<Counts>,
    started: Instant,
    bar: Option<ProgressBar>,
}

/// Runs ended so far.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    finished: usize,
    failed: usize,
}

impl Progress {
    /// The progress of `total` runs; a bar where stderr is a terminal and the runs write to
    /// their logs (`logged`).
    pub(super) fn new(total: usize, logged: bool) -> Self {
        let bar = (logged && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(status_line(0, 0, total, Duration::ZERO));
            bar
        });
        Self {
            total,
            logged,
            counts: Mutex::new(Counts::default()),
            started: Instant::now(),
            bar,
        }
    }

    /// Whether the runs write to their log files (several at once), not to the sweep's output.
    pub(super) fn logged(&self) -> bool {
        self.logged
    }

    /// Prints `message` above the bar, or as a line.
    pub(super) fn say(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.println(message),
            None => eprintln!("{message}"),
        }
    }

    /// Counts one run ended (finished, or `failed`) and says where the sweep stands.
    pub(super) fn ended(&self, failed: bool) {
        let counts = {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            if failed {
                counts.failed += 1;
            } else {
                counts.finished += 1;
            }
            *counts
        };
        let line = status_line(
            counts.finished,
            counts.failed,
            self.total,
            self.started.elapsed(),
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position((counts.finished + counts.failed) as u64);
                bar.set_message(line);
            }
            None => eprintln!("sweep: {line}"),
        }
    }

    /// Takes the bar off the terminal, leaving its last line.
    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

/// `12/72 runs done, 1 failed, 25m 10s elapsed, about 2h 5m left`: the estimate is the time
/// per run so far (the runs at once included) times the runs left.
fn status_line(finished: usize, failed: usize, total: usize, elapsed: Duration) -> String {
    let ended = finished + failed;
    let mut line = format!(
        "{ended}/{total} runs done, {failed} failed, {} elapsed",
        duration(elapsed)
    );
    if ended > 0 && ended < total {
        let left = elapsed.mul_f64((total - ended) as f64 / ended as f64);
        line.push_str(&format!(", about {} left", duration(left)));
    }
    line
}

/// `2h 5m`, `25m 10s`, `40s`.
fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_runs_failures_time_and_what_is_left() {
        let minute = Duration::from_secs(60);
        assert_eq!(
            status_line(0, 0, 10, Duration::ZERO),
            "0/10 runs done, 0 failed, 0s elapsed"
        );
        // 4 runs in 20 minutes: 5 minutes a run, 6 left.
        assert_eq!(
            status_line(3, 1, 10, 20 * minute),
            "4/10 runs done, 1 failed, 20m 0s elapsed, about 30m 0s left"
        );
        assert_eq!(
            status_line(72, 0, 72, 150 * minute + Duration::from_secs(7)),
            "72/72 runs done, 0 failed, 2h 30m elapsed"
        );
    }
}
