//! A child process that is always killed and reaped: on drop, also while a test panics, and —
//! where `setpriv` is available — when the test process itself dies.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A running child process with its output in a log file.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// Whether the child leads its own process group, all of which is signalled and killed (a
    /// launcher such as `buildah run` leaves helpers behind when only it is killed).
    group: bool,
}

fn setpriv_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

impl ChildProcess {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: &Path,
    ) -> Result<Self, String> {
        Self::start_with(name, program, args, envs, log, false)
    }

    /// [`ChildProcess::start`], and with `group` in a process group of its own: every signal, and
    /// the final kill, reach all of the group — for launchers that run the real program as a
    /// grandchild.
    pub fn start_with(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: &Path,
        group: bool,
    ) -> Result<Self, String> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        // The death signal follows the spawning thread; tests spawn from their own thread, which
        // outlives the child because drop kills it first.
        let mut command = if setpriv_available() {
            let mut c = Command::new("setpriv");
            c.args(["--pdeathsig", "KILL", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (key, value) in envs {
            command.env(key, value);
        }
        if group {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_path_buf(),
            group,
        })
    }

    /// The process name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its OS process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether it is still running (checked without reaping).
    pub fn is_running(&self) -> bool {
        self.pid()
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            && std::fs::read_to_string(format!("/proc/{}/stat", self.pid().unwrap_or_default()))
                .map(|stat| !stat.contains(") Z "))
                .unwrap_or(false)
    }

    /// Whether it has exited, and how.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends a signal (by name, e.g. `TERM`, `KILL`, `STOP`, `CONT`).
    pub fn signal(&self, signal: &str) -> Result<(), String> {
        let pid = self.pid().ok_or("process already reaped")?;
        // `-<pid>` names the process group the child leads.
        let target = if self.group {
            format!("-{pid}")
        } else {
            pid.to_string()
        };
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg("--")
            .arg(target)
            .status()
            .map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{signal} {pid} failed"))
        }
    }

    /// Waits up to `limit` for the process to exit by itself.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if self.group {
            // Also after the leader exited: its helpers may still hold the group.
            let _ = self.signal("KILL");
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
