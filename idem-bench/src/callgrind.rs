//! Instruction counts from valgrind's callgrind: the same count whatever
//! else the machine does, so a regression shows on a busy machine where a
//! timing would drown in noise.
//!
//! Two ways in: [`Server`] runs a program under callgrind and zeroes and
//! dumps its counters between requests (`callgrind_control`), for a server
//! whose requests come from another process; [`count_region`] re-runs the
//! current program under callgrind counting only inside one function, for
//! work measured in a loop in process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Boxed error of the benchmarks' setup.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Set in the environment of a program that [`count_region`] runs under
/// callgrind, so it knows to run its region and nothing else.
pub const UNDER_CALLGRIND: &str = "IDEM_BENCH_UNDER_CALLGRIND";

/// Whether this process is the one [`count_region`] started under callgrind.
pub fn under_callgrind() -> bool {
    std::env::var_os(UNDER_CALLGRIND).is_some()
}

/// A server process, under callgrind or not, that prints one line (its
/// addresses) when ready and runs until its standard input closes.
#[derive(Debug)]
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The line the server printed when ready.
    pub ready_line: String,
    callgrind: Option<Counters>,
}

#[derive(Debug)]
struct Counters {
    out_file: PathBuf,
    dumps: u32,
}

impl Server {
    /// Starts `program` with `args`; under callgrind if `callgrind_dir` is
    /// given (its dumps go there), with counting on from the start.
    ///
    /// # Errors
    ///
    /// If the program cannot start or exits before its ready line.
    pub fn start(
        program: &Path,
        args: &[String],
        callgrind_dir: Option<&Path>,
    ) -> Result<Self, Error> {
        let (mut command, callgrind) = match callgrind_dir {
            None => (Command::new(program), None),
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let out_file = dir.join(format!("server.{}.out", std::process::id()));
                let mut command = Command::new("valgrind");
                command
                    .arg("--tool=callgrind")
                    .arg(format!("--callgrind-out-file={}", out_file.display()))
                    .arg("--dump-instr=no")
                    .arg("--dump-line=no")
                    .arg(program);
                (command, Some(Counters { out_file, dumps: 0 }))
            }
        };
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if callgrind.is_some() {
                Stdio::null()
            } else {
                Stdio::inherit()
            })
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("the server has no stdout")?;
        let mut ready_line = String::new();
        BufReader::new(stdout).read_line(&mut ready_line)?;
        if ready_line.trim().is_empty() {
            let status = child.wait()?;
            return Err(format!("the server exited before it was ready: {status}").into());
        }
        Ok(Self {
            child,
            stdin,
            ready_line: ready_line.trim().to_string(),
            callgrind,
        })
    }

    /// Zeroes the server's counters (under callgrind).
    ///
    /// # Errors
    ///
    /// If the server is not under callgrind or `callgrind_control` fails.
    pub fn zero(&self) -> Result<(), Error> {
        self.control("--zero")
    }

    /// Dumps the server's counters and returns the instructions counted
    /// since the last [`zero`](Self::zero) (under callgrind).
    ///
    /// # Errors
    ///
    /// If the server is not under callgrind, `callgrind_control` fails, or
    /// the dump does not appear within a minute.
    pub fn dump(&mut self) -> Result<u64, Error> {
        self.control("--dump")?;
        let counters = self.callgrind.as_mut().ok_or("not under callgrind")?;
        counters.dumps += 1;
        let file = PathBuf::from(format!(
            "{}.{}",
            counters.out_file.display(),
            counters.dumps
        ));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(total) = total_instructions(&file) {
                return Ok(total);
            }
            if Instant::now() > deadline {
                return Err(format!("no callgrind dump at {}", file.display()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn control(&self, what: &str) -> Result<(), Error> {
        if self.callgrind.is_none() {
            return Err("not under callgrind".into());
        }
        let status = Command::new("callgrind_control")
            .arg(what)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("callgrind_control {what} failed: {status}").into())
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing its standard input stops it.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// The instructions a callgrind output file counts in all (its `totals:`
/// or `summary:` line, whose first event is `Ir`).
///
/// # Errors
///
/// If the file cannot be read or has no such line (not written yet).
pub fn total_instructions(file: &Path) -> Result<u64, Error> {
    let text = std::fs::read_to_string(file)?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("{} has no totals yet", file.display()).into())
}

/// Runs the current program again, with `args`, under callgrind counting
/// only inside the function whose name ends in `function` (it must not
/// call itself, and nothing it calls may match), and returns the
/// instructions counted. The program sees [`under_callgrind`].
///
/// # Errors
///
/// If valgrind cannot run, the program fails, or nothing was counted.
pub fn count_region(function: &str, args: &[String], out_dir: &Path) -> Result<u64, Error> {
    std::fs::create_dir_all(out_dir)?;
    let out_file = out_dir.join(format!("region.{}.out", std::process::id()));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect=*{function}"))
        .arg("--dump-instr=no")
        .arg("--dump-line=no")
        .arg(std::env::current_exe()?)
        .args(args)
        .env(UNDER_CALLGRIND, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("the program under callgrind failed: {status}").into());
    }
    let total = total_instructions(&out_file)?;
    let _ = std::fs::remove_file(&out_file);
    if total == 0 {
        return Err(format!("callgrind counted nothing inside {function}").into());
    }
    Ok(total)
}
