//! `top` never outlives its terminal: when the terminal hangs up (an SSH session to a TPU VM
//! drops, the tmux pane is killed) or SIGTERM arrives, it exits promptly instead of spinning on a
//! dead tty. The pseudo-terminal comes from Python's `pty` module (no unsafe code here).

use std::process::Command;

const DRIVER: &str = r#"
import os, pty, sys, time, signal
how = sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "top", "--no-libtpu", "--no-nvml", "--interval", "0.2"])
time.sleep(1.5)
try:
    os.read(fd, 1 << 20)
except OSError:
    pass
if how == "hangup":
    os.close(fd)
else:
    os.kill(pid, signal.SIGTERM)
t0 = time.time()
while time.time() - t0 < 5:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("exited %.2f %d" % (time.time() - t0, status))
        sys.exit(0)
    time.sleep(0.05)
os.kill(pid, signal.SIGKILL)
print("still running")
"#;

fn run(how: &str) -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", DRIVER, env!("CARGO_BIN_EXE_hbm-doctor"), how])
        .output();
    match out {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        _ => {
            eprintln!("SKIPPED: python3 with the pty module is needed to give top a terminal");
            None
        }
    }
}

fn check(how: &str) {
    let Some(line) = run(how) else { return };
    let mut it = line.split_whitespace();
    assert_eq!(it.next(), Some("exited"), "{how}: {line}");
    let secs: f64 = it.next().and_then(|s| s.parse().ok()).expect("seconds");
    let status: i32 = it.next().and_then(|s| s.parse().ok()).expect("status");
    assert!(secs < 2.5, "{how}: took {secs} s to exit");
    assert_eq!(
        status, 0,
        "{how}: wait status {status} (a signal or an error)"
    );
}

#[test]
fn top_exits_when_its_terminal_hangs_up() {
    check("hangup");
}

#[test]
fn top_exits_on_sigterm() {
    check("sigterm");
}
