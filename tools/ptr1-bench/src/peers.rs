//! The transports users would pick instead, driven from Python in their own processes:
//! `pybind/bench/bench.py` (tensorwire from Python next to the Rust engine client, pyzmq
//! `copy=False`, gRPC Python unary, `multiprocessing.shared_memory`) when a Python with
//! tensorwire and numpy is found. Peers
//! that are not installed are listed with the reason, never skipped silently.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Options;
use crate::report::say;

/// The peers this suite knows, by Python module.
const PEERS: [(&str, &str); 5] = [
    ("zmq", "pyzmq (REQ/REP, copy=False)"),
    ("grpc", "gRPC (Python, unary)"),
    (
        "multiprocessing.shared_memory",
        "multiprocessing.shared_memory",
    ),
    ("ray", "Ray (put/get to an actor)"),
    ("iceoryx2", "iceoryx2 (Python loan API)"),
];

/// Measures the Python peers, or says why not.
pub(crate) fn measure(options: &Options, reps: usize, seconds: f64) {
    say!("\nPeers (other transports, from Python, each server in its own process):");
    let Some(root) = workspace_root() else {
        say!("  not measured: pybind/bench/bench.py not found next to this binary's workspace");
        return;
    };
    let Some(python) = python_with_tensorwire(&root) else {
        say!(
            "  not measured: no Python with tensorwire and numpy (run scripts/python-env, which \
             installs it into .venv)"
        );
        return;
    };
    for (module, name) in PEERS {
        let found = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        let how = match (found, module) {
            (false, _) => "not installed: not measured",
            (true, "zmq" | "grpc" | "multiprocessing.shared_memory") => "measured below",
            (true, _) => "installed, but no driver for it in bench.py yet: not measured",
        };
        say!("  {name}: {how}");
    }
    let seconds = if options.quick { 0.5 } else { seconds.max(1.0) };
    let out = Command::new(&python)
        .arg(root.join("pybind/bench/bench.py"))
        .args([
            "--reps",
            &reps.to_string(),
            "--seconds",
            &seconds.to_string(),
        ])
        .output();
    match out {
        Ok(out) if out.status.success() => {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                say!("  {line}");
            }
        }
        Ok(out) => say!(
            "  bench.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("?")
        ),
        Err(e) => say!("  bench.py could not start: {e}"),
    }
}

/// The workspace this binary was built in (`target/<profile>/ptr1-bench` → the root).
fn workspace_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .find(|dir| dir.join("pybind/bench/bench.py").is_file())
        .map(Path::to_path_buf)
}

fn python_with_tensorwire(root: &Path) -> Option<PathBuf> {
    [root.join(".venv/bin/python"), PathBuf::from("python3")]
        .into_iter()
        .find(|python| {
            Command::new(python)
                .args(["-c", "import tensorwire, numpy"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
}
