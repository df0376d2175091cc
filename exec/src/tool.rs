//! Runs external programs (a lab's `ip`, `tc` and `taskset`, the CUDA probe's Python).
//!
//! Every wait is bounded in time, the exit status checked and stderr reported.

use crate::error::{ExecError, Result};
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long one invocation may take: `ip` and `tc` answer in milliseconds and Python starts
/// in a second, so a longer wait means a wedged call or tool, which is reported instead of
/// waited on.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a wait on a child process looks at it.
pub const POLL: Duration = Duration::from_millis(10);

/// `program args…` as a user would type it, for error messages.
pub fn command_line(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `program args…` to completion and returns its stdout; a non-zero exit, a failure to
/// start or a run longer than [`TOOL_TIMEOUT`] is an error quoting the command and its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let (status, stdout, stderr) = output(program, args)?;
    if status.success() {
        Ok(stdout)
    } else {
        Err(ExecError::Tool {
            command: command_line(program, args),
            message: format!("{} ({status})", first_line_or(&stderr, "no message")),
        })
    }
}

/// Runs `program args…` and returns whether it succeeded, for probes whose failure is an
/// answer (does this link exist?) rather than an error.
pub fn succeeds(program: &str, args: &[&str]) -> Result<bool> {
    Ok(output(program, args)?.0.success())
}

/// Runs `program args…`, returning its status, stdout and stderr, within [`TOOL_TIMEOUT`].
pub fn output(program: &str, args: &[&str]) -> Result<(ExitStatus, String, String)> {
    let command = command_line(program, args);
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| ExecError::Tool {
            command: command.clone(),
            message: format!("cannot start `{program}`: {err}"),
        })?;
    // Readers drain the pipes while the tool runs, so a chatty tool cannot block on a full pipe.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_bounded(&mut child, TOOL_TIMEOUT).map_err(|message| {
        kill(&mut child);
        ExecError::Tool {
            command: command.clone(),
            message,
        }
    })?;
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            // A read error leaves what was read so far; the exit status still reports failure.
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Waits for `child` at most `limit`; the error says how long it ran.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> std::result::Result<ExitStatus, String> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() >= deadline => {
                return Err(format!(
                    "still running after {:.1} s; stopped it",
                    limit.as_secs_f64()
                ))
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(err) => return Err(format!("cannot wait for it: {err}")),
        }
    }
}

/// Kills `child` and reaps it (a killed child exits at once; the wait is bounded regardless).
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = wait_bounded(child, Duration::from_secs(2));
}

/// The first non-empty line of `text`, or `otherwise`.
pub fn first_line_or<'a>(text: &'a str, otherwise: &'a str) -> &'a str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or(otherwise)
}

/// Whether `program` can be found on PATH (or is a path to an executable file).
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &std::path::Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_tool_is_an_error_quoting_it_and_its_stderr() {
        let err = run("sh", &["-c", "echo oops >&2; exit 3"]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("sh -c echo oops >&2; exit 3"), "{text}");
        assert!(
            text.contains("oops") && text.contains("exit status: 3"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_tool_is_an_error_naming_it() {
        let err = run("syncopate-no-such-tool", &[]).unwrap_err();
        assert!(err
            .to_string()
            .contains("cannot start `syncopate-no-such-tool`"));
        assert!(!on_path("syncopate-no-such-tool"));
        assert!(on_path("sh"));
    }

    #[test]
    fn stdout_is_returned() {
        assert_eq!(run("sh", &["-c", "echo hello"]).unwrap(), "hello\n");
        assert!(!succeeds("sh", &["-c", "exit 1"]).unwrap());
    }
}
